"""DC-PFL's Tables I-II (and Fig. 9's ablation) on mecsim: the methods on one scenario,
over seeds.

For each method and seed 0 .. N-1 (``--seeds N``, default 3), a run of
``scenarios/dcpfl-mnist-50.yaml`` (the seed decides the partition, the initial model, the
2 Mbps links are fixed) with only the algorithm changed, then one table row with mean ±
std over the seeds:

* as the paper reports it, *at convergence* (:mod:`mecsim.analysis.convergence`: final accuracy =
  mean of the last 5 rounds; converged at the first round from which the 5-round trailing
  mean stays within 0.01 of it): final and best accuracy, communication rounds,
  communication and total time, and the ratio of each total time to DC-PFL's;
* the fair comparison, *to a common target accuracy* (``--target``, default the highest
  whole point that every run's final accuracy reaches): the round, emulated seconds and
  MiB moved until each run's mean user accuracy first reaches it.

Methods: Standalone (= the ``local`` algorithm), FedAvg, Per-FedAvg (first-order),
fixed clusters by k-means after warm-up (ClusterFL-style), DC-PFL, NoLA, NoDC, and two
readings of DC-PFL: ``dcpfl_shared`` (scaling shared_model instead of the literal
per-layer S) and ``dcpfl_heldout`` (trial splits judged on held-out loss).
``--model kapc_cnn`` runs the paper's 2-conv 3-FC shape instead of the scenario's 2NN.
Each DC-PFL run's trial rounds are listed with the run's warnings (a detection at the
earliest possible round, a layer-wise aggregation that never acted).

Long: ~1-3 host-seconds per round per method (50 clients, 2NN; ~25x that with kapc_cnn).
Run it by hand, niced::

    nice -n 10 python benchmarks/papers/dcpfl_table.py --rounds 150 --out runs/dcpfl-table

Finished runs are reused (``OUT/<method>/seed<k>/``), so an interrupted benchmark resumes
at the run it was on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from seeds import add_seeds_argument, ordering, pm, run_dir, run_or_reuse, seed_list

from mecsim.analysis.convergence import TOLERANCE, WINDOW_ROUNDS, to_convergence
from mecsim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "dcpfl-mnist-50.yaml"

# key -> (table label, algorithm, use the scenario's DC-PFL params, param overrides)
METHODS: dict[str, tuple[str, str, bool, dict[str, Any]]] = {
    "standalone": ("Standalone (local)", "local", False, {}),
    "fedavg": ("FedAvg", "fedavg", False, {}),
    "perfedavg": ("Per-FedAvg (FO)", "perfedavg", False, {}),
    "kmeans_cluster": (
        "Fixed clusters (k-means, k=5)",
        "kmeans_cluster",
        False,
        {"warmup_rounds": 5, "clusters": 5},
    ),
    "dcpfl": ("DC-PFL", "dcpfl", True, {}),
    "dcpfl_nola": ("NoLA", "dcpfl_nola", True, {}),
    "dcpfl_nodc": ("NoDC (gamma~ = 0.8)", "dcpfl_nodc", True, {}),
    "dcpfl_shared": ("DC-PFL (scaling shared_model)", "dcpfl", True, {"scaling": "shared_model"}),
    "dcpfl_heldout": ("DC-PFL (trial_loss heldout)", "dcpfl", True, {"trial_loss": "heldout"}),
}
DEFAULT_METHODS = [
    "standalone",
    "fedavg",
    "perfedavg",
    "kmeans_cluster",
    "dcpfl",
    "dcpfl_nola",
    "dcpfl_nodc",
    "dcpfl_shared",
    "dcpfl_heldout",
]


# --quick: seconds, not minutes (8 clients, 7 rounds: DC-PFL's warm-up and beyond)
QUICK = {"rounds": 7, "methods": ["fedavg", "dcpfl"], "clients": 8}


def scenario_for(
    key: str,
    rounds: int | None,
    model: str | None = None,
    scenario_path: Path = SCENARIO,
    seed: int = 0,
    clients: int | None = None,
):
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
    data["seed"] = seed
    data["metrics"]["enabled"] = False
    data["execution"]["backend"] = "local"
    data["name"] = f"{data['name']}-{key}"
    return scenario_from_dict(data, f"{scenario_path} ({key}, seed {seed})")


def run_method(
    key: str,
    rounds: int | None,
    out: Path,
    model: str | None = None,
    scenario_path: Path = SCENARIO,
    seed: int = 0,
    clients: int | None = None,
) -> pd.DataFrame:
    sc = scenario_for(key, rounds, model, scenario_path, seed, clients)
    rows, _ = run_or_reuse(sc, run_dir(out, key, seed), f"{key} seed {seed}")
    return rows


def table(
    results: dict[str, list[pd.DataFrame]], target: float | None = None, reference: str = "dcpfl"
) -> tuple[pd.DataFrame, float]:
    """One row per (method, seed): the convergence figures and those to ``target`` (the
    common target of every run when None); and the target used."""
    from mecsim.analysis.convergence import common_target, to_target

    conv = {
        key: [to_convergence(df.to_dict("records")) for df in runs] for key, runs in results.items()
    }
    if target is None:
        target = common_target([c["final_accuracy"] for runs in conv.values() for c in runs])
    rows = []
    for key, runs in results.items():
        for seed, (df, c) in enumerate(zip(runs, conv[key], strict=True)):
            hit = to_target(df.to_dict("records"), target)
            rows.append(
                {
                    "method": METHODS[key][0],
                    "key": key,
                    "seed": seed,
                    **c,
                    **{f"target_{k}": v for k, v in hit.items()},
                }
            )
    t = pd.DataFrame(rows)
    if reference in results:
        ref = t.loc[t["key"] == reference, "total_time_s"].mean()
        t["time_ratio"] = t["total_time_s"] / ref
    return t, target


def dcpfl_structure(df: pd.DataFrame, loss_window: int = 5, observe_rounds: int = 3) -> str:
    """One line per trial round of a DC-PFL run: round, outcome, groups, gamma_tilde, and
    whether the RDP end before it was detected without a minimum of r ever being seen
    (rebuilt from the recorded radii: ``mecsim.agents.algorithms.dcpfl.rdp_detections``)."""
    if "trial" not in df:
        return ""
    from mecsim.agents.algorithms.dcpfl import rdp_detections

    unseen = {
        k + 1
        for k, flag in rdp_detections(df.to_dict("records"), loss_window, observe_rounds)
        if flag
    }
    lines = []
    for idx, r in df[df["trial"] == 1].iterrows():
        verdict = "kept" if r["split_accepted"] == 1 else "rejected"
        early = ", RDP end detected without a minimum of r" if idx in unseen else ""
        # rounds counted from 1 (the records' round index + 1), as everywhere a person reads
        lines.append(
            f"round {int(r['round']) + 1}: split {verdict} -> {int(r['groups'])} groups, "
            f"gamma~ {r['gamma_tilde']:.2f}, bytes_down {int(r['bytes_down'])}, "
            f"round time {r['round_time_s']:.2f} s{early}"
        )
    last = df.iloc[-1]
    lines.append(f"end: {int(last['groups'])} groups, gamma~ {last['gamma_tilde']:.2f}")
    return "\n".join(lines)


def markdown(t: pd.DataFrame, target: float, dkl: list[float], seeds: int) -> str:
    pct = f"{100 * target:g} %"
    head = (
        "| Method | Final acc. | Best acc. | Conv. round | Comm. rounds | Comm. time (s) | "
        f"Total time (s) | Round to {pct} | Time to {pct} (s) | MiB to {pct} |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = ""
    final: dict[str, list[float]] = {}
    to_goal: dict[str, list[float]] = {}
    for key in dict.fromkeys(t["key"]):
        g = t[t["key"] == key]
        label = g["method"].iloc[0]
        final[label] = g["final_accuracy"].tolist()
        to_goal[label] = g["target_total_time_s"].tolist()
        comm = g["comm_rounds"].max() > 0
        ratio = f" (x{g['time_ratio'].mean():.2f})" if "time_ratio" in g else ""
        body += (
            f"| {label} | {pm(g['final_accuracy'], '.3f')} "
            f"| {pm(g['best_accuracy'], '.3f')} "
            f"| {pm(g['convergence_round'] + 1, '.1f')} "
            f"| {pm(g['comm_rounds'], '.1f') if comm else '-'} "
            f"| {pm(g['comm_time_s'], '.0f') if comm else '-'} "
            f"| {pm(g['total_time_s'], '.0f')}{ratio} "
            f"| {pm(g['target_target_round'] + 1, '.1f')} "
            f"| {pm(g['target_total_time_s'], '.0f')} "
            f"| {pm(g['target_bytes_total'] / 2**20, '.0f')} |\n"
        )
    note = (
        f"\nSeeds 0-{seeds - 1}: mean ± std (ddof 1); '(k of n)': only k runs reached "
        f"the target. Convergence: final accuracy = mean of the last {WINDOW_ROUNDS} "
        f"rounds; converged at the first round from which the {WINDOW_ROUNDS}-round "
        f"trailing mean stays >= final - {TOLERANCE}; best = the best trailing mean. "
        f"Times are emulated seconds up to that round. To {pct}: the first round whose "
        f"mean user accuracy reaches the common target, its emulated time and the MiB "
        f"sent and received until then.\n"
        f"Final accuracy, every pair compared ('>' beyond the spread, '≈' level): "
        f"{ordering(final)}.\n"
        f"Time to {pct}, every pair compared ('<' beyond the spread, '≈' level): "
        f"{ordering(to_goal, higher_is_better=False)}.\n"
    )
    finite = [d for d in dkl if d is not None and math.isfinite(d)]
    if finite:
        note += (
            f"D-bar_KL (Eq. 1-2, pair average, natural log) of the partitions: "
            f"{pm(finite, '.3f')}.\n"
        )
    return head + body + note


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, help="rounds per method (default: the scenario's)")
    p.add_argument(
        "--out",
        help="records directory (default runs/dcpfl-table; with --quick a new temporary directory)",
    )
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=sorted(METHODS))
    p.add_argument("--model", help="override the scenario's model (e.g. kapc_cnn)")
    p.add_argument("--scenario", type=Path, default=SCENARIO)
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="common target accuracy (default: the highest whole point every "
        "run's final accuracy reaches)",
    )
    add_seeds_argument(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"seconds, not minutes: {QUICK['clients']} clients, "
        f"{QUICK['rounds']} rounds, {' and '.join(QUICK['methods'])}, one seed",
    )
    args = p.parse_args(argv)
    clients = None
    if args.quick:
        args.rounds, args.methods, clients = QUICK["rounds"], QUICK["methods"], QUICK["clients"]
        args.seeds = 1
    default_out = tempfile.mkdtemp(prefix="dcpfl-table-") if args.quick else "runs/dcpfl-table"
    out = Path(args.out or default_out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = seed_list(args.seeds)
    results = {
        key: [
            run_method(key, args.rounds, out, args.model, args.scenario, s, clients) for s in seeds
        ]
        for key in args.methods
    }
    t, target = table(results, args.target)
    dkl = []
    for s in seeds:
        meta = run_dir(out, args.methods[0], s) / "run.json"
        dkl.append(json.loads(meta.read_text()).get("label_dkl") if meta.exists() else None)
    md = markdown(t, target, dkl, args.seeds)
    from mecsim.agents.algorithms import run_notes

    for key in results:
        _, algorithm, _, _ = METHODS[key]
        if not algorithm.startswith("dcpfl"):
            continue
        params = scenario_for(
            key, args.rounds, args.model, args.scenario, clients=clients
        ).algorithm.params
        for s, df in zip(seeds, results[key], strict=True):
            md += f"\n{METHODS[key][0]}, seed {s}:\n"
            if algorithm != "dcpfl_nodc":
                md += dcpfl_structure(df, params["loss_window"], params["observe_rounds"]) + "\n"
            for note in run_notes(algorithm, dict(params), df.to_dict("records")):
                md += f"- {note}\n"
    (out / "table.md").write_text(md)
    t.to_csv(out / "table.csv", index=False)
    print(md)
    print(f"records and tables in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
