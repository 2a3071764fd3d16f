"""Local (standalone) training: every client trains its own model and shares nothing.

The baseline of every source paper: nothing is downloaded or uploaded, the server does no
work, and each client is evaluated on its own model.
"""

from __future__ import annotations

import time

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EvalResult,
    ServerAlgorithm,
    local_sgd,
    trained_result,
)
from mecsim.agents.models import get_flat, set_flat


class LocalServer(ServerAlgorithm):
    name = "local"

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        return [ClientTask(c, None, 0) for c in selected]

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        return AggregateStats(flops=0.0)

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        return [ClientTask(c, None, 0) for c in clients]  # each client's own model


class LocalClient(ClientAlgorithm):
    name = "local"

    def _load_own(self, ctx: ClientContext) -> None:
        own = ctx.state.get("weights")
        set_flat(ctx.model, ctx.layout, ctx.init_weights if own is None else own)

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        self._load_own(ctx)
        stats = local_sgd(ctx, cost_key=self.name)
        ctx.state["weights"] = get_flat(ctx.model, ctx.layout)
        return trained_result(
            ctx, stats, weights=None, upload_nbytes=0, download_nbytes=0, started_at=start
        )

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> EvalResult:
        self._load_own(ctx)
        return super().evaluate(ctx, ClientTask(ctx.client_id, None, 0))


#: registered as ``local`` (:data:`mecsim.registry.ALGORITHMS`)
LOCAL = (LocalServer, LocalClient)
