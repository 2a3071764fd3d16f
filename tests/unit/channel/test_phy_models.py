"""``channel.phy`` in scenarios: each rate model through the network model against
numbers worked out by hand or from the standards' tables, and what is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mecsim.channel.phy import he_rate_bps, wifi_station_rates_bps
from mecsim.channel.phy_models import NrPhy, ShannonPhy, TruncatedShannonPhy, WifiAxPhy
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.scenario import ScenarioError, scenario_from_dict


def _cell(phy, n=1, distance_m=10.0, **channel):
    data = {
        "topology": {"clients": n},
        "channel": {
            "model": "shannon",
            "phy": phy,
            "distance_m": distance_m,
            "uplink": {"bandwidth_hz": 20e6, "tx_power_dbm": 20.0},
            "downlink": {"bandwidth_hz": 20e6, "tx_power_dbm": 20.0, "mode": "full"},
            **channel,
        },
    }
    return scenario_from_dict(data, "phy.yaml")


def _rates(sc, n=1):
    nm = NetworkModel(sc, device_profiles(sc))
    specs, _, _, rows = nm.round(0, list(range(n)))
    return nm, specs, rows


def test_shannon_phy_is_the_channels_own_formula_float_for_float():
    sinr = np.array([0.5, 3.0, 1000.0])
    b = np.array([10e6, 20e6, 5e6])
    assert ShannonPhy().rates_bps(sinr, b, None, "ul").tolist() == (b * np.log2(1 + sinr)).tolist()
    # a scenario that names no phy builds none: its rates are the channel's own formula,
    # float for float as before channel.phy existed
    sc = _cell({})
    assert NetworkModel(sc, device_profiles(sc)).channel.phy is None


def test_truncated_shannon_by_hand():
    # SINR 10 dB: log2(11) = 3.4594; uplink 0.4 · 3.4594 = 1.3838 b/s/Hz (< 2.0)
    ul = TruncatedShannonPhy().rates_bps(np.array([10.0]), 10e6, None, "ul")
    assert float(ul[0]) == pytest.approx(10e6 * 0.4 * math.log2(11), rel=1e-12)
    # downlink 0.6 · log2(1 + 1000) = 5.98 -> capped at 4.4
    dl = TruncatedShannonPhy().rates_bps(np.array([1000.0]), 10e6, None, "dl")
    assert float(dl[0]) == pytest.approx(44e6, rel=1e-12)
    # below SINR_MIN (-10 dB): nothing
    assert float(TruncatedShannonPhy().rates_bps(np.array([0.05]), 10e6, None, "ul")[0]) == 0.0
    # a scenario's own α
    # a scenario's own α: 0.75 · log2(1 + 3) = 1.5 b/s/Hz (under the uplink's 2.0)
    own = TruncatedShannonPhy(alpha=0.75).rates_bps(np.array([3.0]), 1e6, None, "ul")
    assert float(own[0]) == pytest.approx(1.5e6, rel=1e-12)


def test_a_wifi_station_close_to_its_access_point_gets_mcs_11_and_the_macs_rate():
    """One station 5 m away (ns-3's path loss: 46.6777 + 30·log10(5) = 67.65 dB; noise
    -173.975 + 73.01 + 7 = -93.97 dBm; SNR 46.3 dB): MCS 11 (143.4 Mb/s on the PHY),
    and the rate of one station alone in its cell on the air (42-MPDU A-MPDUs, its ACKs,
    backoff): 115.5 Mb/s of IP packets, 111.5 Mb/s of TCP payload."""
    sc = _cell(
        {"model": "wifi_ax"},
        distance_m=5.0,
        noise_figure_db=7.0,
        noise_psd_dbm_per_hz=10 * math.log10(1.3803e-23 * 290 * 1e3),
        path_loss_db=-46.6777,
        path_loss_exponent=3.0,
    )
    nm, specs, rows = _rates(sc)
    assert rows[0]["uplink_snr_db"] == pytest.approx(46.319, abs=0.01)
    assert he_rate_bps(11) == pytest.approx(143.382e6, rel=1e-4)
    expect = float(wifi_station_rates_bps(np.array([11]))[0])
    assert expect == pytest.approx(115.5e6, rel=0.01)
    assert rows[0]["uplink_rate_bps"] == pytest.approx(expect, rel=1e-12)
    assert specs[0].uplink_rate_bps == pytest.approx(expect * 1448 / 1500, rel=1e-12)
    # its TCP round trip is the wired path's (the scenario's latencies); what its MAC
    # adds to a window-limited flow is read from its exchanges: 42-MPDU A-MPDUs, and per
    # MPDU a 1,544-byte subframe and half a 96-byte TCP ACK subframe at MCS 11's 1,950
    # bits a 13.6 µs symbol, (12,352 + 384) / 1,950 · 13.6 µs = 88.83 µs
    tcp = specs[0].uplink_tcp
    assert tcp.rtt_s == pytest.approx(0.0, abs=1e-12)
    assert tcp.ampdu_mpdus == 42
    assert tcp.mpdu_air_s == pytest.approx(88.83e-6, rel=0.01)


def test_stations_of_one_cell_contend_and_the_cells_efficiency_falls_with_their_number():
    one = wifi_station_rates_bps(np.array([7]))
    ten = wifi_station_rates_bps(np.full(10, 7))
    # the same MCS, 10 contenders: each station's rate on the air is lower (backoff and
    # collisions grow), and equal among equals
    assert np.all(ten < one[0]) and np.ptp(ten) == 0.0
    # through a scenario: a shared cell's stations contend, dedicated ones do not
    for access, n_contend in (("shared_cell", 4), ("dedicated", 1)):
        sc = _cell({"model": "wifi_ax"}, n=4, distance_m=20.0)
        data = sc.model_dump(mode="json")
        data["channel"]["uplink"]["access"] = access
        data["channel"]["uplink"]["shared"] = access == "shared_cell"
        sc = scenario_from_dict(data, "phy.yaml")
        _, _, rows = _rates(sc, 4)
        mcs = WifiAxPhy().mcs(10 ** (rows[0]["uplink_snr_db"] / 10), 20)
        expect = wifi_station_rates_bps(np.full(n_contend, int(mcs)))[0]
        assert rows[0]["uplink_rate_bps"] == pytest.approx(float(expect), rel=1e-12)


def test_nr_rate_from_the_cqi_tables():
    """SINR 20 dB: the bound log2(1 + 100/Γ), Γ = -ln(2.5e-4)/1.5 = 5.529, is 4.25 b/s/Hz;
    the CQI is the highest of table 2 whose efficiency is at most that; the rate its
    efficiency over 51 PRBs (20 MHz at 30 kHz) with TS 38.306's overhead."""
    from mecsim.channel.phy import nr_cqi_efficiency, piro_snr_gap

    se_bound = math.log2(1 + 100 / piro_snr_gap())
    effs = nr_cqi_efficiency(np.arange(1, 16))
    cqi = int(np.searchsorted(effs, se_bound, side="right"))
    assert effs[cqi - 1] <= se_bound < effs[cqi]
    # 20 MHz at 30 kHz: 51 PRBs; TS 38.306: SE · 51 · 12 · 14 · 2 / 1 ms · (1 - 0.14)
    expect = effs[cqi - 1] * 51 * 12 * 14 * 2 * 1e3 * (1 - 0.14)
    got = NrPhy().rates_bps(np.array([100.0]), 20e6, None, "dl")
    assert float(got[0]) == pytest.approx(expect, rel=1e-12)
    up = NrPhy().rates_bps(np.array([100.0]), 20e6, None, "ul")
    assert float(up[0]) == pytest.approx(expect / 0.86 * 0.92, rel=1e-12)


@pytest.mark.parametrize(
    ("phy", "channel", "field"),
    [
        ({"model": "wifi_ax"}, {"uplink": {"bandwidth_hz": 30e6}}, "uplink.bandwidth_hz"),
        ({"model": "wifi_ax"}, {"downlink": {"bandwidth_hz": 50e6}}, "downlink.bandwidth_hz"),
        ({"model": "wifi_ax"}, {"downlink": {"mode": "equal_split"}}, "downlink.mode"),
        ({"model": "nr", "subcarrier_spacing_khz": 120}, {}, "phy.subcarrier_spacing_khz"),
        ({"model": "nr"}, {"uplink": {"bandwidth_hz": 7e6}}, "uplink.bandwidth_hz"),
        ({"model": "shannon", "spatial_streams": 2}, {}, "phy.spatial_streams"),
        ({"model": "wifi_ax", "spatial_streams": 5}, {}, "phy.spatial_streams"),
        ({"model": "wifi_ax", "guard_interval_ns": 400}, {}, "phy.guard_interval_ns"),
        ({"model": "truncated_shannon", "alpha": 0}, {}, "phy.alpha"),
        ({"model": "lte"}, {}, "phy.model"),
    ],
)
def test_a_phy_without_such_a_band_or_field_is_refused_naming_it(phy, channel, field):
    data = {
        "channel": {
            "model": "shannon",
            "phy": phy,
            "uplink": {"bandwidth_hz": 20e6, **channel.get("uplink", {})},
            "downlink": {"bandwidth_hz": 20e6, **channel.get("downlink", {})},
        }
    }
    with pytest.raises(ScenarioError, match=rf"phy.yaml: channel\.{re_escape(field)}"):
        scenario_from_dict(data, "phy.yaml")


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_moving_rate_under_another_phy_is_refused():
    data = {
        "channel": {
            "model": "shannon",
            "phy": {"model": "wifi_ax"},
            "uplink": {"bandwidth_hz": 20e6},
            "downlink": {"bandwidth_hz": 20e6},
        },
        "geometry": {
            "sites": {"layout": "hex", "rings": 0},
            "mobility": {"model": "random_waypoint", "speed_mps": [1.0, 2.0], "rate": "step"},
        },
    }
    with pytest.raises(ScenarioError, match="geometry.mobility.rate: step"):
        scenario_from_dict(data, "phy.yaml")
    data["geometry"]["mobility"]["rate"] = "round"
    scenario_from_dict(data, "phy.yaml")  # accepted


def test_a_resolved_scenario_with_a_phy_loads_back_as_it_was(tmp_path):
    """A run folder's scenario.yaml carries every field at its value: it must load back
    (resume, replay) to the same scenario."""
    from mecsim.scenario import load_recorded_scenario, resolved_yaml

    for phy in ({"model": "wifi_ax", "spatial_streams": 2}, {"model": "truncated_shannon"}):
        sc = _cell(phy, noise_figure_db=7.0)
        path = tmp_path / "scenario.yaml"
        path.write_text(resolved_yaml(sc))
        assert load_recorded_scenario(path) == sc
