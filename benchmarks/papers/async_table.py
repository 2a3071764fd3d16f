"""docs/async.md's table: time and energy to target accuracies of runs of the async-mec-*
scenarios, from their records.

    python benchmarks/papers/async_table.py RUN_DIR... [--targets 0.8 0.9]

Each run directory gives one row: its algorithm and mode, seed, the emulated seconds and
the clients' energy (J, summed over every update or client-round until then) when the
mean user accuracy first reached each target (evaluated versions or rounds only), the
updates the server took in until then, the final accuracy, the updates (trainings) and
the whole emulated time. ``--quick`` makes two tiny runs (sync and FedAsync, 4 clients)
and prints their table.
"""

from __future__ import annotations

import argparse
import tempfile
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
            out[f"s to {t:.0%}"] = out[f"J to {t:.0%}"] = out[f"updates to {t:.0%}"] = "X"
        else:
            i = hit.index[0]
            out[f"s to {t:.0%}"] = f"{r['elapsed_s'][i]:.1f}"
            out[f"J to {t:.0%}"] = f"{r['energy_j'][: i + 1].sum():.0f}"
            # the trainings the server took in until then (the FedBuff paper's "client
            # trips"): a round's completed clients, a version's updates
            out[f"updates to {t:.0%}"] = int(r["completed"][: i + 1].sum())
    out["final acc"] = f"{ev['mean_accuracy'].iloc[-1]:.3f}"
    out["updates"] = int(r["completed"].sum())
    out["emulated s"] = f"{r['elapsed_s'].iloc[-1]:.1f}"
    return out


def quick_runs(out: Path) -> list[Path]:
    """Two tiny runs of the same scenario, sync and FedAsync, for ``--quick``."""
    import mecsim  # deferred: the table itself reads records only

    dirs = []
    for mode, rounds in (("sync", 2), ("async", 8)):
        scenario = {
            "name": f"quick-{mode}",
            "seed": 0,
            "rounds": rounds,
            "dataset": {"name": "mnist-embedded", "train_size": 400, "test_size": 200},
            "model": {"name": "mlp_2nn"},
            "topology": {"clients": 4},
            "channel": {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 20e6},
                "downlink": {"rate_bps": 50e6},
            },
            "aggregation": {"mode": mode},
            # in-process: the table reads records, which are the same bits on Ray (the
            # default backend would start a Ray instance for each of the two runs)
            "execution": {"backend": "local"},
        }
        run = mecsim.simulate(
            scenario,
            out=str(out),
            run_id=mode,
            progress=False,
            plots=False,
            metrics__enabled=False,
        )
        dirs.append(Path(run.run_dir))
    return dirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--targets", nargs="+", type=float, default=[0.8, 0.9])
    ap.add_argument("--quick", action="store_true", help="two tiny runs, their table")
    args = ap.parse_args()
    if not args.runs and not args.quick:
        ap.error("give run folders (or --quick)")
    tmp = tempfile.TemporaryDirectory() if args.quick else None
    runs = quick_runs(Path(tmp.name)) if tmp is not None else args.runs
    rows = [row(p, args.targets) for p in runs]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in columns) + " |")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
