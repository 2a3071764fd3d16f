"""How fast are what-if sweeps? Three figures, on the machine at hand.

1. **Sweep**: a 50-point uplink-bandwidth sweep (1 to 50 MHz per client) over a recorded
   100-round, 100-client FedAvg run (every client selected every round: 10,000 client
   op-traces). Target: under 5 s on 2 cores. The recorded run is a *real* training run of
   the scenario below (MTFL's 2NN on the embedded MNIST, 40 samples per client, KAPC
   Table 4 channel), made once with the in-process backend and kept in ``--record-dir``
   under ``<scenario name>-<hash of the resolved scenario>/`` (about 1-2 minutes on 2
   cores); later invocations reuse it (``--run-dir DIR`` sweeps an existing run instead).
   The sweep is timed with one process and with a pool of two, after loading the run
   (loading is reported apart).
2. **Sweep on a shared uplink**: the same 50 points with ``channel.uplink.shared: true``
   (the clients' uplinks share one medium, processor sharing), which the engine times
   with its medium-at-once path.
3. **Engine alone**: re-timing 10,000 clients x 100 rounds of FedAvg op-traces
   (download, compute, upload; sizes and FLOPs varying per client, rates drawn per
   client-round from a seeded generator). Target: under 10 s. Timed with the default
   engine path (the closed form when nothing is shared) and, for ``--simpy-rounds``
   rounds, with the SimPy model, checking that both give identical timelines.
   ``benchmarks/speed/engine.py`` times every engine path on shared media.

    nice -n 10 python benchmarks/speed/sweep.py [--record-dir DIR | --run-dir DIR] [--repeats 3]
        [--simpy-rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SCENARIO = {
    "name": "bench-sweep-fedavg-100",
    "seed": 0,
    "rounds": 100,
    "dataset": {
        "name": "mnist-embedded",
        "train_size": 4000,
        "test_size": 1000,
        "partition": {"method": "dirichlet", "alpha": 0.5},
    },
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 100, "participation": 1.0},
    "devices": {"clients": [{"profile": "rpi4"}]},
    "channel": {"model": "shannon", "interference": {"unit": "noise"}},
    "training": {"epochs": 1, "batch_size": 20, "lr": 0.05},
    "evaluation": {"every": 10},
    "metrics": {"enabled": False},
    "execution": {"backend": "local"},
}


def quick_scenario() -> dict:
    """Seconds, not minutes: 5 rounds of 20 clients (the same per-client data)."""
    sc = copy.deepcopy(SCENARIO)
    sc.update(name="bench-sweep-fedavg-quick", rounds=5)
    sc["dataset"].update(train_size=800, test_size=200)
    sc["topology"]["clients"] = 20
    sc["evaluation"]["every"] = 5
    return sc


# where recorded runs are kept and reused (MECSIM_BENCH_DIR, else /tmp/mecsim-bench)
RECORD_DIR = Path(os.environ.get("MECSIM_BENCH_DIR", "/tmp/mecsim-bench"))


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (the sweep's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def recorded_run(scenario: dict, record_dir: Path, run_dir: Path | None):
    """The run to sweep: ``run_dir`` as it is, or the scenario recorded in ``record_dir``
    (``mecsim.analysis.whatif_sweep.record`` names the folder after the scenario and its
    hash, and reuses it when it is there)."""
    from mecsim.analysis.replay import load_run
    from mecsim.analysis.whatif_sweep import record
    from mecsim.scenario import scenario_from_dict

    t0 = time.perf_counter()
    if run_dir is not None:
        run, how = load_run(run_dir), "loaded"
    else:
        run = record(scenario_from_dict(scenario, "benchmarks/speed/sweep.py"), record_dir)
        how = "recorded once, then loaded"
    print(
        f"run {run.run_dir}: {len(run.rounds)} rounds, ready in "
        f"{time.perf_counter() - t0:.2f} s ({how})",
        flush=True,
    )
    return run


def bench_sweep(run, repeats: int, bandwidths_hz: list[float], shared: bool) -> None:
    from mecsim.analysis.whatif_sweep import sweep

    grid = {"channel.uplink.bandwidth_hz": bandwidths_hz}
    if shared:
        grid = {"channel.uplink.shared": [True], **grid}
    label = "shared uplink" if shared else "dedicated uplinks"
    clients = sum(len(r.traces) for r in run.rounds)
    for workers in (1, 2):
        times, cpus = [], []
        for _ in range(repeats):
            c0, t0 = cpu_s(), time.perf_counter()
            df = sweep(run, grid, workers=workers, target_accuracy=0.6)
            times.append(time.perf_counter() - t0)
            cpus.append(cpu_s() - c0)
        print(
            f"sweep ({label}), {len(bandwidths_hz)} points x {clients:,} client-rounds, "
            f"workers={workers}: best {min(times):.2f} s, median "
            f"{statistics.median(times):.2f} s, CPU {min(cpus):.2f} s ({repeats} runs; "
            f"{load()})",
            flush=True,
        )
    assert len(df) == len(bandwidths_hz) and df["exact"].all()
    mean_s = df["round_time_mean_s"].to_numpy()
    print(
        f"  mean round time {mean_s[0]:.1f} s at {bandwidths_hz[0] / 1e6:g} MHz .. "
        f"{mean_s[-1]:.1f} s at {bandwidths_hz[-1] / 1e6:g} MHz; "
        f"non-increasing: {bool(np.all(np.diff(mean_s) <= 0))}"
    )


def fedavg_round(rng: np.random.Generator, n_clients: int):
    from mecsim.emulation.engine import ClientSpec
    from mecsim.emulation.ops import Compute, Download, Upload

    model_bytes = 800_040
    steps = rng.integers(1, 40, n_clients)
    traces, specs = {}, {}
    up = rng.uniform(1e6, 40e6, n_clients)
    down = rng.uniform(5e6, 80e6, n_clients)
    for i in range(n_clients):
        traces[i] = (
            Download(model_bytes),
            Compute(float(steps[i]) * 2.8e7, int(steps[i])),
            Upload(model_bytes),
        )
        specs[i] = ClientSpec(i, float(up[i]), float(down[i]), 0.02, 1.4e10)
    return traces, specs


def bench_engine(simpy_rounds: int, n_clients: int, n_rounds: int) -> None:
    from mecsim.emulation.engine import NetworkSpec, ServerSpec, time_round

    rng = np.random.default_rng(0)
    rounds = [fedavg_round(rng, n_clients) for _ in range(n_rounds)]
    servers, net = [ServerSpec(1e11)], NetworkSpec()
    c0, t0 = cpu_s(), time.perf_counter()
    fast = [time_round(tr, sp, servers, net, aggregate_s=0.01) for tr, sp in rounds]
    fast_s, fast_cpu = time.perf_counter() - t0, cpu_s() - c0
    print(
        f"engine, {n_clients:,} clients x {n_rounds} rounds (default path): {fast_s:.2f} s, "
        f"CPU {fast_cpu:.2f} s ({load()})"
    )
    if simpy_rounds:
        t0 = time.perf_counter()
        slow = [
            time_round(tr, sp, servers, net, aggregate_s=0.01, method="simpy")
            for tr, sp in rounds[:simpy_rounds]
        ]
        per_round = (time.perf_counter() - t0) / simpy_rounds
        same = all(a == b for a, b in zip(fast, slow, strict=False))
        print(
            f"  SimPy model: {per_round:.2f} s per round ({simpy_rounds} rounds timed; "
            f"x{n_rounds} = {per_round * n_rounds:.0f} s extrapolated); "
            f"identical timelines: {same}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--record-dir",
        type=Path,
        default=RECORD_DIR,
        help="where the recorded run is kept and reused (default %(default)s, "
        "or $MECSIM_BENCH_DIR)",
    )
    where.add_argument(
        "--run-dir", type=Path, help="sweep this recorded run directory instead of recording one"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--simpy-rounds", type=int, default=3)
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-shared", action="store_true", help="skip the shared-uplink sweep")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: a 5-round, 20-client record, 5 points, "
        "1,000 clients x 10 rounds for the engine",
    )
    args = p.parse_args(argv)
    scenario, points = SCENARIO, 50
    engine_clients, engine_rounds = 10_000, 100
    if args.quick:
        scenario, points, args.repeats = quick_scenario(), 5, 1
        engine_clients, engine_rounds, args.simpy_rounds = 1_000, 10, min(args.simpy_rounds, 1)
    if not args.skip_sweep:
        from mecsim.analysis.replay import RunLoadError

        try:
            run = recorded_run(scenario, args.record_dir, args.run_dir)
        except RunLoadError as exc:
            print(f"benchmarks/speed/sweep.py: {exc}", file=sys.stderr)
            return 2
        bandwidths_hz = np.linspace(1e6, 50e6, points).tolist()
        bench_sweep(run, args.repeats, bandwidths_hz, shared=False)
        if not args.skip_shared:
            bench_sweep(run, args.repeats, bandwidths_hz, shared=True)
    if not args.skip_engine:
        bench_engine(args.simpy_rounds, engine_clients, engine_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
