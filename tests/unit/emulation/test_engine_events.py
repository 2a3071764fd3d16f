"""The engine's fast paths for shared resources (mecsim.emulation.engine.media and
.events) against the SimPy model, on thousands of random rounds and on cases worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.helpers import assert_timing_close, random_round

from mecsim.emulation.engine import (
    METHODS,
    ClientSpec,
    NetworkSpec,
    RateSchedule,
    ServerSpec,
    dispatch,
    engine_path,
    time_round,
)
from mecsim.emulation.engine import events as engine_events
from mecsim.emulation.engine import media as engine_media
from mecsim.emulation.engine.media import processor_sharing
from mecsim.emulation.ops import Backhaul, Compute, Download, ServerCompute, Upload

FAST = ("media", "events", "auto")


@pytest.mark.slow
def test_fast_paths_equal_simpy_on_random_rounds():
    rng = np.random.default_rng(20261123)
    seen = dict.fromkeys(
        ("media", "stuck", "dropped", "schedule", "backhaul", "server", "shared"), 0
    )
    for _ in range(1500):
        traces, specs, servers, net, agg = random_round(rng)
        ref = time_round(traces, specs, servers, net, agg, method="simpy")
        media = engine_media.media_timelines(traces, specs, servers, net)
        if media is not None:  # it covers the round (one order of resources)
            assert dispatch._summarise(media, net.deadline_s, agg) == ref
            seen["media"] += 1
        events = engine_events.event_timelines(traces, specs, servers, net)
        assert events is not None  # it covers every round
        assert dispatch._summarise(events, net.deadline_s, agg) == ref
        assert time_round(traces, specs, servers, net, agg) == ref
        seen["stuck"] += sum(math.isinf(c.finish_s) for c in ref.clients)
        seen["dropped"] += len(ref.dropped)
        ops = [op for t in traces.values() for op in t]
        seen["backhaul"] += any(isinstance(op, Backhaul) for op in ops)
        seen["server"] += any(isinstance(op, ServerCompute) for op in ops)
        seen["shared"] += net.uplink_shared or net.downlink_shared
        seen["schedule"] += any(
            isinstance(s.uplink_rate_bps, RateSchedule)
            or isinstance(s.downlink_rate_bps, RateSchedule)
            for s in specs.values()
        )
    # the random rounds did reach every case, and each fast path took a good share
    assert min(seen.values()) > 100, seen


@pytest.mark.slow
def test_fast_paths_within_1e9_of_simpy_on_rounds_full_of_ties():
    # Round numbers make many events coincide; the fast paths may then take two events
    # of one instant in another order than SimPy and round differently (a few ulps).
    rng = np.random.default_rng(7)
    identical = 0
    for _ in range(600):
        traces, specs, servers, net, agg = random_round(rng, quantized=True)
        ref = time_round(traces, specs, servers, net, agg, method="simpy")
        for method in FAST:
            got = time_round(traces, specs, servers, net, agg, method=method)
            assert_timing_close(got, ref)
            identical += got == ref
    assert identical > 0.99 * 600 * len(FAST)  # nearly always float for float all the same


def test_processor_sharing_worked_by_hand():
    # Jobs 0 and 1 arrive at 0 s needing 2 s and 4 s alone; job 2 at 1 s needing 1 s.
    # To 1 s: two jobs, v = 0.5. Then three: tags 2, 4, 0.5 + 1 = 1.5; job 2 leaves when
    # v = 1.5, at 1 + 1.0 * 3 = 4 s; job 0 at v = 2: 4 + 0.5 * 2 = 5 s; job 1 alone: 7 s.
    assert processor_sharing([0.0, 0.0, 1.0], [2.0, 4.0, 1.0]) == [5.0, 7.0, 4.0]
    # idle in between: the medium is empty from 1 s to 3 s
    assert processor_sharing([0.0, 3.0], [1.0, 1.0]) == [1.0, 4.0]
    # a job at rate 0 never leaves and keeps its share: the other takes twice as long
    assert processor_sharing([0.0, 0.0], [math.inf, 1.0]) == [math.inf, 2.0]
    assert processor_sharing([], []) == []


@pytest.mark.parametrize("method", METHODS)
def test_dead_client_on_a_shared_medium(method: str) -> None:
    # Client 1's uplink rate is 0: it never finishes, is not completed, and keeps its
    # share of the medium, so client 2's 8 Mbit at 8 Mbps take 2 s, not 1 s.
    traces = {1: (Upload(1_000_000),), 2: (Upload(1_000_000),)}
    specs = {1: ClientSpec(1, 0.0, 8e6, 0.0, 1e9), 2: ClientSpec(2, 8e6, 8e6, 0.0, 1e9)}
    r = time_round(
        traces,
        specs,
        [ServerSpec(1e9)],
        NetworkSpec(uplink_shared=True),
        aggregate_s=0.5,
        method=method,
    )
    one, two = r.clients
    assert math.isinf(one.finish_s) and math.isinf(one.upload_s) and not one.completed
    assert two.finish_s == 2.0 and two.completed
    assert r.dropped == (1,) and r.critical_client == 2 and r.round_time_s == 2.5


@pytest.mark.parametrize("method", METHODS)
def test_shared_fedavg_round_by_hand(method: str) -> None:
    # Shared 8 Mbps down- and uplink. Both download 8 Mbit at once: 2 s each. Client 1
    # computes 1 s, client 2 3 s. Client 1 uploads 8 Mbit alone from 3 s to 5 s (at 8 Mbps
    # until client 2 arrives at 5 s: done exactly then); client 2 uploads 4 Mbit alone:
    # 5 s + 0.5 s = 5.5 s.
    traces = {
        1: (Download(1_000_000), Compute(1e9, 0), Upload(1_000_000)),
        2: (Download(1_000_000), Compute(3e9, 0), Upload(500_000)),
    }
    specs = {c: ClientSpec(c, 8e6, 8e6, 0.0, 1e9) for c in (1, 2)}
    r = time_round(traces, specs, [ServerSpec(1e9)], NetworkSpec(True, True), method=method)
    one, two = r.clients
    assert (one.download_s, one.compute_s, one.upload_s, one.finish_s) == (2.0, 1.0, 1.0, 4.0)
    assert (two.download_s, two.compute_s, two.upload_s, two.finish_s) == (2.0, 3.0, 0.5, 5.5)


def _split_learning_round(batches: int):
    """Per-batch split learning on 2 edge servers x 3 clients (the PHSFL op pattern)."""
    traces, specs = {}, {}
    for c in range(6):
        ops = [Backhaul(3_000_000, "down"), Download(6656)]
        for b in range(batches):
            ops += [
                Compute(4.4e7, 1),
                Upload(884_832 + 7 * c + b),
                ServerCompute(2e9, 1),
                Download(884_736),
                Compute(4.4e7, 0),
            ]
        ops += [Upload(6656), Backhaul(3_000_000, "up")]
        traces[c] = tuple(ops)
        specs[c] = ClientSpec(c, 2e6 + 1e5 * c, 5e6 + 3e5 * c, 0.02, 1.4e10, c // 3)
    servers = [ServerSpec(2e11, 0.001, 1e9, 0.005)] * 2
    return traces, specs, servers, NetworkSpec(uplink_shared=True)


def test_paths_taken() -> None:
    servers = [ServerSpec(1e9)]
    fedavg = {c: (Download(1000), Compute(1e9, 3), Upload(1000)) for c in (1, 2)}
    specs = {c: ClientSpec(c, 1e6, 1e6, 0.01, 1e9) for c in (1, 2)}
    assert engine_path(fedavg, specs, servers, NetworkSpec()) == "closed_form"
    # on shared media: few clients event by event, many a medium at a time
    assert engine_path(fedavg, specs, servers, NetworkSpec(True, True)) == "events"
    many = {c: fedavg[1] for c in range(100)}
    many_specs = {c: ClientSpec(c, 1e6 + c, 2e6 + c, 0.01, 1e9) for c in many}
    assert engine_path(many, many_specs, servers, NetworkSpec(True, True)) == "media"
    sched = {
        c: ClientSpec(c, RateSchedule((0.0, 1.0), (1e6, 2e6 + c)), 1e6, 0.01, 1e9) for c in many
    }
    assert engine_path(many, sched, servers, NetworkSpec()) == "media"
    split = _split_learning_round(3)
    assert engine_path(*split) == "events"
    with pytest.raises(ValueError, match="method"):
        time_round(fedavg, specs, servers, NetworkSpec(), method="fastest")


def test_split_learning_rounds_equal_simpy() -> None:
    for batches in (1, 5, 20):
        traces, specs, servers, net = _split_learning_round(batches)
        ref = time_round(traces, specs, servers, net, method="simpy")
        assert time_round(traces, specs, servers, net) == ref
        assert engine_media.media_timelines(traces, specs, servers, net) is None
        assert ref.backhaul_s > 0 and ref.server_s > 0 and ref.upload_s > 0


def test_rounds_with_link_latency_are_timed_as_simpy_does() -> None:
    # per-link latency is modelled by the closed form and SimPy; the media and event paths
    # step aside for it, so every method gives SimPy's timelines
    from mecsim.emulation.engine import ClientSpec, NetworkSpec, ServerSpec, time_round
    from mecsim.emulation.ops import Compute, Download, Upload

    traces = {c: (Download(100_000 * (c + 1)), Compute(1e8, 3), Upload(50_000)) for c in range(6)}
    specs = {
        c: ClientSpec(
            c, 1e6 + c, 2e6, 0.01, 1e9, 0, uplink_latency_s=0.02 * c, downlink_latency_s=0.005
        )
        for c in range(6)
    }
    for shared in (False, True):
        net = NetworkSpec(uplink_shared=shared, downlink_shared=shared)
        ref = time_round(traces, specs, [ServerSpec(1e9)], net, method="simpy")
        for method in ("auto", "closed_form", "media", "events"):
            assert time_round(traces, specs, [ServerSpec(1e9)], net, method=method) == ref


def _dcu_round(rng: np.random.Generator, quantized: bool):
    """:func:`random_round` with only what columns carry: Download/Compute/Upload ops
    and constant rates (schedules replaced by their first rate)."""
    traces, specs, servers, net, agg = random_round(rng, quantized)
    traces = {
        cid: tuple(op for op in ops if isinstance(op, (Download, Compute, Upload)))
        for cid, ops in traces.items()
    }

    def constant(rate):
        return rate.rates_bps[0] if isinstance(rate, RateSchedule) else rate

    specs = {
        cid: ClientSpec(
            cid,
            constant(s.uplink_rate_bps),
            constant(s.downlink_rate_bps),
            s.step_overhead_s,
            s.flops_per_s,
            s.edge_server,
        )
        for cid, s in specs.items()
    }
    return traces, specs, servers, net, agg


@pytest.mark.parametrize("quantized", [False, True])
def test_media_on_columns_equals_media_on_specs(quantized):
    """media_columns (what replays use on shared media) forms and orders its groups as
    media_timelines does, so it gives the same floats, ties included, and declines the
    same rounds; time_round_columns gives time_round's RoundTiming where it applies."""
    from mecsim.emulation.engine import ClientColumns, plan_traces, time_round_columns
    from mecsim.emulation.engine.specs import _timelines

    rng = np.random.default_rng(4242 + quantized)
    solved = declined = whole = 0
    for _ in range(600):
        traces, specs, servers, net, agg = _dcu_round(rng, quantized)
        ids = list(traces)
        plan = plan_traces(traces)
        assert plan is not None
        cols = ClientColumns.of([specs[c] for c in ids])
        es = np.array([specs[c].edge_server for c in ids], dtype=np.int64)
        expected = engine_media.media_timelines(traces, specs, servers, net)
        got = engine_media.media_columns(plan, cols, es, servers, net)
        if expected is None:
            assert got is None
            declined += 1
            continue
        assert got is not None
        assert _timelines(ids, got[0], got[1], net.deadline_s) == expected
        solved += 1
        columns = time_round_columns(
            plan, cols, net, agg, servers=servers, edge_server=es, failed=ids[:1]
        )
        if columns is not None:
            assert columns.timing() == time_round(traces, specs, servers, net, agg, failed=ids[:1])
            whole += 1
    assert solved > 200 and declined > 50 and whole > 20
