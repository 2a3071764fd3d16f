"""Where KAPC+BLS's upload criterion (TMC Eq. 29) holds, layer by layer, on a real model.

Trains ``--clients`` copies of a model from one initialisation for ``--steps`` SGD steps
on label-skewed parts of the embedded data (client c keeps the labels = c mod clients),
takes client 0's parameters w and its regulariser s = the mean of the clients' (KAPC's
s_i with equal relations), and prints for every Omega = 1 .. L:

* ``printed``: log(left side / right side) of Eq. 29 as printed (it holds where < 0);
* ``geometric``: the per-layer geometric-mean reading of Definition 1,
  (1/Omega) log E_partial(Omega) - (1/L) log E_full with the bounds of Theorems 3-4
  (it holds where < 0);

and the Omega that Algorithm 4 returns on a repeat selection started from L - 1 under
each reading (``last_holding`` search), beside ``omega_policy: withhold_last`` (L - 2).
Both readings are computed with the bounds B^l = ||w^l|| (Eq. 30), tau^l = ||w^l - s^l||
(Eq. 31), n^l / d^l of each layer's weight and c = 10 classes.

    nice -n 10 python benchmarks/papers/kapc_omega.py --model resnet18 --steps 6
    nice -n 10 python benchmarks/papers/kapc_omega.py --model kapc_cnn --steps 20 --grouping module
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from mecsim.agents.algorithms.kapc import (
    BlsConstants,
    criterion_log_lhs,
    layer_norms,
    log_m,
    param_view,
    search_omega,
)
from mecsim.agents.models import build_model, get_flat, model_layout, set_flat
from mecsim.data import load_dataset, normalise


def geometric(omega: int, tau: np.ndarray, b: np.ndarray, k: BlsConstants) -> float:
    """(1/Omega) log E(Omega) - (1/L) log E(L), E from Theorems 3 and 4 without the
    confidence term: E(Omega) = 2 sqrt2 rho A / sqrt m * d_Omega 2^Omega prod B M(Omega)."""
    n_layers = len(b)
    lead = math.log(2 * math.sqrt(2) * k.rho * k.input_bound / math.sqrt(k.samples))

    def log_e(om: int) -> float:
        width = k.classes if om == n_layers else int(k.out_dim[om - 1])
        return (
            lead
            + math.log(width)
            + om * math.log(2)
            + float(np.log(b[:om]).sum())
            + log_m(tau, b, k.n_cols, om)
        )

    return log_e(omega) / omega - log_e(n_layers) / n_layers


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--grouping", default="conv_bn", choices=["conv_bn", "module"])
    p.add_argument("--steps", type=int, default=6, help="SGD steps per client")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: the small kapc_cnn, 2 clients, 2 steps",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.grouping, args.clients, args.steps = "kapc_cnn", "module", 2, 2
    torch.manual_seed(args.seed)
    three = args.model in ("resnet18", "mtfl_cnn")
    shape = (3, 32, 32) if three else (1, 28, 28)
    model = build_model(args.model, shape, 10)
    layout = model_layout(model)
    init = get_flat(model, layout)
    data = "mnist-embedded-3x32" if three else "mnist-embedded"
    pools = load_dataset(data, None, 600, 100, np.random.default_rng(args.seed))
    x = normalise(pools.train.images, data)
    y = torch.from_numpy(pools.train.labels).long()
    weights = []
    for c in range(args.clients):
        set_flat(model, layout, init)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        idx = (y % args.clients == c).nonzero().flatten()[:60]
        for _ in range(args.steps):
            batch = idx[torch.randperm(len(idx))[:10]]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
        weights.append(get_flat(model, layout))
    view = param_view(layout, args.grouping)
    params = [view.extract(w).astype(np.float64) for w in weights]
    s = np.mean(params, axis=0)
    b = layer_norms(params[0], view)
    tau = np.array(
        [
            np.linalg.norm(view.layer(params[0], layer) - view.layer(s, layer))
            for layer in range(view.num_layers)
        ]
    )
    n_layers = view.num_layers
    bound = float(x.flatten(1).norm(dim=1).max())
    k = BlsConstants(view.in_cols, view.out_dim, 10, 60, 1.0, bound)
    printed = [criterion_log_lhs(om, tau, b, tau, b, k) for om in range(1, n_layers + 1)]
    geo = [geometric(om, tau, b, k) for om in range(1, n_layers + 1)]
    print(
        f"{args.model}, {args.grouping}: {n_layers} layers, {args.clients} clients x "
        f"{args.steps} SGD steps, seed {args.seed}"
    )
    print(
        "| Omega | n^l | d^l | B^l | tau^l / B^l | printed: log(lhs/rhs) | geometric: log ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for om in range(1, n_layers + 1):
        i = om - 1
        print(
            f"| {om} | {view.in_cols[i]} | {view.out_dim[i]} | {b[i]:.3f} "
            f"| {tau[i] / b[i]:.4f} | {printed[i]:.2f} | {geo[i]:.3f} |"
        )
    for name, values in (("printed", printed), ("geometric", geo)):
        chosen = search_omega(n_layers - 1, lambda om, v=values: v[om - 1] < 0.0, n_layers)
        holds = [om for om in range(1, n_layers + 1) if values[om - 1] < 0.0]
        where = holds if len(holds) < 8 else f"{holds[:3]} ... {holds[-3:]}"
        print(
            f"{name}: holds at Omega in {where}; Algorithm 4 from Omega = L - 1 = "
            f"{n_layers - 1} returns {chosen}"
        )
    print(f"withhold_last (2): Omega = {max(n_layers - 2, 1)} on every repeat selection")


if __name__ == "__main__":
    main()
