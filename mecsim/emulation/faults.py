"""Emulated faults: crashes, drop-outs, stragglers, link and edge-server outages.

A scenario's ``faults:`` section (:class:`mecsim.scenario.FaultsConfig`) describes what
goes wrong on the emulated testbed. Every draw comes from the scenario seed: per run
(which clients straggle, and by how much) and per round (which selected clients crash,
drop out or lose their link), so a faulted run is reproducible and replayable.

What each fault does to a client-round, and the ``status`` recorded for it:

- ``outage`` — the client's link is down for the whole round (``outage_prob``): it
  cannot receive the model, so it does not train, and it is not aggregated. A client
  whose transfer can never end (a link at 0 b/s for ever, a trace, an outage interval
  that outlasts the round) is also an ``outage``; round times stay finite.
- ``crashed`` — the device crashes during local training (``crash_prob``), at a point
  drawn uniformly in its computation: its op-trace ends there, its work and any change
  to its private state are lost (the host restores the state it had), nothing is
  uploaded.
- ``dropped_out`` — the client trains (its private state advances) but leaves before
  uploading (``dropout_prob``): its op-trace ends before its last upload.
- stragglers — a ``straggler.fraction`` of the clients (drawn once) compute
  ``slowdown`` times slower (a factor drawn once per client, uniform in the range).
- link outages — intervals of emulated time (since the run started) during which the
  links of some clients (``link_outages``) or of every client of an edge server
  (``edge_server_outages``: its radio is down) carry 0 b/s.
- ``dropped_deadline`` — late for the round's deadline, or, with ``wait_for_fraction``
  below 1, later than the first ceil(q*K) of the K selected clients to deliver (the
  server aggregates without them, as MTFL's step 5).

The round completes with the survivors. Replay re-applies the same link faults and
stragglers (they are part of the scenario) and the recorded crashes and drop-outs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mecsim.emulation.engine import ClientSpec, RateSchedule, TimeVaryingRate
from mecsim.emulation.ops import Compute, Download, Op, OpTrace, Upload

if TYPE_CHECKING:
    from mecsim.scenario import EdgeServerOutage, FaultsConfig, LinkOutage

_FAULT_STREAM = 7  # the scenario seed's stream for fault draws

STATUSES = (
    "completed",
    "dropped_deadline",
    "crashed",
    "dropped_out",
    "outage",
    "rejected_nonfinite",
)


@dataclass(frozen=True)
class RoundFaults:
    """The faults drawn for one round's selected clients."""

    outage: frozenset[int] = frozenset()  # link down for the whole round
    crash_at: Mapping[int, float] = field(default_factory=dict)  # fraction of compute done
    dropout: frozenset[int] = frozenset()

    @property
    def failed(self) -> dict[int, str]:
        """Clients whose round ends in failure whatever the timing: id -> status."""
        out = dict.fromkeys(self.crash_at, "crashed")
        out.update(dict.fromkeys(self.dropout, "dropped_out"))
        return out


def draws_any(cfg: FaultsConfig | None) -> bool:
    """Can :func:`draw_round` draw a fault (an outage, crash or drop-out) for any round?"""
    return cfg is not None and (cfg.outage_prob > 0 or cfg.crash_prob > 0 or cfg.dropout_prob > 0)


def active(cfg: FaultsConfig | None) -> bool:
    """Does this ``faults`` configuration inject anything?"""
    return cfg is not None and (
        cfg.crash_prob > 0
        or cfg.dropout_prob > 0
        or cfg.outage_prob > 0
        or (cfg.straggler is not None and cfg.straggler.fraction > 0)
        or bool(cfg.link_outages)
        or bool(cfg.edge_server_outages)
        or cfg.wait_for_fraction < 1
    )


def draw_round(cfg: FaultsConfig | None, seed: int, rnd: int, selected: list[int]) -> RoundFaults:
    """Which of ``selected`` suffer an outage, a crash (and where) or a drop-out this
    round. One draw of each kind per selected client in selection order, so adding a
    kind of fault leaves the others' draws unchanged; precedence outage > crash >
    drop-out."""
    if cfg is None or not selected:
        return RoundFaults()
    rng = np.random.default_rng([seed, _FAULT_STREAM, 1, rnd])
    k = len(selected)
    u_outage, u_crash, u_point, u_drop = (rng.random(k) for _ in range(4))
    outage, crash_at, dropout = set(), {}, set()
    for i, cid in enumerate(selected):
        if u_outage[i] < cfg.outage_prob:
            outage.add(cid)
        elif u_crash[i] < cfg.crash_prob:
            crash_at[cid] = float(u_point[i])
        elif u_drop[i] < cfg.dropout_prob:
            dropout.add(cid)
    return RoundFaults(frozenset(outage), crash_at, frozenset(dropout))


def slowdown_factors(cfg: FaultsConfig | None, seed: int, n_clients: int) -> np.ndarray:
    """Per-client compute slow-down (1.0: none), drawn once per run."""
    factors = np.ones(n_clients)
    st = None if cfg is None else cfg.straggler
    if st is None or st.fraction <= 0:
        return factors
    rng = np.random.default_rng([seed, _FAULT_STREAM, 0])
    lo, hi = (st.slowdown, st.slowdown) if isinstance(st.slowdown, (int, float)) else st.slowdown
    k = int(round(st.fraction * n_clients))
    who = rng.choice(n_clients, size=k, replace=False) if k else np.array([], dtype=int)
    draws = rng.uniform(lo, hi, size=k)
    factors[who] = draws
    return factors


def _down_intervals(
    cfg: FaultsConfig, cid: int, edge_server: int, direction: str, round_start_s: float
) -> list[tuple[float, float]]:
    """Outage intervals of one link, in seconds since the round started (may be < 0)."""
    out = []
    o: LinkOutage | EdgeServerOutage
    for o in cfg.link_outages:
        if (o.clients == "all" or cid in o.clients) and o.direction in ("both", direction):
            out.append((o.start_s - round_start_s, o.start_s + o.duration_s - round_start_s))
    for o in cfg.edge_server_outages:
        if o.edge_server == edge_server:
            out.append((o.start_s - round_start_s, o.start_s + o.duration_s - round_start_s))
    return [(a, b) for a, b in out if b > 0]


def with_outages(
    rate: float | TimeVaryingRate, intervals: Iterable[tuple[float, float]]
) -> float | TimeVaryingRate:
    """``rate`` (b/s, or a schedule from t=0) with 0 b/s during each interval [a, b)."""
    cuts = sorted((max(a, 0.0), b) for a, b in intervals if b > max(a, 0.0))
    if not cuts:
        return rate
    if isinstance(rate, TimeVaryingRate) and not isinstance(rate, RateSchedule):
        return rate.with_outages(cuts)  # a moving client's link: it integrates around them
    sched = rate if isinstance(rate, RateSchedule) else RateSchedule((0.0,), (float(rate),))
    times = set(sched.times_s) | {t for ab in cuts for t in ab if math.isfinite(t)}
    out_t: list[float]
    out_r: list[float]
    out_t, out_r = [], []
    for t in sorted(times):
        if any(a <= t < b for a, b in cuts):
            r = 0.0
        else:
            k = int(np.searchsorted(sched.times_s, t, side="right")) - 1
            r = sched.rates_bps[k]
        if out_r and out_r[-1] == r:
            continue
        out_t.append(t)
        out_r.append(r)
    return RateSchedule(tuple(out_t), tuple(out_r))


def apply_to_specs(
    specs: Mapping[int, ClientSpec],
    cfg: FaultsConfig | None,
    factors: np.ndarray,
    round_start_s: float,
    outage: Iterable[int] = (),
) -> dict[int, ClientSpec]:
    """The round's client specs with stragglers slowed down, and links at 0 b/s for the
    clients in ``outage`` (whole round) and during the configured outage intervals."""
    if cfg is None:
        return dict(specs)
    down_all = set(outage)
    out = {}
    for cid, spec in specs.items():
        f = float(factors[cid])
        up, down = spec.uplink_rate_bps, spec.downlink_rate_bps
        if cid in down_all:
            up, down = 0.0, 0.0
        else:
            up = with_outages(
                up, _down_intervals(cfg, cid, spec.edge_server, "uplink", round_start_s)
            )
            down = with_outages(
                down, _down_intervals(cfg, cid, spec.edge_server, "downlink", round_start_s)
            )
        out[cid] = dataclasses.replace(
            spec,
            uplink_rate_bps=up,
            downlink_rate_bps=down,
            step_overhead_s=spec.step_overhead_s * f,
            flops_per_s=spec.flops_per_s / f,
        )
    return out


def crash_trace(trace: OpTrace, fraction: float) -> OpTrace:
    """The op-trace of a client that crashed after ``fraction`` of its computation: the
    ops before that point, and the part of the Compute op it was in."""
    total = sum(op.flops for op in trace if isinstance(op, Compute))
    budget = fraction * total
    out: list[Op] = []
    for op in trace:
        if isinstance(op, Compute):
            if op.flops >= budget:
                part = budget / op.flops if op.flops > 0 else 0.0
                out.append(Compute(op.flops * part, int(op.batches * part), op.what))
                return tuple(out)
            budget -= op.flops
        out.append(op)
    return tuple(out)


def dropout_trace(trace: OpTrace) -> OpTrace:
    """The op-trace of a client that left before its last upload."""
    last = max((i for i, op in enumerate(trace) if isinstance(op, Upload)), default=None)
    return tuple(trace) if last is None else tuple(trace[:last])


def outage_trace(download_nbytes: int) -> OpTrace:
    """What a client whose link is down all round does: wait for a download that never
    comes (its links are at 0 b/s)."""
    return (Download(max(1, int(download_nbytes))),)


def wait_for_count(cfg: FaultsConfig | None, selected: int) -> int | None:
    """How many of the selected clients the server waits for (None: all of them)."""
    if cfg is None or cfg.wait_for_fraction >= 1:
        return None
    return max(1, math.ceil(cfg.wait_for_fraction * selected))
