"""The engine's closed form: a round with nothing shared, solved with numpy.

Two inputs are read as columns, so that re-timing the same op-traces under many
scenarios (a what-if sweep) reads each trace once: :func:`plan_traces` groups a round's
traces by their sequence of op kinds and keeps each op's size as an array (a
:class:`TracePlan`, which a replay caches per recorded round), and :class:`ClientColumns`
holds the clients' links and CPUs as arrays (a replay builds them without making a
:class:`~mecsim.emulation.engine.specs.ClientSpec` per client).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from mecsim.channel.tcp import TcpColumns
from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    TimeVaryingRate,
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
_COMPUTE = 1
_TCP_FIELDS = ("downlink_tcp", "uplink_tcp")


@dataclass(frozen=True)
class ClientColumns:
    """The clients' specs as columns, one row per client in the round's order, for rounds
    whose rates are constants (bit/s): what the closed form reads of each ClientSpec, and
    for shared media each flow's max share of its medium (None: 1.0 for every client)."""

    downlink_rate_bps: np.ndarray
    uplink_rate_bps: np.ndarray
    downlink_latency_s: np.ndarray
    uplink_latency_s: np.ndarray
    step_overhead_s: np.ndarray
    flops_per_s: np.ndarray
    downlink_max_share: np.ndarray | None = None
    uplink_max_share: np.ndarray | None = None
    #: moving clients' links (``rate: step``), timed at once: ``(links, j)``, row i's
    #: link being ``links``' link ``j[i]`` (``links.transfer_times_s(j, nbits, start_s)``,
    #: :class:`~mecsim.emulation.moving_rate.MovingLinks`); None: the rate columns
    downlink_moving: tuple[Any, np.ndarray] | None = None
    uplink_moving: tuple[Any, np.ndarray] | None = None
    #: each direction's TCP flows as columns (None: no flow adds time to a transfer)
    downlink_tcp: TcpColumns | None = None
    uplink_tcp: TcpColumns | None = None

    @classmethod
    def of(
        cls,
        specs: Sequence[ClientSpec],
        *,
        max_shares: bool = True,
        moving: dict[str, Any] | None = None,
    ) -> ClientColumns:
        """The columns of ``specs`` (their rates numbers, or every one of a direction a
        link of one batch: :func:`batch_links`); ``max_shares=False`` leaves out the max
        shares (nothing shared: not read); ``moving``: :func:`rate_batches` of ``specs``
        when the caller has it already."""
        if moving is None:
            moving = rate_batches(specs)
        if any(m is False for m in moving.values()):
            raise ValueError("ClientColumns.of: rates that are neither numbers nor one batch")
        down_moving, up_moving = (cast("tuple[Any, np.ndarray] | None", m) for m in moving.values())

        def column(name: str) -> np.ndarray:
            if moving.get(name) is not None:  # timed by the links: no rate column
                return np.full(len(specs), np.nan)
            return np.array([float(getattr(s, name)) for s in specs])

        return cls(
            column("downlink_rate_bps"),
            column("uplink_rate_bps"),
            column("downlink_latency_s"),
            column("uplink_latency_s"),
            column("step_overhead_s"),
            column("flops_per_s"),
            column("downlink_max_share") if max_shares else None,
            column("uplink_max_share") if max_shares else None,
            downlink_moving=down_moving,
            uplink_moving=up_moving,
            downlink_tcp=TcpColumns.of([s.downlink_tcp for s in specs]),
            uplink_tcp=TcpColumns.of([s.uplink_tcp for s in specs]),
        )


def rate_batches(specs: Sequence[ClientSpec]) -> dict[str, Any]:
    """:func:`batch_links` of each direction's rates of ``specs``, by rate field name."""
    return {
        name: batch_links([getattr(s, name) for s in specs])
        for name in ("downlink_rate_bps", "uplink_rate_bps")
    }


def batch_links(rates: Sequence[object]) -> tuple[Any, np.ndarray] | None | Literal[False]:
    """One direction of a round's rates: None when all are numbers; ``(links, j)`` when
    all are links of one batch (:meth:`TimeVaryingRate.batch_link`, e.g. a round's
    moving clients); False otherwise (a rate trace, outages, a mix: not as columns)."""
    if not any(isinstance(r, TimeVaryingRate) for r in rates):
        return None
    first = rates[0].batch_link() if isinstance(rates[0], TimeVaryingRate) else None
    if first is None:
        return False
    js = []
    for r in rates:
        link = r.batch_link() if isinstance(r, TimeVaryingRate) else None
        if link is None or link[0] is not first[0]:
            return False
        js.append(link[1])
    return first[0], np.array(js, dtype=np.int64)


@dataclass(frozen=True)
class PlanGroup:
    """Clients with one sequence of op kinds: their positions in the round, and per op
    its sizes as arrays (a transfer: bits; a computation: FLOPs and batches)."""

    kinds: tuple[int, ...]  # per op: 0 download, 1 compute, 2 upload
    positions: np.ndarray | slice  # slice(None): every client, in order
    sizes: tuple[tuple[np.ndarray, ...], ...]


@dataclass(frozen=True)
class TracePlan:
    """A round's op-traces as the closed form reads them (see :func:`plan_traces`)."""

    ids: tuple[int, ...]
    groups: tuple[PlanGroup, ...]


def plan_traces(traces: Mapping[int, OpTrace]) -> TracePlan | None:
    """The traces grouped by sequence of op kinds with their sizes as arrays, or None when
    an op is not a Download, Compute or Upload (then the round needs another path)."""
    ids = tuple(traces)
    by_types: dict[tuple[type, ...], list[int]] = {}  # sequence of op types -> positions
    for pos, trace in enumerate(traces.values()):
        by_types.setdefault(tuple(map(type, trace)), []).append(pos)
    if any(t not in _CLOSED_FORM_KIND for types in by_types for t in types):
        return None
    rows_of = list(traces.values())
    groups = []
    for types, positions in by_types.items():
        rows = [rows_of[p] for p in positions]
        kinds = tuple(_CLOSED_FORM_KIND[t] for t in types)
        sizes: list[tuple[np.ndarray, ...]] = []
        for k, kind in enumerate(kinds):
            if kind == _COMPUTE:
                sizes.append(
                    (
                        np.array([float(r[k].flops) for r in rows]),  # type: ignore[union-attr]
                        np.array([float(r[k].batches) for r in rows]),  # type: ignore[union-attr]
                    )
                )
            else:
                sizes.append((8.0 * np.array([float(r[k].nbytes) for r in rows]),))  # type: ignore[union-attr]
        where: np.ndarray | slice = (
            slice(None) if len(by_types) == 1 else np.array(positions, dtype=np.int64)
        )
        groups.append(PlanGroup(kinds, where, tuple(sizes)))
    return TracePlan(ids, tuple(groups))


def _closed_form_timelines(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    network: NetworkSpec,
) -> tuple[ClientTimeline, ...] | None:
    """Per-client timelines without SimPy, or None when the round needs the SimPy model.

    Applies when nothing is shared: no shared medium, no edge-server compute, constant
    rates, and only Download / Compute / Upload ops. Then each client's clock is the sum
    of its op durations (:func:`closed_form_columns`).
    """
    solved = _closed_form_arrays(traces, clients, network)
    if solved is None:
        return None
    ids, finish_s, spent_s = solved
    return _timelines(ids, finish_s, spent_s, network.deadline_s)


def _closed_form_arrays(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    network: NetworkSpec,
) -> tuple[list[int], np.ndarray, np.ndarray] | None:
    """(ids, finish_s, per-kind seconds) of :func:`_closed_form_timelines`, or None."""
    if network.uplink_shared or network.downlink_shared:
        return None
    ids = list(traces)
    specs = [clients[cid] for cid in ids]
    for cid, spec in zip(ids, specs, strict=True):
        if spec.client_id != cid:
            raise ValueError(f"clients[{cid}] has client_id {spec.client_id}")
    moving = rate_batches(specs)  # each direction's rates looked at once, used twice
    if any(m is False for m in moving.values()):
        return None  # a rate trace (or outages): the SimPy model or the media path
    if not all(TcpColumns.uniform([getattr(s, k) for s in specs]) for k in _TCP_FIELDS):
        return None  # TCP flows of different kinds in one direction: the SimPy model
    plan = plan_traces(traces)
    if plan is None:
        return None
    columns = ClientColumns.of(specs, max_shares=False, moving=moving)
    finish_s, spent_s = closed_form_columns(plan, columns)
    return ids, finish_s, spent_s


def closed_form_columns(plan: TracePlan, clients: ClientColumns) -> tuple[np.ndarray, np.ndarray]:
    """(finish_s, per-kind seconds: download, compute, upload) of every client.

    Clients with the same sequence of op kinds are advanced together, one op at a time,
    with the arithmetic of the SimPy model in the same order (clock ``now + delay``,
    per-kind time += clock difference, an op that never ends leaves the client stuck at
    ``inf``), so the result is equal to the SimPy model's bit for bit
    (``tests/unit/emulation/test_engine_closed_form.py`` checks it on random rounds).
    """
    n = len(plan.ids)
    finish_s = np.zeros(n)
    spent_s = np.zeros((n, 3))  # download, compute, upload
    for group in plan.groups:
        finish_s[group.positions], spent_s[group.positions] = _advance_group(group, clients)
    return finish_s, spent_s


def _advance_group(group: PlanGroup, clients: ClientColumns) -> tuple[np.ndarray, np.ndarray]:
    """(finish_s, per-kind seconds) of clients sharing one sequence of op kinds."""
    at = group.positions
    down_bps, up_bps = clients.downlink_rate_bps[at], clients.uplink_rate_bps[at]
    down_lat_s, up_lat_s = clients.downlink_latency_s[at], clients.uplink_latency_s[at]
    overhead_s, flops_per_s = clients.step_overhead_s[at], clients.flops_per_s[at]
    m = len(down_bps)
    now_s, spent_s = np.zeros(m), np.zeros((m, 3))
    stuck, stuck_kind = np.zeros(m, dtype=bool), np.zeros(m, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for kind, sizes in zip(group.kinds, group.sizes, strict=True):
            if kind == _COMPUTE:  # Device.run
                flops, batches = sizes
                flop_s = np.where(flops_per_s > 0, flops / flops_per_s, np.inf)
                delay_s = batches * overhead_s + np.where(flops > 0, flop_s, 0.0)
                delay_s = np.where(delay_s > 0, delay_s, 0.0)
            else:  # DedicatedLink.transfer
                (nbits,) = sizes
                rate, lat_s = (down_bps, down_lat_s) if kind == 0 else (up_bps, up_lat_s)
                moving = clients.downlink_moving if kind == 0 else clients.uplink_moving
                tcp = clients.downlink_tcp if kind == 0 else clients.uplink_tcp
                if moving is None:
                    if tcp is None:
                        delay_s = np.where(
                            nbits > 0, np.where(rate > 0, nbits / rate + lat_s, np.inf), 0.0
                        )
                    else:  # DedicatedLink.transfer with its TCP flow
                        extra_s = tcp.extra_s(at, nbits / 8.0, rate)
                        delay_s = np.where(
                            nbits > 0,
                            np.where(rate > 0, nbits / rate + extra_s + lat_s, np.inf),
                            0.0,
                        )
                else:  # a moving client's link: its rate integrated from now (mid*)
                    links, js = moving
                    took_s = links.transfer_times_s(js[at], nbits, now_s)
                    if tcp is not None:  # at the rate the transfer averaged
                        took_s = took_s + tcp.extra_s(at, nbits / 8.0, nbits / took_s)
                    delay_s = np.where(nbits > 0, took_s + lat_s, 0.0)
            blocked = np.isinf(delay_s) & ~stuck
            stuck_kind[blocked] = kind
            stuck |= blocked
            new_s = np.where(stuck, now_s, now_s + delay_s)
            spent_s[:, kind] += new_s - now_s
            now_s = new_s
    now_s[stuck] = np.inf
    spent_s[stuck, stuck_kind[stuck]] = np.inf
    return now_s, spent_s
