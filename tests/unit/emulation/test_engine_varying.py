"""Shared media whose flows' link rates change at known times (a rate trace, a moving
client under ``geometry.mobility.rate: step``; docs/engine.md, "The model"): processor
sharing re-rated where a rate changes (:class:`mecsim.emulation.engine.sharing.
VaryingSharing`), against cases worked by hand, a brute-force simulation in small time
steps, and every engine path on random rounds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from support.helpers import assert_timing_close, random_round

from mecsim.emulation.engine import (
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
from mecsim.emulation.engine.sharing import varying_processor_sharing
from mecsim.emulation.engine.specs import constant_segments
from mecsim.emulation.ops import Compute, Upload

METHODS = ("simpy", "events", "media", "auto")
SHARED_UP = NetworkSpec(uplink_shared=True)


def _uploader(cid: int, up, nbytes: int, compute_s: float = 0.0):
    """A client that computes for ``compute_s`` (1 GFLOP/s) and then uploads ``nbytes``
    on the shared uplink at ``up`` (b/s or a RateSchedule)."""
    spec = ClientSpec(cid, up, 1e9, 0.0, 1e9)
    ops = ((Compute(compute_s * 1e9, 0),) if compute_s else ()) + (Upload(nbytes),)
    return spec, ops


@pytest.mark.parametrize("method", METHODS)
def test_two_flows_one_rate_change_worked_by_hand(method: str):
    """Flows A (10 Mbit) and B (6 Mbit) start together on one shared uplink. A's link runs
    at 10 Mb/s until 1 s, then 20 Mb/s; B's at 4 Mb/s throughout. Two on the medium: each
    at its own rate / 2.

    - 0–1 s: A at 5 Mb/s, B at 2 Mb/s: at 1 s A has 5 Mbit left, B 4 Mbit.
    - from 1 s: A at 20 / 2 = 10 Mb/s: its 5 Mbit take 0.5 s: **A done at 1.5 s**; B sent
      2 × 0.5 = 1 Mbit meanwhile: 3 Mbit left.
    - from 1.5 s B is alone at 4 Mb/s: 3 / 4 = 0.75 s: **B done at 2.25 s**.

    (With A's rate frozen at 10 Mb/s, A would end at 2 s and B at 2.5 s.) Every number
    here is exact in binary floating point, so every path gives them to the bit."""
    a, ops_a = _uploader(0, RateSchedule((0.0, 1.0), (10e6, 20e6)), 1_250_000)
    b, ops_b = _uploader(1, 4e6, 750_000)
    t = time_round({0: ops_a, 1: ops_b}, {0: a, 1: b}, [ServerSpec(1e9)], SHARED_UP, method=method)
    assert [c.finish_s for c in t.clients] == [1.5, 2.25]
    assert [c.upload_s for c in t.clients] == [1.5, 2.25]
    assert t.round_time_s == 2.25 and t.critical_client == 1


@pytest.mark.parametrize("method", METHODS)
def test_a_late_arrival_and_a_drop_to_zero_worked_by_hand(method: str):
    """A (8 Mbit) starts at 0 s at 8 Mb/s, its link down (0 b/s) from 0.5 s to 1.5 s and
    at 8 Mb/s again after. B (4 Mbit, 4 Mb/s) computes for 0.25 s, then uploads.

    - 0–0.25 s: A alone at 8 Mb/s: 2 Mbit; 6 left.
    - 0.25–0.5 s: both, A at 4, B at 2 Mb/s: A 1 Mbit (5 left), B 0.5 (3.5 left).
    - 0.5–1.5 s: A at 0 b/s keeps its share: B at 4 / 2 = 2 Mb/s: 2 Mbit (1.5 left).
    - from 1.5 s: A at 4, B at 2 Mb/s: B's 1.5 Mbit take 0.75 s: **B done at 2.25 s**
      (upload 2.0 s); A sent 3 Mbit meanwhile (2 left).
    - alone at 8 Mb/s: 0.25 s: **A done at 2.5 s**."""
    a, ops_a = _uploader(0, RateSchedule((0.0, 0.5, 1.5), (8e6, 0.0, 8e6)), 1_000_000)
    b, ops_b = _uploader(1, 4e6, 500_000, compute_s=0.25)
    t = time_round({0: ops_a, 1: ops_b}, {0: a, 1: b}, [ServerSpec(1e9)], SHARED_UP, method=method)
    assert [c.finish_s for c in t.clients] == [2.5, 2.25]
    assert [c.upload_s for c in t.clients] == [2.5, 2.0]
    assert t.clients[1].compute_s == 0.25


def test_paths_taken_for_a_varying_shared_medium():
    """A small round goes to ``events`` (``media`` for 32 clients a group and more); the
    closed form never takes a shared medium."""
    for n, path in ((3, "events"), (64, "media")):
        made = [_uploader(c, RateSchedule((0.0, 1.0), (1e6, 2e6 + c)), 100_000) for c in range(n)]
        traces = {c: ops for c, (_, ops) in enumerate(made)}
        specs = {c: spec for c, (spec, _) in enumerate(made)}
        assert engine_path(traces, specs, [ServerSpec(1e9)], SHARED_UP) == path


def test_a_capped_flow_with_a_varying_one_is_refused_naming_both():
    """Water-filling with time-varying rates is not built: the SimPy model says so, and the
    fast paths leave such a round to it."""
    a, ops_a = _uploader(0, RateSchedule((0.0, 1.0), (1e6, 2e6)), 100_000)
    b, ops_b = _uploader(1, 1e6, 100_000)
    b = dataclasses.replace(b, uplink_max_share=0.5)
    traces, specs = {0: ops_a, 1: ops_b}, {0: a, 1: b}
    assert engine_events.event_timelines(traces, specs, [ServerSpec(1e9)], SHARED_UP) is None
    assert engine_media.media_timelines(traces, specs, [ServerSpec(1e9)], SHARED_UP) is None
    with pytest.raises(ValueError, match="capped below its link rate .* water-filling with"):
        time_round(traces, specs, [ServerSpec(1e9)], SHARED_UP)


def _brute_force_finish_s(
    arrive_s: list[float], nbits: list[float], schedules: list[RateSchedule], dt_s: float
) -> list[float]:
    """Processor sharing in time steps of ``dt_s``, independently: at each step the flows
    present (arrived by the step's start) move at their link rate then (looked up in
    their schedules) / n; within a step, a flow whose bits run out leaves there and the
    others go on at the new n for the rest of the step. Arrivals and rate changes must
    fall on the steps' grid."""
    m = len(arrive_s)
    left = list(nbits)
    done = [math.inf] * m
    i = 0
    while any(math.isinf(d) for d in done) and i * dt_s < 100.0:
        t0 = i * dt_s
        into = 0.0  # seconds of this step gone
        while True:
            here = [k for k in range(m) if arrive_s[k] <= t0 + 1e-12 and math.isinf(done[k])]
            if not here:
                break
            speed = {}
            for k in here:
                s = schedules[k]
                piece = max(j for j, ts in enumerate(s.times_s) if ts <= t0 + 1e-12)
                speed[k] = s.rates_bps[piece] / len(here)
            first = min((left[k] / speed[k] for k in here if speed[k] > 0), default=math.inf)
            dt = min(first, dt_s - into)
            for k in here:
                left[k] -= speed[k] * dt
            into += dt
            if first > dt_s - into + dt:  # nobody leaves in this step
                break
            for k in here:
                if speed[k] > 0 and left[k] <= 1e-6:
                    done[k] = t0 + into
        i += 1
    return done


def test_varying_sharing_matches_a_brute_force_simulation():
    """30 random sets of 2–6 flows (arrivals in 0–2 s, 1–20 Mbit, 1–4 rate pieces on a
    0.25 s grid of 1–20 Mb/s) against the brute force at 1 ms steps: within 1e-9
    relative (both exact but for rounding: the brute force re-reads the rates every
    step and adds the bits up step by step)."""
    rng = np.random.default_rng(44)
    for _ in range(30):
        m = int(rng.integers(2, 7))
        arrive = sorted(float(x) for x in rng.integers(0, 9, m) * 0.25)
        bits = [float(x) for x in rng.integers(1, 21, m) * 1e6]
        scheds = []
        for _k in range(m):
            pieces = int(rng.integers(1, 5))
            times = (0.0, *sorted({float(x) for x in rng.integers(1, 16, pieces - 1) * 0.25}))
            rates = tuple(float(x) * 1e6 for x in rng.integers(1, 21, len(times)))
            scheds.append(RateSchedule(times, rates))
        segments = [s.segments(a) for s, a in zip(scheds, arrive, strict=True)]
        got = varying_processor_sharing(arrive, bits, segments)
        want = _brute_force_finish_s(arrive, bits, scheds, 1e-3)
        assert got == pytest.approx(want, rel=1e-9)


def test_constant_rates_give_processor_sharing_s_times():
    """Constant rates only: the same departures as the constant-rate medium's virtual
    time (within 1e-12 relative: the two add the bits up in another order)."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        m = int(rng.integers(1, 12))
        arrive = sorted(rng.uniform(0, 5, m).tolist())
        rates = rng.uniform(1e5, 5e7, m).tolist()
        bits = rng.uniform(1e3, 1e8, m).tolist()
        got = varying_processor_sharing(arrive, bits, [constant_segments(r) for r in rates])
        want = engine_media.processor_sharing(
            arrive, [b / r for b, r in zip(bits, rates, strict=True)]
        )
        assert got == pytest.approx(want, rel=1e-12)


def _varying(rng: np.random.Generator, specs: dict[int, ClientSpec], quantized: bool):
    """Some clients' links (shared or not) replaced by rate traces."""
    p = rng.choice([0.0, 0.3, 0.8])

    def trace(rate):
        if not rng.random() < p:
            return rate
        k = int(rng.integers(1, 5))
        if quantized:
            times = tuple(float(t) for t in range(k))
            rates = tuple(float(rng.choice([0.0, 1e6, 2e6])) for _ in range(k))
        else:
            times = (0.0, *np.sort(rng.uniform(0.01, 20.0, k - 1)).tolist())
            rates = tuple(
                0.0 if rng.random() < 0.15 else float(rng.uniform(1e5, 5e7)) for _ in range(k)
            )
        if rates[-1] == 0.0 and rng.random() < 0.8:
            rates = (*rates[:-1], 1e6)
        return RateSchedule(times, rates)

    return {
        c: dataclasses.replace(
            s,
            uplink_rate_bps=trace(s.uplink_rate_bps),
            downlink_rate_bps=trace(s.downlink_rate_bps),
        )
        for c, s in specs.items()
    }


@pytest.mark.parametrize("quantized", [False, True], ids=["random", "ties"])
def test_fast_paths_equal_simpy_on_random_rounds_with_varying_shared_media(quantized: bool):
    """Random rounds (random_round: 1–30 clients on 1–3 edge servers, FedAvg-like and
    per-batch op-traces, edge-server work, backhaul, deadlines) with some links made rate
    traces, shared media included: ``events``, ``media`` (where it applies) and ``auto``
    against SimPy. Float for float (asserted identical on the rounds drawn at random), but
    for simultaneous events, which a fast path may take in another order than SimPy (a
    few ulps: docs/engine.md, "Exactness"): on rounds of round numbers, full of such ties,
    asserted within 1e-9 and identical in over 95 % of them."""
    rng = np.random.default_rng(4400 + quantized)
    seen = {"varying shared": 0, "media": 0, "identical": 0}
    rounds = 300
    for _ in range(rounds):
        traces, specs, servers, net, agg = random_round(rng, quantized)
        specs = _varying(rng, specs, quantized)
        ref = time_round(traces, specs, servers, net, agg, method="simpy")
        timed = [engine_events.event_timelines(traces, specs, servers, net)]
        media = engine_media.media_timelines(traces, specs, servers, net)
        if media is not None:
            timed.append(media)
            seen["media"] += 1
        got = [dispatch._summarise(t, net.deadline_s, agg) for t in timed]
        got.append(time_round(traces, specs, servers, net, agg))
        for g in got:
            if quantized:
                assert_timing_close(g, ref)
            else:
                assert g == ref
        seen["identical"] += all(g == ref for g in got)
        seen["varying shared"] += any(
            (net.uplink_shared and isinstance(s.uplink_rate_bps, RateSchedule))
            or (net.downlink_shared and isinstance(s.downlink_rate_bps, RateSchedule))
            for s in specs.values()
        )
    assert seen["varying shared"] > 120 and seen["media"] > 150, seen
    assert seen["identical"] > 0.95 * rounds, seen
