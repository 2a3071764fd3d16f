"""PHSFL vs HSFL (the paper's Figs. 3-4): global and personalised mean test accuracy and
loss for Dirichlet alpha = 0.1 and 0.5, plus the timing engine's speed on a
100-client round.

Runs ``scenarios/phsfl-mnist-4x25.yaml`` (embedded MNIST instead of CIFAR-10) for each
alpha and algorithm, in-process, evaluating at the end of every global round, and
writes the records under ``--out`` and a table to ``--out/fig3.md`` (+ ``fig3.json``).
Means are over the clients with test data (with alpha = 0.1 a few of the 100 clients get
no test sample). Long: run it by hand, niced, e.g.::

    nice -n 10 python benchmarks/papers/phsfl_fig3.py --global-rounds 10 --out runs/phsfl-fig3

(``--alphas 0.1`` and ``--alphas 0.5``, or ``--algorithms phsfl`` and ``--algorithms
hsfl``, in two processes use two cores.) Every (alpha, algorithm) runs under seeds
0 .. N-1 (``--seeds N``, default 3); the table shows mean ± std over the seeds, and
finished runs under ``--out`` are reused. The paper runs
R = 100 global rounds on CIFAR-10; its figures, for the shape: alpha = 0.1: global
HSFL 0.6606 / PHSFL 0.6446 (loss 1.0049 / 1.0975), personalised HSFL 0.7958 / PHSFL
0.8708 (loss 0.6735 / 0.4721); alpha = 0.5: personalised +4.75 % (HSFL) and +9.03 %
(PHSFL) over the global models.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import simpy
from seeds import add_seeds_argument, ordering, pm, run_or_reuse, seed_list

from mecsim.emulation.engine import engine_path, time_round
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import op_from_dict
from mecsim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "phsfl-mnist-4x25.yaml"
PAPER = {  # Section V-B, CIFAR-10, R = 100, after K = 10 fine-tuning steps
    (0.1, "hsfl"): {
        "global_acc": 0.6606,
        "global_loss": 1.0049,
        "personal_acc": 0.7958,
        "personal_loss": 0.6735,
    },
    (0.1, "phsfl"): {
        "global_acc": 0.64458,
        "global_loss": 1.0975,
        "personal_acc": 0.8708,
        "personal_loss": 0.4721,
    },
}


def scenario_for(
    alpha: float,
    algorithm: str,
    global_rounds: int,
    run_id: str,
    out: Path,
    train_size: int | None,
    test_size: int | None,
    seed: int = 0,
    epochs: int | None = None,
    scenario: Path = SCENARIO,
    clients: int | None = None,
):
    data = load_scenario(scenario).model_dump(mode="json")
    if clients is not None:
        data["topology"]["clients"] = clients
    k1 = data["algorithm"]["params"]["edge_rounds"]
    data.update(name=f"phsfl-fig3-{run_id}", rounds=global_rounds * k1, seed=seed)
    if epochs:
        data["training"]["epochs"] = epochs
    data["dataset"]["partition"]["alpha"] = alpha
    if train_size:
        data["dataset"]["train_size"] = train_size
    if test_size:
        data["dataset"]["test_size"] = test_size
    data["algorithm"]["name"] = algorithm
    data["evaluation"] = {"every": k1, "clients": "all"}
    data["metrics"]["enabled"] = False
    data["execution"] = {"backend": "local", "hosts": 1}
    data["outputs"] = {**data["outputs"], "dir": str(out), "run_id": run_id, "table_format": "csv"}
    return scenario_from_dict(data, f"{scenario} (fig3 {run_id})")


def engine_events_per_second(
    run_dir: Path, round_index: int = 0, repeats: int = 3
) -> dict[str, float]:
    """Re-time one recorded round: its ops, the SimPy model's events, and the wall seconds
    of the engine's default path and of the SimPy model (best of ``repeats``)."""
    sc = load_scenario(run_dir / "scenario.yaml")
    lines = (run_dir / "optraces.jsonl").read_text().splitlines()
    rec = json.loads(lines[round_index])
    traces = {int(c): tuple(op_from_dict(d) for d in ops) for c, ops in rec["clients"].items()}
    network = NetworkModel(sc, device_profiles(sc))
    specs, servers, net, _ = network.round(rec["round"], sorted(traces), 0.0)
    count = {"events": 0}
    step = simpy.Environment.step

    def counting_step(env: simpy.Environment) -> None:
        count["events"] += 1
        step(env)

    simpy.Environment.step = counting_step  # type: ignore[method-assign]
    try:
        time_round(traces, specs, servers, net, method="simpy")
    finally:
        simpy.Environment.step = step  # type: ignore[method-assign]
    walls: dict[str, float] = {}
    for method in ("auto", "simpy"):
        best = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            time_round(traces, specs, servers, net, method=method)
            best.append(time.perf_counter() - t0)
        walls[method] = min(best)
    return {
        "round": rec["round"],
        "clients": len(traces),
        "ops": sum(len(t) for t in traces.values()),
        "simpy_events": count["events"],
        "path": engine_path(traces, specs, servers, net),
        "wall_s": walls["auto"],
        "simpy_wall_s": walls["simpy"],
        "simpy_events_per_s": count["events"] / walls["simpy"],
    }


def final_figures(rows: list[dict]) -> dict[str, float]:
    last = [r for r in rows if np.isfinite(r.get("mean_accuracy", np.nan))][-1]
    return {
        "global_acc": last["mean_global_accuracy"],
        "global_loss": last["mean_global_test_loss"],
        "personal_acc": last["mean_accuracy"],
        "personal_loss": last["mean_test_loss"],
        "round": last["round"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--global-rounds", type=int, default=10, help="R (the paper: 100)")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--algorithms", nargs="+", default=["phsfl", "hsfl"])
    ap.add_argument("--train-size", type=int, default=None)
    ap.add_argument("--test-size", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None, help="kappa_0 (default: the scenario's)")
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument(
        "--out",
        type=Path,
        help="default runs/phsfl-fig3 in the repository; with --quick a new temporary directory",
    )
    add_seeds_argument(ap)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: PHSFL, "
        "alpha 0.5, 1 global round, 8 clients (2 per edge server), 200 images, "
        "1 epoch, one seed",
    )
    args = ap.parse_args(argv)
    clients = None
    if args.quick:
        args.global_rounds, args.alphas, args.algorithms, args.seeds = 1, [0.5], ["phsfl"], 1
        args.train_size, args.test_size, clients, args.epochs = 200, 100, 8, 1
    if args.out is None:
        args.out = (
            Path(tempfile.mkdtemp(prefix="phsfl-fig3-"))
            if args.quick
            else ROOT / "runs" / "phsfl-fig3"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for alpha in args.alphas:
        for algorithm in args.algorithms:
            key = f"{algorithm}-a{alpha:g}-R{args.global_rounds}"
            per_seed = []
            for seed in seed_list(args.seeds):
                run_id = f"{key}-s{seed}"
                sc = scenario_for(
                    alpha,
                    algorithm,
                    args.global_rounds,
                    run_id,
                    args.out,
                    args.train_size,
                    args.test_size,
                    seed,
                    args.epochs,
                    args.scenario,
                    clients,
                )
                t0 = time.perf_counter()
                df, _ = run_or_reuse(sc, args.out / run_id, run_id)
                rows = df.to_dict("records")
                wall = time.perf_counter() - t0
                curve = [
                    {
                        "global_round": int(r["global_round"]),
                        "global_acc": r["mean_global_accuracy"],
                        "global_loss": r["mean_global_test_loss"],
                        "personal_acc": r["mean_accuracy"],
                        "personal_loss": r["mean_test_loss"],
                    }
                    for r in rows
                    if np.isfinite(r["mean_accuracy"])
                ]
                res = {
                    **final_figures(rows),
                    "curve": curve,
                    "host_wall_s": wall,
                    "emulated_s": rows[-1]["elapsed_s"],
                    "mean_edge_round_s": float(np.mean([r["round_time_s"] for r in rows])),
                    "mean_backhaul_s": float(np.mean([r["backhaul_time_s"] for r in rows])),
                    "activation_bytes_per_round": rows[0]["activation_bytes"],
                    "gradient_bytes_per_round": rows[0]["gradient_bytes"],
                    # Eq. 17's fine-tuning over the run: once at its end by default
                    # (finetune_charge: final), after every global round otherwise
                    "finetune_bytes_run": float(
                        np.nansum([r.get("finetune_bytes", np.nan) for r in rows])
                    ),
                    "finetune_es_gflops_run": float(
                        np.nansum([r.get("finetune_es_gflops", np.nan) for r in rows])
                    ),
                }
                if not results and not per_seed:
                    res["engine"] = engine_events_per_second(args.out / run_id)
                per_seed.append(res)
                print(
                    f"{run_id}: {json.dumps({k: v for k, v in res.items() if k != 'curve'})}",
                    flush=True,
                )
            results[key] = {"alpha": alpha, "algorithm": algorithm, "seeds": per_seed}
    stem = f"fig3-{'-'.join(f'{a:g}' for a in args.alphas)}-{'-'.join(args.algorithms)}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    lines = [
        "| run | global acc | global loss | personalised acc | personalised loss "
        "| edge round (s) | paper (CIFAR-10, R=100) |",
        "|---|---|---|---|---|---|---|",
    ]
    personal: dict[float, dict[str, list[float]]] = {}
    for key, res in results.items():
        seeds = res["seeds"]
        p = PAPER.get((res["alpha"], res["algorithm"]))
        paper = (
            (
                f"{p['global_acc']:.4f} / {p['global_loss']:.4f} / {p['personal_acc']:.4f}"
                f" / {p['personal_loss']:.4f}"
            )
            if p
            else ""
        )
        col = {
            k: [s[k] for s in seeds]
            for k in (
                "global_acc",
                "global_loss",
                "personal_acc",
                "personal_loss",
                "mean_edge_round_s",
            )
        }
        personal.setdefault(res["alpha"], {})[res["algorithm"].upper()] = col["personal_acc"]
        lines.append(
            f"| {key} | {pm(col['global_acc'], '.4f')} | {pm(col['global_loss'], '.4f')} "
            f"| {pm(col['personal_acc'], '.4f')} | {pm(col['personal_loss'], '.4f')} "
            f"| {pm(col['mean_edge_round_s'], '.1f')} | {paper} |"
        )
    lines.append("")
    lines.append(f"Seeds 0-{args.seeds - 1}: mean ± std (ddof 1) of the final global round.")
    for alpha, accs in personal.items():
        lines.append(
            f"Personalised accuracy at alpha = {alpha:g}, every pair compared ('>' beyond "
            f"the spread, '≈' level): {ordering(accs)}."
        )
    table = "\n".join(lines)
    (args.out / f"{stem}.md").write_text(table + "\n")
    print(table)
    print(f"records and tables in {args.out}")


if __name__ == "__main__":
    main()
