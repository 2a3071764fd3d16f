"""The shape of the KAPC+BLS paper's Table 3: the self-relationship threshold mu, over seeds.

Runs KAPC+BLS with mu in {0.3, 0.5, 0.7, 0.9} (and plain KAPC as the no-filter
reference) under seeds 0 .. N-1 and prints best mean accuracy, MiB uploaded /
downloaded per round, the mean number of layers downloaded and held back by the mu
filter, and the largest self-relationship r_ii (mean ± std over the seeds) beside Table
3 (CIFAR-10, alpha = 0.1, 100 clients with 10 % selected: 77.79 / 80.01 / 80.02 / 79.70 %,
download 163.64 / 251.10 / 327.48 / 425.58 MB per round). The expected shape: the smaller
mu, the less is downloaded -- which needs self-relationships above mu: the table says
when none was.

Default scenario: ``scenarios/kapc-mnist-10.yaml`` (the data this machine can train);
``--scenario scenarios/kapc-cifar10-system.yaml`` runs the ResNet18 stand-in.

    nice -n 10 python benchmarks/papers/kapc_mu_sweep.py --rounds 20
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kapc_common import (
    QUICK_OVERRIDES,
    MiB,
    best_mean_accuracy,
    column_max,
    per_round_mean,
    quick_out,
    run_variant,
)
from seeds import add_seeds_argument, pm, seed_list

ROOT = Path(__file__).resolve().parents[2]
PAPER = {
    0.3: (77.79, 387.29, 163.64),
    0.5: (80.01, 380.70, 251.10),
    0.7: (80.02, 380.88, 327.48),
    0.9: (79.70, 373.94, 425.58),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=str(ROOT / "scenarios" / "kapc-mnist-10.yaml"))
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None, help="E (default: the scenario's)")
    p.add_argument("--mus", nargs="+", type=float, default=list(PAPER))
    p.add_argument("--no-reference", action="store_true", help="skip the plain KAPC run")
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--hosts", type=int, default=None)
    p.add_argument(
        "--out", help="records (default runs/kapc-mu-sweep; with --quick a new temporary directory)"
    )
    p.add_argument(
        "--kapc-params",
        default='{"lam": 1.0, "beta": 0.01}',
        help="JSON of hyper-parameters for every run (e.g. omega_policy)",
    )
    add_seeds_argument(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: 2 rounds of "
        "KAPC+BLS at mu = 0.5 without the reference, one seed, 400 images, "
        "in-process",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.mus, args.no_reference, args.backend = 2, [0.5], True, "local"
        args.seeds = 1
    out = quick_out(args.out, args.quick, "runs/kapc-mu-sweep")
    base = dict(json.loads(args.kapc_params))
    overrides = dict(QUICK_OVERRIDES) if args.quick else {}
    if args.epochs:
        overrides["training"] = {**overrides.get("training", {}), "epochs": args.epochs}
    variants = [] if args.no_reference else [("kapc", None)]
    variants += [("kapc_bls", mu) for mu in args.mus]
    lines = [
        "| method | mu | best mean acc. (%) | MiB up / round | MiB down / round "
        "| layers down | layers held back by mu | largest r_ii "
        "| paper acc. / up / down (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, mu in variants:
        params = dict(base) if mu is None else {**base, "mu": mu}
        run_id = name if mu is None else f"kapc_bls-mu{mu:g}"
        cols: dict[str, list[float]] = {
            k: [] for k in ("acc", "up", "down", "layers", "held", "rii")
        }
        for seed in seed_list(args.seeds):
            rounds, _ = run_variant(
                args.scenario,
                run_id,
                {"name": name, "params": params},
                rounds=args.rounds,
                backend=args.backend,
                hosts=args.hosts,
                out=out,
                seed=seed,
                overrides=overrides,
            )
            cols["acc"].append(best_mean_accuracy(rounds))
            cols["up"].append(rounds["bytes_up"].mean() / MiB)
            cols["down"].append(rounds["bytes_down"].mean() / MiB)
            cols["layers"].append(per_round_mean(rounds, "kapc_layers_down_mean"))
            cols["held"].append(per_round_mean(rounds, "kapc_layers_filtered_mean"))
            cols["rii"].append(column_max(rounds, "kapc_self_relation_max"))
        paper = PAPER.get(mu)
        ref = f"{paper[0]:.2f} / {paper[1]:.2f} / {paper[2]:.2f}" if paper else "426.54 / 426.54"
        lines.append(
            f"| {name} | {'-' if mu is None else f'{mu:g}'} | {pm(cols['acc'], scale=100)} "
            f"| {pm(cols['up'], '.2f')} | {pm(cols['down'], '.2f')} | {pm(cols['layers'])} "
            f"| {pm(cols['held'], missing='-')} | {pm(cols['rii'], '.3f', missing='-')} "
            f"| {ref} |"
        )
        print(lines[-1], flush=True)
    policy = base.get("omega_policy", "withhold_last")
    table = "\n".join(lines) + (
        f"\n\nSeeds 0-{args.seeds - 1}: mean ± std (ddof 1). KAPC+BLS uploads under "
        f"omega_policy {policy}.\n"
    )
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mu_sweep.md").write_text(table)
    print(f"records and table in {out}")


if __name__ == "__main__":
    main()
