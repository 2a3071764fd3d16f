"""DC-PFL's Tables I-II (and Fig. 9's ablation) on mecsim: seven methods, one scenario.

For each method, a run of ``scenarios/dcpfl-mnist-50.yaml`` (same seed: same partition,
same initial model, same 2 Mbps links) with only the algorithm changed, then one table row:
final accuracy, communication rounds, communication time, computation time and total
time to convergence (defined in :mod:`mecsim.convergence`: final accuracy = mean of the
last 5 rounds; converged at the first round from which the 5-round trailing mean stays
within 0.01 of it), and the ratio of each total time to DC-PFL's, as in the paper.

Methods: Standalone (= the ``local`` algorithm), FedAvg, Per-FedAvg (first-order),
fixed clusters by k-means after warm-up (ClusterFL-style), DC-PFL, NoLA, NoDC.
``--model kapc_cnn`` runs the paper's 2-conv 3-FC shape instead of the scenario's 2NN.

Long: ~1-3 host-seconds per round per method (50 clients, 2NN; ~25x that with kapc_cnn).
Run it by hand, niced::

    nice -n 10 python benchmarks/dcpfl_table.py --rounds 150 --out runs/dcpfl-table

Finished runs are reused (``OUT/<method>/rounds.csv`` with every round), so an
interrupted benchmark resumes at the method it was running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from mecsim.convergence import TOLERANCE, WINDOW_ROUNDS, to_convergence
from mecsim.records import RecordsWriter
from mecsim.runner import run
from mecsim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "dcpfl-mnist-50.yaml"

# key -> (table label, algorithm, use the scenario's DC-PFL params, param overrides)
METHODS: dict[str, tuple[str, str, bool, dict[str, Any]]] = {
    "standalone": ("Standalone (local)", "local", False, {}),
    "fedavg": ("FedAvg", "fedavg", False, {}),
    "perfedavg": ("Per-FedAvg (FO)", "perfedavg", False, {}),
    "kmeans_cluster": ("Fixed clusters (k-means, k=5)", "kmeans_cluster", False,
                       {"warmup_rounds": 5, "clusters": 5}),
    "dcpfl": ("DC-PFL", "dcpfl", True, {}),
    "dcpfl_nola": ("NoLA", "dcpfl_nola", True, {}),
    "dcpfl_nodc": ("NoDC (gamma~ = 0.8)", "dcpfl_nodc", True, {}),
}
DEFAULT_METHODS = ["standalone", "fedavg", "perfedavg", "kmeans_cluster", "dcpfl",
                   "dcpfl_nola", "dcpfl_nodc"]


# --quick: seconds, not minutes (8 clients, 7 rounds: DC-PFL's warm-up and beyond)
QUICK = {"rounds": 7, "methods": ["fedavg", "dcpfl"], "clients": 8}


def scenario_for(key: str, rounds: int | None, model: str | None = None,
                 scenario_path: Path = SCENARIO, clients: int | None = None):
    _, algorithm, dcpfl_params, overrides = METHODS[key]
    data = load_scenario(scenario_path).model_dump(mode="json")
    if model is not None:
        data["model"]["name"] = model
    if clients is not None:
        data["topology"]["clients"] = clients
    params = dict(data["algorithm"]["params"]) if dcpfl_params else {}
    data["algorithm"] = {"name": algorithm, "params": {**params, **overrides}}
    if rounds is not None:
        data["rounds"] = rounds
    data["metrics"]["enabled"] = False
    data["execution"]["backend"] = "local"
    data["name"] = f"{data['name']}-{key}"
    return scenario_from_dict(data, f"{scenario_path} ({key})")


def run_method(key: str, rounds: int | None, out: Path,
               model: str | None = None, clients: int | None = None) -> pd.DataFrame:
    sc = scenario_for(key, rounds, model, clients=clients)
    run_dir = out / key
    csv = run_dir / "rounds.csv"
    if csv.exists():
        done = pd.read_csv(csv)
        if len(done) == sc.rounds:
            print(f"[{key}] reusing {csv} ({len(done)} rounds)", flush=True)
            return done
        shutil.rmtree(run_dir)  # an interrupted run: start that method again
    start = time.perf_counter()
    print(f"[{key}] {sc.algorithm.name} {dict(sc.algorithm.params)}, {sc.rounds} rounds",
          flush=True)
    run(sc, key, run_dir, [RecordsWriter(run_dir)])
    print(f"[{key}] done in {time.perf_counter() - start:.0f} host s", flush=True)
    return pd.read_csv(csv)


def table(results: dict[str, pd.DataFrame], reference: str = "dcpfl") -> pd.DataFrame:
    rows = []
    for key, df in results.items():
        c = to_convergence(df.to_dict("records"))
        rows.append({"method": METHODS[key][0], "key": key, **c})
    t = pd.DataFrame(rows)
    if reference in results:
        ref = float(t.loc[t["key"] == reference, "total_time_s"].iloc[0])
        t["time_ratio"] = t["total_time_s"] / ref
    return t


def dcpfl_structure(df: pd.DataFrame) -> str:
    """One line per trial round of a DC-PFL run: round, outcome, groups, gamma_tilde."""
    if "trial" not in df:
        return ""
    lines = []
    for _, r in df[df["trial"] == 1].iterrows():
        verdict = "kept" if r["split_accepted"] == 1 else "rejected"
        # rounds counted from 1 (the records' round index + 1), as everywhere a person reads
        lines.append(f"round {int(r['round']) + 1}: split {verdict} -> {int(r['groups'])} groups, "
                     f"gamma~ {r['gamma_tilde']:.2f}, bytes_down {int(r['bytes_down'])}, "
                     f"round time {r['round_time_s']:.2f} s")
    last = df.iloc[-1]
    lines.append(f"end: {int(last['groups'])} groups, gamma~ {last['gamma_tilde']:.2f}")
    return "\n".join(lines)


def markdown(t: pd.DataFrame, dkl: float | None) -> str:
    head = ("| Method | Final acc. | Conv. round | Comm. rounds | Comm. time (s) | "
            "Comp. time (s) | Total time (s) |\n|---|---|---|---|---|---|---|\n")
    body = ""
    for _, r in t.iterrows():
        ratio = f" (x{r['time_ratio']:.2f})" if "time_ratio" in r else ""
        comm = "-" if r["comm_rounds"] == 0 else f"{int(r['comm_rounds'])}"
        ctime = "-" if r["comm_rounds"] == 0 else f"{r['comm_time_s']:.0f}"
        body += (f"| {r['method']} | {r['final_accuracy']:.3f} | "
                 f"{int(r['convergence_round']) + 1} | {comm} | {ctime} | "
                 f"{r['compute_time_s']:.0f} | {r['total_time_s']:.0f}{ratio} |\n")
    note = (f"\nConvergence: final accuracy = mean of the last {WINDOW_ROUNDS} rounds; "
            f"converged at the first round from which the {WINDOW_ROUNDS}-round trailing "
            f"mean stays >= final - {TOLERANCE}. Times are emulated seconds up to that round.")
    if dkl is not None:
        note += f"\nD-bar_KL (Eq. 1-2, pair average, natural log) of the partition: {dkl:.3f}."
    return head + body + note + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, help="rounds per method (default: the scenario's)")
    p.add_argument("--out", help="records directory (default runs/dcpfl-table; with "
                   "--quick a new temporary directory)")
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=sorted(METHODS))
    p.add_argument("--model", help="override the scenario's model (e.g. kapc_cnn)")
    p.add_argument("--quick", action="store_true",
                   help=f"seconds, not minutes: {QUICK['clients']} clients, "
                        f"{QUICK['rounds']} rounds, {' and '.join(QUICK['methods'])}")
    args = p.parse_args(argv)
    clients = None
    if args.quick:
        args.rounds, args.methods, clients = QUICK["rounds"], QUICK["methods"], QUICK["clients"]
    default_out = tempfile.mkdtemp(prefix="dcpfl-table-") if args.quick else "runs/dcpfl-table"
    out = Path(args.out or default_out)
    out.mkdir(parents=True, exist_ok=True)
    results = {key: run_method(key, args.rounds, out, args.model, clients)
               for key in args.methods}
    t = table(results)
    dkl = None
    meta = out / args.methods[0] / "run.json"
    if meta.exists():
        dkl = json.loads(meta.read_text()).get("label_dkl")
    md = markdown(t, dkl)
    for key in results:
        if key.startswith("dcpfl") and key != "dcpfl_nodc":
            md += f"\n{METHODS[key][0]} structure:\n{dcpfl_structure(results[key])}\n"
    (out / "table.md").write_text(md)
    t.to_csv(out / "table.csv", index=False)
    print(md)
    print(f"records and tables in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
