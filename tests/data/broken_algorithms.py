"""Deliberately broken algorithms, for the conformance kit's own tests
(``tests/integration/test_conformance.py``): a plugin file (``mecsim check NAME --plugin FILE``).

Each is FedAvg with one promise broken, and the kit must name the property it breaks:

``broken_global_rng``
    adds noise drawn from numpy's global random generator, never seeded from
    ``ctx.generator``: two runs with one seed differ (``determinism``);
``broken_hidden_state``
    says its clients keep no state (``keeps_no_state = True``, so they may be lent to
    other hosts) but counts its rounds in ``ctx.state`` (``movable``);
``broken_upload_bytes``
    uploads the whole model but charges half of its bytes (``optraces``).
"""

from __future__ import annotations

import time

import numpy as np

from mecsim.api import (
    ALGORITHMS,
    ClientContext,
    ClientResult,
    ClientTask,
    get_flat,
    local_sgd,
    register,
    set_flat,
    trained_result,
)

FedAvgServer, FedAvgClient = ALGORITHMS.get("fedavg")


class GlobalRngClient(FedAvgClient):
    """Noise from np.random's global state: not the client's seeded generator."""

    name = "broken_global_rng"
    keeps_no_state = True

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        result = super().fit(ctx, task)
        assert result.weights is not None
        noise = np.random.normal(0.0, 1e-4, size=result.weights.shape)  # the bug
        result.weights = (result.weights + noise).astype(np.float32)
        return result


class HiddenStateClient(FedAvgClient):
    """Claims to keep nothing between rounds, and keeps a count."""

    name = "broken_hidden_state"
    keeps_no_state = True  # the lie

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        ctx.state["rounds_trained"] = int(ctx.state.get("rounds_trained", 0)) + 1  # the bug
        return super().fit(ctx, task)


class UnderReportingClient(FedAvgClient):
    """Sends the whole model, charges half of it."""

    name = "broken_upload_bytes"
    keeps_no_state = True

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        assert task.weights is not None
        set_flat(ctx.model, ctx.layout, task.weights)
        stats = local_sgd(ctx, cost_key=self.name)
        weights = get_flat(ctx.model, ctx.layout)
        return trained_result(
            ctx,
            stats,
            weights=weights,
            upload_nbytes=weights.nbytes // 2,  # the bug
            download_nbytes=task.download_nbytes,
            started_at=start,
        )


register("algorithm", "broken_global_rng", (FedAvgServer, GlobalRngClient))
register("algorithm", "broken_hidden_state", (FedAvgServer, HiddenStateClient))
register("algorithm", "broken_upload_bytes", (FedAvgServer, UnderReportingClient))
