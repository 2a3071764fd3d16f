"""Table 3's shape on bytes over a paper-length run: KAPC+BLS downloads and uploads per mu.

The KAPC+BLS paper's Table 3 (CIFAR-10, alpha = 0.1, 100 clients, 10 selected a round,
100 rounds) gives, per round, uploads of 387.29 / 380.70 / 380.88 / 373.94 MB and
downloads of 163.64 / 251.10 / 327.48 / 425.58 MB at mu = 0.3 / 0.5 / 0.7 / 0.9: at
mu = 0.9 more is downloaded than uploaded. Whether that can happen depends on which
layers the server sends (``download_policy``): T. Algorithm 5 sends s_i over every layer
the mu filter lets through; ``uploaded_only`` sends only what the client uploaded last
time, so downloads stay below uploads at every mu.

What runs, and what is real: the whole KAPC+BLS algorithm (relation cube, mu filter,
Eq. 33-34, Algorithm 4 with ``omega_policy``, the clients' coached training) on
``scenarios/kapc-cifar10-system.yaml`` for 100 rounds, 10 of 100 clients a round, on a
**reduced ResNet18**: the same CIFAR ResNet18 (21 layers under ``conv_bn`` grouping, the
same order and kinds) with every width divided by ``--width-divisor`` (default 16:
channels 4/8/16/32, ~44 k parameters; the convolutions' relative sizes are ResNet18's,
the stem and FC relatively larger), so a run takes minutes on 2 cores. The server's
decisions (which layers each selected client downloads, which it uploads) are recorded
and **the bytes are counted at the full ResNet18's layer sizes** (4 bytes per parameter
of each conv_bn layer; 44,695,848 B the whole model), per round, summed over the
selected clients, in MiB (the paper's "MB" are MiB: 10 x 42.63 MiB = 426.3). Which
layers exceed mu depends on the relations the reduced model learns on the stand-in data,
not on a CIFAR-trained ResNet18: the shape (down vs up per mu) is what this shows, not
the paper's numbers.

    nice -n 15 python benchmarks/papers/kapc_table3_bytes.py              # ~10 runs of 100 rounds
    nice -n 15 python benchmarks/papers/kapc_table3_bytes.py --quick      # 2 rounds, seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from mecsim.agents.algorithms.base import AggregateStats, ClientResult, ClientTask
from mecsim.agents.algorithms.kapc import KapcBlsClient, KapcBlsServer, param_view
from mecsim.agents.models import BYTES_PER_ELEMENT, ResNet18, _BasicBlock, build_model, model_layout
from mecsim.registry import register, registry
from mecsim.run.loop import run
from mecsim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
PAPER = {  # Table 3: mu -> (U-Comm, D-Comm) MB per round
    0.3: (387.29, 163.64),
    0.5: (380.70, 251.10),
    0.7: (380.88, 327.48),
    0.9: (373.94, 425.58),
}

#: (round, client, downloaded layers, uploaded layers) of every KapcBlsRecorded run, in order
DECISIONS: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []


class NarrowResNet18(ResNet18):
    """The CIFAR ResNet18 of :mod:`mecsim.agents.models` with every width divided by
    ``divisor``: the same 41 parameterised modules (21 conv_bn layers) in the same order."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, divisor: int = 8) -> None:
        nn.Module.__init__(self)
        w = [max(1, c // divisor) for c in (64, 128, 256, 512)]
        self.conv1 = nn.Conv2d(in_channels, w[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w[0])
        blocks: list[nn.Module] = []
        in_planes = w[0]
        for planes, stride in zip(w, (1, 2, 2, 2), strict=True):
            for s in (stride, 1):
                blocks.append(_BasicBlock(in_planes, planes, s))
                in_planes = planes
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(w[3], num_classes)


class KapcBlsRecorded(KapcBlsServer):
    """KAPC+BLS's server, unchanged, recording which layers each client downloads and
    uploads (read by :func:`account`)."""

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        tasks = super().configure_fit(rnd, selected)
        self._sent = {t.client_id: tuple(t.config["layers"]) for t in tasks}
        return tasks

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        for r in results:
            up = tuple(r.extra["layers"]) if r.weights is not None else ()
            DECISIONS.append((rnd, r.client_id, self._sent.get(r.client_id, ()), up))
        return super().aggregate_fit(rnd, results)


def resnet18_layer_bytes() -> np.ndarray:
    """Bytes of each of the full ResNet18's 21 conv_bn layers (its trainable parameters)."""
    layout = model_layout(build_model("resnet18", (3, 32, 32), 10))
    return param_view(layout, "conv_bn").numel() * BYTES_PER_ELEMENT


def account(
    decisions: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]], layer_bytes: np.ndarray
) -> dict[str, float]:
    """MiB downloaded and uploaded per round (summed over a round's clients, mean over
    rounds) at ``layer_bytes``, and the mean layers per selected client."""
    rounds = sorted({d[0] for d in decisions})
    down = {r: 0 for r in rounds}
    up = {r: 0 for r in rounds}
    for rnd, _, sent, uploaded in decisions:
        down[rnd] += int(layer_bytes[list(sent)].sum()) if sent else 0
        up[rnd] += int(layer_bytes[list(uploaded)].sum()) if uploaded else 0
    return {
        "rounds": len(rounds),
        "mib_down": float(np.mean([down[r] for r in rounds])) / MiB,
        "mib_up": float(np.mean([up[r] for r in rounds])) / MiB,
        "layers_down": float(np.mean([len(d[2]) for d in decisions])),
        "layers_up": float(np.mean([len(d[3]) for d in decisions])),
    }


def ensure_registered(divisor: int) -> str:
    name = f"resnet18_div{divisor}"
    if name not in registry("model"):
        register(
            "model",
            name,
            lambda in_shape, classes: NarrowResNet18(in_shape[0], classes, divisor),
        )
    if "kapc_bls_recorded" not in registry("algorithm"):
        register("algorithm", "kapc_bls_recorded", (KapcBlsRecorded, KapcBlsClient))
    return name


def run_one(
    scenario_path: Path,
    model: str,
    params: dict[str, Any],
    *,
    rounds: int,
    seed: int,
    overrides: dict[str, Any],
) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
    """One in-process run without records; the recorded decisions."""
    data = load_scenario(scenario_path).model_dump(mode="json")
    data.update(rounds=rounds, seed=seed)
    data["model"] = {**data["model"], "name": model}
    data["algorithm"] = {"name": "kapc_bls_recorded", "params": params}
    data["execution"]["backend"] = "local"
    data["metrics"]["enabled"] = False
    data["evaluation"] = {**data["evaluation"], "every": rounds}  # accuracy is not the point
    data["checkpoint"] = {**data.get("checkpoint", {}), "every": 0}
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    scenario = scenario_from_dict(data, f"{scenario_path} [{model}, {params}]")
    DECISIONS.clear()
    run(scenario, "kapc-table3-bytes")
    return list(DECISIONS)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=str(ROOT / "scenarios" / "kapc-cifar10-system.yaml"))
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--mus", nargs="+", type=float, default=list(PAPER))
    p.add_argument(
        "--policies", nargs="+", default=["algorithm5", "uploaded_only"], help="download_policy"
    )
    p.add_argument("--width-divisor", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kapc-params", default="{}", help="JSON of more kapc_bls parameters")
    p.add_argument("--out", help="write the table as JSON here too")
    p.add_argument(
        "--quick", action="store_true", help="2 rounds, mu 0.3: that it runs (both policies)"
    )
    args = p.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.quick:
        args.rounds, args.mus = 2, [0.3]
    model = ensure_registered(args.width_divisor)
    layer_bytes = resnet18_layer_bytes()
    extra = json.loads(args.kapc_params)
    rows: list[dict[str, Any]] = []
    print(
        f"KAPC+BLS, {args.rounds} rounds, ResNet18 / {args.width_divisor} trained, bytes at "
        f"ResNet18's layer sizes ({int(layer_bytes.sum()):,} B a model), seed {args.seed}",
        flush=True,
    )
    header = (
        "| download_policy | mu | MiB up / round | MiB down / round | down / up | "
        "layers down | layers up | paper: up / down (MB) |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---|"]
    for policy in args.policies:
        for mu in args.mus:
            start = time.perf_counter()
            params = {**extra, "mu": mu, "download_policy": policy}
            decisions = run_one(
                Path(args.scenario),
                model,
                params,
                rounds=args.rounds,
                seed=args.seed,
                overrides=overrides,
            )
            row = {"download_policy": policy, "mu": mu, **account(decisions, layer_bytes)}
            rows.append(row)
            paper = PAPER.get(mu)
            ref = f"{paper[0]:.2f} / {paper[1]:.2f}" if paper else "-"
            lines.append(
                f"| {policy} | {mu:g} | {row['mib_up']:.2f} | {row['mib_down']:.2f} | "
                f"{row['mib_down'] / row['mib_up']:.3f} | {row['layers_down']:.2f} | "
                f"{row['layers_up']:.2f} | {ref} |"
            )
            print(
                f"  {policy} mu={mu:g}: {time.perf_counter() - start:.0f} s host",
                file=sys.stderr,
                flush=True,
            )
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
