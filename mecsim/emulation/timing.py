"""Step 3 of a round, "time": the round's network drawn, the emulated faults applied, the
op-traces played through the engine. The run loop (:mod:`mecsim.run.round`) and replay
(:mod:`mecsim.analysis.replay`) both time a round with :func:`emulate_round`, so a replay
with no override gives the recorded times to the bit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mecsim.emulation import faults
from mecsim.emulation.engine import (
    ClientSpec,
    NetworkSpec,
    RoundTiming,
    ServerSpec,
    SolvedRound,
    solve_round,
)
from mecsim.emulation.network import NetworkModel
from mecsim.emulation.ops import OpTrace


@dataclass(frozen=True)
class EmulatedRound:
    """A round's network as the engine sees it, after the emulated faults."""

    specs: dict[int, ClientSpec]  # per selected client, in selection order
    servers: list[ServerSpec]
    network: NetworkSpec
    failed: frozenset[int]  # crashed or dropped out: timed as they ran, never completed
    wait_for: int | None  # the server aggregates once this many have completed
    channel_rows: dict[int, dict[str, Any]]  # per client: the draws (empty: not asked)
    # the last traces timed and their solution: timing the same traces again (after the
    # aggregation, with its time) only summarises them again
    _solved: dict[str, tuple[Mapping[int, OpTrace], SolvedRound]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def time(self, traces: Mapping[int, OpTrace], aggregate_s: float = 0.0) -> RoundTiming:
        """The round's timelines and critical path; ``aggregate_s`` is the server's
        aggregation time (0 before it is known). Timing the same ``traces`` object again
        (unchanged) reuses its timelines."""
        last = self._solved.get("last")
        if last is None or last[0] is not traces:
            last = (traces, solve_round(traces, self.specs, self.servers, self.network))
            self._solved["last"] = last
        return last[1].timing(aggregate_s, failed=self.failed, wait_for=self.wait_for)


def emulate_round(
    network: NetworkModel,
    faults_cfg: Any,
    slowdown: np.ndarray,
    rnd: int,
    selected: list[int],
    elapsed_s: float,
    outage: Collection[int],
    failed: Collection[int],
    *,
    records: bool = True,
) -> EmulatedRound:
    """Round ``rnd``'s network (:meth:`NetworkModel.round`: the channel drawn from the
    scenario seed and the round) with the scenario's emulated faults applied: stragglers'
    slow-down, link and edge-server outages, the clients whose link is down all round
    (``outage``) and those that failed (``failed``: crashed or dropped out), and the
    ``wait_for_fraction`` cut-off. ``records=False`` skips the channel's per-client
    records (a replay re-draws the same channel and does not need them)."""
    specs, servers, net, channel_rows = network.round(rnd, selected, elapsed_s, records=records)
    specs = faults.apply_to_specs(specs, faults_cfg, slowdown, elapsed_s, outage)
    return EmulatedRound(
        specs,
        servers,
        net,
        frozenset(failed),
        faults.wait_for_count(faults_cfg, len(selected)),
        channel_rows,
    )
