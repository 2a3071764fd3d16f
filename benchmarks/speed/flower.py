"""A Flower app's round on mecsim against Flower's own simulation, on the same app and
machine: ``python benchmarks/speed/flower.py [--clients 10 100] [--rounds 4]``.

The app is tests/data/flower_seeded_app (FedAvg, full participation, a 25k-parameter MLP,
200 MNIST images a client, one epoch: train and evaluate messages every round). Its
ServerApp stamps the wall clock before the first round and after each (its
``evaluate_fn``), so both sides are measured the same way, from inside the app: a round
is its train and its evaluate messages, from the strategy's point of view. Flower runs
``flwr.simulation.run_simulation`` (Ray backend, one CPU a ClientApp actor, as its
docs' default); mecsim runs ``mecsim run`` with its defaults (Ray, one host actor a
core) and ``--backend local``. The first round (actors starting, imports) is left out:
the figure is the median of the others.

Prints one line per side and client count, then the ratios mecsim / Flower; a speed
claim from it is a figure of one sitting on a quiet machine (docs/speed.md). Without
Flower installed it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

#: --quick runs Flower's simulation, which starts Ray (tests/e2e/test_benchmarks.py)
QUICK_USES_RAY = True

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "data" / "flower_seeded_app"
SIM = ROOT / "tests" / "support" / "flower_sim.py"


def _walls(npz: Path) -> list[float]:
    data = np.load(npz)
    return [float(data[f"wall{r}"]) for r in range(1, 1 + sum(k.startswith("wall") for k in data))]


def flower_round_s(clients: int, rounds: int, tmp: Path) -> float:
    out = tmp / f"flower-{clients}.npz"
    env = {**os.environ, "SEEDEDAPP_OUT": str(out), "SEEDEDAPP_ROUNDS": str(rounds)}
    run = subprocess.run(
        [sys.executable, str(SIM), str(clients)], capture_output=True, text=True, env=env
    )
    if run.returncode != 0:
        raise SystemExit(f"Flower's simulation failed:\n{run.stderr[-3000:]}")
    return float(np.median(_walls(out)[1:]))


def mecsim_round_s(clients: int, rounds: int, tmp: Path, backend: str | None) -> float:
    out = tmp / f"mecsim-{clients}-{backend}.npz"
    scenario = {
        "name": f"flower-bench-{clients}",
        "seed": 0,
        "rounds": rounds,
        "topology": {"clients": clients},
        "algorithm": {"name": "flower", "params": {"app": str(APP)}},
        "checkpoint": {"every": 0},
        "metrics": {"enabled": False},
        "outputs": {"dir": str(tmp / "runs")},
    }
    path = tmp / f"flower-{clients}.yaml"
    path.write_text(yaml.safe_dump(scenario))
    cmd = [sys.executable, "-m", "mecsim", "run", str(path), "--quiet", "--no-plots"]
    if backend:
        cmd += ["--backend", backend]
    env = {**os.environ, "SEEDEDAPP_OUT": str(out)}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(f"mecsim failed:\n{run.stderr[-3000:]}")
    return float(np.median(_walls(out)[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds a run (the first is left out)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="4 clients, 3 rounds, mecsim in-process only: that it runs (the suite)",
    )
    args = parser.parse_args()
    if args.quick:
        args.clients, args.rounds = [4], 3
    try:
        import flwr
    except ImportError:
        print('skipped: Flower is not installed (pip install "mecsim[flower]")')
        return
    print(f"Flower {flwr.__version__}; app: {APP.relative_to(ROOT)}; median round, wall seconds")
    with tempfile.TemporaryDirectory(prefix="mecsim-flower-bench-") as name:
        tmp = Path(name)
        for n in args.clients:
            theirs = flower_round_s(n, args.rounds, tmp)
            print(f"{n:>4} clients  Flower run_simulation {theirs:7.3f} s")
            # --quick (the suite): in-process only, the Ray run adds ~20 s of start-up
            backends = [("--backend local", "local")]
            if not args.quick:
                backends.insert(0, ("(Ray, defaults)", None))
            for label, backend in backends:
                ours = mecsim_round_s(n, args.rounds, tmp, backend)
                print(f"{n:>4} clients  mecsim {label} {ours:7.3f} s  ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
