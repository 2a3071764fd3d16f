"""The classic app with Flower's secure aggregation (SecAgg+), as Flower's fl-dp-sa
example runs it: the ClientApp with secaggplus_mod, the ServerApp's FedAvg under
DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...)). Each round's training is four
batches of train messages (setup, share keys, collect masked vectors, unmask).

$CLASSICAPP_NODES set, the strategy waits for that many clients before it samples
(Flower's simulation registers its nodes after the ServerApp starts); $CLASSICAPP_OUT
set, the global arrays after every round are written there (an .npz, ``round{r}``);
$CLASSICAPP_ROUNDS the rounds when the run config has none (Flower's simulation);
$CLASSICAPP_SHARES / $CLASSICAPP_THRESHOLD set SecAgg+'s num_shares and
reconstruction_threshold (default: every client, threshold 2)."""

import os

import numpy as np
from flwr.client import ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, Message, parameters_to_ndarrays
from flwr.server import Grid, LegacyContext, ServerApp
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from classicapp.client_app import client_fn
from classicapp.server_app import server_fn


def seeded_numpy_mod(msg: Message, context: Context, call_next):
    """Seed numpy's global generator from the partition id and the server round (the
    message's group_id) before SecAgg+ runs: its stochastic quantisation draws from it,
    so mecsim's run and Flower's simulation round the same way (to compare them)."""
    pid = int(context.node_config["partition-id"])
    np.random.seed(1000 * pid + int(msg.metadata.group_id or 0))
    return call_next(msg, context)


client = ClientApp(client_fn=client_fn, mods=[seeded_numpy_mod, secaggplus_mod])

server = ServerApp()


def _number(text: str) -> int | float:
    return float(text) if "." in text else int(text)


@server.main()
def main(grid: Grid, context: Context) -> None:
    defaults = {
        "num-server-rounds": int(os.environ.get("CLASSICAPP_ROUNDS", "3")),
        "fraction-train": 1.0,
        "fraction-evaluate": 1.0,
    }
    context.run_config = {**defaults, "lr": 0.1, **context.run_config}
    components = server_fn(context)
    strategy = components.strategy
    nodes = int(os.environ.get("CLASSICAPP_NODES", "0"))
    if nodes:
        strategy.min_available_clients = nodes
        strategy.min_fit_clients = nodes
    rounds: dict[int, np.ndarray] = {}
    evaluate = strategy.evaluate

    def keep(server_round, parameters):
        arrays = parameters_to_ndarrays(parameters)
        rounds[server_round] = np.concatenate([a.ravel() for a in arrays])
        return evaluate(server_round, parameters)

    strategy.evaluate = keep
    legacy = LegacyContext(context=context, config=components.config, strategy=strategy)
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(
            num_shares=_number(os.environ.get("CLASSICAPP_SHARES", "1.0")),
            reconstruction_threshold=_number(os.environ.get("CLASSICAPP_THRESHOLD", "2")),
        )
    )
    workflow(grid, legacy)
    out = os.environ.get("CLASSICAPP_OUT")
    if out:
        np.savez(out, **{f"round{r}": v for r, v in rounds.items()})
