"""The edge server's rate for aggregation: FLOP/s of the folds mecsim's servers perform.

A server's aggregation is element-wise: per element and upload a multiply and an add
(FedAvg's :class:`~mecsim.agents.algorithms.fedavg.WeightedSum`, 2 |w| K + |w| FLOPs with
its final division; :func:`~mecsim.agents.algorithms.fedavg.weighted_average`, 2 |w| K, of
MTFL, DC-PFL, k-means and PHSFL). Each element is read once from memory and used for two
FLOPs, so the rate is set by memory bandwidth and numpy's per-call work, far below a
CPU's matmul peak. This script times both folds on this machine's CPU, over uploads the
size of MTFL's 2NN (the default scenario: 200,010 float32 elements, 10 uploads) and of
ResNet18 (11.17 M elements, 10 uploads: KAPC's CIFAR-10 system setting), and prints
FLOPs / seconds with the best (shortest) of ``--repeats`` runs, so that other work on
a shared machine slows the figure as little as it can.

The edge-server profile's ``aggregate_flops_per_s`` (mecsim/emulation/profiles/devices.yaml)
is this script's WeightedSum figure for ResNet18-sized uploads on the CPU named in
docs/devices.md.

    python benchmarks/speed/aggregation_rate.py [--repeats 7] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from mecsim.agents.algorithms.fedavg import (
    FOLD_THREADS,
    WeightedSum,
    aggregation_flops,
    weighted_average,
    weighted_sum_flops,
)

SIZES = {"mlp_2nn (default scenario)": 200_010, "ResNet18-sized": 11_173_962}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm: pages touched, the fold's thread pool started
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(size: int, uploads: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(size, dtype=np.float32) for _ in range(uploads)]
    weights = [float(n) for n in rng.integers(50, 500, size=uploads)]

    def fold() -> None:
        acc = WeightedSum()
        acc.add_many(vectors, weights)
        acc.result()

    def average() -> None:
        weighted_average(vectors, weights)

    t_fold = best_seconds(fold, repeats)
    t_avg = best_seconds(average, repeats)
    return {
        "weighted_sum_s": t_fold,
        "weighted_sum_flops_per_s": weighted_sum_flops(size, uploads) / t_fold,
        "weighted_average_s": t_avg,
        "weighted_average_flops_per_s": aggregation_flops(size, uploads) / t_avg,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--uploads", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="small vectors, 2 repeats")
    args = parser.parse_args()
    sizes = {"tiny (quick)": 50_000} if args.quick else SIZES
    repeats = 2 if args.quick else args.repeats
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; fold threads {FOLD_THREADS}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, size in sizes.items():
        m = measure(size, args.uploads, repeats)
        print(
            f"{name}: {size} elements x {args.uploads} uploads, best of {repeats}: "
            f"WeightedSum {m['weighted_sum_s'] * 1e3:.3f} ms = "
            f"{m['weighted_sum_flops_per_s'] / 1e9:.3f} GFLOP/s; "
            f"weighted_average {m['weighted_average_s'] * 1e3:.3f} ms = "
            f"{m['weighted_average_flops_per_s'] / 1e9:.3f} GFLOP/s"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
