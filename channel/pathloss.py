"""3GPP TR 38.901 (V16/V17) path loss: UMi-Street Canyon and UMa (Sec. 7.4).

Every formula here is one row of Table 7.4.1-1 (path loss) or Table 7.4.2-1 (LOS
probability); distances in m, the carrier ``f_c`` in GHz, path losses in dB (a loss:
positive, the channel's power gain is ``10^(−PL/10)``).

    d_3D   = sqrt(d_2D² + (h_BS − h_UT)²)
    d'_BP  = 4 · h'_BS · h'_UT · f_c / c,   h' = h − h_E,  h_E = 1 m,  c = 3.0·10^8 m/s
             (f_c in Hz here: Table 7.4.1-1, note 1)

    UMi-Street Canyon (h_BS = 10 m)
      PL1        = 32.4 + 21 log10(d_3D) + 20 log10(f_c)              (10 m <= d_2D <= d'_BP)
      PL2        = 32.4 + 40 log10(d_3D) + 20 log10(f_c)
                   − 9.5 log10(d'_BP² + (h_BS − h_UT)²)                (d'_BP < d_2D <= 5 km)
      PL'_NLOS   = 35.3 log10(d_3D) + 22.4 + 21.3 log10(f_c) − 0.3 (h_UT − 1.5)
      PL_NLOS    = max(PL_LOS, PL'_NLOS);   σ_SF = 4 dB (LOS), 7.82 dB (NLOS)
      Pr_LOS     = 1 (d_2D <= 18 m);  18/d_2D + exp(−d_2D/36)(1 − 18/d_2D) beyond

    UMa (h_BS = 25 m)
      PL1        = 28.0 + 22 log10(d_3D) + 20 log10(f_c)              (10 m <= d_2D <= d'_BP)
      PL2        = 28.0 + 40 log10(d_3D) + 20 log10(f_c)
                   − 9 log10(d'_BP² + (h_BS − h_UT)²)                  (d'_BP < d_2D <= 5 km)
      PL'_NLOS   = 13.54 + 39.08 log10(d_3D) + 20 log10(f_c) − 0.6 (h_UT − 1.5)
      PL_NLOS    = max(PL_LOS, PL'_NLOS);   σ_SF = 4 dB (LOS), 6 dB (NLOS)
      Pr_LOS     = 1 (d_2D <= 18 m);  [18/d_2D + exp(−d_2D/63)(1 − 18/d_2D)]
                   · (1 + C'(h_UT) · 5/4 · (d_2D/100)³ · exp(−d_2D/150)) beyond,
                   C'(h_UT) = 0 (h_UT <= 13 m), ((h_UT − 13)/10)^1.5 (13 m < h_UT <= 23 m)

Validity (Table 7.4.1-1): 10 m <= d_2D <= 5 km, 1.5 m <= h_UT <= 22.5 m, 0.5 GHz <= f_c
<= 100 GHz.

The effective environment height h_E (Table 7.4.1-1, note 1): UMi h_E = 1 m. UMa
h_E = 1 m with probability 1 / (1 + C(d_2D, h_UT)), else uniform over
{12, 15, ..., h_UT − 1.5} (m), with

    C(d_2D, h_UT) = 0                                  (h_UT < 13 m)
                    ((h_UT − 13)/10)^1.5 · g(d_2D)     (13 m <= h_UT <= 23 m)
    g(d_2D)       = 0 (d_2D <= 18 m);  5/4 · (d_2D/100)³ · exp(−d_2D/150) beyond

so for h_UT <= 13 m it is 1 m with probability 1. Each link carries two U[0, 1) draws
(u_1, u_2, :attr:`LargeScaleDraw.environment_u`): h_E = 1 m where u_1 < 1/(1 + C),
else the ⌊u_2 · K⌋-th of the K heights of the set (a link whose d_2D changes keeps its
u_1, u_2: its h_E is a function of its distance).

A client's LOS state and shadow fading are drawn once per run (like its distance), by
:meth:`Tr38901PathLoss.draw`; :meth:`Tr38901PathLoss.path_loss_db` then gives its path
loss, a pure function of the 2D distance, the state, the shadowing and h_E. (Clients
that move: mecsim.channel.spatial, LOS state and shadowing as functions of position.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

#: Table 7.4.1-1, note 1: c = 3.0·10^8 m/s
SPEED_OF_LIGHT_M_PER_S = 3.0e8
#: Table 7.4.1-1, note 1: the effective environment height h_E (see the module docstring)
EFFECTIVE_ENVIRONMENT_HEIGHT_M = 1.0

#: the 3GPP models (``channel.path_loss.model``); ``exponent`` is the KAPC Table 4 model
Tr38901Model = Literal["38.901-umi", "38.901-uma"]
TR38901_MODELS: tuple[str, ...] = ("38.901-umi", "38.901-uma")
LosMode = Literal["random", "always", "never"]
LOS_MODES: tuple[str, ...] = ("random", "always", "never")

#: Table 7.4.1-1's default base-station heights (m)
DEFAULT_BS_HEIGHT_M = {"38.901-umi": 10.0, "38.901-uma": 25.0}
#: Table 7.4.1-1's default device (UT) height (m): the lower end of its 1.5-22.5 m range
DEFAULT_UT_HEIGHT_M = 1.5
#: Table 7.4.1-1's shadow-fading standard deviations σ_SF (dB): (LOS, NLOS)
SHADOW_STD_DB = {"38.901-umi": (4.0, 7.82), "38.901-uma": (4.0, 6.0)}

#: Table 7.4.1-1's validity ranges
DISTANCE_2D_RANGE_M = (10.0, 5000.0)
CARRIER_RANGE_GHZ = (0.5, 100.0)
UT_HEIGHT_RANGE_M = (1.5, 22.5)

#: the per-client quantities a 38.901 channel adds to each client-round's records
#: (clients.csv): its path loss (shadowing included), LOS state (1.0 LOS, 0.0 NLOS) and
#: shadow fading
RECORD_KEYS = ("path_loss_db", "los", "shadow_fading_db")


def _d(distance_m: ArrayLike) -> np.ndarray:
    return np.asarray(distance_m, dtype=float)


def distance_3d_m(distance_2d_m: ArrayLike, bs_height_m: float, ut_height_m: float) -> np.ndarray:
    """``d_3D = sqrt(d_2D² + (h_BS − h_UT)²)`` (m)."""
    return np.hypot(_d(distance_2d_m), bs_height_m - ut_height_m)


def breakpoint_distance_m(
    bs_height_m: float,
    ut_height_m: float,
    carrier_ghz: float,
    environment_height_m: ArrayLike = EFFECTIVE_ENVIRONMENT_HEIGHT_M,
) -> Any:
    """``d'_BP = 4 · (h_BS − h_E) · (h_UT − h_E) · f_c / c`` with ``f_c`` in Hz (m):
    Table 7.4.1-1, note 1 (a float for a float h_E, an array for an array)."""
    h_e: Any = (
        float(environment_height_m)  # type: ignore[arg-type]
        if np.isscalar(environment_height_m)
        else np.asarray(environment_height_m, dtype=float)
    )
    return (4.0 * (bs_height_m - h_e) * (ut_height_m - h_e) * (carrier_ghz * 1e9)) / (
        SPEED_OF_LIGHT_M_PER_S
    )


def _dual_slope_los_db(
    distance_2d_m: ArrayLike,
    carrier_ghz: float,
    bs_height_m: float,
    ut_height_m: float,
    intercept_db: float,
    pl1_slope: float,
    bp_coefficient: float,
    environment_height_m: ArrayLike = EFFECTIVE_ENVIRONMENT_HEIGHT_M,
) -> np.ndarray:
    """The LOS rows of UMi and UMa: PL1 up to the breakpoint, PL2 beyond it (the
    breakpoint of each link's h_E)."""
    d2 = _d(distance_2d_m)
    d3 = distance_3d_m(d2, bs_height_m, ut_height_m)
    bp = breakpoint_distance_m(bs_height_m, ut_height_m, carrier_ghz, environment_height_m)
    f = 20.0 * np.log10(carrier_ghz)
    pl1 = intercept_db + pl1_slope * np.log10(d3) + f
    pl2 = (
        intercept_db
        + 40.0 * np.log10(d3)
        + f
        - bp_coefficient * np.log10(bp**2 + (bs_height_m - ut_height_m) ** 2)
    )
    return np.where(d2 <= bp, pl1, pl2)


def umi_los_db(
    distance_2d_m: ArrayLike,
    carrier_ghz: float,
    bs_height_m: float = 10.0,
    ut_height_m: float = DEFAULT_UT_HEIGHT_M,
) -> np.ndarray:
    """UMi-Street Canyon LOS path loss (dB): PL1 = 32.4 + 21 log10(d_3D) + 20 log10(f_c)
    up to d'_BP, PL2 = 32.4 + 40 log10(d_3D) + 20 log10(f_c) − 9.5 log10(d'_BP² +
    (h_BS − h_UT)²) beyond (Table 7.4.1-1)."""
    return _dual_slope_los_db(distance_2d_m, carrier_ghz, bs_height_m, ut_height_m, 32.4, 21.0, 9.5)


def umi_nlos_db(
    distance_2d_m: ArrayLike,
    carrier_ghz: float,
    bs_height_m: float = 10.0,
    ut_height_m: float = DEFAULT_UT_HEIGHT_M,
) -> np.ndarray:
    """UMi-Street Canyon NLOS path loss (dB): max(PL_LOS, PL'_NLOS), PL'_NLOS =
    35.3 log10(d_3D) + 22.4 + 21.3 log10(f_c) − 0.3 (h_UT − 1.5) (Table 7.4.1-1)."""
    d3 = distance_3d_m(distance_2d_m, bs_height_m, ut_height_m)
    nlos = 35.3 * np.log10(d3) + 22.4 + 21.3 * np.log10(carrier_ghz) - 0.3 * (ut_height_m - 1.5)
    return np.maximum(umi_los_db(distance_2d_m, carrier_ghz, bs_height_m, ut_height_m), nlos)


def uma_los_db(
    distance_2d_m: ArrayLike,
    carrier_ghz: float,
    bs_height_m: float = 25.0,
    ut_height_m: float = DEFAULT_UT_HEIGHT_M,
    environment_height_m: ArrayLike = EFFECTIVE_ENVIRONMENT_HEIGHT_M,
) -> np.ndarray:
    """UMa LOS path loss (dB): PL1 = 28.0 + 22 log10(d_3D) + 20 log10(f_c) up to d'_BP,
    PL2 = 28.0 + 40 log10(d_3D) + 20 log10(f_c) − 9 log10(d'_BP² + (h_BS − h_UT)²)
    beyond (Table 7.4.1-1), d'_BP of each link's h_E (note 1)."""
    return _dual_slope_los_db(
        distance_2d_m, carrier_ghz, bs_height_m, ut_height_m, 28.0, 22.0, 9.0, environment_height_m
    )


def uma_nlos_db(
    distance_2d_m: ArrayLike,
    carrier_ghz: float,
    bs_height_m: float = 25.0,
    ut_height_m: float = DEFAULT_UT_HEIGHT_M,
    environment_height_m: ArrayLike = EFFECTIVE_ENVIRONMENT_HEIGHT_M,
) -> np.ndarray:
    """UMa NLOS path loss (dB): max(PL_LOS, PL'_NLOS), PL'_NLOS = 13.54 +
    39.08 log10(d_3D) + 20 log10(f_c) − 0.6 (h_UT − 1.5) (Table 7.4.1-1)."""
    d3 = distance_3d_m(distance_2d_m, bs_height_m, ut_height_m)
    nlos = 13.54 + 39.08 * np.log10(d3) + 20.0 * np.log10(carrier_ghz) - 0.6 * (ut_height_m - 1.5)
    los = uma_los_db(distance_2d_m, carrier_ghz, bs_height_m, ut_height_m, environment_height_m)
    return np.maximum(los, nlos)


def uma_c(distance_2d_m: ArrayLike, ut_height_m: float) -> np.ndarray:
    """``C(d_2D, h_UT)`` of Table 7.4.1-1, note 1: ``C'(h_UT) · g(d_2D)`` with
    ``g = 0`` up to 18 m and ``5/4 · (d_2D/100)³ · exp(−d_2D/150)`` beyond (``C'`` is
    :func:`uma_c_prime`: 0 below 13 m)."""
    d2 = _d(distance_2d_m)
    g = np.where(d2 <= 18.0, 0.0, 1.25 * (d2 / 100.0) ** 3 * np.exp(-d2 / 150.0))
    out: np.ndarray = uma_c_prime(ut_height_m) * g
    return out


def uma_environment_heights_m(ut_height_m: float) -> tuple[float, ...]:
    """The set h_E is drawn from when it is not 1 m: {12, 15, ..., h_UT − 1.5} (m);
    empty below h_UT = 13.5 m."""
    top = ut_height_m - 1.5
    return tuple(float(h) for h in np.arange(12.0, top + 1e-9, 3.0))


def uma_environment_height_m(
    distance_2d_m: ArrayLike, ut_height_m: float, environment_u: ArrayLike
) -> np.ndarray:
    """Each link's h_E (m) of Table 7.4.1-1, note 1, from its two U[0, 1) draws
    ``environment_u[..., 0]`` (1 m where below 1/(1 + C)) and ``[..., 1]`` (which height
    of :func:`uma_environment_heights_m`, uniformly); 1 m where the set is empty."""
    d2 = _d(distance_2d_m)
    u = np.asarray(environment_u, dtype=float)
    heights = np.asarray(uma_environment_heights_m(ut_height_m))
    if heights.size == 0:
        return np.full(d2.shape, EFFECTIVE_ENVIRONMENT_HEIGHT_M)
    k = np.minimum((u[..., 1] * heights.size).astype(np.int64), heights.size - 1)
    one = u[..., 0] < 1.0 / (1.0 + uma_c(d2, ut_height_m))
    out: np.ndarray = np.where(one, EFFECTIVE_ENVIRONMENT_HEIGHT_M, heights[k])
    return out


def los_probability_umi(distance_2d_m: ArrayLike) -> np.ndarray:
    """UMi-Street Canyon Pr_LOS (Table 7.4.2-1): 1 up to 18 m, then
    ``18/d_2D + exp(−d_2D/36) · (1 − 18/d_2D)``."""
    d2 = _d(distance_2d_m)
    far = np.maximum(d2, 18.0)  # the formula's branch, evaluated only where it applies
    return np.where(d2 <= 18.0, 1.0, 18.0 / far + np.exp(-far / 36.0) * (1.0 - 18.0 / far))


def uma_c_prime(ut_height_m: float) -> float:
    """``C'(h_UT)`` of Table 7.4.2-1: 0 up to 13 m, ``((h_UT − 13)/10)^1.5`` above."""
    return 0.0 if ut_height_m <= 13.0 else ((ut_height_m - 13.0) / 10.0) ** 1.5


def los_probability_uma(
    distance_2d_m: ArrayLike, ut_height_m: float = DEFAULT_UT_HEIGHT_M
) -> np.ndarray:
    """UMa Pr_LOS (Table 7.4.2-1): 1 up to 18 m, then ``[18/d_2D + exp(−d_2D/63) ·
    (1 − 18/d_2D)] · (1 + C'(h_UT) · 5/4 · (d_2D/100)³ · exp(−d_2D/150))``."""
    d2 = _d(distance_2d_m)
    far = np.maximum(d2, 18.0)
    base = 18.0 / far + np.exp(-far / 63.0) * (1.0 - 18.0 / far)
    height = 1.0 + uma_c_prime(ut_height_m) * 1.25 * (far / 100.0) ** 3 * np.exp(-far / 150.0)
    return np.where(d2 <= 18.0, 1.0, base * height)


@dataclass(frozen=True)
class LargeScaleDraw:
    """A client population's LOS state and shadow fading (dB), drawn once per run."""

    los: np.ndarray  # bool
    shadow_fading_db: np.ndarray
    #: (..., 2) each link's two U[0, 1) draws for UMa's h_E (the module's docstring);
    #: None: h_E = 1 m
    environment_u: np.ndarray | None = None

    def take(self, index: Any) -> LargeScaleDraw:
        """The draws of the links ``index`` selects (numpy indexing of the link axes)."""
        env = None if self.environment_u is None else self.environment_u[index]
        return LargeScaleDraw(self.los[index], self.shadow_fading_db[index], env)


@dataclass(frozen=True, kw_only=True)
class Tr38901PathLoss:
    """One of Table 7.4.1-1's scenarios with its parameters (``channel.path_loss``).

    ``bs_height_m`` None is the table's value for the model (UMi 10 m, UMa 25 m).
    ``los``: ``random`` draws each client's state with Pr_LOS of its distance;
    ``always`` / ``never`` fix it. ``shadowing=False`` sets the shadow fading to 0 dB.
    """

    model: Tr38901Model
    carrier_ghz: float
    bs_height_m: float | None = None
    ut_height_m: float = DEFAULT_UT_HEIGHT_M
    los: LosMode = "random"
    shadowing: bool = True

    def __post_init__(self) -> None:
        if self.model not in TR38901_MODELS:
            raise ValueError(f"model {self.model!r} is not one of {TR38901_MODELS}")
        if self.los not in LOS_MODES:
            raise ValueError(f"los {self.los!r} is not one of {LOS_MODES}")
        lo, hi = CARRIER_RANGE_GHZ
        if not lo <= self.carrier_ghz <= hi:
            raise ValueError(f"carrier_ghz: {self.carrier_ghz:g} is outside {lo:g}-{hi:g} GHz")
        lo, hi = UT_HEIGHT_RANGE_M
        if not lo <= self.ut_height_m <= hi:
            raise ValueError(f"ut_height_m: {self.ut_height_m:g} is outside {lo:g}-{hi:g} m")
        top_env = max(self.environment_heights_m)
        if not self.bs_height_m_resolved > top_env:
            raise ValueError(
                f"bs_height_m: {self.bs_height_m_resolved:g} m is not above the effective "
                f"environment height h_E = {top_env:g} m (Table 7.4.1-1, note 1)"
            )

    @property
    def bs_height_m_resolved(self) -> float:
        return DEFAULT_BS_HEIGHT_M[self.model] if self.bs_height_m is None else self.bs_height_m

    @property
    def breakpoint_m(self) -> float:
        """d'_BP at h_E = 1 m (m)."""
        return float(
            breakpoint_distance_m(self.bs_height_m_resolved, self.ut_height_m, self.carrier_ghz)
        )

    @property
    def environment_heights_m(self) -> tuple[float, ...]:
        """Every h_E a link can have (m): 1 m, and for UMa above h_UT = 13 m the set of
        note 1."""
        if self.model == "38.901-uma" and uma_c_prime(self.ut_height_m) > 0:
            return (EFFECTIVE_ENVIRONMENT_HEIGHT_M, *uma_environment_heights_m(self.ut_height_m))
        return (EFFECTIVE_ENVIRONMENT_HEIGHT_M,)

    def environment_height_m(
        self, distance_2d_m: ArrayLike, environment_u: ArrayLike | None = None
    ) -> np.ndarray | float:
        """Each link's h_E (m): 1 m under UMi, without draws or at h_UT <= 13 m; UMa's
        note 1 otherwise (:func:`uma_environment_height_m`)."""
        if environment_u is None or len(self.environment_heights_m) == 1:
            return EFFECTIVE_ENVIRONMENT_HEIGHT_M
        return uma_environment_height_m(distance_2d_m, self.ut_height_m, environment_u)

    def los_probability(self, distance_2d_m: ArrayLike) -> np.ndarray:
        if self.model == "38.901-umi":
            return los_probability_umi(distance_2d_m)
        return los_probability_uma(distance_2d_m, self.ut_height_m)

    def los_db(self, distance_2d_m: ArrayLike, environment_height_m: ArrayLike = 1.0) -> np.ndarray:
        """PL_LOS (dB) with each link's h_E (UMi: always 1 m)."""
        h, f = self.bs_height_m_resolved, self.carrier_ghz
        if self.model == "38.901-umi":
            return umi_los_db(distance_2d_m, f, h, self.ut_height_m)
        return uma_los_db(distance_2d_m, f, h, self.ut_height_m, environment_height_m)

    def nlos_db(
        self, distance_2d_m: ArrayLike, environment_height_m: ArrayLike = 1.0
    ) -> np.ndarray:
        """PL_NLOS (dB) with each link's h_E (UMi: always 1 m)."""
        h, f = self.bs_height_m_resolved, self.carrier_ghz
        if self.model == "38.901-umi":
            return umi_nlos_db(distance_2d_m, f, h, self.ut_height_m)
        return uma_nlos_db(distance_2d_m, f, h, self.ut_height_m, environment_height_m)

    def shadow_std_db(self, los: ArrayLike) -> np.ndarray:
        """σ_SF of each client's state (Table 7.4.1-1)."""
        los_std, nlos_std = SHADOW_STD_DB[self.model]
        return np.where(np.asarray(los, dtype=bool), los_std, nlos_std)

    def draw(self, distance_2d_m: ArrayLike, rng: np.random.Generator) -> LargeScaleDraw:
        """Each client's LOS state, shadow fading and h_E draws. Draw order: U[0, 1) per
        client (the state: LOS where u < Pr_LOS(d_2D)), then N(0, 1) per client (the
        shadowing, scaled by σ_SF of the state), then two U[0, 1) per client (h_E, the
        module's docstring; they come last, so the others are the numbers drawn before
        h_E was modelled). All are always drawn, so ``los`` and ``shadowing`` change no
        other draw."""
        d2 = _d(distance_2d_m)
        u = rng.random(d2.shape)
        z = rng.standard_normal(d2.shape)
        env = rng.random((*d2.shape, 2))
        if self.los == "always":
            los = np.ones(d2.shape, dtype=bool)
        elif self.los == "never":
            los = np.zeros(d2.shape, dtype=bool)
        else:
            los = u < self.los_probability(d2)
        shadow = self.shadow_std_db(los) * z if self.shadowing else np.zeros(d2.shape)
        return LargeScaleDraw(los, shadow, env)

    def path_loss_db(
        self,
        distance_2d_m: ArrayLike,
        los: ArrayLike,
        shadow_fading_db: ArrayLike = 0.0,
        environment_u: ArrayLike | None = None,
    ) -> np.ndarray:
        """``PL = PL_LOS or PL_NLOS (by state) + shadow fading`` (dB), with each link's
        h_E from its draws ``environment_u`` (None: 1 m)."""
        los_b = np.asarray(los, dtype=bool)
        h_e = self.environment_height_m(distance_2d_m, environment_u)
        mean = np.where(los_b, self.los_db(distance_2d_m, h_e), self.nlos_db(distance_2d_m, h_e))
        return mean + np.asarray(shadow_fading_db, dtype=float)

    def link_path_loss_db(self, distance_2d_m: ArrayLike, draw: LargeScaleDraw) -> np.ndarray:
        """:meth:`path_loss_db` of links with their :class:`LargeScaleDraw`."""
        return self.path_loss_db(distance_2d_m, draw.los, draw.shadow_fading_db, draw.environment_u)
