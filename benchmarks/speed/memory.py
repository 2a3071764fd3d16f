"""Memory per virtual client: the whole process tree's PSS as the population grows.

Runs FedAvg with MTFL's 2NN (800,040 B of float32 weights) on the Ray backend, every
client holding 5 train images and 1 test image drawn from the embedded MNIST (clients may
share images, so 10,000 clients fit the 10,000 images), for 2 rounds, and samples the
proportional set size (PSS: shared pages split among the processes that map them) of
this process and every process below it (Ray's GCS, raylet with the object store,
client-host and server actors) every 0.1 s. Two series:

- **selected**: full participation, N = 10 / 1,000 / 10,000: the growth of the peak per
  added client is the memory of a selected client (its update, its training);
- **idle**: 10 clients selected a round, N = 10 / 1,000 / 10,000: the growth per added
  client is what an unselected client costs (its data, its place in the host).

    python benchmarks/speed/memory.py [--clients 10 1000 10000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import psutil

from mecsim.run.loop import run
from mecsim.scenario import scenario_from_dict

MODEL_BYTES = 800_040  # mlp_2nn, float32
QUICK_USES_RAY = True  # tests/e2e/test_benchmarks.py marks this benchmark's --quick run "ray"
MB = 1e6


def tree_pss_bytes(root: psutil.Process) -> int:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


class PeakSampler:
    """Samples the process tree's PSS in a thread; :attr:`peak` is the largest seen."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.root = psutil.Process(os.getpid())
        self.interval_s, self.peak = interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss_bytes(self.root))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss_bytes(self.root))


def scenario(n_clients: int, participation: float, out_dir: str) -> dict:
    return {
        "name": f"memory-{n_clients}",
        "seed": 0,
        "rounds": 2,
        "dataset": {
            "name": "mnist-embedded",
            "train_size": 9000,
            "test_size": 1000,
            "partition": {"method": "iid", "samples_per_client": 5, "test_samples_per_client": 1},
        },
        "model": {"name": "mlp_2nn"},
        "topology": {"clients": n_clients, "participation": participation},
        "channel": {
            "model": "fixed_rate",
            "uplink": {"rate_bps": 1e7},
            "downlink": {"rate_bps": 1e7},
        },
        "training": {"epochs": 1, "batch_size": 5, "lr": 0.05},
        "evaluation": {"every": 10, "clients": "selected"},
        "outputs": {"dir": out_dir, "save_optraces": False},
        "metrics": {"enabled": False},
    }


def peak_pss(n_clients: int, participation: float, interval_s: float = 0.1) -> tuple[int, float]:
    """(peak PSS of the process tree in bytes, wall seconds) of one 2-round run, sampled
    every ``interval_s``."""
    with tempfile.TemporaryDirectory() as tmp:
        sc = scenario_from_dict(scenario(n_clients, participation, tmp))
        start = time.perf_counter()
        with PeakSampler(interval_s) as sampler:
            run(sc, "memory", None, [], backend="ray", hosts=2)
        return sampler.peak, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 1000, 10000])
    ap.add_argument("--series", choices=["selected", "idle", "both"], default="both")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: 10 and 50 clients, the selected series, sampled every "
        "0.5 s (a check that the script runs, not a measurement: a sample reads every "
        "process's smaps, ~0.05 s of CPU, which every 0.1 s takes half a core from the run)",
    )
    args = ap.parse_args()
    interval_s = 0.1
    if args.quick:
        args.clients, args.series, interval_s = [10, 50], "selected", 0.5
    series = ["selected", "idle"] if args.series == "both" else [args.series]
    import ray

    # one Ray for every point (each run's actors come and go; the instance stays), so the
    # points differ only by their clients
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    print(f"model: {MODEL_BYTES / MB:.3f} MB of weights; PSS of the whole process tree")
    for kind in series:
        print(
            f"\n{kind}: {'clients':>8} {'selected':>9} {'peak PSS MB':>12} "
            f"{'MB/client':>10} {'x model':>8} {'wall s':>7}"
        )
        base = None
        for n in sorted(args.clients):
            part = 1.0 if kind == "selected" else min(1.0, 10 / n)
            peak, wall = peak_pss(n, part, interval_s)
            selected = max(1, round(part * n))
            if base is None:
                base = (n, peak)
                per, ratio = "-", "-"
            else:
                slope = (peak - base[1]) / (n - base[0])
                per, ratio = f"{slope / MB:.4f}", f"{slope / MODEL_BYTES:.2f}"
            print(
                f"{'':>10}{n:>8} {selected:>9} {peak / MB:>12.1f} {per:>10} {ratio:>8} {wall:>7.1f}"
            )


if __name__ == "__main__":
    main()
