"""The engine's closed form: a round with nothing shared, solved with numpy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, cast

import numpy as np

from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    RateSchedule,
    _timelines,
)
from mecsim.emulation.ops import (
    Compute,
    Download,
    OpTrace,
    Upload,
)

# Op types the closed form covers, and the column of each in its per-kind time table.
# Exact types only: a subclass (or any op type added later) goes to the SimPy model.
_CLOSED_FORM_KIND: dict[type, int] = {Download: 0, Compute: 1, Upload: 2}


def _closed_form_timelines(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    network: NetworkSpec,
) -> tuple[ClientTimeline, ...] | None:
    """Per-client timelines without SimPy, or None when the round needs the SimPy model.

    Applies when nothing is shared: no shared medium, no edge-server compute, constant
    rates, and only Download / Compute / Upload ops. Then each client's clock is the sum
    of its op durations. Clients with the same sequence of op kinds are stacked into numpy
    arrays and advanced together, one op at a time, with the arithmetic of the SimPy
    model in the same order (clock ``now + delay``, per-kind time += clock difference,
    an op that never ends leaves the client stuck at ``inf``), so the result is equal to
    the SimPy model's bit for bit (``tests/test_engine_closed_form.py`` checks it on
    random rounds).
    """
    if network.uplink_shared or network.downlink_shared:
        return None
    ids = list(traces)
    groups: dict[tuple[type, ...], list[int]] = {}  # sequence of op types -> positions
    for pos, cid in enumerate(ids):
        spec = clients[cid]
        if spec.client_id != cid:
            raise ValueError(f"clients[{cid}] has client_id {spec.client_id}")
        if isinstance(spec.uplink_rate_bps, RateSchedule) or isinstance(
            spec.downlink_rate_bps, RateSchedule
        ):
            return None
        groups.setdefault(tuple(map(type, traces[cid])), []).append(pos)
    if any(t not in _CLOSED_FORM_KIND for types in groups for t in types):
        return None

    finish_s = np.zeros(len(ids))
    spent_s = np.zeros((len(ids), 3))  # download, compute, upload
    for types, positions in groups.items():
        kinds = tuple(_CLOSED_FORM_KIND[t] for t in types)
        rows = [traces[ids[p]] for p in positions]
        specs = [clients[ids[p]] for p in positions]
        finish_s[positions], spent_s[positions] = _advance_group(kinds, rows, specs)

    return _timelines(ids, finish_s, spent_s, network.deadline_s)


class _ConstantRates(Protocol):
    """A ClientSpec whose rates are constants (no RateSchedule: the closed form's rounds)."""

    @property
    def uplink_rate_bps(self) -> float: ...

    @property
    def downlink_rate_bps(self) -> float: ...


def _advance_group(
    kinds: tuple[int, ...], rows: list[OpTrace], specs: list[ClientSpec]
) -> tuple[np.ndarray, np.ndarray]:
    """(finish_s, per-kind seconds) of clients sharing one sequence of op kinds."""
    m = len(rows)
    rates = cast("list[_ConstantRates]", specs)  # _closed_form_timelines left out schedules
    down_bps = np.array([float(s.downlink_rate_bps) for s in rates])
    up_bps = np.array([float(s.uplink_rate_bps) for s in rates])
    down_lat_s = np.array([float(s.downlink_latency_s) for s in specs])
    up_lat_s = np.array([float(s.uplink_latency_s) for s in specs])
    overhead_s = np.array([float(s.step_overhead_s) for s in specs])
    flops_per_s = np.array([float(s.flops_per_s) for s in specs])
    now_s, spent_s = np.zeros(m), np.zeros((m, 3))
    stuck, stuck_kind = np.zeros(m, dtype=bool), np.zeros(m, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for k, kind in enumerate(kinds):
            if kind == 1:  # Device.run
                work = cast("list[tuple[Compute, ...]]", rows)  # column k holds Compute ops
                flops = np.array([float(r[k].flops) for r in work])
                batches = np.array([float(r[k].batches) for r in work])
                flop_s = np.where(flops_per_s > 0, flops / flops_per_s, np.inf)
                delay_s = batches * overhead_s + np.where(flops > 0, flop_s, 0.0)
                delay_s = np.where(delay_s > 0, delay_s, 0.0)
            else:  # DedicatedLink.transfer
                sent = cast("list[tuple[Download | Upload, ...]]", rows)  # column k: transfers
                nbits = 8.0 * np.array([float(r[k].nbytes) for r in sent])
                rate, lat_s = (down_bps, down_lat_s) if kind == 0 else (up_bps, up_lat_s)
                delay_s = np.where(nbits > 0, np.where(rate > 0, nbits / rate + lat_s, np.inf), 0.0)
            blocked = np.isinf(delay_s) & ~stuck
            stuck_kind[blocked] = kind
            stuck |= blocked
            new_s = np.where(stuck, now_s, now_s + delay_s)
            spent_s[:, kind] += new_s - now_s
            now_s = new_s
    now_s[stuck] = np.inf
    spent_s[stuck, stuck_kind[stuck]] = np.inf
    return now_s, spent_s
