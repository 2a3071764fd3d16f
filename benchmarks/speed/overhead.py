"""How much mecsim adds to the cost of the training itself.

The same FedAvg workload — the embedded MNIST images split IID over N clients, MTFL's
2NN, one local epoch of SGD at batch 32 per round, weighted averaging — run two ways:

1. a plain PyTorch loop in one process (load global weights, train each client in turn,
   average), with 1 and with 2 torch threads; the faster of the two is the reference;
2. ``mecsim`` with the Ray backend (host actors, server actor, SimPy timing, channel
   draws, FLOP and memory accounting, records), evaluation switched off between rounds.

Reports the median round wall time of each and their ratio, for N = 10, 100 and 1,000
clients; at 1,000 (and more) 10 % of the clients train each round (both ways draw 100
of them at random every round), below that all of them. The first round of every run
(warm-up) and mecsim's last round (which also evaluates) are left out; the three runs
are repeated ``--trials`` times, interleaved, to even out noise from other work on the
machine. mecsim's round time is the run loop's whole round (plan, train, time,
aggregate, records: ``host_wall_s``).

    python benchmarks/speed/overhead.py [--rounds 10] [--trials 3] [--clients 10 100 1000] [--quick]
    # mecsim's parts:
    python benchmarks/speed/overhead.py --parts --clients 1000 --rounds 40 --trials 1
    cd benchmarks/speed && python overhead.py --algorithm fedavg_plugin:FEDAVG   # as a plugin
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from mecsim.agents.algorithms.fedavg import weighted_average
from mecsim.agents.models import build_model, get_flat, model_layout, set_flat
from mecsim.data import load_dataset, normalise, partition
from mecsim.run.loop import run
from mecsim.scenario import scenario_from_dict

TRAIN, TEST, BATCH, LR = 9000, 1000, 32, 0.05
QUICK_USES_RAY = True  # tests/e2e/test_benchmarks.py marks this benchmark's --quick run "ray"


def participation(n_clients: int) -> float:
    """The fraction of the clients that trains each round: 10 % from 1,000 clients on."""
    return 0.1 if n_clients >= 1000 else 1.0


def scenario(n_clients: int, rounds: int, out_dir: str, algorithm: str = "fedavg") -> dict:
    return {
        "name": f"overhead-{n_clients}",
        "seed": 0,
        "rounds": rounds,
        "dataset": {
            "name": "mnist-embedded",
            "train_size": TRAIN,
            "test_size": TEST,
            "partition": {"method": "iid"},
        },
        "model": {"name": "mlp_2nn"},
        "topology": {"clients": n_clients, "participation": participation(n_clients)},
        "training": {"epochs": 1, "batch_size": BATCH, "lr": LR},
        "algorithm": {"name": algorithm},
        "evaluation": {"every": rounds + 1},  # only after the last round
        "outputs": {"dir": out_dir, "save_optraces": True},
        "metrics": {"enabled": False},
    }


def plain_loop(n_clients: int, rounds: int, threads: int | None = None) -> list[float]:
    """Round wall times of the same FedAvg work in a plain PyTorch loop."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    rng = np.random.default_rng(np.random.SeedSequence([0, 1]))
    pools = load_dataset("mnist-embedded", None, TRAIN, TEST, rng)
    parts = partition(pools, n_clients, "iid", rng)
    data = [
        (
            normalise(pools.train.images[idx], "mnist-embedded"),
            torch.from_numpy(pools.train.labels[idx].astype(np.int64)),
        )
        for idx in parts.train
    ]
    torch.manual_seed(0)
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    global_w = get_flat(model, layout)
    gen = torch.Generator().manual_seed(0)
    per_round = max(1, round(participation(n_clients) * n_clients))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        updates, sizes = [], []
        chosen = sorted(rng.choice(n_clients, size=per_round, replace=False).tolist())
        for x, y in (data[c] for c in chosen):
            set_flat(model, layout, global_w)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            order = torch.randperm(len(y), generator=gen)
            for b in range(0, len(y), BATCH):
                idx = order[b : b + BATCH]
                if len(idx) < 2:
                    continue
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
            updates.append(get_flat(model, layout))
            sizes.append(len(y))
        global_w = weighted_average(updates, sizes)
        times.append(time.perf_counter() - start)
    torch.set_num_threads(previous)
    return times


def mecsim_rows(
    n_clients: int, rounds: int, hosts: int | None, algorithm: str = "fedavg"
) -> list[dict]:
    """The round rows of a mecsim run, but the last (it also evaluates)."""
    with tempfile.TemporaryDirectory() as tmp:
        sc = scenario_from_dict(scenario(n_clients, rounds, tmp, algorithm))
        rows = run(sc, "bench", None, [], backend="ray", hosts=hosts)
    return rows[:-1]


def mecsim_rounds(
    n_clients: int, rounds: int, hosts: int | None, algorithm: str = "fedavg"
) -> list[float]:
    return [r["host_wall_s"] for r in mecsim_rows(n_clients, rounds, hosts, algorithm)]


def print_parts(n_clients: int, rows: list[dict]) -> None:
    """The median round and its parts: training (plan, the hosts' work, their results
    back), waiting for the server's aggregate, and the rest (timing, records, the next
    round's submission), in ms."""

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1000

    rest = [r["host_wall_s"] - r["host_train_wall_s"] - r["host_aggregate_s"] for r in rows]
    print(
        f"{n_clients} clients: round {ms([r['host_wall_s'] for r in rows]):.1f} ms "
        f"train {ms([r['host_train_wall_s'] for r in rows]):.1f} ms "
        f"aggregate {ms([r['host_aggregate_s'] for r in rows]):.1f} ms "
        f"rest {ms(rest):.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[10, 100, 1000],
        help="numbers of clients (10 %% of them train each round from 1,000 on)",
    )
    ap.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="mecsim host actors (default: one per core; 1 = same CPU as the "
        "one-thread plain loop)",
    )
    ap.add_argument(
        "--algorithm",
        default="fedavg",
        help="mecsim's algorithm: fedavg (built in), or a plugin's name or import string "
        "doing the same work, e.g. fedavg_plugin:FEDAVG (benchmarks/speed/fedavg_plugin.py, "
        "run from benchmarks/speed/) to measure what a plugin costs per round",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: 10 clients, 3 rounds, 1 trial, the plain "
        "loop with 1 thread only (mecsim with Ray); also prints --parts' line",
    )
    ap.add_argument(
        "--parts",
        action="store_true",
        help="mecsim only: the median round and its parts (training, waiting for the "
        "aggregate, the rest) per number of clients, no plain loop",
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.trials, args.clients = 3, 1, [10]
    if args.parts:
        for n in args.clients:
            rows = [
                r
                for _ in range(args.trials)
                for r in mecsim_rows(n, args.rounds, args.hosts, args.algorithm)[1:]
            ]
            print_parts(n, rows)
        return
    print(
        f"{'clients':>8} {'trained':>8} {'plain 1 thr':>12} {'plain 2 thr':>12} "
        f"{'mecsim':>9} {'ratio':>6}   (median seconds per round)"
    )
    for n in args.clients:
        one, two, rows = [], [], []
        for _ in range(args.trials):
            one += plain_loop(n, args.rounds, threads=1)[1:]  # first round warms up
            if not args.quick:  # two torch threads on a busy machine can take minutes
                two += plain_loop(n, args.rounds, threads=2)[1:]
            rows += mecsim_rows(n, args.rounds, args.hosts, args.algorithm)[1:]
        ours = [r["host_wall_s"] for r in rows]
        plain = min(statistics.median(one), statistics.median(two or one))
        mine = statistics.median(ours)
        two_s = f"{statistics.median(two):>12.3f}" if two else f"{'-':>12}"
        trained = max(1, round(participation(n) * n))
        print(
            f"{n:>8} {trained:>8} {statistics.median(one):>12.3f} {two_s} "
            f"{mine:>9.3f} {mine / plain:>6.2f}"
        )
        if args.quick:  # the parts too (what --parts prints), from the same rounds
            print_parts(n, rows)


if __name__ == "__main__":
    main()
