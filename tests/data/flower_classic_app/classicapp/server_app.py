"""The ServerApp: server_fn returning a ServerConfig and flwr.server.strategy's FedAvg
with initial parameters and a centralised evaluate_fn (on partition 0's test images)."""

from flwr.common import ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from classicapp.client_app import get_weights, set_weights
from classicapp.task import load_data, make_net, test


def evaluate_fn(server_round, parameters, config):
    net = make_net()
    set_weights(net, parameters)
    _, data = load_data(0, 1)
    loss, acc = test(net, data)
    return loss, {"accuracy": acc}


def server_fn(context):
    cfg = context.run_config
    lr = float(cfg["lr"])
    strategy = FedAvg(
        fraction_fit=float(cfg["fraction-train"]),
        fraction_evaluate=float(cfg["fraction-evaluate"]),
        min_fit_clients=1,
        min_evaluate_clients=1,
        min_available_clients=1,
        initial_parameters=ndarrays_to_parameters(get_weights(make_net())),
        on_fit_config_fn=lambda rnd: {"server-round": rnd, "lr": lr},
        evaluate_fn=evaluate_fn,
    )
    return ServerAppComponents(
        strategy=strategy, config=ServerConfig(num_rounds=int(cfg["num-server-rounds"]))
    )


app = ServerApp(server_fn=server_fn)
