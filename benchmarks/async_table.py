"""docs/async.md's table: time and energy to target accuracies of runs of the async-mec-*
scenarios, from their records.

    python benchmarks/async_table.py RUN_DIR... [--targets 0.8 0.9]

Each run directory gives one row: its algorithm and mode, seed, the emulated seconds and
the clients' energy (J, summed over every update or client-round until then) when the
mean user accuracy first reached each target (evaluated versions or rounds only), the
final accuracy, the updates (trainings) and the whole emulated time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml


def row(run_dir: Path, targets: list[float]) -> dict[str, object]:
    sc = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    r = pd.read_csv(run_dir / "rounds.csv")
    ev = r[r["mean_accuracy"].notna()]
    out: dict[str, object] = {
        "run": run_dir.name,
        "mode": (sc.get("aggregation") or {}).get("mode", "sync"),
        "seed": sc["seed"],
    }
    for t in targets:
        hit = ev[ev["mean_accuracy"] >= t]
        if hit.empty:
            out[f"s to {t:.0%}"] = out[f"J to {t:.0%}"] = "X"
        else:
            i = hit.index[0]
            out[f"s to {t:.0%}"] = f"{r['elapsed_s'][i]:.1f}"
            out[f"J to {t:.0%}"] = f"{r['energy_j'][: i + 1].sum():.0f}"
    out["final acc"] = f"{ev['mean_accuracy'].iloc[-1]:.3f}"
    out["updates"] = int(r["completed"].sum())
    out["emulated s"] = f"{r['elapsed_s'].iloc[-1]:.1f}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--targets", nargs="+", type=float, default=[0.8, 0.9])
    args = ap.parse_args()
    rows = [row(p, args.targets) for p in args.runs]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
