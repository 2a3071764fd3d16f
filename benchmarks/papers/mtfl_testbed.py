"""MTFL Table 4: the Raspberry-Pi testbed's average round time and its split, emulated.

For FL(FedAvg), MTFL(FedAvg-Adam) (private gamma, beta) and Independent (``local``), on
the MNIST 2NN and the CIFAR-10 CNN:

1. **record** ``scenarios/mtfl-rpi-testbed.yaml`` with the scheme for ``--rounds`` rounds
   (real training on the embedded data, in-process): each client's op-trace (bytes it
   downloaded and uploaded, FLOPs and steps it trained) and the server's aggregation
   FLOPs. The CIFAR CNN has no CIFAR data here: it trains on ``mnist-embedded-3x32``
   (the embedded MNIST padded to 32 x 32, 3 channels), a stand-in of CIFAR's input
   shape -- the timing needs only the FLOPs and bytes, which depend on shapes alone;
2. **paper-size** each trace: the testbed's clients held 6,000 MNIST / 5,000 CIFAR-10
   training images (the training sets split over 10 clients), so one epoch at batch 20 is
   300 / 250 steps; each Compute op keeps its measured FLOPs per step and gets that many
   steps. Bytes are unchanged (the same model and algorithm);
3. **time** the paper-sized traces with the engine through the scenario's network (the
   shared access point) and devices, the server time from its profile, and average.

``--fit`` recomputes the calibration of the access point and the server from the FL(FedAvg)
MNIST row only (Down 5 %, Up 6 %, Server 1 % of 30 s) by bisection on the emulated
critical path, and prints it beside the scenario's values; everything else is a
prediction.

    nice -n 10 python benchmarks/papers/mtfl_testbed.py [--rounds 2] [--fit] [--out FILE]

Every recorded round of a scheme has the same traces' shapes and the channel is a fixed
rate, so every round times the same; ``--rounds 2`` is enough (the paper averaged 10).
Each scheme is recorded under seeds 0 .. N-1 (``--seeds N``, default 3) and the table
shows mean ± std: the seed changes the data and the initial model, not a trace's shape,
so a spread above zero would mean the timing depends on more than the FLOPs and bytes.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seeds import add_seeds_argument, pm, seed_list

from mecsim.emulation.engine import time_round
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, OpTrace, op_from_dict, trace_bytes
from mecsim.run.round import run_round
from mecsim.run.setup import prepare
from mecsim.scenario import Scenario, load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "mtfl-rpi-testbed.yaml"
MiB = 2**20

SCHEMES: dict[str, dict[str, Any]] = {
    "FL(FedAvg)": {
        "algorithm": {"name": "mtfl", "params": {"private": "none", "strategy": "fedavg"}},
        "optimizer": "sgd",
        "lr": 0.1,
    },
    "MTFL(FedAvg-Adam)": {
        "algorithm": {"name": "mtfl", "params": {"private": "yb", "strategy": "fedavg_adam"}},
        "optimizer": "adam",
        "lr": 0.001,
    },
    "Independent": {"algorithm": {"name": "local", "params": {}}, "optimizer": "sgd", "lr": 0.1},
}
TASKS: dict[str, dict[str, Any]] = {
    # paper_samples: the testbed's training images per client (training set / 10 clients)
    "MNIST 2NN": {
        "model": "mlp_2nn",
        "dataset": "mnist-embedded",
        "train_size": 8000,
        "test_size": 2000,
        "paper_samples": 6000,
    },
    "CIFAR10 CNN": {
        "model": "mtfl_cnn",
        "dataset": "mnist-embedded-3x32",
        "train_size": 2000,
        "test_size": 500,
        "paper_samples": 5000,
    },
}
# Table 4: round time (s) and % Down / Client / Up / Server
PAPER: dict[tuple[str, str], tuple[float, float, float, float, float]] = {
    ("MNIST 2NN", "FL(FedAvg)"): (30, 5, 88, 6, 1),
    ("MNIST 2NN", "MTFL(FedAvg-Adam)"): (38, 11, 76, 12, 1),
    ("MNIST 2NN", "Independent"): (29, 0, 100, 0, 0),
    ("CIFAR10 CNN", "FL(FedAvg)"): (108, 5, 86, 5, 4),
    ("CIFAR10 CNN", "MTFL(FedAvg-Adam)"): (136, 11, 74, 12, 3),
    ("CIFAR10 CNN", "Independent"): (100, 0, 100, 0, 0),
}


@dataclass(frozen=True)
class Recorded:
    """A scheme's recorded rounds: (selected clients, their op-traces, aggregation FLOPs)."""

    scenario: Scenario
    rounds: tuple[tuple[list[int], dict[int, OpTrace], float], ...]


def variant(
    task: str, scheme: str, rounds: int, base: Path = SCENARIO, seed: int | None = None
) -> Scenario:
    data = load_scenario(base).model_dump(mode="json")
    t, s = TASKS[task], SCHEMES[scheme]
    data.update(rounds=rounds)
    if seed is not None:
        data["seed"] = seed
    data["model"]["name"] = t["model"]
    data["dataset"].update(name=t["dataset"], train_size=t["train_size"], test_size=t["test_size"])
    data["algorithm"] = s["algorithm"]
    data["training"].update(optimizer=s["optimizer"], lr=s["lr"])
    data["metrics"]["enabled"] = False
    data["execution"] = {"backend": "local", "hosts": 1}
    return scenario_from_dict(data, f"{base.name} ({task}, {scheme})")


def record(sc: Scenario) -> Recorded:
    rs = prepare(sc, "testbed", None)
    out = []
    try:
        elapsed = 0.0
        for rnd in range(sc.rounds):
            row, _, tr = run_round(rs, rnd, elapsed)
            elapsed = row["elapsed_s"]
            traces = {
                int(c): tuple(op_from_dict(d) for d in ops) for c, ops in tr["clients"].items()
            }
            out.append((sorted(traces), traces, float(tr["aggregate_flops"])))
    finally:
        rs.executor.close()
    return Recorded(sc, tuple(out))


def paper_sized(trace: OpTrace, steps: int) -> OpTrace:
    """The trace with each Compute op re-sized to ``steps`` steps of its FLOPs per step."""
    ops = []
    for op in trace:
        if isinstance(op, Compute):
            ops.append(Compute(op.flops / op.batches * steps, steps, op.what))
        else:
            ops.append(op)
    return tuple(ops)


def time_recorded(rec: Recorded, steps: int | None, sc: Scenario | None = None) -> dict[str, float]:
    """Average per-round critical-path seconds (and bytes) of the recorded rounds, with
    traces paper-sized to ``steps`` (None: as recorded), through ``sc``'s network."""
    sc = sc or rec.scenario
    profiles = device_profiles(sc)
    network = NetworkModel(sc, profiles)
    server = profiles[sc.devices.edge_server]
    per_step = {
        op.flops / op.batches
        for _, traces, _ in rec.rounds
        for tr in traces.values()
        for op in tr
        if isinstance(op, Compute)
    }
    if len(per_step) != 1:
        raise ValueError(
            f"clients trained with different FLOPs per step {sorted(per_step)}: "
            "give every client a multiple of the batch size"
        )
    keys = ("round_time_s", "download_s", "client_s", "upload_s", "server_s")
    acc = dict.fromkeys(keys + ("mib_up_per_client", "mib_down_per_client"), 0.0)
    elapsed = 0.0
    for rnd, (selected, traces, agg_flops) in enumerate(rec.rounds):
        specs, servers, net, _ = network.round(rnd, selected, elapsed, records=False)
        sized = {c: (paper_sized(t, steps) if steps else t) for c, t in traces.items()}
        timing = time_round(
            sized, specs, servers, net, aggregate_s=server.aggregate_time_s(agg_flops)
        )
        elapsed += timing.round_time_s
        for k in keys:
            acc[k] += getattr(timing, k)
        up = sum(trace_bytes(t)[0] for t in traces.values()) / len(traces)
        down = sum(trace_bytes(t)[1] for t in traces.values()) / len(traces)
        acc["mib_up_per_client"] += up / MiB
        acc["mib_down_per_client"] += down / MiB
    out = {k: v / len(rec.rounds) for k, v in acc.items()}
    out["flops_per_step"] = per_step.pop()
    return out


def with_channel(
    sc: Scenario, downlink_bps: float | None = None, uplink_bps: float | None = None
) -> Scenario:
    data = sc.model_dump(mode="json")
    if downlink_bps is not None:
        data["channel"]["downlink"]["rate_bps"] = downlink_bps
    if uplink_bps is not None:
        data["channel"]["uplink"]["rate_bps"] = uplink_bps
    return scenario_from_dict(data, "fit")


def bisect_rate(seconds_at, target_s: float, lo: float = 1e5, hi: float = 1e10) -> float:
    """The rate (bit/s) at which the decreasing function ``seconds_at(rate)`` is target_s."""
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if seconds_at(mid) > target_s:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return math.sqrt(lo * hi)


def fit(rec: Recorded, steps: int, paper: tuple[float, ...]) -> dict[str, float]:
    """AP downlink/uplink rates and server FLOP/s reproducing ``paper``'s Down/Up/Server."""
    total, down_pct, _, up_pct, server_pct = paper
    down_s, up_s, server_s = total * down_pct / 100, total * up_pct / 100, total * server_pct / 100
    sc = rec.scenario
    r_down = bisect_rate(
        lambda r: time_recorded(rec, steps, with_channel(sc, r))["download_s"], down_s
    )
    sc_d = with_channel(sc, r_down)
    r_up = bisect_rate(
        lambda r: time_recorded(rec, steps, with_channel(sc_d, None, r))["upload_s"], up_s
    )
    agg = {f for _, _, f in rec.rounds}
    if len(agg) != 1:
        raise ValueError(f"aggregation FLOPs differ between rounds: {sorted(agg)}")
    return {
        "downlink_rate_bps": r_down,
        "uplink_rate_bps": r_up,
        "server_flops_per_s": agg.pop() / server_s,
        "down_s": down_s,
        "up_s": up_s,
        "server_s": server_s,
    }


def _pcts(t: dict[str, float]) -> list[float]:
    total = t["round_time_s"]
    return [100 * t[k] / total for k in ("download_s", "client_s", "upload_s", "server_s")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds recorded per scheme")
    p.add_argument(
        "--fit",
        action="store_true",
        help="recompute the AP and server calibration from FL(FedAvg) MNIST",
    )
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--out", type=Path, help="also write the markdown table here")
    add_seeds_argument(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: one round of "
        "the MNIST 2NN schemes on 100 images per client, one seed (the figures "
        "need the recorded traces' shapes only, so they are those of the full run)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.tasks, args.seeds = 1, ["MNIST 2NN"], 1
        TASKS["MNIST 2NN"] = {**TASKS["MNIST 2NN"], "train_size": 1000, "test_size": 200}

    base = load_scenario(SCENARIO)
    lines = []
    if args.fit:
        rec = record(variant("MNIST 2NN", "FL(FedAvg)", args.rounds))
        steps = math.ceil(TASKS["MNIST 2NN"]["paper_samples"] / base.training.batch_size)
        f = fit(rec, steps, PAPER[("MNIST 2NN", "FL(FedAvg)")])
        lines += [
            "## Calibration (fitted to FL(FedAvg), MNIST 2NN, Table 4: Down 5 %, Up 6 %, "
            "Server 1 % of 30 s)\n",
            "| quantity | fitted | in the scenario |",
            "|---|---|---|",
            f"| AP downlink rate (bit/s), Down = {f['down_s']:.2f} s | "
            f"{f['downlink_rate_bps']:.4g} | {base.channel.downlink.rate_bps:.4g} |",
            f"| AP uplink rate (bit/s), Up = {f['up_s']:.2f} s | "
            f"{f['uplink_rate_bps']:.4g} | {base.channel.uplink.rate_bps:.4g} |",
            f"| server FLOP/s, Server = {f['server_s']:.2f} s | "
            f"{f['server_flops_per_s']:.4g} | "
            f"{device_profiles(base)[base.devices.edge_server].flops_per_s:.4g} |",
            "",
        ]
        print("\n".join(lines), flush=True)

    lines += [
        f"## Table 4, emulated (paper-sized traces) beside the paper; seeds "
        f"0-{args.seeds - 1}, mean ± std\n",
        "| task | scheme | round (s) | Down % | Client % | Up % | Server % | "
        "paper round (s) | paper D/C/U/S % | MiB down / up per client | "
        "as run: round (s), steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in args.tasks:
        steps = math.ceil(TASKS[task]["paper_samples"] / base.training.batch_size)
        for scheme in SCHEMES:
            runs = []
            for seed in seed_list(args.seeds):
                rec = record(variant(task, scheme, args.rounds, seed=seed))
                t = time_recorded(rec, steps)
                raw = time_recorded(rec, None)
                first_trace = next(iter(rec.rounds[0][1].values()))
                recorded_steps = next(op.batches for op in first_trace if isinstance(op, Compute))
                runs.append((t, raw, recorded_steps))
                print(
                    f"{task} {scheme} seed {seed}: {t['round_time_s']:.3f} s (FLOPs/step "
                    f"{t['flops_per_step']:.6g}, {steps} steps, critical path s: down "
                    f"{t['download_s']:.3f} client {t['client_s']:.3f} up "
                    f"{t['upload_s']:.3f} server {t['server_s']:.3f})",
                    flush=True,
                )
            pt, *pp = PAPER[(task, scheme)]
            pcts = [_pcts(t) for t, _, _ in runs]
            row = (
                f"| {task} | {scheme} | {pm([t['round_time_s'] for t, _, _ in runs])} | "
                + " | ".join(pm([p[k] for p in pcts], ".1f") for k in range(4))
                + f" | {pt:g} | {'/'.join(f'{x:g}' for x in pp)} | "
                f"{runs[0][0]['mib_down_per_client']:.3f} / "
                f"{runs[0][0]['mib_up_per_client']:.3f} | "
                f"{pm([raw['round_time_s'] for _, raw, _ in runs])}, {runs[0][2]} |"
            )
            lines.append(row)
            print(row, flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
