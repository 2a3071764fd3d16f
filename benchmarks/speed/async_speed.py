"""Wall time of an asynchronous run against the same trainings in synchronous rounds.

The issue's figure (docs/async.md, "Speed"): FedAsync with 100 clients and 1,000
updates (1,000 versions) against 10 synchronous FedAvg rounds of the same 100 clients
(1,000 trainings), the same data, model, links and hosts; evaluation only at the end of
each run. Prints both wall times and their ratio (the target: at most 1.3).

    python benchmarks/speed/async_speed.py [--backend local|ray] [--hosts 2] [--repeats 1]

``--quick`` checks that the script runs (10 clients, 2 rounds against 20 updates): its
ratio measures nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import mecsim


def scenario(mode: str, clients: int = 100) -> dict:
    return {
        "name": f"speed-{mode}",
        "seed": 0,
        "rounds": 10 if mode == "sync" else 10 * clients,
        "dataset": {
            "name": "mnist-embedded",
            "train_size": 80 * clients,
            "test_size": 20 * clients,
            "partition": {"method": "iid"},
        },
        "model": {"name": "mlp_2nn"},
        "topology": {"clients": clients},
        "devices": {"clients": [{"profile": "rpi3b", "count": clients // 2}, {"profile": "rpi4"}]},
        "channel": {
            "model": "fixed_rate",
            "uplink": {"rate_bps": 20e6},
            "downlink": {"rate_bps": 50e6},
        },
        "training": {"epochs": 1, "batch_size": 20, "lr": 0.05},
        "evaluation": {"every": 10 * clients},
        "checkpoint": {"every": 0},
        "outputs": {"table_format": "csv"},
        "aggregation": {"mode": mode},
    }


def timed(mode: str, backend: str, hosts: int, clients: int = 100, rounds: int = 0) -> float:
    sc = scenario(mode, clients)
    if rounds:
        sc["rounds"] = rounds
        sc["evaluation"] = {"every": rounds}
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        run = mecsim.simulate(
            sc,
            out=out,
            run_id=mode,
            backend=backend,
            hosts=hosts,
            progress=False,
            plots=False,
            metrics__enabled=False,
        )
        took = time.perf_counter() - t0
        assert run.status == "finished"
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local", choices=("local", "ray"))
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="check that it runs (10 clients)")
    args = ap.parse_args()
    if args.quick:
        sync_s = timed("sync", "local", 1, clients=10, rounds=2)
        async_s = timed("async", "local", 1, clients=10, rounds=20)
        print(
            f"quick: 2 sync rounds of 10 {sync_s:.1f} s, FedAsync 20 updates {async_s:.1f} s, "
            f"ratio {async_s / sync_s:.2f} (measures nothing at this size)"
        )
        return
    for _ in range(args.repeats):
        sync_s = timed("sync", args.backend, args.hosts)
        async_s = timed("async", args.backend, args.hosts)
        print(
            f"{args.backend}, {args.hosts} hosts: 10 sync rounds of 100 {sync_s:.1f} s, "
            f"FedAsync 1,000 updates {async_s:.1f} s, ratio {async_s / sync_s:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
