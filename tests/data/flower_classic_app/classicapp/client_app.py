"""The ClientApp: a NumPyClient from client_fn, seeded from its partition id and the
server round as seededapp's is."""

import torch
from flwr.client import ClientApp, NumPyClient

from classicapp.task import load_data, make_net, test, train


def get_weights(net):
    return [v.cpu().numpy() for v in net.state_dict().values()]


def set_weights(net, weights) -> None:
    keys = list(net.state_dict())
    net.load_state_dict({k: torch.tensor(w) for k, w in zip(keys, weights, strict=True)})


class SeededClient(NumPyClient):
    def __init__(self, pid: int, partitions: int, epochs: int) -> None:
        self.pid, self.partitions, self.epochs = pid, partitions, epochs

    def fit(self, parameters, config):
        net = make_net()
        set_weights(net, parameters)
        data, _ = load_data(self.pid, self.partitions)
        seed = 1000 * self.pid + int(config["server-round"])
        loss = train(net, data, self.epochs, float(config["lr"]), seed)
        return get_weights(net), len(data[1]), {"train_loss": loss}

    def evaluate(self, parameters, config):
        net = make_net()
        set_weights(net, parameters)
        _, data = load_data(self.pid, self.partitions)
        loss, acc = test(net, data)
        return loss, len(data[1]), {"accuracy": acc}


def client_fn(context):
    return SeededClient(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        int(context.run_config.get("local-epochs", 1)),
    ).to_client()


app = ClientApp(client_fn=client_fn)
