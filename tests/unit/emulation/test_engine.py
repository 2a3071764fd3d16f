"""Tests of the SimPy timing engine, each against numbers worked by hand."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from mecsim.emulation.engine import (
    METHODS,
    ClientSpec,
    NetworkSpec,
    RateSchedule,
    RoundTiming,
    ServerSpec,
    time_round,
)
from mecsim.emulation.ops import Compute, Download, ServerCompute, Upload


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-12)


def spec(
    cid: int,
    up: float | RateSchedule = 8e6,
    down: float | RateSchedule = 8e6,
    overhead_s: float = 0.0,
    flops_per_s: float = 1e9,
    server: int = 0,
) -> ClientSpec:
    return ClientSpec(cid, up, down, overhead_s, flops_per_s, server)


SERVER = [ServerSpec(flops_per_s=1e9)]


def by_id(timing: RoundTiming) -> dict:
    return {t.client_id: t for t in timing.clients}


def test_sequential_single_client() -> None:
    # 8e6 bits / 8e6 bps = 1 s; 10*0.05 + 2e9/1e9 = 2.5 s; 4e6 bits / 4e6 bps = 1 s.
    trace = (Download(1_000_000), Compute(2e9, 10), Upload(500_000))
    c = spec(7, up=4e6, down=8e6, overhead_s=0.05)
    r = time_round({7: trace}, {7: c}, SERVER, NetworkSpec(), aggregate_s=0.3)
    (t,) = r.clients
    assert (t.start_s, t.finish_s) == (0.0, approx(4.5))
    assert (t.download_s, t.compute_s, t.upload_s) == (approx(1), approx(2.5), approx(1))
    assert t.server_compute_s == 0.0 and t.completed
    assert r.critical_client == 7 and r.dropped == ()
    assert r.wait_s == approx(4.5) and r.aggregate_s == 0.3
    assert r.round_time_s == approx(4.8)
    assert (r.download_s, r.client_s, r.upload_s) == (approx(1), approx(2.5), approx(1))
    assert r.server_s == approx(0.3) and r.idle_s == approx(0.0)


def test_parallel_dedicated_links() -> None:
    trace = (Download(1_000_000), Upload(1_000_000))
    # client 1: 8e6 bits at 8e6 down (1 s) + at 2e6 up (4 s) = 5 s
    # client 2: 8e6 bits at 4e6 down (2 s) + at 8e6 up (1 s) = 3 s
    clients = {1: spec(1, up=2e6, down=8e6), 2: spec(2, up=8e6, down=4e6)}
    r = time_round({1: trace, 2: trace}, clients, SERVER, NetworkSpec(), aggregate_s=0.5)
    t = by_id(r)
    assert t[1].finish_s == approx(5.0) and t[2].finish_s == approx(3.0)
    assert [c.client_id for c in r.clients] == [1, 2]
    assert r.critical_client == 1
    assert r.round_time_s == approx(5.5)
    assert (r.download_s, r.upload_s, r.client_s) == (approx(1), approx(4), 0.0)


def test_shared_uplink_equal_start() -> None:
    # Two 8e6-bit uploads at 8e6 bps each share one medium: 4e6 bps each -> both at 2 s.
    traces = {1: (Upload(1_000_000),), 2: (Upload(1_000_000),)}
    clients = {1: spec(1), 2: spec(2)}
    r = time_round(traces, clients, SERVER, NetworkSpec(uplink_shared=True))
    assert [t.finish_s for t in r.clients] == [approx(2.0), approx(2.0)]
    assert [t.upload_s for t in r.clients] == [approx(2.0), approx(2.0)]
    # Not shared: 1 s each.
    r = time_round(traces, clients, SERVER, NetworkSpec(downlink_shared=True))
    assert [t.finish_s for t in r.clients] == [approx(1.0), approx(1.0)]


def test_shared_uplink_staggered() -> None:
    # Both 1 Mbps. A uploads 2 Mbit from t=0. B computes 1 s, then uploads 0.5 Mbit.
    # 0..1: A alone at 1 Mbps -> 1 Mbit left. From 1: each at 0.5 Mbps; B's 0.5 Mbit
    # takes 1 s -> B done at 2 (A has 0.5 Mbit left). 2..: A alone -> done at 2.5.
    traces = {1: (Upload(250_000),), 2: (Compute(1e9, 0), Upload(62_500))}
    clients = {1: spec(1, up=1e6), 2: spec(2, up=1e6)}
    r = time_round(traces, clients, SERVER, NetworkSpec(uplink_shared=True))
    a, b = r.clients
    assert a.finish_s == approx(2.5) and a.upload_s == approx(2.5)
    assert b.finish_s == approx(2.0) and b.upload_s == approx(1.0) and b.compute_s == approx(1)
    assert r.critical_client == 1
    # Same with B sending 1 Mbit: from 1 s both have 1 Mbit at 0.5 Mbps -> both done at 3.
    traces[2] = (Compute(1e9, 0), Upload(125_000))
    a, b = time_round(traces, clients, SERVER, NetworkSpec(uplink_shared=True)).clients
    assert a.finish_s == approx(3.0) and b.finish_s == approx(3.0) and b.upload_s == approx(2)


def test_shared_uplink_unequal_rates() -> None:
    # 8e6 bits each; A's own rate 8e6, B's 4e6. Shared: A at 4e6, B at 2e6 bps.
    # A done at 2 s; B has sent 4e6 by then, the rest at 4e6 bps alone -> 3 s.
    traces = {1: (Upload(1_000_000),), 2: (Upload(1_000_000),)}
    clients = {1: spec(1, up=8e6), 2: spec(2, up=4e6)}
    a, b = time_round(traces, clients, SERVER, NetworkSpec(uplink_shared=True)).clients
    assert a.finish_s == approx(2.0) and b.finish_s == approx(3.0)


def test_shared_downlink_many_clients() -> None:
    # n equal clients on one medium, all starting together: each finishes at n * bits/rate.
    n = 100
    traces = {i: (Download(1_000_000), Compute(1e9, 0), Upload(1_000)) for i in range(n)}
    clients = {i: spec(i, up=8e6, down=8e6) for i in range(n)}
    t0 = time.perf_counter()
    r = time_round(traces, clients, SERVER, NetworkSpec(uplink_shared=True, downlink_shared=True))
    elapsed_s = time.perf_counter() - t0
    assert all(t.download_s == approx(n * 1.0) for t in r.clients)
    # uploads also start together: n * 8e3 / 8e6 s
    assert all(t.finish_s == approx(n + 1 + n * 1e-3) for t in r.clients)
    assert elapsed_s < 1.0  # typically a few ms; generous bound for loaded CI hosts


def test_shared_edge_server_cpu() -> None:
    # Server 1e9 FLOP/s, 0.01 s/step. A: 1e9 FLOPs from t=0. B: device compute 0.5 s, then
    # 50 steps (50*0.01*1e9 = 5e8) + 5e8 FLOPs = 1e9. 0..0.5: A alone, 5e8 left.
    # From 0.5 both at 5e8/s: A done at 1.5, B has 5e8 left -> alone -> done at 2.0.
    servers = [ServerSpec(flops_per_s=1e9, step_overhead_s=0.01)]
    traces = {1: (ServerCompute(1e9),), 2: (Compute(5e8, 0), ServerCompute(5e8, 50))}
    r = time_round(traces, {1: spec(1), 2: spec(2)}, servers, NetworkSpec(), aggregate_s=0.25)
    a, b = r.clients
    assert a.finish_s == approx(1.5) and a.server_compute_s == approx(1.5)
    assert b.finish_s == approx(2.0) and b.server_compute_s == approx(1.5)
    assert r.critical_client == 2
    assert (r.client_s, r.server_s) == (approx(0.5), approx(1.75))
    assert r.round_time_s == approx(2.25) and r.idle_s == approx(0.0)


def test_deadline_drops_late_client() -> None:
    # Dedicated links, uploads of 8e6 bits at 4e6, 8e6/3, 1.6e6 bps -> 2 s, 3 s, 5 s.
    traces = {i: (Upload(1_000_000),) for i in (1, 2, 3)}
    clients = {1: spec(1, up=4e6), 2: spec(2, up=8e6 / 3), 3: spec(3, up=1.6e6)}
    net = NetworkSpec(deadline_s=4.0)
    r = time_round(traces, clients, SERVER, net, aggregate_s=0.5)
    t = by_id(r)
    assert t[3].finish_s == approx(5.0) and not t[3].completed  # runs past the deadline
    assert t[1].completed and t[2].completed
    assert r.dropped == (3,) and r.critical_client == 2
    assert r.wait_s == 4.0 and r.round_time_s == approx(4.5)
    # critical path: upload 3 s + server 0.5 s; idle = 4.5 - 3.5 = 1 s
    assert (r.upload_s, r.server_s, r.idle_s) == (approx(3.0), approx(0.5), approx(1.0))


def test_deadline_all_dropped() -> None:
    r = time_round(
        {1: (Upload(1_000_000),)},
        {1: spec(1, up=1e6)},
        SERVER,
        NetworkSpec(deadline_s=2.0),
        aggregate_s=0.1,
    )
    assert r.critical_client is None and r.dropped == (1,)
    assert r.round_time_s == approx(2.1) and r.idle_s == approx(2.0)
    assert r.server_s == approx(0.1) and r.upload_s == 0.0


def test_rate_schedule_transfer_time() -> None:
    s = RateSchedule((0.0, 1.0, 3.0), (1e6, 2e6, 0.5e6))
    # 1e6 bits in [0,1), then 3e6 at 2e6 bps -> 1.5 s: 2.5 s
    assert s.transfer_time_s(4e6, 0.0) == approx(2.5)
    # from 0.5: 0.5e6 by 1, then 3.5e6 at 2e6 -> 1.75 s: 2.25 s
    assert s.transfer_time_s(4e6, 0.5) == approx(2.25)
    # 1e6 + 4e6 by t=3, then 1e6 at 0.5e6 -> 2 s: 5 s
    assert s.transfer_time_s(6e6, 0.0) == approx(5.0)
    # after the last breakpoint the last rate holds: 1e6 bits at 0.5e6 bps
    assert s.transfer_time_s(1e6, 10.0) == approx(2.0)
    assert s.transfer_time_s(0, 0.7) == 0.0
    # a gap of zero rate: 1e6 in [0,1), nothing in [1,2), then 1e6 at 1e6 bps -> 3 s
    assert RateSchedule((0.0, 1.0, 2.0), (1e6, 0.0, 1e6)).transfer_time_s(2e6, 0.0) == approx(3)
    assert math.isinf(RateSchedule((0.0, 1.0), (1e6, 0.0)).transfer_time_s(2e6, 0.0))
    for bad in [
        ((), ()),
        ((0.5,), (1.0,)),
        ((0.0, 2.0, 1.0), (1, 1, 1)),
        ((0.0,), (-1.0,)),
        ((0.0, 1.0), (1.0,)),
    ]:
        with pytest.raises(ValueError):
            RateSchedule(*bad)


def test_dedicated_download_with_schedule() -> None:
    # Compute 0.5 s, then 2e6 bits: 0.5e6 in [0.5,1), 1.5e6 at 2e6 bps -> 0.75 s: 1.25 s.
    sched = RateSchedule((0.0, 1.0, 3.0), (1e6, 2e6, 0.5e6))
    traces = {1: (Compute(5e8, 0), Download(250_000))}
    (t,) = time_round(traces, {1: spec(1, down=sched)}, SERVER, NetworkSpec()).clients
    assert t.download_s == approx(1.25) and t.finish_s == approx(1.75)
    # a rate that drops to 0 forever: the client never finishes and is dropped
    dead = RateSchedule((0.0, 1.0), (1e6, 0.0))
    r = time_round(
        {1: (Download(1_000_000),)}, {1: spec(1, down=dead)}, SERVER, NetworkSpec(deadline_s=3.0)
    )
    assert math.isinf(r.clients[0].finish_s) and r.dropped == (1,) and r.round_time_s == 3.0


def test_zero_work_ops_take_no_time() -> None:
    trace = (Download(0), Compute(0.0, 0), ServerCompute(0.0, 0), Upload(0))
    net = NetworkSpec(uplink_shared=True, downlink_shared=True)
    (t,) = time_round({1: trace}, {1: spec(1, up=0.0, down=0.0)}, SERVER, net).clients
    assert t.finish_s == 0.0 and t.completed
    assert (t.download_s, t.compute_s, t.upload_s, t.server_compute_s) == (0, 0, 0, 0)
    # a zero-byte upload does not take a share of the medium
    traces = {1: (Upload(1_000_000),), 2: (Upload(0),)}
    a, b = time_round(traces, {1: spec(1), 2: spec(2)}, SERVER, net).clients
    assert a.finish_s == approx(1.0) and b.finish_s == 0.0


def test_empty_round() -> None:
    r = time_round({}, {}, SERVER, NetworkSpec(), aggregate_s=0.2)
    assert r.clients == () and r.critical_client is None and r.round_time_s == approx(0.2)


def test_shared_medium_takes_a_schedule_but_not_with_a_capped_flow() -> None:
    """A rate trace on a shared medium is processor-shared, re-rated where it changes
    (test_engine_varying.py has the cases by hand); alone, 1 Mbit at 1 Mb/s is 1 s. With a
    flow capped below its link rate on the same medium (water-filling) it is refused,
    naming the client."""
    sched = RateSchedule((0.0,), (1e6,))
    r = time_round(
        {5: (Upload(125_000),)}, {5: spec(5, up=sched)}, SERVER, NetworkSpec(uplink_shared=True)
    )
    assert r.clients[0].finish_s == 1.0
    capped = replace(spec(7), downlink_max_share=0.5)
    with pytest.raises(ValueError, match="client 6: the shared downlink medium .* capped"):
        time_round(
            {6: (Download(10),), 7: (Download(10),)},
            {6: spec(6, down=sched), 7: capped},
            SERVER,
            NetworkSpec(downlink_shared=True),
        )
    # dedicated is fine
    r = time_round({5: (Upload(125_000),)}, {5: spec(5, up=sched)}, SERVER, NetworkSpec())
    assert r.clients[0].finish_s == approx(1.0)


def test_edge_servers_do_not_share_media_or_cpu() -> None:
    # Clients 1, 2 on server 0 share its uplink (2 s each); client 3 on server 1 is alone (1 s).
    traces = {i: (Upload(1_000_000),) for i in (1, 2, 3)}
    clients = {1: spec(1), 2: spec(2), 3: spec(3, server=1)}
    r = time_round(traces, clients, SERVER * 2, NetworkSpec(uplink_shared=True))
    t = by_id(r)
    assert (t[1].finish_s, t[2].finish_s, t[3].finish_s) == (approx(2), approx(2), approx(1))
    # one ServerCompute of 1e9 FLOPs each on two servers: 1 s each, not 2
    traces = {1: (ServerCompute(1e9),), 3: (ServerCompute(1e9),)}
    r = time_round(traces, clients, SERVER * 2, NetworkSpec())
    assert [c.finish_s for c in r.clients] == [approx(1.0), approx(1.0)]
    with pytest.raises(ValueError, match="edge server"):
        time_round(traces, clients, SERVER, NetworkSpec())


@pytest.mark.parametrize("method", METHODS)
def test_client_that_never_finishes_is_not_completed(method: str) -> None:
    # Without a deadline, a client whose link is at 0 b/s for ever never finishes: it is
    # not completed, and the round ends when the others are done (client 2: 1 s + 0.5 s).
    traces = {1: (Download(1_000_000),), 2: (Download(1_000_000),)}
    clients = {1: spec(1, down=0.0), 2: spec(2, down=8e6)}
    r = time_round(traces, clients, SERVER, NetworkSpec(), aggregate_s=0.5, method=method)
    t = by_id(r)
    assert math.isinf(t[1].finish_s) and not t[1].completed
    assert t[2].completed and r.dropped == (1,)
    assert r.round_time_s == approx(1.5) and math.isfinite(r.round_time_s)
    assert r.critical_client == 2
