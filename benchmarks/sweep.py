"""How fast are what-if sweeps? Two figures (issue 8), on the machine at hand.

1. **Sweep**: a 50-point uplink-bandwidth sweep (1 to 50 MHz per client) over a recorded
   100-round, 100-client FedAvg run (every client selected every round: 10,000 client
   op-traces). Target: under 5 s on 2 cores. The recorded run is a *real* training run of
   the scenario below (MTFL's 2NN on the embedded MNIST, 40 samples per client, KAPC
   Table 4 channel), made once with the in-process backend and kept in ``--run-dir``
   (about 1-2 minutes on 2 cores); later invocations reuse it. The sweep is timed with
   one process and with a pool of two, after loading the run (loading is reported apart).
2. **Engine alone**: re-timing 10,000 clients x 100 rounds of FedAvg op-traces
   (download, compute, upload; sizes and FLOPs varying per client, rates drawn per
   client-round from a seeded generator). Target: under 10 s. Timed with the default
   engine path (the closed form when nothing is shared) and, for ``--simpy-rounds``
   rounds, with the SimPy model, checking that both give identical timelines.

    nice -n 10 python benchmarks/sweep.py [--run-dir DIR] [--repeats 3] [--simpy-rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

SCENARIO = {
    "name": "bench-sweep-fedavg-100", "seed": 0, "rounds": 100,
    "dataset": {"name": "mnist-embedded", "train_size": 4000, "test_size": 1000,
                "partition": {"method": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 100, "participation": 1.0},
    "devices": {"clients": [{"profile": "rpi4"}]},
    "channel": {"model": "shannon", "interference": {"unit": "noise"}},
    "training": {"epochs": 1, "batch_size": 20, "lr": 0.05},
    "evaluation": {"every": 10},
    "metrics": {"enabled": False},
    "execution": {"backend": "local"},
}
BANDWIDTHS_HZ = np.linspace(1e6, 50e6, 50).tolist()


def recorded_run(run_dir: Path):
    from mecsim.replay import load_run
    from mecsim.scenario import scenario_from_dict
    from mecsim.sweep import record

    if not (run_dir / "optraces.jsonl").exists():
        print(f"recording {run_dir} (real training, once) ...", flush=True)
        t0 = time.perf_counter()
        record(scenario_from_dict(SCENARIO, "benchmarks/sweep.py"), run_dir.parent)
        print(f"  recorded in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    run = load_run(run_dir)
    print(f"loaded {run}: {time.perf_counter() - t0:.2f} s")
    return run


def bench_sweep(run, repeats: int) -> None:
    from mecsim.sweep import sweep

    grid = {"channel.uplink.bandwidth_hz": BANDWIDTHS_HZ}
    for workers in (1, 2):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            df = sweep(run, grid, workers=workers, target_accuracy=0.6)
            times.append(time.perf_counter() - t0)
        print(f"sweep, 50 points x 100 rounds x 100 clients, workers={workers}: "
              f"best {min(times):.2f} s, median {statistics.median(times):.2f} s "
              f"({repeats} runs)")
    assert len(df) == 50 and df["exact"].all()
    mean_s = df["round_time_mean_s"].to_numpy()
    print(f"  mean round time {mean_s[0]:.1f} s at 1 MHz .. {mean_s[-1]:.1f} s at 50 MHz; "
          f"non-increasing: {bool(np.all(np.diff(mean_s) <= 0))}")


def fedavg_round(rng: np.random.Generator, n_clients: int):
    from mecsim.engine import ClientSpec
    from mecsim.ops import Compute, Download, Upload

    model_bytes = 800_040
    steps = rng.integers(1, 40, n_clients)
    traces, specs = {}, {}
    up = rng.uniform(1e6, 40e6, n_clients)
    down = rng.uniform(5e6, 80e6, n_clients)
    for i in range(n_clients):
        traces[i] = (Download(model_bytes), Compute(float(steps[i]) * 2.8e7, int(steps[i])),
                     Upload(model_bytes))
        specs[i] = ClientSpec(i, float(up[i]), float(down[i]), 0.02, 1.4e10)
    return traces, specs


def bench_engine(simpy_rounds: int, n_clients: int = 10_000, n_rounds: int = 100) -> None:
    from mecsim.engine import NetworkSpec, ServerSpec, time_round

    rng = np.random.default_rng(0)
    rounds = [fedavg_round(rng, n_clients) for _ in range(n_rounds)]
    servers, net = [ServerSpec(1e11)], NetworkSpec()
    t0 = time.perf_counter()
    fast = [time_round(tr, sp, servers, net, aggregate_s=0.01) for tr, sp in rounds]
    fast_s = time.perf_counter() - t0
    print(f"engine, {n_clients} clients x {n_rounds} rounds (default path): {fast_s:.2f} s")
    if simpy_rounds:
        t0 = time.perf_counter()
        slow = [time_round(tr, sp, servers, net, aggregate_s=0.01, method="simpy")
                for tr, sp in rounds[:simpy_rounds]]
        per_round = (time.perf_counter() - t0) / simpy_rounds
        same = all(a == b for a, b in zip(fast, slow, strict=False))
        print(f"  SimPy model: {per_round:.2f} s per round ({simpy_rounds} rounds timed; "
              f"x{n_rounds} = {per_round * n_rounds:.0f} s extrapolated); "
              f"identical timelines: {same}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path,
                   default=Path("/tmp/mecsim-bench") / SCENARIO["name"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--simpy-rounds", type=int, default=3)
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-engine", action="store_true")
    args = p.parse_args()
    if not args.skip_sweep:
        bench_sweep(recorded_run(args.run_dir), args.repeats)
    if not args.skip_engine:
        bench_engine(args.simpy_rounds)


if __name__ == "__main__":
    main()
