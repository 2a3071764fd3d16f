"""3GPP TR 38.901 path loss (channel.path_loss): Table 7.4.1-1 and Table 7.4.2-1 against
values worked out by hand, the draws per client, validation, and the exponent model's
records unchanged.

Hand working: every log10 below is of a power of ten, of 2, or written out to 18+ digits
(a 30-digit decimal calculator: ``Decimal(x).log10()``, ``Decimal(-x).exp()``); the
expected values are the table's formulas evaluated with them, not the code's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.scenarios import tiny

from mecsim.analysis.replay import load_run, replay
from mecsim.channel import ClientRadio, ShannonChannel, Tr38901PathLoss
from mecsim.channel.pathloss import (
    breakpoint_distance_m,
    los_probability_uma,
    los_probability_umi,
    uma_c_prime,
    uma_los_db,
    uma_nlos_db,
    umi_los_db,
    umi_nlos_db,
)
from mecsim.emulation.network import (
    NetworkModel,
    build_channel,
    channel_record_keys,
    device_profiles,
)
from mecsim.run.rows import REPLAY_COLUMNS
from mecsim.scenario import ScenarioError, load_scenario
from mecsim.scenario.loader import default_scenario_path
from mecsim.scenario.overrides import apply_overrides
from mecsim.store.checkpoints import scenario_digest
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder

TOL_DB = 1e-9


def _d2(d3: float, dh: float) -> float:
    """The 2D distance whose 3D distance is ``d3`` at a height difference ``dh``."""
    return math.sqrt(d3 * d3 - dh * dh)


# --- breakpoint distance (Table 7.4.1-1, note 1) ----------------------------------------
def test_breakpoint_distance_by_hand():
    # d'_BP = 4 (h_BS - 1)(h_UT - 1) f_c / c, f_c in Hz, c = 3e8 m/s
    # UMi, 10 m / 1.5 m, 10 GHz: 4 * 9 * 0.5 * 1e10 / 3e8 = 18 * 33.333... = 600 m
    assert breakpoint_distance_m(10.0, 1.5, 10.0) == pytest.approx(600.0, abs=1e-9)
    # UMi, 1 GHz: 60 m; UMa, 25 m / 1.5 m, 1 GHz: 4 * 24 * 0.5 * 1e9 / 3e8 = 160 m
    assert breakpoint_distance_m(10.0, 1.5, 1.0) == pytest.approx(60.0, abs=1e-9)
    assert breakpoint_distance_m(25.0, 1.5, 1.0) == pytest.approx(160.0, abs=1e-9)
    assert Tr38901PathLoss(model="38.901-uma", carrier_ghz=1.0).breakpoint_m == pytest.approx(160)


# --- UMi-Street Canyon (h_BS 10 m, h_UT 1.5 m: h_BS - h_UT = 8.5 m) -----------------------
def test_umi_los_below_the_breakpoint():
    # f_c = 10 GHz (d'_BP = 600 m); d_3D = 100 m, so d_2D = sqrt(100^2 - 8.5^2) = 99.64 m < 600
    # PL1 = 32.4 + 21 log10(100) + 20 log10(10) = 32.4 + 42 + 20 = 94.4 dB
    d2 = _d2(100.0, 8.5)
    assert float(umi_los_db(d2, 10.0)) == pytest.approx(94.4, abs=TOL_DB)


def test_umi_los_above_the_breakpoint():
    # f_c = 1 GHz (d'_BP = 60 m); d_3D = 1000 m, d_2D = sqrt(1000^2 - 8.5^2) = 999.96 m > 60
    # PL2 = 32.4 + 40 log10(1000) + 20 log10(1) - 9.5 log10(60^2 + 8.5^2)
    #     = 152.4 - 9.5 log10(3672.25) = 152.4 - 9.5 * 3.564932239502147672
    #     = 152.4 - 33.866856275270402887 = 118.533143724729597 dB
    d2 = _d2(1000.0, 8.5)
    assert float(umi_los_db(d2, 1.0)) == pytest.approx(118.5331437247296, abs=TOL_DB)
    # at the breakpoint itself (d_2D = d'_BP = 60 m, d_3D = sqrt(3600 + 72.25)) the two
    # pieces meet: PL1 = 32.4 + 21 * 0.5 log10(3672.25) and PL2 = 32.4 + (40 * 0.5 - 9.5)
    # log10(3672.25), both 32.4 + 10.5 * 3.564932239502147672 = 69.831788514772550556 dB
    assert float(umi_los_db(60.0, 1.0)) == pytest.approx(69.83178851477255, abs=TOL_DB)
    assert float(umi_los_db(60.0 + 1e-9, 1.0)) == pytest.approx(69.83178851477255, abs=1e-6)


def test_umi_nlos():
    # f_c = 10 GHz, d_3D = 100 m (as the LOS case: PL_LOS = 94.4 dB)
    # PL'_NLOS = 35.3 log10(100) + 22.4 + 21.3 log10(10) - 0.3 (1.5 - 1.5)
    #          = 70.6 + 22.4 + 21.3 = 114.3 dB;  PL_NLOS = max(94.4, 114.3) = 114.3 dB
    assert float(umi_nlos_db(_d2(100.0, 8.5), 10.0)) == pytest.approx(114.3, abs=TOL_DB)
    # h_UT = 3.5 m (h_BS - h_UT = 6.5 m, d'_BP = 4*9*2.5*1e10/3e8 = 3000 m): d_3D = 100 m
    # PL_LOS = 94.4 dB (PL1 does not depend on h_UT); PL' = 114.3 - 0.3 * 2 = 113.7 dB
    d2 = _d2(100.0, 6.5)
    assert float(umi_los_db(d2, 10.0, ut_height_m=3.5)) == pytest.approx(94.4, abs=TOL_DB)
    assert float(umi_nlos_db(d2, 10.0, ut_height_m=3.5)) == pytest.approx(113.7, abs=TOL_DB)


# --- UMa (h_BS 25 m, h_UT 1.5 m: h_BS - h_UT = 23.5 m) -----------------------------------
def test_uma_los_below_the_breakpoint():
    # f_c = 10 GHz: d'_BP = 4 * 24 * 0.5 * 1e10 / 3e8 = 1600 m; d_3D = 1000 m,
    # d_2D = sqrt(1000^2 - 23.5^2) = 999.72 m < 1600
    # PL1 = 28.0 + 22 log10(1000) + 20 log10(10) = 28 + 66 + 20 = 114.0 dB
    assert float(uma_los_db(_d2(1000.0, 23.5), 10.0)) == pytest.approx(114.0, abs=TOL_DB)


def test_uma_los_above_the_breakpoint():
    # f_c = 1 GHz: d'_BP = 160 m; d_3D = 1000 m, d_2D = 999.72 m > 160
    # PL2 = 28 + 40 log10(1000) + 20 log10(1) - 9 log10(160^2 + 23.5^2)
    #     = 148 - 9 log10(26152.25) = 148 - 9 * 4.417509059189837987
    #     = 148 - 39.757581532708541880 = 108.242418467291458 dB
    assert float(uma_los_db(_d2(1000.0, 23.5), 1.0)) == pytest.approx(
        108.24241846729146, abs=TOL_DB
    )


def test_uma_nlos():
    # f_c = 10 GHz, d_3D = 1000 m (PL_LOS = 114.0 dB, above)
    # PL'_NLOS = 13.54 + 39.08 log10(1000) + 20 log10(10) - 0.6 (1.5 - 1.5)
    #          = 13.54 + 117.24 + 20 = 150.78 dB;  PL_NLOS = max(114.0, 150.78) = 150.78 dB
    assert float(uma_nlos_db(_d2(1000.0, 23.5), 10.0)) == pytest.approx(150.78, abs=TOL_DB)
    # where the LOS formula is the larger: h_UT = 22.5 m (h_BS - h_UT = 2.5 m, d'_BP =
    # 4*24*21.5*1e10/3e8 = 68,800 m), d_3D = 20 m (d_2D = sqrt(400 - 6.25) = 19.84 m), 10 GHz
    # PL1 = 28 + 22 log10(20) + 20 = 48 + 22 * 1.301029995663981195 = 76.622659904607586 dB
    # PL' = 13.54 + 39.08 * 1.301029995663981195 + 20 - 0.6 * 21 = 71.784252230548385 dB
    # PL_NLOS = max(76.6227, 71.7843) = PL_LOS = 76.622659904607586 dB
    d2 = _d2(20.0, 2.5)
    assert float(uma_nlos_db(d2, 10.0, ut_height_m=22.5)) == pytest.approx(
        76.62265990460759, abs=TOL_DB
    )
    assert float(uma_nlos_db(d2, 10.0, ut_height_m=22.5)) == float(
        uma_los_db(d2, 10.0, ut_height_m=22.5)
    )


def test_vectorised_and_by_state():
    pl = Tr38901PathLoss(model="38.901-umi", carrier_ghz=10.0)
    d2 = np.array([_d2(100.0, 8.5), _d2(100.0, 8.5)])
    # LOS client 94.4 dB, NLOS client 114.3 dB, + their shadowing
    got = pl.path_loss_db(d2, np.array([True, False]), np.array([1.5, -2.0]))
    np.testing.assert_allclose(got, [95.9, 112.3], rtol=0, atol=TOL_DB)


# --- LOS probability (Table 7.4.2-1) -----------------------------------------------------
def test_umi_los_probability_curve():
    # 1 up to 18 m; beyond: 18/d + exp(-d/36) (1 - 18/d)
    # d = 36:  0.5  + 0.5  e^-1 = 0.5  + 0.5  * 0.367879441171442322 = 0.683939720585721161
    # d = 72:  0.25 + 0.75 e^-2 = 0.25 + 0.75 * 0.135335283236612692 = 0.351501462427459519
    # d = 180: 0.1  + 0.9  e^-5 = 0.1  + 0.9  * 0.006737946999085467 = 0.106064152299176920
    d = [10.0, 18.0, 36.0, 72.0, 180.0]
    want = [1.0, 1.0, 0.683939720585721161, 0.351501462427459519, 0.106064152299176920]
    np.testing.assert_allclose(los_probability_umi(d), want, rtol=0, atol=1e-15)


def test_uma_los_probability_curve():
    # h_UT = 1.5 m: C'(1.5) = 0, so the height factor (1 + C' 5/4 (d/100)^3 e^(-d/150)) is 1
    # d = 63:  18/63 + e^-1 (1 - 18/63) = 2/7 + 5/7 * 0.367879441171442322 = 0.548485315122458801
    # d = 126: 1/7 + 6/7 e^-2 = 0.142857142857142857 + 0.116001671345668022 = 0.258858814202810879
    d = [10.0, 18.0, 63.0, 126.0]
    want = [1.0, 1.0, 0.548485315122458801, 0.258858814202810879]
    np.testing.assert_allclose(los_probability_uma(d, 1.5), want, rtol=0, atol=1e-15)
    assert uma_c_prime(1.5) == 0.0 and uma_c_prime(13.0) == 0.0
    # h_UT = 23 m: C'(23) = ((23 - 13)/10)^1.5 = 1; d = 150 m:
    # base   = 18/150 + e^(-150/63) (1 - 0.12) = 0.12 + 0.88 * 0.092462476062919987
    #        = 0.201366978935369589
    # factor = 1 + 1 * 1.25 * 1.5^3 * e^-1 = 1 + 4.21875 * 0.367879441171442322
    #        = 2.551991392442022294
    # Pr_LOS = 0.201366978935369589 * 2.551991392442022294 = 0.513886796965117209
    assert uma_c_prime(23.0) == pytest.approx(1.0, abs=1e-15)
    # C'(17) = 0.4^1.5 = 0.4 * sqrt(0.4) = 0.4 * 0.632455532033675866 = 0.252982212813470346
    assert uma_c_prime(17.0) == pytest.approx(0.252982212813470346, abs=1e-15)
    assert float(los_probability_uma(150.0, 23.0)) == pytest.approx(0.513886796965117209, abs=1e-15)
    # the curve falls with distance, and stays in [0, 1]
    d = np.linspace(10.0, 5000.0, 500)
    for p in (los_probability_umi(d), los_probability_uma(d, 1.5)):
        assert np.all(np.diff(p) <= 0) and p.min() >= 0 and p.max() <= 1


# --- draws: the state and the shadow fading ----------------------------------------------
N = 20_000


@pytest.mark.parametrize(
    "model,los,std",
    [
        ("38.901-umi", "always", 4.0),
        ("38.901-umi", "never", 7.82),
        ("38.901-uma", "always", 4.0),
        ("38.901-uma", "never", 6.0),
    ],
)
def test_shadow_std_per_state(model, los, std):
    """The sample std of N normal draws has a standard error of about std/sqrt(2N)
    (= std/200 at N = 20,000) and the sample mean std/sqrt(N) (std/141): 5 standard errors
    each, so a correct model fails with probability ~1e-6 (and the seed is fixed)."""
    pl = Tr38901PathLoss(model=model, carrier_ghz=3.5, los=los)
    d = np.random.default_rng(0).uniform(10.0, 500.0, N)
    draw = pl.draw(d, np.random.default_rng(1))
    assert draw.los.all() if los == "always" else not draw.los.any()
    s = draw.shadow_fading_db
    assert abs(s.std(ddof=1) - std) < 5 * std / math.sqrt(2 * (N - 1))
    assert abs(s.mean()) < 5 * std / math.sqrt(N)


def test_random_state_follows_the_los_probability():
    pl = Tr38901PathLoss(model="38.901-umi", carrier_ghz=3.5)
    d = np.random.default_rng(0).uniform(10.0, 500.0, N)
    draw = pl.draw(d, np.random.default_rng(1))
    p = los_probability_umi(d)
    # the LOS count is a sum of independent Bernoulli(p_i): mean sum p, var sum p(1-p)
    assert abs(draw.los.sum() - p.sum()) < 5 * math.sqrt((p * (1 - p)).sum())
    for state, std in ((True, 4.0), (False, 7.82)):
        s = draw.shadow_fading_db[draw.los == state]
        assert abs(s.std(ddof=1) - std) < 5 * std / math.sqrt(2 * (len(s) - 1))


def test_state_and_shadowing_switches_change_no_other_draw():
    d = np.random.default_rng(0).uniform(10.0, 500.0, 1000)

    def draw(**kw):
        return Tr38901PathLoss(model="38.901-umi", carrier_ghz=3.5, **kw).draw(
            d, np.random.default_rng(7)
        )

    always, never, rand = draw(los="always"), draw(los="never"), draw()
    # one N(0, 1) per client whatever the state: scaled by 4 (LOS) or 7.82 (NLOS)
    np.testing.assert_allclose(always.shadow_fading_db / 4.0, never.shadow_fading_db / 7.82)
    z = always.shadow_fading_db / 4.0
    np.testing.assert_allclose(rand.shadow_fading_db, np.where(rand.los, 4.0, 7.82) * z)
    off = draw(shadowing=False)
    assert (off.shadow_fading_db == 0).all() and (off.los == rand.los).all()


# --- the scenario, the network model, the records ----------------------------------------
def _scenario(path_loss, **channel):
    ch = {"model": "shannon", "interference": None, **channel}
    if path_loss is not None:
        ch["path_loss"] = path_loss
    return tiny(channel=ch)


def test_a_link_by_hand_through_the_network_model():
    """One client at d_3D = 100 m of a UMi cell at 10 GHz, LOS, no shadowing: PL = 94.4 dB.
    Uplink: 20 dBm over 10 MHz: noise -174 + 70 = -104 dBm, SNR = 20 - 94.4 + 104 = 29.6 dB.
    Downlink: 30 dBm over 50 MHz: noise -174 + 10 log10(5e7) = -97.01029995663981 dBm,
    SNR = 30 - 94.4 + 97.01029995663981 = 32.61029995663981 dB."""
    sc = _scenario(
        {"model": "38.901-umi", "carrier_ghz": 10.0, "los": "always", "shadowing": False},
        distance_m=_d2(100.0, 8.5),
        uplink={"bandwidth_hz": 10e6, "tx_power_dbm": 20.0},
        downlink={"bandwidth_hz": 50e6, "tx_power_dbm": 30.0, "mode": "full"},
    )
    net = NetworkModel(sc, device_profiles(sc))
    ch = net.links(0, [0, 1]).channel
    np.testing.assert_allclose(ch.uplink_snr_db, 29.6, atol=TOL_DB)
    np.testing.assert_allclose(ch.downlink_snr_db, 32.61029995663981, atol=TOL_DB)
    np.testing.assert_allclose(ch.extra["path_loss_db"], 94.4, atol=TOL_DB)
    assert (ch.extra["los"] == 1.0).all() and (ch.extra["shadow_fading_db"] == 0).all()
    rec = ch.records()[0]
    assert {"path_loss_db", "los", "shadow_fading_db"} <= set(rec)


def test_the_exponent_draws_stay_the_same_under_38901():
    """The 3GPP state and shadowing come from a stream of their own: every draw of the
    exponent model (distance, band, power; fading and interference per round) is the same
    number under 38.901, only the gain differs."""
    exp_sc = tiny(channel={"model": "shannon", "interference": {"unit": "noise"}})
    umi_sc = tiny(
        channel={
            "model": "shannon",
            "interference": {"unit": "noise"},
            "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5},
        }
    )
    a, b = (
        NetworkModel(exp_sc, device_profiles(exp_sc)),
        NetworkModel(umi_sc, device_profiles(umi_sc)),
    )
    for key in ("distance_m", "bandwidth_hz", "tx_power_dbm"):
        assert np.array_equal(getattr(a.radio, key), getattr(b.radio, key)), key
    assert a.radio.los is None and b.radio.los is not None
    ca, cb = a.links(1, [0, 2, 3]).channel, b.links(1, [0, 2, 3]).channel
    for key in ("fading_gain", "ul_interference_raw", "dl_interference_raw"):
        assert np.array_equal(getattr(ca, key), getattr(cb, key)), key
    assert not np.array_equal(ca.uplink_rate_bps, cb.uplink_rate_bps)
    assert ca.extra == {}


def test_default_is_the_exponent_model_unchanged():
    sc = load_scenario(default_scenario_path())
    assert sc.channel.path_loss.model == "exponent"
    ch = build_channel(sc.channel)
    assert isinstance(ch, ShannonChannel) and ch.path_loss is None
    assert channel_record_keys(sc.channel) == ()
    # the exponent model's gain, as before: g = 10^(-40/10) * 300^-4 at 300 m (SNR -11.60 dB)
    radio = ClientRadio(np.array([300.0]), np.array([20e6]), np.array([26.5]))
    rc = ShannonChannel(interference=False).draw_round(radio, [0], np.random.default_rng(0))
    want = 26.5 - 30 + 30 - 40 - 40 * math.log10(300) - (-174 + 10 * math.log10(20e6))
    assert rc.uplink_snr_db[0] == pytest.approx(want, abs=1e-9) and rc.extra == {}
    # a checkpoint's digest does not see the new section at its default...
    explicit = apply_overrides(sc, {"channel.path_loss": {"model": "exponent"}})
    assert scenario_digest(explicit) == scenario_digest(sc)
    # ...and does see a 3GPP model
    umi = apply_overrides(sc, {"channel.path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5}})
    assert scenario_digest(umi) != scenario_digest(sc)


def test_draw_round_needs_the_radio_of_its_draw_clients():
    pl = Tr38901PathLoss(model="38.901-uma", carrier_ghz=2.0)
    ch = ShannonChannel(path_loss=pl, interference=False)
    bare = ClientRadio(np.array([300.0]), np.array([20e6]), np.array([26.5]))
    with pytest.raises(ValueError, match="draw_clients"):
        ch.draw_round(bare, [0], np.random.default_rng(0))
    # without a stream of its own, the state is drawn after (not instead of) the others
    r1 = ch.draw_clients(5, np.random.default_rng(4))
    r0 = ShannonChannel().draw_clients(5, np.random.default_rng(4))
    assert np.array_equal(r1.distance_m, r0.distance_m) and r1.path_loss_db is not None
    with pytest.raises(ValueError, match="distance_range_m"):
        ShannonChannel(path_loss=pl, distance_range_m=(5.0, 100.0))


_PL = "channel.path_loss."


@pytest.mark.parametrize(
    "path_loss,channel,field",
    [
        ({"model": "38.901-umi"}, {}, "channel.path_loss.carrier_ghz"),
        ({"model": "38.901-uma", "carrier_ghz": 0.4}, {}, "channel.path_loss.carrier_ghz"),
        ({"model": "38.901-uma", "carrier_ghz": 101}, {}, "channel.path_loss.carrier_ghz"),
        (
            {"model": "38.901-umi", "carrier_ghz": 3.5},
            {"distance_m": [5, 500]},
            "channel.distance_m",
        ),
        ({"model": "38.901-uma", "carrier_ghz": 3.5}, {"distance_m": 6000}, "channel.distance_m"),
        ({"model": "38.901-umi", "carrier_ghz": 3.5, "ut_height_m": 1.0}, {}, _PL + "ut_height_m"),
        ({"model": "38.901-umi", "carrier_ghz": 3.5, "ut_height_m": 30}, {}, _PL + "ut_height_m"),
        ({"model": "38.901-umi", "carrier_ghz": 3.5, "bs_height_m": 1.0}, {}, _PL + "bs_height_m"),
        ({"model": "38.901-rma", "carrier_ghz": 3.5}, {}, "channel.path_loss.model"),
        ({"model": "38.901-umi", "carrier_ghz": 3.5, "los": "often"}, {}, "channel.path_loss.los"),
        ({"model": "38.901-umi", "frequency_ghz": 3.5}, {}, "channel.path_loss.frequency_ghz"),
    ],
)
def test_bad_path_loss_is_refused_naming_the_field(path_loss, channel, field):
    with pytest.raises(ScenarioError) as err:
        _scenario(path_loss, **channel)
    assert f"tiny: {field}: " in str(err.value)


def test_the_exponent_model_keeps_its_distances():
    # the 10 m - 5 km range is the 3GPP tables': the exponent model has no such limit
    assert _scenario(None, distance_m=[5, 500]).channel.distance_m == (5.0, 500.0)
    # and takes (ignores) 3GPP fields, so a sweep over the model may set them on every point
    sc = _scenario({"model": "exponent", "carrier_ghz": 3.5})
    assert build_channel(sc.channel).path_loss is None


# --- run and sweep agree -----------------------------------------------------------------
def test_a_sweep_over_the_model_replays_what_a_run_gives(tmp_path):
    """A recorded exponent-model run re-timed with channel.path_loss set to 38.901-umi
    (``mecsim sweep``'s axes) gives, bit for bit, the rounds of a run of that scenario."""
    base = tiny(rounds=2)
    run_in_folder(base, tmp_path / "exp")
    point = {"channel.path_loss.model": "38.901-umi", "channel.path_loss.carrier_ghz": 3.5}
    run_in_folder(apply_overrides(base, point), tmp_path / "umi")
    got = replay(load_run(tmp_path / "exp"), point).rounds
    want = read_csv_exact(tmp_path / "umi" / "rounds.csv")[REPLAY_COLUMNS]
    for col in REPLAY_COLUMNS:  # accuracy too: training does not depend on the channel
        assert np.array_equal(got[col].to_numpy(), want[col].to_numpy(), equal_nan=True), col
    clients = read_csv_exact(tmp_path / "umi" / "clients.csv")
    assert {"path_loss_db", "los", "shadow_fading_db"} <= set(clients.columns)
    assert "path_loss_db" not in read_csv_exact(tmp_path / "exp" / "clients.csv").columns
