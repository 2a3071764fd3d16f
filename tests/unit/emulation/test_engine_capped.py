"""Flows capped below their link rate on a shared medium (a lossy TCP flow's Mathis bound):
the medium's time is shared max-min fairly (water-filling, mecsim.emulation.engine.sharing),
in the SimPy model and the fast paths alike. Cases worked by hand, a property test against
a water-filling simulation written here in bits, and the fast paths against SimPy on
random rounds."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.helpers import assert_timing_close, random_round

from mecsim.channel.transport import mathis_goodput_bps
from mecsim.emulation.engine import (
    METHODS,
    ClientColumns,
    ClientSpec,
    NetworkSpec,
    ServerSpec,
    dispatch,
    plan_traces,
    time_round,
    time_round_columns,
)
from mecsim.emulation.engine import events as engine_events
from mecsim.emulation.engine import media as engine_media
from mecsim.emulation.engine.sharing import capped_processor_sharing, progress_rates
from mecsim.emulation.network import NetworkModel, device_profiles, max_share
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.scenario import scenario_from_dict

SERVERS = [ServerSpec(1e9)]
UP = NetworkSpec(uplink_shared=True)


def _flow(cid: int, rate_bps: float, cap_bps: float, **kw) -> ClientSpec:
    """A client whose uplink has link rate ``rate_bps`` and a cap ``cap_bps``: goodput
    min(rate, cap), max share goodput / rate where the cap binds."""
    good = min(rate_bps, cap_bps)
    share = good / rate_bps if good < rate_bps else 1.0
    return ClientSpec(cid, good, 1e9, 0.0, 1e9, uplink_max_share=share, **kw)


# ---------------------------------------------------------------------------------------
# (a) the case: 10 flows of 1 MB, a shared 100 Mb/s medium, a 5.06 Mb/s cap
# ---------------------------------------------------------------------------------------
# Mathis bound, MSS 1460 B, RTT 40 ms (20 ms up + 20 ms down), p = 0.005:
#   8 * 1460 * sqrt(1.5) / (0.04 * sqrt(0.005)) = 14305.02 / 0.00282843 = 5.05759 Mbit/s
# Each flow needs 5.05759 / 100 = 5.06 % of the medium's time; ten need 50.6 % < 100 %, so
# every flow runs at its cap: 8 Mbit / 5.05759 Mbit/s = 1.58178 s (+ 20 ms uplink latency
# when the latency is modelled). Processor sharing of the capped rate (the old rule) gave
# 10 * 1.58178 = 15.8178 s.
MATHIS_BPS = 8 * 1460 * math.sqrt(1.5) / (0.04 * math.sqrt(0.005))
ONE_MB_CAPPED_S = 8e6 / MATHIS_BPS


def test_mathis_figure_of_the_ten_flow_case():
    assert MATHIS_BPS == pytest.approx(5.05759e6, rel=1e-5)
    assert float(mathis_goodput_bps(100e6, 0.04, 0.005)) == pytest.approx(MATHIS_BPS, rel=1e-12)
    assert ONE_MB_CAPPED_S == pytest.approx(1.58178, rel=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_ten_capped_flows_run_at_their_cap(method: str):
    specs = {c: _flow(c, 100e6, MATHIS_BPS) for c in range(10)}
    traces = {c: (Upload(1_000_000),) for c in range(10)}
    t = time_round(traces, specs, SERVERS, UP, method=method)
    for c in t.clients:
        assert c.finish_s == pytest.approx(1.58178, rel=1e-5)
        assert c.finish_s == pytest.approx(ONE_MB_CAPPED_S, rel=1e-12)
    # the old rule, for the record: each capped flow at 5.06 Mb/s / 10
    old = {c: dataclasses.replace(s, uplink_max_share=1.0) for c, s in specs.items()}
    t_old = time_round(traces, old, SERVERS, UP, method=method)
    assert t_old.round_time_s == pytest.approx(15.8178, rel=1e-5)


def test_ten_capped_flows_from_a_scenario_with_latency_and_loss():
    """The same case from a scenario: fixed 100 Mb/s shared uplink, 20 ms each way, 0.5 %
    uplink loss. Each upload: 8 Mbit / 5.05759 Mbit/s + 20 ms = 1.60178 s."""
    sc = scenario_from_dict(
        {
            "topology": {"clients": 10, "participation": 1.0},
            "channel": {
                "model": "fixed_rate",
                "uplink": {
                    "rate_bps": 100e6,
                    "shared": True,
                    "latency_s": 0.02,
                    "loss_rate": 0.005,
                    "transport": "ideal",  # the Mathis cap this case is worked for
                },
                "downlink": {"rate_bps": 100e6, "latency_s": 0.02, "transport": "ideal"},
            },
        },
        "ten.yaml",
    )
    net = NetworkModel(sc, device_profiles(sc))
    specs, servers, network, rows = net.round(0, list(range(10)))
    assert network.uplink_shared
    for s in specs.values():
        assert s.uplink_rate_bps == pytest.approx(MATHIS_BPS, rel=1e-12)  # the goodput
        assert s.uplink_max_share == pytest.approx(MATHIS_BPS / 100e6, rel=1e-12)
        assert s.downlink_max_share == 1.0  # no downlink loss
    traces = {c: (Upload(1_000_000),) for c in range(10)}
    t = time_round(traces, specs, servers, network)
    assert t.round_time_s == pytest.approx(ONE_MB_CAPPED_S + 0.02, rel=1e-12)
    assert t.round_time_s == pytest.approx(1.60178, rel=1e-5)


def test_max_share_is_exactly_one_without_a_binding_cap():
    rate = np.array([0.0, 1e6, 7.3e6, np.inf, 100e6])
    assert max_share(rate, rate).tolist() == [1.0] * 5  # no loss: processor sharing stays
    assert max_share(rate, np.minimum(rate, 5e6)).tolist() == [1.0, 1.0, 5 / 7.3, 0.0, 0.05]


# ---------------------------------------------------------------------------------------
# (b) mixed caps: the surplus a capped flow leaves goes to the others
# ---------------------------------------------------------------------------------------
def test_progress_rates_by_hand():
    # shares .1, .4, 1, 1: .1 * 4 <= 1 takes .1; .4 * 3 = 1.2 > .9: level .9 / 3 = .3
    # -> flow .4 runs at .3 / .4 = .75 of its goodput, the uncapped at .3
    assert progress_rates([0.4, 1.0, 0.1, 1.0]) == pytest.approx([0.75, 0.3, 1.0, 0.3])
    assert progress_rates([0.1, 0.2]) == [1.0, 1.0]  # all fit: every flow at its cap
    assert progress_rates([1.0, 1.0, 1.0]) == pytest.approx([1 / 3] * 3)  # plain sharing
    assert progress_rates([0.0, 1.0]) == [1.0, 1.0]  # no airtime needed, the other alone
    assert progress_rates([]) == []


def _mixed_round():
    # One 100 Mb/s medium; all flows start at 0 s:
    #   A: cap 10 Mb/s, 10 Mbit    B: cap 40 Mb/s, 40 Mbit
    #   C: uncapped,    20 Mbit    D: uncapped,    60 Mbit
    specs = {
        1: _flow(1, 100e6, 10e6),
        2: _flow(2, 100e6, 40e6),
        3: _flow(3, 100e6, math.inf),
        4: _flow(4, 100e6, math.inf),
    }
    traces = {c: (Upload(int(mbit * 125_000)),) for c, mbit in ((1, 10), (2, 40), (3, 20), (4, 60))}
    return traces, specs


@pytest.mark.parametrize("method", METHODS)
def test_mixed_caps_water_filling_by_hand(method: str):
    # 0 to 2/3 s: A takes its 10 Mb/s; B, C, D share the other 90: 30 Mb/s each (B's cap
    #   of 40 does not bind). C's 20 Mbit are done at 20 / 30 = 2/3 s.
    #   Left: A 10 - 6.667 = 3.333, B 40 - 20 = 20, D 60 - 20 = 40 Mbit.
    # 2/3 s to 1 s: A 10, B 40 (both at their caps: .1 * 3 and .4 * 2 fit), D the other
    #   50 Mb/s. A's 3.333 Mbit are done at 2/3 + 1/3 = 1 s. Left: B 6.667, D 23.333.
    # 1 s to 7/6 s: B 40, D 60. B done at 1 + 6.667 / 40 = 7/6 s. Left: D 13.333.
    # 7/6 s on: D alone at 100 Mb/s: 7/6 + 0.1333 = 1.3 s (= 130 Mbit / 100 Mb/s: D never
    # stopped using what the others left, the medium was full throughout).
    traces, specs = _mixed_round()
    t = time_round(traces, specs, SERVERS, UP, method=method)
    finish = {c.client_id: c.finish_s for c in t.clients}
    assert finish == pytest.approx({1: 1.0, 2: 7 / 6, 3: 2 / 3, 4: 1.3}, rel=1e-12)
    # The old rule (each flow at min(rate, cap) / n): A and B need 1 s alone, C .2, D .6;
    # four at 1/4 each: C done at .8 s; three at 1/3: D's .4 left done at .8 + 1.2 = 2 s;
    # A and B's .4 left at 1/2: 2.8 s.
    old = {c: dataclasses.replace(s, uplink_max_share=1.0) for c, s in specs.items()}
    t_old = time_round(traces, old, SERVERS, UP, method=method)
    finish_old = {c.client_id: c.finish_s for c in t_old.clients}
    assert finish_old == pytest.approx({1: 2.8, 2: 2.8, 3: 0.8, 4: 2.0}, rel=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_unequal_link_rates_share_the_medium_s_time(method: str):
    # Today's rule for uncapped flows is equal shares of the medium's TIME, each at its own
    # link rate; capped flows keep it. E: link 50 Mb/s, cap 10 Mb/s -> needs 10 / 50 = 20 %
    # of the time; F: link 100 Mb/s, uncapped, gets the other 80 %: 80 Mb/s. 10 Mbit each:
    # F done at 10 / 80 = 0.125 s, E at its cap throughout: 10 / 10 = 1 s.
    # (Old rule: E 10 Mb/s / 2, F 100 / 2: F at 0.2 s, E at 0.2 + 0.9 = 1.1 s.)
    specs = {5: _flow(5, 50e6, 10e6), 6: _flow(6, 100e6, math.inf)}
    traces = {5: (Upload(1_250_000),), 6: (Upload(1_250_000),)}
    t = time_round(traces, specs, SERVERS, UP, method=method)
    assert {c.client_id: c.finish_s for c in t.clients} == pytest.approx({5: 1.0, 6: 0.125})


def test_capped_processor_sharing_arrivals_by_hand():
    # Solo seconds at the goodput; shares 0.5 and 1. Job 0 (share .5, 1 s alone) arrives at
    # 0 s and runs alone at its cap (p = 1). Job 1 (uncapped, 1 s alone) arrives at 0.5 s:
    # .5 * 2 <= 1, so job 0 keeps its half (p = 1) and job 1 gets the other half (p = .5).
    # Job 0 is done at 1 s; job 1 has .25 s done, then alone: 1 + .75 = 1.75 s.
    assert capped_processor_sharing([0.0, 0.5], [1.0, 1.0], [0.5, 1.0]) == [1.0, 1.75]
    # a capped job at rate 0 never leaves and keeps its share (here .5 of the time)
    assert capped_processor_sharing([0.0, 0.0], [math.inf, 1.0], [0.5, 1.0]) == [math.inf, 2.0]
    assert capped_processor_sharing([], [], []) == []


@pytest.mark.parametrize("method", METHODS)
def test_capped_and_uncapped_media_apart(method: str):
    """A capped flow on the uplink does not change the downlink's processor sharing, nor
    another edge server's uplink."""
    specs = {
        1: _flow(1, 8e6, 2e6),
        2: _flow(2, 8e6, math.inf),
        3: _flow(3, 8e6, math.inf, edge_server=1),
        4: _flow(4, 8e6, math.inf, edge_server=1),
    }
    specs = {c: dataclasses.replace(s, downlink_rate_bps=8e6) for c, s in specs.items()}
    traces = {c: (Download(1_000_000), Upload(1_000_000)) for c in specs}
    net = NetworkSpec(uplink_shared=True, downlink_shared=True)
    t = time_round(traces, specs, SERVERS * 2, net, method=method)
    by = {c.client_id: c for c in t.clients}
    for c in by.values():  # two 8 Mbit downloads per edge server at 8 / 2 Mb/s: 2 s
        assert c.download_s == 2.0
    # edge server 0: 1 needs 2 / 8 = 1/4 of the time (2 Mb/s: 4 s), 2 gets 3/4: 6 Mb/s,
    # done 8 / 6 = 1.333 s after the download; then 1 alone at its cap
    assert by[1].upload_s == pytest.approx(4.0) and by[2].upload_s == pytest.approx(4 / 3)
    # edge server 1: processor sharing, 8 / 4 = 2 s each
    assert by[3].upload_s == 2.0 and by[4].upload_s == 2.0


# ---------------------------------------------------------------------------------------
# (c) property: against a water-filling simulation of its own, in bits
# ---------------------------------------------------------------------------------------
def _fair_rates_bps(rate_bps: list[float], cap_bps: list[float]) -> list[float]:
    """Max-min fair shares of the medium's time with per-flow caps, by progressive
    filling: raise every unfrozen flow's time share together; a flow whose cap is reached
    (cap <= share * its link rate) is frozen at its cap; repeat until none freezes."""
    n = len(rate_bps)
    frozen = [False] * n
    while True:
        free = [i for i in range(n) if not frozen[i]]
        if not free:
            return [cap_bps[i] for i in range(n)]
        used = sum(cap_bps[i] / rate_bps[i] for i in range(n) if frozen[i])
        level = (1.0 - used) / len(free)
        newly = [i for i in free if cap_bps[i] <= level * rate_bps[i]]
        if not newly:
            return [cap_bps[i] if frozen[i] else level * rate_bps[i] for i in range(n)]
        for i in newly:
            frozen[i] = True


def _brute_force_finish_s(
    arrive_s: list[float], bits: list[float], rate_bps: list[float], cap_bps: list[float]
) -> list[float]:
    """Each flow's finish time, event by event in bits."""
    n = len(arrive_s)
    left = list(bits)
    finish = [math.nan] * n
    now = 0.0
    active: list[int] = []
    pending = sorted(range(n), key=lambda i: arrive_s[i])
    while pending or active:
        rates = _fair_rates_bps([rate_bps[i] for i in active], [cap_bps[i] for i in active])
        to_finish = [left[i] / r for i, r in zip(active, rates, strict=True)]
        t_done = now + min(to_finish, default=math.inf)
        t_arrive = arrive_s[pending[0]] if pending else math.inf
        t = min(t_done, t_arrive)
        for i, r in zip(active, rates, strict=True):
            left[i] -= r * (t - now)
        now = t
        if t_done <= t_arrive:
            first = min(to_finish)
            done = [i for i, d in zip(active, to_finish, strict=True) if d <= first * (1 + 1e-12)]
            for i in done:
                finish[i] = now
            active = [i for i in active if i not in done]
        else:
            active.append(pending.pop(0))
    return finish


_flows = st.lists(
    st.tuples(
        st.floats(0.0, 5.0),  # arrival, s
        st.integers(1, 2_000_000),  # bytes
        st.sampled_from([10e6, 20e6, 54e6, 100e6]),  # link rate, b/s
        st.one_of(st.just(math.inf), st.floats(0.5e6, 60e6)),  # cap, b/s
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_flows)
def test_engines_match_a_brute_force_water_filling(flows):
    specs, traces = {}, {}
    for c, (arrive, nbytes, rate, cap) in enumerate(flows):
        specs[c] = _flow(c, rate, cap)
        # arrive by computing arrive * 1e9 FLOPs at 1e9 FLOP/s (0 s: no compute op)
        traces[c] = ((Compute(arrive * 1e9, 0),) if arrive > 0 else ()) + (Upload(nbytes),)
    arrive_s = [arrive * 1e9 / 1e9 if arrive > 0 else 0.0 for arrive, *_ in flows]
    want = _brute_force_finish_s(
        arrive_s,
        [8.0 * nbytes for _, nbytes, _, _ in flows],
        [rate for *_, rate, _ in flows],
        [min(rate, cap) for *_, rate, cap in flows],
    )
    for method in ("simpy", "events", "media"):
        t = time_round(traces, specs, SERVERS, UP, method=method)
        got = [c.finish_s for c in t.clients]
        assert got == pytest.approx(want, rel=1e-9), method
    # the columns path replays take (media_columns)
    ids = list(traces)
    plan = plan_traces(traces)
    assert plan is not None
    cols = ClientColumns.of([specs[c] for c in ids])
    solved = engine_media.media_columns(plan, cols, np.zeros(len(ids), dtype=int), SERVERS, UP)
    assert solved is not None
    assert solved[0].tolist() == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------------------------------
# the fast paths against SimPy on random rounds with capped flows
# ---------------------------------------------------------------------------------------
def _capped(rng: np.random.Generator, specs: dict[int, ClientSpec]) -> dict[int, ClientSpec]:
    """Some clients' flows capped at a random share of their medium (some media none)."""
    p = rng.choice([0.0, 0.3, 0.8])
    out = {}
    for cid, s in specs.items():
        up = float(rng.uniform(0.0, 1.0)) if rng.random() < p else 1.0
        down = float(rng.uniform(0.0, 1.0)) if rng.random() < p else 1.0
        out[cid] = dataclasses.replace(s, uplink_max_share=up, downlink_max_share=down)
    return out


def test_fast_paths_equal_simpy_on_random_rounds_with_capped_flows():
    rng = np.random.default_rng(27)
    seen = {"capped": 0, "media": 0, "identical": 0}
    rounds = 400
    for _ in range(rounds):
        traces, specs, servers, net, agg = random_round(rng)
        specs = _capped(rng, specs)
        ref = time_round(traces, specs, servers, net, agg, method="simpy")
        events = engine_events.event_timelines(traces, specs, servers, net)
        assert events is not None
        got = dispatch._summarise(events, net.deadline_s, agg)
        assert_timing_close(got, ref)
        seen["identical"] += got == ref
        media = engine_media.media_timelines(traces, specs, servers, net)
        if media is not None:
            assert_timing_close(dispatch._summarise(media, net.deadline_s, agg), ref)
            seen["media"] += 1
        seen["capped"] += any(
            (net.uplink_shared and s.uplink_max_share < 1)
            or (net.downlink_shared and s.downlink_max_share < 1)
            for s in specs.values()
        )
    assert seen["capped"] > 100 and seen["media"] > 50, seen
    assert seen["identical"] > 0.95 * rounds, seen  # float for float but for ties


def test_columns_equal_specs_with_capped_flows():
    """time_round_columns (replays) gives time_round's numbers on capped media."""
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(80):
        n = int(rng.integers(64, 150))  # groups of >= 32 per edge server: the media path
        ids = rng.permutation(500)[:n].tolist()
        es = rng.integers(0, 2, size=n)
        specs = {}
        traces = {}
        for k, c in enumerate(ids):
            rate = float(rng.choice([10e6, 50e6]))
            cap = float(rng.uniform(1e6, 30e6)) if rng.random() < 0.5 else math.inf
            specs[c] = dataclasses.replace(_flow(c, rate, cap), edge_server=int(es[k]))
            traces[c] = (
                Download(int(rng.integers(1, 1e6))),
                Compute(float(rng.uniform(0, 1e9)), 0),
                Upload(int(rng.integers(1, 1e6))),
            )
        net = NetworkSpec(uplink_shared=True, downlink_shared=bool(rng.random() < 0.5))
        plan = plan_traces(traces)
        assert plan is not None
        cols = ClientColumns.of([specs[c] for c in ids])
        got = time_round_columns(
            plan, cols, net, servers=SERVERS * 2, edge_server=es.astype(np.int64)
        )
        if got is None:  # groups too small for the media path
            continue
        ref = time_round(traces, specs, SERVERS * 2, net, method="simpy")
        assert_timing_close(got.timing(), ref)
        checked += 1
    assert checked > 20
