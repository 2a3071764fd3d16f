"""Step 3 of a round, "time": the round's network drawn, the emulated faults applied, the
op-traces played through the engine. The run loop (:mod:`mecsim.run.round`) and replay
(:mod:`mecsim.analysis.replay`) both time a round with :func:`emulate_round`, so a replay
with no override gives the recorded times to the bit.
"""

from __future__ import annotations

import dataclasses
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
from mecsim.emulation.interference import SAME_START_RTOL, InstantUplink
from mecsim.emulation.network import NetworkModel
from mecsim.emulation.ops import OpTrace, Upload

#: a round is solved at most this many times for per-instant interference (until the
#: uploads start where the solution before had them: twice for op-traces whose upload is
#: their last op)
INSTANT_PASSES = 4


@dataclass(frozen=True)
class EmulatedRound:
    """A round's network as the engine sees it, after the emulated faults."""

    specs: dict[int, ClientSpec]  # per selected client, in selection order
    servers: list[ServerSpec]
    network: NetworkSpec
    failed: frozenset[int]  # crashed or dropped out: timed as they ran, never completed
    wait_for: int | None  # the server aggregates once this many have completed
    channel_rows: dict[int, dict[str, Any]]  # per client: the draws (empty: not asked)
    #: per-instant uplink interference: the round's uplinks, solved by :meth:`time`
    instant: InstantUplink | None = None
    # the last traces timed and their solution: timing the same traces again (after the
    # aggregation, with its time) only summarises them again
    _solved: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def time(self, traces: Mapping[int, OpTrace], aggregate_s: float = 0.0) -> RoundTiming:
        """The round's timelines and critical path; ``aggregate_s`` is the server's
        aggregation time (0 before it is known). Timing the same ``traces`` object again
        (unchanged) reuses its timelines."""
        last = self._solved.get("last")
        if last is None or last[0] is not traces:
            if self.instant is None:
                solved = solve_round(traces, self.specs, self.servers, self.network)
            else:
                solved = self._solve_instant(traces, self.instant)
            last = (traces, solved)
            self._solved["last"] = last
        return last[1].timing(aggregate_s, failed=self.failed, wait_for=self.wait_for)

    def timed_specs(self) -> Mapping[int, ClientSpec]:
        """The specs the last :meth:`time` timed: :attr:`specs`, or, under per-instant
        interference, with each uplink's rate schedule (what its energy is charged by)."""
        specs: Mapping[int, ClientSpec] = self._solved.get("specs", self.specs)
        return specs

    def _solve_instant(self, traces: Mapping[int, OpTrace], instant: InstantUplink) -> SolvedRound:
        """The round with per-instant uplink interference: solved with the per-round
        rates, each upload's start read off it (a client's upload must be its trace's
        last op), the uploads solved exactly from those starts
        (:meth:`InstantUplink.rates`), each client's uplink given its rate as a schedule
        (clients that move: the solution's end, :class:`InstantRate`), and the round
        solved again, until the uploads start where the solution before had
        them (at once for traces whose upload is their last op)."""
        specs = self.specs
        order = [int(c) for c in instant.clients]
        nbits = np.zeros(len(order))
        for i, cid in enumerate(order):
            trace = traces.get(cid, ())
            uploads = [k for k, op in enumerate(trace) if isinstance(op, Upload)]
            if uploads and (len(uploads) > 1 or uploads[0] != len(trace) - 1):
                raise ValueError(
                    "channel.interference.timing: instant needs each client's upload to be "
                    f"the last op of its trace; client {cid}'s trace has {len(uploads)} "
                    f"upload(s), the first at op {uploads[0]} of {len(trace)}: use timing: round"
                )
            if uploads:
                last_op = trace[-1]
                assert isinstance(last_op, Upload)
                nbits[i] = 8.0 * float(last_op.nbytes)
        before: tuple[np.ndarray, np.ndarray] | None = None
        for _ in range(INSTANT_PASSES):
            solved = solve_round(traces, specs, self.servers, self.network)
            timelines = {c.client_id: c for c in solved.timing(0.0).clients}
            starts = np.full(len(order), np.nan)
            # a start read off as finish − duration is a few ulps of the finish off
            tol_s = np.zeros(len(order))
            for i, cid in enumerate(order):
                tl = timelines.get(cid)
                if nbits[i] > 0 and tl is not None and np.isfinite(tl.finish_s):
                    starts[i] = tl.finish_s - tl.upload_s
                    tol_s[i] = SAME_START_RTOL * max(1.0, abs(tl.finish_s))
            if before is not None and _settled((starts, tol_s), before, instant.motion is not None):
                self._solved["specs"] = specs
                return solved
            rates = instant.rates(starts, nbits, tol_s)
            specs = dict(specs)
            for cid, rate in zip(order, rates, strict=True):
                if cid in specs:
                    specs[cid] = dataclasses.replace(specs[cid], uplink_rate_bps=rate)
            before = (starts, tol_s)
        raise ValueError(
            "channel.interference.timing: instant: the uploads' starts did not settle in "
            f"{INSTANT_PASSES} solutions of the round; use timing: round"
        )


def _settled(
    now: tuple[np.ndarray, np.ndarray], before: tuple[np.ndarray, np.ndarray], walkers: bool
) -> bool:
    """Do the uploads start where the solution before had them? ``(starts, tolerances)``
    of each: the same numbers; with clients that move, within the tolerances
    (:data:`SAME_START_RTOL` of each finish the start was read off, as finish −
    duration: a few ulps), for which a walker's :class:`InstantRate` answers the upload
    solved: solving again would give the same ends but for those ulps."""
    (a, tol_a), (b, tol_b) = now, before
    if np.array_equal(a, b, equal_nan=True):
        return True
    if not walkers or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    on = ~np.isnan(a)
    return bool(np.all(np.abs(a[on] - b[on]) <= np.maximum(tol_a[on], tol_b[on])))


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
        network.instant_uplink,
    )
