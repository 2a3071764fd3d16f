"""Handover during a round (``geometry.handover``; docs/mobility.md, "Handover during a
round"): the A3 rule evaluated at every measurement time, and a transfer that crosses a
cell edge handed over mid-way with its interruption, against a hand calculation.

The case: sites A = (200, 100) m (edge server 0) and B = (800, 100) m (edge server 1);
client 0 walks along y = 130 m from x = 300 m at 10 m/s (an ns-2 trace: x(t) = 300 +
10 t), client 1 stands at (150, 100). Rule ``nearest``, hysteresis H = 20 m,
time-to-trigger 0.32 s, measurements every 0.2 s (the mobility grid too, so every grid
position is a whole metre: exact in float32). B enters when d_A − d_B > 20 m:

    t (s)   x (m)   d_A = √((x − 200)² + 30²)   d_B = √((800 − x)² + 30²)   d_A − d_B
    21.0    510     √97,000 = 311.448           √85,000 = 291.548            19.900
    21.2    512     √98,244 = 313.439           √83,844 = 289.558            23.881  enters

held 0 s at 21.2, 0.2 s at 21.4, 0.4 s ≥ 0.32 s at 21.6: the client hands over at
t_h = 21.6 s (measurement 108).

The channel: exponent model (PL0 = −40 dB at 1 m, γ = 4), 10 MHz, 23 dBm, N0 = −174
dBm/Hz, no fading or interference: r_s(t) = B · log2(1 + k · 10^−4 · d_s(t)^−4) with
k = p / (N0 · B). An upload of 4 Mbit starts at 20 s (a round starting there): on A
its bits up to 21.6 s, nothing for the interruption (0.05 s), the rest on B from
21.65 s, each stretch integrated by the engine's documented rule (mid*: whole grid pieces
at their midpoints' rates; the piece a stretch ends in at the midpoint of the part used,
three fixed-point iterations).
"""

from __future__ import annotations

import math

import pytest
from support.scenarios import tiny

from mecsim.emulation.engine import time_round
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Upload
from mecsim.scenario import ScenarioError, scenario_from_dict

NS2 = """\
$node_(0) set X_ 300.0
$node_(0) set Y_ 130.0
$node_(1) set X_ 150.0
$node_(1) set Y_ 100.0
$ns_ at 0.0 "$node_(0) setdest 900.0 130.0 10.0"
"""
STEP_S = 0.2
INTERRUPTION_S = 0.05
BANDWIDTH_HZ = 10e6
P_W = 10 ** (23 / 10) / 1e3
N0_W_PER_HZ = 10 ** (-174 / 10) / 1e3
K = P_W / (N0_W_PER_HZ * BANDWIDTH_HZ)
A, B = (200.0, 100.0), (800.0, 100.0)


def _scenario(tmp_path, handover: dict | None = None, **extra):
    path = tmp_path / "walk.tcl"
    path.write_text(NS2)
    geometry = {
        "area": {"width_m": 1000, "height_m": 200},
        "sites": {"layout": "explicit", "positions_m": [list(A), list(B)]},
        "association": {"rule": "nearest", "hysteresis_m": 20.0, "time_to_trigger_s": 0.32},
        "mobility": {
            "model": "trace",
            "step_s": STEP_S,
            "trace": {"format": "ns2", "path": str(path)},
        },
    }
    if handover is not None:
        geometry["handover"] = handover
    channel = {
        "model": "shannon",
        "interference": None,
        "uplink": {"transport": "ideal", "bandwidth_hz": BANDWIDTH_HZ, "tx_power_dbm": 23.0},
        "downlink": {"transport": "ideal"},
    }
    return tiny(
        topology={"clients": 2, "edge_servers": 2}, channel=channel, geometry=geometry, **extra
    )


def _rate(site: tuple[float, float], t: float) -> float:
    x = 300.0 + 10.0 * t
    d = math.hypot(x - site[0], 130.0 - site[1])
    return BANDWIDTH_HZ * math.log2(1.0 + K * 1e-4 * d**-4.0)


def _next_grid(t: float) -> float:
    b = (math.floor(t / STEP_S + 1e-9) + 1) * STEP_S
    return b if b - t > 1e-9 * STEP_S else b + STEP_S


def _mid_star_end(site, t0: float, bits: float) -> float:
    """When ``bits`` sent from ``t0`` on ``site`` are through (the mid* rule)."""
    t, left = t0, bits
    while True:
        b = _next_grid(t)
        r = _rate(site, (t + b) / 2)
        if r * (b - t) >= left:
            end = t + left / r
            for _ in range(3):
                end = t + left / _rate(site, (t + end) / 2)
            return end
        left -= r * (b - t)
        t = b


def _bits_until(site, t0: float, limit: float) -> float:
    """Bits sent on ``site`` from ``t0`` to ``limit``: whole pieces at their midpoints,
    the last part at the midpoint of the part used."""
    t, sent = t0, 0.0
    while True:
        b = _next_grid(t)
        if b >= limit:
            return sent + _rate(site, (t + limit) / 2) * (limit - t)
        sent += _rate(site, (t + b) / 2) * (b - t)
        t = b


def test_a3_is_evaluated_at_every_measurement_time(tmp_path):
    sc = _scenario(tmp_path, {"measurement_period_s": STEP_S, "interruption_s": INTERRUPTION_S})
    net = NetworkModel(sc, device_profiles(sc))
    timeline = net.moving.timeline
    assert timeline.serving_at(21.4).tolist() == [0, 0]
    timeline.advance_to(21.4)
    assert timeline.held_s[0, 1] == pytest.approx(0.2)  # entered at 21.2 s
    assert timeline.serving_at(21.6).tolist() == [1, 0]
    assert timeline.between(0, 0.0, 30.0).tolist() == [108 * STEP_S]
    # a round's start takes the cells of the last measurement at or before it
    net.links(0, [0, 1], 0.0)
    net.links(1, [0, 1], 21.5)
    assert net.edge_server.tolist() == [0, 0] and net.round_cells.handovers.tolist() == [0, 0]
    net.links(2, [0, 1], 21.7)
    assert net.edge_server.tolist() == [1, 0] and net.round_cells.handovers.tolist() == [1, 0]


@pytest.mark.parametrize("method", ["simpy", "events", "auto"])
def test_an_upload_crossing_the_cell_edge_is_handed_over_with_its_interruption(tmp_path, method):
    bits = 4e6
    t0, t_h = 20.0, 108 * STEP_S
    assert t_h == pytest.approx(21.6, abs=1e-12)
    on_a = _bits_until(A, t0, t_h)
    assert 0 < on_a < bits  # not through on A before the handover
    finish = _mid_star_end(B, t_h + INTERRUPTION_S, bits - on_a)
    by_hand = finish - t0
    # without the handover the upload finishes on A (farther), later
    on_a_alone = _mid_star_end(A, t0, bits) - t0
    assert on_a_alone > by_hand + 0.1

    sc = _scenario(tmp_path, {"measurement_period_s": STEP_S, "interruption_s": INTERRUPTION_S})
    net = NetworkModel(sc, device_profiles(sc))
    net.round(0, [0, 1], 0.0, records=False)
    specs, servers, network, _ = net.round(1, [0, 1], t0, records=False)
    up = specs[0].uplink_rate_bps
    assert up.transfer_time_s(bits, 0.0) == pytest.approx(by_hand, rel=1e-9, abs=1e-9)
    t = time_round({0: (Upload(int(bits / 8)),)}, {0: specs[0]}, servers, network, method=method)
    assert t.clients[0].upload_s == pytest.approx(by_hand, rel=1e-9, abs=1e-9)

    # the same round without handover during rounds: the upload stays on A
    old = _scenario(tmp_path)
    net = NetworkModel(old, device_profiles(old))
    net.round(0, [0, 1], 0.0, records=False)
    specs, _, _, _ = net.round(1, [0, 1], t0, records=False)
    assert specs[0].uplink_rate_bps.transfer_time_s(bits, 0.0) == pytest.approx(
        on_a_alone, rel=1e-9
    )


def test_a_transfer_starting_during_an_interruption_waits_for_its_end(tmp_path):
    """An upload from 21.62 s (0.02 s into the interruption) starts at 21.65 s on B."""
    bits = 1e6
    sc = _scenario(tmp_path, {"measurement_period_s": STEP_S, "interruption_s": INTERRUPTION_S})
    net = NetworkModel(sc, device_profiles(sc))
    net.round(0, [0, 1], 0.0, records=False)
    specs, _, _, _ = net.round(1, [0, 1], 20.0, records=False)
    got = specs[0].uplink_rate_bps.transfer_time_s(bits, 1.62)
    by_hand = _mid_star_end(B, 108 * STEP_S + INTERRUPTION_S, bits) - (20.0 + 1.62)
    assert got == pytest.approx(by_hand, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"geometry": {"mobility": {"model": "static"}}}, "do not move"),
        ({"algorithm": {"name": "phsfl"}}, "hierarchical"),
    ],
)
def test_handover_during_a_round_is_refused_where_it_is_not_built(tmp_path, change, why):
    sc = _scenario(tmp_path, {})
    data = sc.model_dump(mode="json")
    for key, value in change.items():
        data[key] = {**data[key], **value}
    with pytest.raises(ScenarioError, match=rf"geometry\.handover: .*{why}"):
        scenario_from_dict(data, "t")


def test_bad_handover_values_are_refused_naming_the_field(tmp_path):
    data = _scenario(tmp_path, {}).model_dump(mode="json")
    data["geometry"]["handover"] = {"interruption_s": -0.01}
    with pytest.raises(ScenarioError, match=r"geometry\.handover\.interruption_s"):
        scenario_from_dict(data, "t")
    data["geometry"]["handover"] = {"measurement_period_s": 0}
    with pytest.raises(ScenarioError, match=r"geometry\.handover\.measurement_period_s"):
        scenario_from_dict(data, "t")


def test_a_scenario_without_the_field_dumps_as_before(tmp_path):
    sc = _scenario(tmp_path)
    assert "handover" not in sc.model_dump(mode="json")["geometry"]
    on = _scenario(tmp_path, {})
    assert on.model_dump(mode="json")["geometry"]["handover"] == {
        "measurement_period_s": 0.2,
        "interruption_s": 0.05,
    }


def test_the_records_say_where_a_transfer_was_handed_over(tmp_path):
    """The round from 20 s lasting 5 s: client 0 hands over once, 1.6 s after the
    round's start, during its upload; client 1 stands (none). A transfer timed after the
    handover is not counted as handed over."""
    sc = _scenario(tmp_path, {"measurement_period_s": STEP_S, "interruption_s": INTERRUPTION_S})
    net = NetworkModel(sc, device_profiles(sc))
    net.round(0, [0, 1], 0.0, records=False)
    specs, _, _, _ = net.round(1, [0, 1], 20.0, records=False)
    specs[0].downlink_rate_bps.transfer_time_s(1e5, 0.0)  # through before 21.6 s
    specs[0].uplink_rate_bps.transfer_time_s(4e6, 0.0)
    rows = net.handovers_in_round([0, 1], 20.0, 5.0)
    assert rows[0]["handovers_in_round"] == 1
    assert rows[0]["handover_s"] == pytest.approx(1.6, abs=1e-12)
    assert rows[0]["handover_transfer"] == "upload"
    assert rows[1]["handovers_in_round"] == 0 and math.isnan(rows[1]["handover_s"])
    assert rows[1]["handover_transfer"] == ""
    keys = ("handovers_in_round", "handover_s", "handover_transfer")
    from mecsim.emulation.network import client_record_keys

    assert client_record_keys(sc)[-3:] == keys
    assert not set(keys) & set(client_record_keys(_scenario(tmp_path)))


def test_the_new_fields_can_be_set_by_an_override(tmp_path):
    """Left out of a dump at their defaults, the fields are still override paths."""
    from mecsim.scenario.overrides import apply_overrides

    sc = _scenario(tmp_path)
    on = apply_overrides(sc, {"geometry.handover": {"interruption_s": 0.03}})
    assert on.geometry.handover.interruption_s == 0.03
    assert on.geometry.handover.measurement_period_s == 0.2
    off = apply_overrides(on, {"geometry.handover": None})
    assert off.geometry.handover is None
