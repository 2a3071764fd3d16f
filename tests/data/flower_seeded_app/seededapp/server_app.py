"""The ServerApp: one of Flower's strategies; the global arrays after every round are
written to $SEEDEDAPP_OUT (an .npz) when it is set; $SEEDEDAPP_CENTRAL set, its
evaluate_fn scores them on partition 0's test images (a centralised evaluation)."""

import os
import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedProx

from seededapp.task import load_data, make_net, test

app = ServerApp()

DEFAULTS = {
    "num-server-rounds": int(os.environ.get("SEEDEDAPP_ROUNDS", "3")),
    "fraction-train": 1.0,
    "fraction-evaluate": 1.0,
    "lr": 0.1,
    "strategy": "fedavg",
}
STRATEGIES = {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam, "fedavgm": FedAvgM}


class InSendOrder:
    """``grid`` with the replies of ``send_and_receive`` in the order their messages were
    sent. Flower's simulation hands them back as they arrive, which depends on how busy
    the machine is, and FedAvg's sum is float arithmetic, so its last bits depend on the
    order: under the suite's load a run of this seeded app differed from mecsim's in 71 %
    of the global arrays' values by round 3 (atol 1e-6), and passed on a quiet machine.
    In send order Flower's run and mecsim's are reproducible and comparable value for
    value."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *args, **kwargs):
        messages = list(messages)
        order = {m.metadata.dst_node_id: i for i, m in enumerate(messages)}
        replies = list(self._grid.send_and_receive(messages, *args, **kwargs))
        return sorted(replies, key=lambda r: order.get(r.metadata.src_node_id, len(order)))


@app.main()
def main(grid: Grid, context: Context) -> None:
    grid = InSendOrder(grid)
    # Flower's run_simulation gives an empty run config: the defaults are the pyproject's
    cfg = {**DEFAULTS, **context.run_config}
    kwargs = dict(
        fraction_train=float(cfg["fraction-train"]),
        fraction_evaluate=float(cfg["fraction-evaluate"]),
    )
    name = os.environ.get("SEEDEDAPP_STRATEGY", str(cfg["strategy"]))
    if name == "fedprox":
        kwargs["proximal_mu"] = 0.1
    strategy = STRATEGIES[name](**kwargs)
    rounds = {}

    stamps = {}

    def keep(server_round: int, arrays: ArrayRecord):
        # called before the first round and after each: the wall time between two calls
        # is a round's (its train and evaluate messages), for benchmarks/speed/flower.py
        stamps[server_round] = time.perf_counter()
        rounds[server_round] = np.concatenate([a.numpy().ravel() for a in arrays.values()])
        if os.environ.get("SEEDEDAPP_CENTRAL"):  # a centralised evaluation: partition 0's
            net = make_net()  # test images
            net.load_state_dict(arrays.to_torch_state_dict())
            loss, acc = test(net, load_data(0, 1)[1])
            return MetricRecord({"accuracy": acc, "loss": loss})
        return None

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(make_net().state_dict()),
        train_config=ConfigRecord({"lr": float(cfg["lr"])}),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=keep,
    )
    out = os.environ.get("SEEDEDAPP_OUT")
    if out:
        # how many times the clients trained, averaged: their Context state (stateful)
        times = {f"times{r}": m["times"] for r, m in result.train_metrics_clientapp.items()}
        walls = {f"wall{r}": stamps[r] - stamps[r - 1] for r in stamps if r > 0}
        np.savez(out, **{f"round{r}": v for r, v in rounds.items()}, **times, **walls)
