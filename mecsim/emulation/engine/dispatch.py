"""The timing engine's entry point: :func:`time_round` picks the fastest exact path."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace

from mecsim.emulation.engine import events, media
from mecsim.emulation.engine.closed_form import _closed_form_timelines
from mecsim.emulation.engine.simpy_model import _simulate
from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
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
    must hold a spec for each. Raises ValueError for a shared medium with a
    :class:`RateSchedule` rate, or a ServerCompute on a missing edge server.

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
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {METHODS}")
    with _collector_paused():
        _, timelines = _solve(traces, clients, servers, network, method)
        deadline_s = network.deadline_s
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


METHODS = ("auto", "closed_form", "media", "events", "simpy")


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

    # the media and event paths do not model per-link latency yet: such rounds go to
    # the closed form (which does) or to SimPy
    latency = any(s.uplink_latency_s or s.downlink_latency_s for s in clients.values())
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
    round_s = wait_s + aggregate_s
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
    idle_s = round_s - sum(parts) if math.isfinite(round_s) else 0.0
    return RoundTiming(
        clients=timelines,
        critical_client=crit.client_id if crit else None,
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
