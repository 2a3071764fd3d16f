"""The timing engine's entry point: :func:`time_round` picks the fastest exact path."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from mecsim.channel.tcp import TcpFlow
from mecsim.emulation.engine import events, media
from mecsim.emulation.engine.closed_form import (
    ClientColumns,
    TracePlan,
    _closed_form_arrays,
    _closed_form_timelines,
    closed_form_columns,
)
from mecsim.emulation.engine.simpy_model import _simulate
from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    RoundColumns,
    RoundTiming,
    ServerSpec,
    _made_it,
)
from mecsim.emulation.ops import (
    OpTrace,
)


def time_round(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
    aggregate_s: float = 0.0,
    *,
    method: str = "auto",
    failed: Collection[int] = (),
    wait_for: int | None = None,
) -> RoundTiming:
    """Time one round: all clients start at 0 s and run their op-traces in order.

    ``traces`` maps client_id -> op-trace (its order is the output order); ``clients``
    must hold a spec for each. Raises ValueError for a shared medium with both a
    :class:`TimeVaryingRate` rate and a flow capped below its link rate (``max_share <
    1``), or a ServerCompute on a missing edge server.

    ``method`` picks how the model is solved. Every way gives the SimPy model's timelines
    float for float (tests check thousands of random rounds), except that when two
    events fall on the very same instant the fast paths may take them in another order
    than SimPy does, which can move a result by a few ulps (tests check <= 1e-9
    relative on rounds built to be full of such ties):

    - ``"closed_form"``: :func:`_closed_form_timelines`, numpy, when nothing is shared
      (no shared medium, edge-server CPU, backhaul or rate trace);
    - ``"media"``: :func:`mecsim.emulation.engine.media.media_timelines`, each shared resource for
      all its flows at once, when every client visits each resource at most once and in
      an order all agree on (download, then upload: FedAvg-like rounds on shared media);
    - ``"events"``: :func:`mecsim.emulation.engine.events.event_timelines`, event by event without
      SimPy, for any round (per-batch split learning, backhaul, rate traces);
    - ``"simpy"``: :func:`_simulate`, the SimPy model: the reference the others are
      tested against, and what runs a round none of them covers (an op type they do not
      know) or reports invalid input;
    - ``"auto"`` (default): the first of closed_form, media, events that covers the
      round, else simpy; media only for groups of clients large enough to pay for
      numpy's per-call cost (``media.WORTHWHILE_GROUP_SIZE``), as in a
      1,000-client round on a shared access point.

    A named method that does not cover the round falls back the same way (closed_form ->
    media -> events -> simpy).

    ``failed``: clients whose op-trace ends in a failure (a crash, a drop-out before the
    upload): timed as they ran, never completed. ``wait_for``: the server aggregates once
    this many clients have completed; the later ones are dropped as at a deadline.
    """
    return solve_round(traces, clients, servers, network, method=method).timing(
        aggregate_s, failed=failed, wait_for=wait_for
    )


METHODS = ("auto", "closed_form", "media", "events", "simpy")


@dataclass(frozen=True, eq=False)
class SolvedRound:
    """A round's client timelines, solved (:func:`solve_round`) before the aggregation
    time and the completion rule are known: :meth:`timing` summarises them as
    :func:`time_round` does, as often as needed (a round is timed before and after its
    aggregation)."""

    deadline_s: float | None
    columns: tuple[tuple[int, ...], np.ndarray, np.ndarray] | None  # the closed form's
    timelines: tuple[ClientTimeline, ...] = ()  # any other path's

    def timing(
        self, aggregate_s: float = 0.0, *, failed: Collection[int] = (), wait_for: int | None = None
    ) -> RoundTiming:
        """:func:`time_round`'s answer for this aggregation time, ``failed`` and
        ``wait_for``."""
        with _collector_paused():
            if self.columns is not None:
                ids, finish_s, spent_s = self.columns
                return _summarise_columns(
                    ids, finish_s, spent_s, self.deadline_s, aggregate_s, failed, wait_for
                ).timing()
            return _complete(self.timelines, self.deadline_s, aggregate_s, failed, wait_for)


def solve_round(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
    *,
    method: str = "auto",
) -> SolvedRound:
    """The first half of :func:`time_round`: the round's timelines by ``method``."""
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {METHODS}")
    with _collector_paused():
        if method in ("auto", "closed_form"):  # the closed form, summarised as columns
            solved = _closed_form_arrays(traces, clients, network)
            if solved is not None:
                ids, finish_s, spent_s = solved
                return SolvedRound(network.deadline_s, (tuple(ids), finish_s, spent_s))
        _, timelines = _solve(traces, clients, servers, network, method)
        return SolvedRound(network.deadline_s, None, timelines)


def time_round_columns(
    plan: TracePlan,
    clients: ClientColumns,
    network: NetworkSpec,
    aggregate_s: float = 0.0,
    *,
    failed: Collection[int] = (),
    wait_for: int | None = None,
    servers: Sequence[ServerSpec] | None = None,
    edge_server: np.ndarray | None = None,
) -> RoundColumns | None:
    """:func:`time_round` of a round the closed form covers, given as columns: the
    round's op-traces planned once (:func:`~mecsim.emulation.engine.closed_form.plan_traces`)
    and its clients' constant rates, latencies and CPUs as arrays. The same numbers as
    ``time_round(...)`` (``.timing()`` gives its RoundTiming), without an object per
    client: what a replay re-timing recorded rounds under many scenarios uses. None when
    a medium is shared and the media path does not cover the round as ``time_round``
    would take it (per-link latency, small groups): then build ClientSpecs and call
    :func:`time_round`. ``servers`` and ``edge_server`` (each client's, in the plan's
    order) are needed for shared media."""
    with _collector_paused():
        if network.uplink_shared or network.downlink_shared:
            if servers is None or edge_server is None:
                return None
            if (
                clients.uplink_latency_s.any()
                or clients.downlink_latency_s.any()
                or clients.uplink_tcp is not None
                or clients.downlink_tcp is not None
            ):
                return None  # time_round leaves such rounds to the SimPy model
            solved = media.media_columns(
                plan,
                clients,
                edge_server,
                servers,
                network,
                min_group_size=media.WORTHWHILE_GROUP_SIZE,
            )
            if solved is None:
                return None
            finish_s, spent_s = solved
        else:
            finish_s, spent_s = closed_form_columns(plan, clients)
        return _summarise_columns(
            plan.ids, finish_s, spent_s, network.deadline_s, aggregate_s, failed, wait_for
        )


_PATHS = METHODS[1:]


def engine_path(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
) -> str:
    """Which way :func:`time_round` (``method="auto"``) solves this round (it solves it)."""
    with _collector_paused():
        return _solve(traces, clients, servers, network, "auto")[0]


def _solve(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
    method: str,
) -> tuple[str, tuple[ClientTimeline, ...]]:
    """(path, timelines): the first path from ``method`` on that covers the round."""

    # the media and event paths do not model per-link latency or TCP flows whose window
    # can hold a transfer yet: such rounds go to the closed form (which does) or to SimPy
    specs = list(clients.values())
    latency = any(s.uplink_latency_s or s.downlink_latency_s for s in specs) or any(
        _flows_add_time([getattr(s, k) for s in specs]) for k in ("uplink_tcp", "downlink_tcp")
    )
    for path in _PATHS[0 if method == "auto" else _PATHS.index(method) :]:
        if latency and path in ("media", "events"):
            continue
        if path == "closed_form":
            timelines = _closed_form_timelines(traces, clients, network)
        elif path == "media":
            timelines = media.media_timelines(
                traces,
                clients,
                servers,
                network,
                min_group_size=media.WORTHWHILE_GROUP_SIZE if method == "auto" else 0,
            )
        elif path == "events":
            timelines = events.event_timelines(traces, clients, servers, network)
        else:
            timelines = _simulate(traces, clients, servers, network)
        if timelines is not None:
            return path, timelines
    raise AssertionError("the SimPy model covers every round")


def _flows_add_time(flows: list[TcpFlow | None]) -> bool:
    """Can any of a direction's TCP flows hold a transfer (``TcpFlow.adds_time``)? One
    flow object shared by every client (the usual case without latency) is asked once."""
    first = flows[0] if flows else None
    if all(f is first for f in flows):
        return first is not None and first.adds_time
    return any(f is not None and f.adds_time for f in flows)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a round is solved, as ``timeit`` does.

    Solving allocates tens of thousands of small objects (heap entries, timelines) that
    form no cycles; each allocation burst would start collections that traverse every
    live object, including all the recorded op-traces a replay holds (millions). That
    cost 30-40 % of a 10,000-client round. Reference counting frees everything as usual;
    the collector runs again afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _complete(
    timelines: tuple[ClientTimeline, ...],
    deadline_s: float | None,
    aggregate_s: float,
    failed: Collection[int],
    wait_for: int | None,
) -> RoundTiming:
    """The round's timing from its timelines: who completed (``failed`` never do; with
    ``wait_for``, the server stops waiting once that many have), then :func:`_summarise`."""
    if failed or wait_for is not None:
        failed = frozenset(failed)
        finishes = sorted(
            t.finish_s for t in timelines if t.completed and t.client_id not in failed
        )
        if wait_for is not None and 0 < wait_for < len(finishes):
            cutoff_s = finishes[wait_for - 1]
            deadline_s = cutoff_s if deadline_s is None else min(deadline_s, cutoff_s)
        timelines = tuple(
            replace(t, completed=t.client_id not in failed and _made_it(t.finish_s, deadline_s))
            for t in timelines
        )
    return _summarise(timelines, deadline_s, aggregate_s)


def _busy_s(t: ClientTimeline) -> float:
    return t.download_s + t.compute_s + t.upload_s + t.server_compute_s + t.backhaul_s


def _summarise(
    timelines: tuple[ClientTimeline, ...], deadline_s: float | None, aggregate_s: float
) -> RoundTiming:
    """The round's makespan and critical-path breakdown from its client timelines."""
    done = [t for t in timelines if t.completed]
    dropped = tuple(t.client_id for t in timelines if not t.completed)
    # among clients finishing together (released by one backhaul transfer), the critical
    # one is the one that waited least: its own ops make up the path
    crit = max(done, key=lambda t: (t.finish_s, _busy_s(t))) if done else None
    wait_s = deadline_s if dropped and deadline_s is not None else crit.finish_s if crit else 0.0
    parts = (
        (
            crit.download_s,
            crit.compute_s,
            crit.upload_s,
            crit.server_compute_s + aggregate_s,
            crit.backhaul_s,
        )
        if crit
        else (0.0, 0.0, 0.0, aggregate_s, 0.0)
    )
    return _timing(timelines, crit.client_id if crit else None, wait_s, aggregate_s, parts, dropped)


def _summarise_columns(
    ids: tuple[int, ...],
    finish_s: np.ndarray,
    spent_s: np.ndarray,
    deadline_s: float | None,
    aggregate_s: float,
    failed: Collection[int],
    wait_for: int | None,
) -> RoundColumns:
    """:func:`_complete`, on columns: the same
    comparisons and the same float operations in the same order, so the same numbers
    (``tests/unit/emulation/test_engine_closed_form.py`` compares the two on random rounds)."""
    completed = np.isfinite(finish_s)
    if deadline_s is not None:
        completed &= finish_s <= deadline_s
    if failed or wait_for is not None:
        failed = frozenset(failed)
        ok = np.array([cid not in failed for cid in ids], dtype=bool).reshape(-1)
        finishes = np.sort(finish_s[completed & ok])
        if wait_for is not None and 0 < wait_for < len(finishes):
            cutoff_s = float(finishes[wait_for - 1])
            deadline_s = cutoff_s if deadline_s is None else min(deadline_s, cutoff_s)
        completed = ok & np.isfinite(finish_s)
        if deadline_s is not None:
            completed &= finish_s <= deadline_s
    done = np.flatnonzero(completed)
    dropped = tuple(ids[i] for i in np.flatnonzero(~completed).tolist())
    parts: tuple[float, float, float, float, float]
    if len(done):
        # max by (finish_s, busy seconds), the first of equals: as max() over timelines
        f = finish_s[done]
        top = done[f == f.max()]
        if len(top) > 1:
            busy = spent_s[top, 0]
            for k in range(1, spent_s.shape[1]):
                busy = busy + spent_s[top, k]
            if spent_s.shape[1] == 3:  # ClientTimeline's server and backhaul seconds: 0.0
                busy = busy + 0.0 + 0.0
            crit = int(top[int(np.argmax(busy))])
        else:
            crit = int(top[0])
        row = spent_s[crit].tolist() + [0.0, 0.0][: 5 - spent_s.shape[1]]
        crit_id: int | None = ids[crit]
        crit_finish_s = float(finish_s[crit])
        parts = (row[0], row[1], row[2], row[3] + aggregate_s, row[4])
    else:
        crit_id, crit_finish_s = None, 0.0
        parts = (0.0, 0.0, 0.0, aggregate_s, 0.0)
    wait_s = deadline_s if dropped and deadline_s is not None else crit_finish_s
    return RoundColumns(
        ids, finish_s, spent_s, completed, _timing((), crit_id, wait_s, aggregate_s, parts, dropped)
    )


def _timing(
    clients: tuple[ClientTimeline, ...],
    critical_client: int | None,
    wait_s: float,
    aggregate_s: float,
    parts: tuple[float, float, float, float, float],
    dropped: tuple[int, ...],
) -> RoundTiming:
    """The round's breakdown from its critical path's ``parts`` (download, client, upload,
    server with the aggregation, backhaul): the round waits ``wait_s``, then aggregates;
    what the parts do not cover is idle."""
    round_s = wait_s + aggregate_s
    idle_s = round_s - sum(parts) if math.isfinite(round_s) else 0.0
    return RoundTiming(
        clients=clients,
        critical_client=critical_client,
        wait_s=wait_s,
        aggregate_s=aggregate_s,
        round_time_s=round_s,
        download_s=parts[0],
        client_s=parts[1],
        upload_s=parts[2],
        server_s=parts[3],
        idle_s=max(0.0, idle_s),
        dropped=dropped,
        backhaul_s=parts[4],
    )
