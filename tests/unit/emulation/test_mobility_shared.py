"""Moving clients on a shared medium (``geometry.mobility.rate: step`` with a shared cell;
docs/mobility.md, "Moving clients on a shared medium"): a moving link's rate piece by
piece (:meth:`MovingRate.segments`, the grid steps' midpoints), one flow alone against
the integral worked by hand, two walkers sharing a cell, every engine path against the
SimPy model on rounds of a moving scenario, and the radio energy of such a client.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from support.moving import BANDWIDTH_HZ, moving_links, straight_track
from support.scenarios import tiny

from mecsim.emulation.engine import (
    ClientSpec,
    NetworkSpec,
    ServerSpec,
    engine_path,
    time_round,
)
from mecsim.emulation.moving_rate import MovingRate
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, Download, ServerCompute, Upload

SHARED_UP = NetworkSpec(uplink_shared=True)
METHODS = ("simpy", "events", "media", "auto")


def _rate(d_m: float) -> float:
    """The channel's Shannon rate at ``d_m`` metres: 10 MHz · log2(1 + 10^8.7 d^−4)."""
    return BANDWIDTH_HZ * math.log2(1.0 + 10**8.7 * d_m**-4.0)


def _walker(start_x: float, speed_mps: float, round_start_s: float = 0.0) -> MovingRate:
    """A client walking away from the site at (0, 0) along the x axis, 1 s steps."""
    track = straight_track((start_x, 0.0), (speed_mps, 0.0))
    return MovingRate(moving_links(track, (0.0, 0.0), 1.0, round_start_s), 0)


def test_segments_are_the_grid_steps_midpoint_rates_by_hand():
    """A car from 100 m at 30 m/s, the round starting at 2.5 s, a transfer from 0.2 s
    (2.7 s absolute): its first piece ends at the next grid time, 3 s (0.5 s relative),
    at the rate of step [2, 3]'s midpoint, 2.5 s: d = 100 + 75 = 175 m; then whole steps
    at 3.5 s (d = 205 m), 4.5 s (235 m), ... An outage [0.9, 1.2) cuts the second piece."""
    car = MovingRate(
        moving_links(straight_track((100.0, 0.0), (30.0, 0.0)), (0.0, 0.0), 1.0, 2.5), 0
    )
    first = [next(it) for it in [car.segments(0.2)] for _ in range(3)]
    assert [u for _, u in first] == [0.5, 1.5, 2.5]
    want = [_rate(175.0), _rate(205.0), _rate(235.0)]
    assert [r for r, _ in first] == pytest.approx(want, rel=1e-12)
    cut = car.with_outages([(0.9, 1.2)]).segments(0.2)
    pieces = [next(cut) for _ in range(5)]
    assert [u for _, u in pieces] == [0.5, 0.9, 1.2, 1.5, 2.5]
    assert [r for r, _ in pieces] == pytest.approx(
        [want[0], want[1], 0.0, want[1], want[2]], rel=1e-12
    )


def test_after_the_horizon_a_segment_holds_for_ever():
    """With the links' horizon at 3 s (the round's deadline), the pieces before it at
    their midpoints; from the first piece starting at or after it, the held position's
    rate (d = 100 + 30 · 3 = 190 m) until inf."""
    links = dataclasses.replace(
        moving_links(straight_track((100.0, 0.0), (30.0, 0.0)), (0.0, 0.0), 1.0), horizon_s=3.0
    )
    pieces = list(MovingRate(links, 0).segments(0.0))
    assert [u for _, u in pieces] == [1.0, 2.0, 3.0, math.inf]
    want = [_rate(115.0), _rate(145.0), _rate(175.0), _rate(190.0)]
    assert [r for r, _ in pieces] == pytest.approx(want, rel=1e-12)


def test_step_rates_far_into_the_round_are_computed_for_the_link_alone():
    """Steps past the round's first 256 s (16 blocks of 16 steps, computed for every link
    at once) are computed for the asking link alone: the same numbers, the goodput at
    each step's midpoint."""
    car = MovingRate(
        moving_links(straight_track((100.0, 0.0), (1.0, 0.0)), (0.0, 0.0), 1.0, 0.0), 0
    )
    it = car.segments(300.0)
    got = [next(it) for _ in range(3)]
    assert [u for _, u in got] == [301.0, 302.0, 303.0]
    assert [r for r, _ in got] == pytest.approx(
        [_rate(400.5), _rate(401.5), _rate(402.5)], rel=1e-12
    )
    assert set(car.links._step_rates) == {(18, 0)}  # one row: this link's block 18
    first = [next(car.segments(0.0))[0]]
    assert first == pytest.approx([_rate(100.5)], rel=1e-12)
    assert set(car.links._step_rates) == {(18, 0), 0}  # block 0: every link's


@pytest.mark.parametrize("method", METHODS)
def test_one_walker_alone_on_a_shared_cell_by_hand(method: str):
    """One flow on the medium moves at its link rate: 160 Mbit from a walker leaving
    100 m at 1.5 m/s, 1 s steps: the step midpoints' rates r_k = r(100 + 1.5 (k + 0.5))
    for whole steps, then the rest at the last step's: with S_K the bits of the first K
    whole steps (K the last for which S_K < 160 Mbit), end = K + (160e6 − S_K) / r_K."""
    bits = 160e6
    rates = [_rate(100.0 + 1.5 * (k + 0.5)) for k in range(60)]
    sent, k = 0.0, 0
    while sent + rates[k] < bits:
        sent += rates[k]
        k += 1
    by_hand = k + (bits - sent) / rates[k]
    assert 3.0 < by_hand < 60.0  # several steps
    spec = ClientSpec(0, _walker(100.0, 1.5), 1e9, 0.0, 1e9)
    t = time_round(
        {0: (Upload(int(bits / 8)),)}, {0: spec}, [ServerSpec(1e9)], SHARED_UP, method=method
    )
    assert t.clients[0].upload_s == pytest.approx(by_hand, rel=1e-12)
    # a dedicated link takes the last piece's rate at the midpoint of the part it uses
    # (mid*): 6.7908 s against 6.7932 s here, 0.035 % apart
    alone = spec.uplink_rate_bps.transfer_time_s(bits, 0.0)
    assert alone == pytest.approx(by_hand, rel=5e-4) and alone != by_hand


@pytest.mark.parametrize("method", METHODS)
def test_two_walkers_sharing_a_cell_by_hand(method: str):
    """Walker A leaves 100 m at 1.5 m/s with 40 Mbit; walker B stands at 150 m (0 m/s) with
    80 Mbit; both start at 0 on one shared uplink. Each at its link rate / 2 while both
    are on: A's rate step by step a_k = r(100 + 1.5 (k + 0.5)), B's b = r(150). By hand,
    step by step: A is through once Σ a_k / 2 reaches 8 Mbit (at t_A inside its step),
    B has sent b · t_A / 2 by then and the rest alone at b."""
    a_bits, b_bits = 40e6, 80e6
    b = _rate(150.0)
    sent_a, k = 0.0, 0
    while True:
        a_k = _rate(100.0 + 1.5 * (k + 0.5))
        if sent_a + a_k / 2 >= a_bits:
            t_a = k + (a_bits - sent_a) / (a_k / 2)
            break
        sent_a += a_k / 2
        k += 1
    t_b = t_a + (b_bits - b * t_a / 2) / b
    assert t_a > 1.0 and b * t_a / 2 < b_bits  # A spans steps; B outlasts it
    specs = {
        0: ClientSpec(0, _walker(100.0, 1.5), 1e9, 0.0, 1e9),
        1: ClientSpec(1, _walker(150.0, 0.0), 1e9, 0.0, 1e9),
    }
    traces = {0: (Upload(int(a_bits / 8)),), 1: (Upload(int(b_bits / 8)),)}
    t = time_round(traces, specs, [ServerSpec(1e9)], SHARED_UP, method=method)
    assert [c.upload_s for c in t.clients] == pytest.approx([t_a, t_b], rel=1e-12)


def _moving_shared_scenario(clients: int):
    """Walkers and cars on 2 cells whose uplinks and downlinks are shared (one medium per
    cell), ``rate: step``."""
    return tiny(
        topology={"clients": clients, "edge_servers": 2},
        channel={
            "model": "shannon",
            "interference": None,
            "uplink": {"shared": True, "access": "shared_cell", "bandwidth_hz": 20e6},
            "downlink": {"mode": "shared"},
        },
        geometry={
            "area": {"width_m": 1000, "height_m": 400},
            "sites": {"layout": "explicit", "positions_m": [[250, 200], [750, 200]]},
            "mobility": {"model": "random_waypoint", "speed_mps": [1, 35]},
        },
    )


@pytest.mark.parametrize("clients", [6, 80])
def test_every_engine_times_a_moving_shared_round_as_the_simpy_model_does(clients: int):
    """Rounds of a moving scenario on shared cells: FedAvg-like op-traces (download,
    compute, upload; ``media`` takes the 80-client round, ``events`` the 6-client one) and
    per-batch split-learning ones (uplink, edge-server CPU, downlink per batch:
    ``events``), every path to the bit against the SimPy model."""
    sc = _moving_shared_scenario(clients)
    net = NetworkModel(sc, device_profiles(sc))
    sel = list(range(clients))
    net.links(0, sel, 0.0)
    specs, servers, network, _ = net.round(1, sel, 9.0, records=False)
    assert network.uplink_shared and network.downlink_shared
    assert all(isinstance(specs[c].uplink_rate_bps, MovingRate) for c in sel)
    fedavg = {
        c: (Download(400_000 + 9_000 * c), Compute(1e9 + 1e7 * c, 5), Upload(900_000 + 7_000 * c))
        for c in sel
    }
    per_batch = {
        c: tuple(
            op
            for _ in range(4)
            for op in (
                Compute(2e8, 1),
                Upload(60_000 + 500 * c),
                ServerCompute(1e8, 1),
                Download(60_000 + 300 * c),
            )
        )
        for c in sel
    }
    for traces, path in ((fedavg, "media" if clients >= 64 else "events"), (per_batch, "events")):
        ref = time_round(traces, specs, servers, network, 0.01, method="simpy")
        assert engine_path(traces, specs, servers, network) == path
        for method in ("events", "media", "auto"):
            assert time_round(traces, specs, servers, network, 0.01, method=method) == ref, method
        assert all(c.completed for c in ref.clients) and ref.round_time_s > 0


def test_a_moving_client_s_radio_energy_on_a_shared_medium_is_its_air_time():
    """On a shared medium a transfer's duration holds the other flows' shares: a moving
    client's radio is charged its bits at its air rate at the round's start (as a
    constant link is), not the duration; on a dedicated link, the duration."""
    sc = _moving_shared_scenario(6)
    net = NetworkModel(sc, device_profiles(sc))
    sel = list(range(6))
    net.links(0, sel, 0.0)
    links = net.links(1, sel, 9.0)
    air_up, air_down = net.round_links[0].T
    assert np.isfinite(air_up).all() and np.isfinite(air_down).all()
    assert air_up.tolist() == links.uplink_goodput_bps.tolist()  # no loss: the goodput
