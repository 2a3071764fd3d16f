"""KAPC's relation cube layer by layer, from the last checkpoint of a recorded run.

Reads ``RUN/checkpoints/round-*.pt`` (the newest) and prints, per KAPC layer: its size
n_l, the clients' mean squared norm ||w_j^l||^2, the self-relationships r_ii^l (mean and
largest over the clients) and the size of one relation step at that state, eta_r times
the gradient of A. Eq. 11-12 over every client,
``2 lam <s_i^l - w_i^l, w_j^l> + beta (r_ij^l - 1/N)`` (median of |step| over i, j; for
comparison, an entry of a uniform row is 1/N). The first term is an inner product over the
layer's n_l parameters, so it grows with the layer's size and norm: the step moves the
relations of a large layer far (they are clamped to 0 and renormalised), those of a
small layer hardly at all.

    python benchmarks/papers/kapc_relations.py runs/kapc-table1/kapc/seed0
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import torch

from mecsim.agents.algorithms.kapc import normalise_rows, relation_gradient
from mecsim.agents.state import decode, resolve_blobs


def load_server_state(run: Path) -> tuple[dict, int]:
    ckpts = sorted(
        run.glob("checkpoints/round-*.pt"), key=lambda p: int(re.findall(r"\d+", p.name)[0])
    )
    if not ckpts:
        raise SystemExit(f"{run}: no checkpoint")
    payload = torch.load(ckpts[-1], map_location="cpu", weights_only=True)

    def blob(key: str) -> torch.Tensor:
        # weights_only=True: tensors and plain containers only, never code from the file
        return torch.load(
            run / "checkpoints" / "blobs" / f"{key}.pt", map_location="cpu", weights_only=True
        )

    server = resolve_blobs(payload["server"], blob)
    return decode(server)["algorithm"], int(payload["rounds_done"])


def quick_run() -> Path:
    """A 2-round KAPC run of the mnist-10 scenario, shrunk, in a new temporary folder."""
    import tempfile

    from mecsim.scenario import load_scenario, scenario_from_dict
    from mecsim.store.session import run_in_folder

    data = load_scenario(
        Path(__file__).resolve().parents[2] / "scenarios" / "kapc-mnist-10.yaml"
    ).model_dump(mode="json")
    data.update(rounds=2)
    data["topology"]["clients"] = 4
    data["dataset"].update(train_size=400, test_size=100)
    data["training"]["epochs"] = 1
    data["metrics"]["enabled"] = False
    data["execution"]["backend"] = "local"
    out = Path(tempfile.mkdtemp(prefix="kapc-relations-")) / "kapc"
    run_in_folder(scenario_from_dict(data, "kapc_relations --quick"), out)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, nargs="?", help="a recorded KAPC run folder")
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=0.01)
    p.add_argument("--lr-relation", type=float, default=0.01)
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: record a "
        "2-round KAPC run (4 clients, 400 images) in a temporary directory and "
        "read that",
    )
    args = p.parse_args(argv)
    if args.quick and args.run is None:
        args.run = quick_run()
    if args.run is None:
        p.error("give a run folder (or --quick)")
    state, rounds = load_server_state(args.run)
    view, ids = state["view"], state["ids"]
    params = [state["client_params"].get(c, state["init_params"]) for c in ids]
    r = normalise_rows(np.asarray(state["relations"], dtype=np.float64))
    n = len(ids)
    grams = []
    for layer in range(view.num_layers):
        x = np.stack([view.layer(q, layer) for q in params]).astype(np.float64)
        grams.append(x @ x.T)
    grams = np.stack(grams)
    steps = np.stack(
        [
            args.lr_relation * relation_gradient(r[i], grams, i, args.lam, args.beta, n)
            for i in range(n)
        ]
    )  # N x L x N
    self_rel = r[np.arange(n), :, np.arange(n)]  # N x L
    print(f"{args.run}: after {rounds} rounds, {n} clients, {view.num_layers} layers")
    print("| layer | n_l | mean ||w^l||^2 | r_ii mean | r_ii max | median |eta_r grad| |")
    print("|---:|---:|---:|---:|---:|---:|")
    for layer in range(view.num_layers):
        print(
            f"| {layer + 1} | {int(view.numel()[layer])} "
            f"| {np.mean(np.diag(grams[layer])):.3g} | {self_rel[:, layer].mean():.3f} "
            f"| {self_rel[:, layer].max():.3f} | {np.median(np.abs(steps[:, layer])):.3g} |"
        )


if __name__ == "__main__":
    main()
