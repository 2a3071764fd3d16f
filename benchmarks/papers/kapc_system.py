"""The KAPC+BLS paper's system-cost tables (TMC 2024, Tables 5 and 6), emulated.

Runs FedAvg, FedProx, KAPC and KAPC+BLS (mu = 0.7) on
``scenarios/kapc-cifar10-system.yaml`` — ResNet18, 100 clients, 10 % per round, the
Table 4 channel with the +20 dB calibration, on the MNIST-3x32 stand-in data — and
prints, per round on average:

* Table 5: emulated time per round and its critical-path split into upload, download,
  client compute and server (seconds and %), beside the paper's;
* Table 6: MiB up / down, client and server GFLOPs, beside the paper's; and the server
  process's resident memory (the paper: 1101.62 MB for KAPC, 753.02 MB for FedAvg).

Bytes and server FLOPs follow the paper's setting exactly; client GFLOPs and compute
time scale with the stand-in's data (20 images per client on average, E = 1, against
~500 CIFAR images and E = 5), so the script also prints the client GFLOPs per trained
sample. Server memory is the RSS of the server actor (Ray backend) or of the whole
process (local backend).

Every method runs under seeds 0 .. N-1 (``--seeds N``, default 3); the tables show
mean ± std over the seeds. KAPC+BLS's row is labelled with its upload policy.

    nice -n 10 python benchmarks/papers/kapc_system.py            # 3 rounds each, 3 seeds
    nice -n 10 python benchmarks/papers/kapc_system.py --rounds 5 --methods kapc kapc_bls
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kapc_common import QUICK_OVERRIDES, MiB, quick_out, run_variant
from seeds import add_seeds_argument, pm, seed_list

from mecsim.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "kapc-cifar10-system.yaml"
METHODS = {
    "fedavg": {"name": "fedavg", "params": {}},
    "fedprox": {"name": "fedprox", "params": {"mu": 0.01}},
    "kapc": {"name": "kapc", "params": {"lam": 1.0, "beta": 0.01}},
    "kapc_bls": {"name": "kapc_bls", "params": {"lam": 1.0, "beta": 0.01, "mu": 0.7}},
}
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "kapc": "KAPC",
    "kapc_bls": "KAPC+BLS (omega_policy withhold_last)",
}
# Table 5: time, U-Comm, D-Comm, Client, Server (s); Table 6: U, D (MB), C, S (GFLOPs)
PAPER_T5 = {
    "fedavg": (32.70, 19.28, 7.16, 5.81, 0.45),
    "fedprox": (37.39, 19.34, 7.16, 10.37, 0.52),
    "kapc": (37.94, 19.29, 7.15, 8.65, 2.85),
    "kapc_bls": (36.04, 15.93, 5.49, 13.18, 1.44),
}
PAPER_T6 = {
    "fedavg": (426.54, 426.54, 424.13, 0.22),
    "fedprox": (426.54, 426.54, 524.77, 0.22),
    "kapc": (426.54, 426.17, 524.77, 0.56),
    "kapc_bls": (380.88, 327.48, 524.80, 0.56),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="default: the scenario's 3")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--hosts", type=int, default=None)
    p.add_argument("--scenario", default=str(SCENARIO))
    p.add_argument(
        "--out", help="records (default runs/kapc-system; with --quick a new temporary directory)"
    )
    add_seeds_argument(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: 1 round of "
        "KAPC+BLS, one seed, 10 clients (1 selected), 400 images, in-process, "
        "and the small kapc_cnn instead of ResNet18 (the code path, not the "
        "figures)",
    )
    args = p.parse_args(argv)
    overrides = None
    if args.quick:
        args.rounds, args.methods, args.backend, args.seeds = 1, ["kapc_bls"], "local", 1
        overrides = {**QUICK_OVERRIDES, "topology": {"clients": 10}, "model": {"name": "kapc_cnn"}}
        print("--quick: kapc_cnn instead of ResNet18, 10 clients, 1 round", flush=True)
    out = quick_out(args.out, args.quick, "runs/kapc-system")
    epochs = load_scenario(args.scenario).training.epochs
    t5 = [
        "| method | time (s) | U-Comm (s / %) | D-Comm (s / %) | Client (s / %) "
        "| Server (s / %) | paper: time, U, D, Client, Server (s) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    t6 = [
        "| method | U-Comm (MiB) | D-Comm (MiB) | C-Comp (GFLOPs) | S-Comp (GFLOPs) "
        "| client GFLOPs / sample | server RSS (MiB) | mean layers down / up "
        "| paper: U, D (MB), C, S (GFLOPs) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    phases = ("ul_time_s", "dl_time_s", "client_time_s", "server_time_s")
    for name in args.methods:
        cols: dict[str, list[float]] = {
            k: []
            for k in (
                "total",
                *phases,
                "up",
                "down",
                "cg",
                "sg",
                "per_sample",
                "rss",
                "ldown",
                "lup",
            )
        }
        for seed in seed_list(args.seeds):
            rounds, clients = run_variant(
                args.scenario,
                name,
                METHODS[name],
                rounds=args.rounds,
                backend=args.backend,
                hosts=args.hosts,
                out=out,
                seed=seed,
                overrides=overrides,
            )
            cols["total"].append(rounds["round_time_s"].mean())
            for c in phases:
                cols[c].append(rounds[c].mean())
            sel = clients[clients["selected"].astype(bool)]
            cols["per_sample"].append(
                sel["gflops"].sum() / max(int(sel["num_samples"].sum()) * epochs, 1)
            )
            cols["up"].append(rounds["bytes_up"].mean() / MiB)
            cols["down"].append(rounds["bytes_down"].mean() / MiB)
            cols["cg"].append(rounds["client_gflops"].mean())
            cols["sg"].append(rounds["server_gflops"].mean())
            cols["rss"].append(rounds["server_rss_mb"].max())
            for key, col in (("ldown", "kapc_layers_down_mean"), ("lup", "kapc_layers_up_mean")):
                cols[key].append(rounds[col].mean() if col in rounds else float("nan"))
        total = sum(cols["total"]) / len(cols["total"])
        split = " | ".join(
            f"{pm(cols[c])} / {100 * sum(cols[c]) / len(cols[c]) / total:.1f}" for c in phases
        )
        t5.append(
            f"| {LABELS[name]} | {pm(cols['total'])} | {split} | "
            + ", ".join(f"{v:.2f}" for v in PAPER_T5[name])
            + " |"
        )
        layers = (
            "-"
            if all(v != v for v in cols["ldown"])
            else f"{pm(cols['ldown'])} / {pm(cols['lup'])}"
        )
        t6.append(
            f"| {LABELS[name]} | {pm(cols['up'])} | {pm(cols['down'])} "
            f"| {pm(cols['cg'])} | {pm(cols['sg'], '.4f')} | {pm(cols['per_sample'], '.3f')} "
            f"| {pm(cols['rss'], '.1f')} | {layers} | "
            + ", ".join(f"{v:.2f}" for v in PAPER_T6[name])
            + " |"
        )
    text = (
        f"Seeds 0-{args.seeds - 1}: mean ± std (ddof 1) of the per-run means.\n\n"
        "Table 5 (emulated, mean per round; % of the mean round)\n\n"
        + "\n".join(t5)
        + "\n\nTable 6 (mean per round; server RSS: max over rounds)\n\n"
        + "\n".join(t6)
    )
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "system.md").write_text(text + "\n")
    print(f"records and tables in {out}")


if __name__ == "__main__":
    main()
