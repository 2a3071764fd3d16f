"""UMa's effective environment height h_E (3GPP TR 38.901 Table 7.4.1-1, note 1).

Hand-worked numbers: h_UT = 20 m, h_BS = 25 m, f_c = 3.5 GHz, d_2D = 1 km.

    C'(20) = (0.7)^1.5 = 0.585662;  g(1000) = 1.25 · 10³ · exp(−1000/150) = 1.590770
    C(1000, 20) = 0.931667;  P(h_E = 1 m) = 1 / (1 + C) = 0.517688
    h_E ∈ {12, 15, 18} m otherwise (h_UT − 1.5 = 18.5)

    d_3D = √(1000² + 5²) = 1000.0125 m
    h_E = 1 m:  d'_BP = 4 · 24 · 19 · 3.5e9 / 3e8 = 21,280 m  -> PL1 = 104.8815 dB
    h_E = 18 m: d'_BP = 4 · 7 · 2 · 3.5e9 / 3e8 = 653.33 m   -> PL2 = 28 + 40 log10(d_3D)
                + 20 log10(3.5) − 9 log10(653.33² + 25) = 108.2089 dB  (+3.3274 dB)
    h_E = 12, 15 m: d'_BP = 4,853 / 2,333 m > 1 km           -> PL1 = 104.8815 dB
"""

from __future__ import annotations

import numpy as np
import pytest

from mecsim.channel import Tr38901PathLoss
from mecsim.channel.pathloss import (
    uma_c,
    uma_environment_height_m,
    uma_environment_heights_m,
)


def _uma(**kw: float) -> Tr38901PathLoss:
    return Tr38901PathLoss(model="38.901-uma", carrier_ghz=3.5, ut_height_m=20.0, **kw)


def test_c_of_note_1_by_hand() -> None:
    assert float(uma_c(1000.0, 20.0)) == pytest.approx(0.931667, rel=1e-5)
    # g(d) = 0 up to 18 m; C' = 0 up to 13 m
    assert float(uma_c(18.0, 20.0)) == 0.0
    assert float(uma_c(1000.0, 13.0)) == 0.0
    # 50 m: 0.585662 · 1.25 · 0.125 · exp(−1/3) = 0.0655696
    assert float(uma_c(50.0, 20.0)) == pytest.approx(0.0655696, rel=1e-5)


def test_the_set_h_e_is_drawn_from() -> None:
    assert uma_environment_heights_m(20.0) == (12.0, 15.0, 18.0)
    assert uma_environment_heights_m(22.5) == (12.0, 15.0, 18.0, 21.0)
    assert uma_environment_heights_m(13.4) == ()  # 13.4 − 1.5 < 12: only 1 m
    assert _uma().environment_heights_m == (1.0, 12.0, 15.0, 18.0)
    umi = Tr38901PathLoss(model="38.901-umi", carrier_ghz=3.5, ut_height_m=20.0)
    assert umi.environment_heights_m == (1.0,)


def test_each_link_s_h_e_from_its_two_draws() -> None:
    # 1 m below 1/(1 + C) = 0.517688, else the ⌊u2 · 3⌋-th of (12, 15, 18)
    u = np.array([[0.5, 0.9], [0.52, 0.0], [0.6, 0.5], [0.99, 0.9], [0.6, 0.999999]])
    h = uma_environment_height_m(np.full(5, 1000.0), 20.0, u)
    assert h.tolist() == [1.0, 12.0, 15.0, 18.0, 18.0]
    # at 18 m C = 0: 1 m whatever the draws
    assert uma_environment_height_m(18.0, 20.0, np.array([0.99, 0.9])).tolist() == 1.0


def test_the_issue_s_3_33_db_case() -> None:
    pl = _uma()
    one = float(pl.path_loss_db(1000.0, True, 0.0, np.array([0.1, 0.9])))
    high = float(pl.path_loss_db(1000.0, True, 0.0, np.array([0.9, 0.9])))
    mid = float(pl.path_loss_db(1000.0, True, 0.0, np.array([0.9, 0.1])))
    assert one == pytest.approx(104.8815, abs=1e-4)
    assert high == pytest.approx(108.2089, abs=1e-4)
    assert high - one == pytest.approx(3.3274, abs=1e-4)
    assert mid == pytest.approx(104.8815, abs=1e-4)  # h_E = 12 m: still below d'_BP
    # without draws: h_E = 1 m, the model before note 1 was modelled
    assert float(pl.path_loss_db(1000.0, True)) == pytest.approx(104.8815, abs=1e-4)
    # NLOS is max(PL_LOS, PL'_NLOS): at 1 km PL'_NLOS (135.63 dB) is the larger either way
    assert float(pl.path_loss_db(1000.0, False, 0.0, np.array([0.9, 0.9]))) == pytest.approx(
        13.54 + 39.08 * np.log10(np.hypot(1000.0, 5.0)) + 20 * np.log10(3.5) - 0.6 * 18.5
    )


def test_the_draws_frequency_is_note_1_s_probability() -> None:
    pl = _uma()
    d = np.full(200_000, 1000.0)
    draw = pl.draw(d, np.random.default_rng(11))
    assert draw.environment_u is not None
    h = pl.environment_height_m(d, draw.environment_u)
    # P(1 m) = 0.517688; σ of the fraction √(p(1−p)/n) = 0.00112: 5σ
    assert np.mean(h == 1.0) == pytest.approx(0.517688, abs=0.0056)
    for height in (12.0, 15.0, 18.0):  # each (1 − p)/3 = 0.160771
        assert np.mean(h == height) == pytest.approx(0.160771, abs=0.0045)


def test_the_draws_are_reproducible_and_leave_the_earlier_ones_alone() -> None:
    pl = _uma()
    d = np.linspace(20.0, 900.0, 50)
    a, b = pl.draw(d, np.random.default_rng(5)), pl.draw(d, np.random.default_rng(5))
    assert a.environment_u is not None and b.environment_u is not None
    assert np.array_equal(a.environment_u, b.environment_u)
    # the LOS state's U and the shadowing's N come first, as before h_E was modelled
    rng = np.random.default_rng(5)
    u, z = rng.random(50), rng.standard_normal(50)
    assert np.array_equal(a.los, u < pl.los_probability(d))
    assert np.array_equal(a.shadow_fading_db, pl.shadow_std_db(a.los) * z)
    assert np.array_equal(a.environment_u, rng.random((50, 2)))


def test_low_devices_and_umi_keep_h_e_of_1_m() -> None:
    low = Tr38901PathLoss(model="38.901-uma", carrier_ghz=3.5, ut_height_m=1.5)
    d = np.array([100.0, 1000.0, 3000.0])
    u = np.full((3, 2), 0.99)
    assert np.array_equal(low.path_loss_db(d, True, 0.0, u), low.path_loss_db(d, True))
    umi = Tr38901PathLoss(model="38.901-umi", carrier_ghz=3.5, ut_height_m=20.0)
    assert np.array_equal(umi.path_loss_db(d, True, 0.0, u), umi.path_loss_db(d, True))


def test_a_base_station_below_h_e_is_refused() -> None:
    with pytest.raises(ValueError, match=r"bs_height_m: 15 m is not above .* h_E = 18 m"):
        _uma(bs_height_m=15.0)
