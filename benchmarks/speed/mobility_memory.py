"""Memory and time of mobility: positions of 10,000 clients over 1,000 time steps.

The target: at most 200 MB. The positions themselves are float32 (n, T, 2), T =
1,001 grid points for 1,000 steps: 10,000 × 1,001 × 2 × 4 B = 80.08 MB; what a model
needs besides (its per-client state, the float64 temporaries of one step) is what this
measures. Per model, in this process:

- **peak**: the largest traced allocation (``tracemalloc``: numpy reports its arrays to
  it) while the trajectory is generated, the result included;
- **RSS growth**: the resident set's growth over the same generation (``psutil``; after
  a first, untraced run, so the allocator's pools are warm);
- **time**: the wall time of one untraced generation (1 s steps, a 2 km × 2 km area,
  walking speeds). Only indicative on a shared machine.

    python benchmarks/speed/mobility_memory.py [--clients 10000] [--steps 1000] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np
import psutil

from mecsim.emulation.mobility import Area, build_trajectory
from mecsim.scenario.mobility import MobilityConfig

MB = 1e6
TARGET_MB = 200.0
MODELS = {
    "static": MobilityConfig(model="static"),
    "random_waypoint": MobilityConfig(model="random_waypoint", speed_mps=(0.5, 1.5), pause_s=30),
    "gauss_markov": MobilityConfig(model="gauss_markov", mean_speed_mps=1.0, alpha=0.75),
    "random_walk": MobilityConfig(model="random_walk", speed_mps=(0.5, 1.5), interval_s=10),
}


def measure(config: MobilityConfig, clients: int, steps: int) -> dict[str, float]:
    area = Area.of_size(2000.0, 2000.0)
    initial = np.random.default_rng(0).random((clients, 2)) * 2000.0
    horizon_s = steps * config.step_s

    def run():
        return build_trajectory(config, initial, area, seed=1, horizon_s=horizon_s)

    gc.collect()
    start = time.perf_counter()
    first = run()
    seconds = time.perf_counter() - start
    shape, nbytes = first.positions_m.shape, first.positions_m.nbytes
    strided = first.positions_m.strides[1] == 0
    del first
    gc.collect()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    tracemalloc.start()
    traj = run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = proc.memory_info().rss - rss0
    assert traj.positions_m.shape == shape
    del traj
    return {
        "points": float(shape[1]),
        "array_mb": 0.0 if strided else nbytes / MB,
        "peak_mb": peak / MB,
        "rss_mb": rss / MB,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true", help="1,000 clients, 100 steps")
    args = parser.parse_args()
    clients, steps = (1_000, 100) if args.quick else (args.clients, args.steps)
    print(f"{clients:,} clients, {steps:,} steps of 1 s (float32 positions)")
    print(f"{'model':<16} {'points':>7} {'array MB':>9} {'peak MB':>8} {'RSS MB':>8} {'time s':>7}")
    worst = 0.0
    for name, config in MODELS.items():
        r = measure(config, clients, steps)
        worst = max(worst, r["peak_mb"])
        print(
            f"{name:<16} {r['points']:>7.0f} {r['array_mb']:>9.2f} {r['peak_mb']:>8.2f} "
            f"{r['rss_mb']:>8.2f} {r['seconds']:>7.2f}"
        )
    verdict = "within" if worst <= TARGET_MB else "OVER"
    print(f"largest peak {worst:.2f} MB: {verdict} the {TARGET_MB:.1f} MB target")


if __name__ == "__main__":
    main()
