"""FedRep beside FedAvg and Ditto on a label-skewed split, over seeds.

Every run is ``scenarios/fedrep-mnist-dir01.yaml`` with only ``algorithm`` (and ``seed``)
changed, run in-process (``--backend local``) through :func:`mecsim.api.simulate`, the
same code path as ``mecsim run``. Ditto is the plugin of ``examples/ditto`` (``pip install
-e examples/ditto``); it is left out, and said so, when it is not installed. Per run it
reads rounds.csv:

* mean user accuracy per round (``mean_accuracy``: each client's model on its own test
  data: the body with the client's head for FedRep, the personal model for Ditto, the
  global model for FedAvg), its best and its last;
* MiB up and down per round (``bytes_up / 2**20``, ``bytes_down / 2**20``), checked
  against the bytes worked out by hand from the model's layout;
* emulated seconds (``round_time_s``), client GFLOPs (``client_gflops``) and energy
  (``energy_j``, all devices) per round, means over the rounds;

and writes results.md: the command, the bytes by hand, a table of mean ± sample standard
deviation (ddof = 1) over the seeds, and the accuracy of every round of the first seed;
every run's figures go to results.csv. Finished runs are remembered in the CSV: a second
call with the same ``--csv`` runs only what is missing.

    nice -n 10 python examples/fedrep/compare.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import importlib.util
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from mecsim.api import MODELS, model_layout, simulate

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenarios" / "fedrep-mnist-dir01.yaml"
MiB = 2**20

#: label -> the scenario's ``algorithm`` section
METHODS: dict[str, dict[str, Any]] = {
    "fedrep": {"name": "fedrep", "params": {"head_epochs": 5, "head_layers": 1}},
    "fedavg": {"name": "fedavg"},
    "ditto (λ=0.1)": {"name": "ditto", "params": {"lam": 0.1}},
}

FIELDS = [
    "method",
    "seed",
    "rounds",
    "best_acc",
    "final_acc",
    "mib_up",
    "mib_down",
    "round_time_s",
    "client_gflops",
    "energy_j",
    "host_s",
    "acc_by_round",
]


def expected_bytes(base: dict[str, Any]) -> dict[str, int]:
    """Each algorithm's bytes a client sends up (and receives) in a round, from the model's
    layout: float32 values, 4 bytes each; FedRep's body is every value outside the last
    ``head_layers`` layers."""
    model = MODELS.get(base["model"]["name"])((1, 28, 28), 10)
    layout = model_layout(model)
    head_layers = int(METHODS["fedrep"]["params"]["head_layers"])
    last = layout.layer_numel()[layout.num_layers - head_layers :]
    return {"fedrep": 4 * (layout.size - int(last.sum())), "fedavg": 4 * layout.size}


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
    return {
        "method": method,
        "seed": seed,
        "rounds": len(df),
        "best_acc": float(acc.max()),
        "final_acc": float(acc.iloc[-1]),
        "mib_up": float((df["bytes_up"] / MiB).mean()),
        "mib_down": float((df["bytes_down"] / MiB).mean()),
        "round_time_s": float(df["round_time_s"].mean()),
        "client_gflops": float(df["client_gflops"].mean()),
        "energy_j": float(df["energy_j"].mean()),
        "host_s": host_s,
        "acc_by_round": " ".join(f"{a:.6f}" for a in acc),
    }


def mean_std(values: list[float], digits: int, scale: float = 1.0) -> str:
    vals = [v * scale for v in values if not math.isnan(v)]
    if not vals:
        return "–"
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def summary_table(results: list[dict]) -> str:
    lines = [
        (
            "| method | best mean acc (%) | final mean acc (%) | MiB up / round "
            "| MiB down / round | emulated s / round | client GFLOPs / round "
            "| energy J / round | seeds |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        rows = [r for r in results if r["method"] == method]
        if not rows:
            continue
        col = {k: [float(r[k]) for r in rows] for k in FIELDS[3:-1]}
        seeds = ",".join(str(r["seed"]) for r in sorted(rows, key=lambda r: int(r["seed"])))
        lines.append(
            f"| {method} | {mean_std(col['best_acc'], 2, 100)} "
            f"| {mean_std(col['final_acc'], 2, 100)} "
            f"| {mean_std(col['mib_up'], 3)} | {mean_std(col['mib_down'], 3)} "
            f"| {mean_std(col['round_time_s'], 2)} | {mean_std(col['client_gflops'], 2)} "
            f"| {mean_std(col['energy_j'], 1)} | {seeds} |"
        )
    return "\n".join(lines) + "\n"


def rounds_table(results: list[dict], seed: int) -> str:
    rows = {r["method"]: r for r in results if int(r["seed"]) == seed}
    methods = [m for m in METHODS if m in rows]
    accs = {m: [float(a) for a in rows[m]["acc_by_round"].split()] for m in methods}
    lines = [
        "| round | " + " | ".join(f"{m} acc (%)" for m in methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for i in range(max(len(a) for a in accs.values())):
        cells = [f"{100 * accs[m][i]:.2f}" if i < len(accs[m]) else "–" for m in methods]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bytes_section(base: dict[str, Any], results: list[dict]) -> str:
    """The bytes by hand, and the measured ones checked against them (exactly)."""
    clients = int(base["topology"]["clients"])
    want = expected_bytes(base)
    for r in results:
        per_client = want.get(METHODS[r["method"]]["name"], want["fedavg"])  # Ditto: FedAvg's
        for col in ("mib_up", "mib_down"):
            if not math.isclose(float(r[col]), clients * per_client / MiB, rel_tol=1e-12):
                raise AssertionError(f"{r['method']} seed {r['seed']}: {col} {r[col]}")
    body, whole = want["fedrep"] // 4, want["fedavg"] // 4
    return (
        f"The 2NN holds {whole:,} float32 values: Linear(784, 200) 157,000, BatchNorm1d(200) "
        f"800 (γ, β and the running mean and variance), Linear(200, 200) 40,200, "
        f"Linear(200, 10) 2,010. FedRep's head is the last Linear layer, so a client sends "
        f"and receives the body, {whole:,} − 2,010 = {body:,} values = {4 * body:,} bytes, "
        f"where FedAvg and Ditto send the whole model, {4 * whole:,} bytes. With "
        f"{clients} clients a round: {clients} × {4 * body:,} = {clients * 4 * body:,} bytes "
        f"= {clients * 4 * body / MiB:.3f} MiB each way for FedRep, {clients * 4 * whole:,} "
        f"bytes = {clients * 4 * whole / MiB:.3f} MiB for FedAvg ({100 * 2010 / whole:.2f} % "
        f"less). `compare.py` checks every run's `bytes_up` and `bytes_down` against these "
        f"figures exactly.\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=None, help="default: the scenario's")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default="runs/fedrep-compare", help="run folders go here")
    ap.add_argument("--csv", default=str(HERE / "results.csv"), help="per-run figures")
    ap.add_argument("--table", default=str(HERE / "results.md"), help="the markdown page")
    args = ap.parse_args(argv)

    methods = list(args.methods)
    if "ditto (λ=0.1)" in methods and importlib.util.find_spec("mecsim_ditto") is None:
        print("mecsim-ditto is not installed (pip install -e examples/ditto): Ditto left out")
        methods.remove("ditto (λ=0.1)")
    base = yaml.safe_load(SCENARIO.read_text())
    rounds = args.rounds or int(base["rounds"])
    csv_path = Path(args.csv)
    done: list[dict] = []
    if csv_path.is_file():
        with csv_path.open(newline="") as f:
            done = list(csv.DictReader(f))
    have = {(r["method"], int(r["seed"]), int(r["rounds"])) for r in done}
    for method in methods:
        for seed in args.seeds:
            if (method, seed, rounds) in have:
                continue
            row = run_one(base, method, seed, rounds, Path(args.out))
            done.append(row)
            print(
                f"{method} seed {seed}: best {row['best_acc']:.4f} final {row['final_acc']:.4f} "
                f"{row['mib_up']:.3f} MiB up {row['round_time_s']:.2f} s/round "
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
        if r["method"] in methods and int(r["seed"]) in args.seeds and int(r["rounds"]) == rounds
    ]
    seeds = " ".join(str(s) for s in args.seeds)
    text = (
        "# FedRep beside FedAvg and Ditto: what compare.py measured\n\n"
        f"Written by `nice -n 10 python examples/fedrep/compare.py --seeds {seeds}` "
        f"on {datetime.date.today().isoformat()} ({platform.machine()}, in-process: "
        f"`--backend local`); the setting is `scenarios/fedrep-mnist-dir01.yaml` "
        f"({rounds} rounds), only `algorithm` and `seed` changed between runs. Mean ± sample "
        "standard deviation over the seeds; *best* is the largest mean user accuracy over "
        "the rounds, *final* the last round's; MiB, emulated seconds, client GFLOPs and "
        "energy (all devices) are per round, means over the rounds.\n\n"
        + summary_table(wanted)
        + "\n## Bytes, by hand\n\n"
        + bytes_section(base, wanted)
        + f"\n## Mean user accuracy, round by round (seed {args.seeds[0]})\n\n"
        + rounds_table(wanted, args.seeds[0])
    )
    Path(args.table).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
