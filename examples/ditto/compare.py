"""Ditto against FedAvg and mecsim's built-in personalised algorithms, over seeds.

Every run is ``scenarios/ditto-mnist-dir01.yaml`` with only ``algorithm`` (and ``seed``)
changed, run in-process (``--backend local``) through :func:`mecsim.api.simulate`, the
same code path as ``mecsim run``. Per run it reads rounds.csv:

* best mean user accuracy: the largest ``mean_accuracy`` over the rounds (each client's
  model as the algorithm evaluates it, on the client's own test data: the personal model
  for Ditto, local, MTFL, Per-FedAvg and KAPC; the global model for FedAvg);
* final mean user accuracy: ``mean_accuracy`` of the last round;
* MiB per round: ``(bytes_up + bytes_down) / 2**20``, mean over rounds;
* emulated seconds per round: ``round_time_s``, mean over rounds;
* client GFLOPs per round: ``client_gflops``, mean over rounds;

and writes a markdown table of mean ± sample standard deviation (ddof = 1) over the
seeds, and every run's figures as CSV. Finished runs are remembered in the CSV: a second
call with the same ``--csv`` runs only what is missing.

    nice -n 10 python examples/ditto/compare.py --seeds 0 1 2 \\
        --table examples/ditto/results.md --csv examples/ditto/results.csv
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from mecsim.api import simulate

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenarios" / "ditto-mnist-dir01.yaml"
MiB = 2**20

#: label -> the scenario's ``algorithm`` section
METHODS: dict[str, dict[str, Any]] = {
    "ditto (λ=0.1)": {"name": "ditto", "params": {"lam": 0.1}},
    "ditto (λ=1)": {"name": "ditto", "params": {"lam": 1.0}},
    "fedavg": {"name": "fedavg"},
    "local": {"name": "local"},
    "mtfl": {"name": "mtfl"},
    "perfedavg": {"name": "perfedavg"},
    "kapc": {"name": "kapc"},
}

FIELDS = [
    "method",
    "seed",
    "rounds",
    "best_acc",
    "final_acc",
    "final_global_acc",
    "mib_per_round",
    "round_time_s",
    "client_gflops",
    "host_s",
]


def run_one(base: dict[str, Any], method: str, seed: int, rounds: int, out: Path) -> dict:
    sc = copy.deepcopy(base)
    sc["algorithm"] = copy.deepcopy(METHODS[method])
    sc["seed"] = seed
    sc["rounds"] = rounds
    sc["name"] = f"cmp-{sc['algorithm']['name']}-s{seed}"
    t0 = time.perf_counter()
    run = simulate(sc, out=out, backend="local", progress=False, plots=False)
    host_s = time.perf_counter() - t0
    if run.status != "finished":
        raise RuntimeError(f"{method} seed {seed}: run {run.run_dir} is {run.status}")
    df = run.rounds
    acc = df["mean_accuracy"]
    glob = df["mean_global_accuracy"].iloc[-1] if "mean_global_accuracy" in df else math.nan
    return {
        "method": method,
        "seed": seed,
        "rounds": len(df),
        "best_acc": float(acc.max()),
        "final_acc": float(acc.iloc[-1]),
        "final_global_acc": float(glob),
        "mib_per_round": float(((df["bytes_up"] + df["bytes_down"]) / MiB).mean()),
        "round_time_s": float(df["round_time_s"].mean()),
        "client_gflops": float(df["client_gflops"].mean()),
        "host_s": host_s,
    }


def mean_std(values: list[float], digits: int, scale: float = 1.0) -> str:
    vals = [v * scale for v in values if not math.isnan(v)]
    if not vals:
        return "–"
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def table(results: list[dict]) -> str:
    lines = [
        "| method | best mean acc (%) | final mean acc (%) | final global acc (%) "
        "| MiB up+down / round | emulated s / round | client GFLOPs / round | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        rows = [r for r in results if r["method"] == method]
        if not rows:
            continue
        col = {k: [float(r[k]) for r in rows] for k in FIELDS[2:]}
        seeds = ",".join(str(r["seed"]) for r in sorted(rows, key=lambda r: int(r["seed"])))
        lines.append(
            f"| {method} | {mean_std(col['best_acc'], 2, 100)} "
            f"| {mean_std(col['final_acc'], 2, 100)} "
            f"| {mean_std(col['final_global_acc'], 2, 100)} "
            f"| {mean_std(col['mib_per_round'], 2)} | {mean_std(col['round_time_s'], 2)} "
            f"| {mean_std(col['client_gflops'], 2)} | {seeds} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=None, help="default: the scenario's")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default="runs/ditto-compare", help="run folders go here")
    ap.add_argument("--csv", default=str(HERE / "results.csv"), help="per-run figures")
    ap.add_argument("--table", default=str(HERE / "results.md"), help="the markdown table")
    args = ap.parse_args(argv)

    base = yaml.safe_load(SCENARIO.read_text())
    rounds = args.rounds or int(base["rounds"])
    csv_path = Path(args.csv)
    done: list[dict] = []
    if csv_path.is_file():
        with csv_path.open(newline="") as f:
            done = list(csv.DictReader(f))
    have = {(r["method"], int(r["seed"]), int(r["rounds"])) for r in done}
    for method in args.methods:
        for seed in args.seeds:
            if (method, seed, rounds) in have:
                continue
            row = run_one(base, method, seed, rounds, Path(args.out))
            done.append(row)
            print(
                f"{method} seed {seed}: best {row['best_acc']:.4f} final {row['final_acc']:.4f} "
                f"{row['mib_per_round']:.2f} MiB {row['round_time_s']:.2f} s/round "
                f"({row['host_s']:.0f} s host)",
                flush=True,
            )
            with csv_path.open("w", newline="") as f:  # after every run: resumable
                w = csv.DictWriter(f, fieldnames=FIELDS)
                w.writeheader()
                w.writerows(done)
    wanted = [
        r
        for r in done
        if r["method"] in args.methods
        and int(r["seed"]) in args.seeds
        and int(r["rounds"]) == rounds
    ]
    text = table(wanted)
    Path(args.table).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
