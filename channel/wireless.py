"""Wireless link models: the Shannon-rate model of KAPC Table 4 (after its ref. [43]).

Large-scale gain   ``g_i = h_i · 10^(PL0/10) · (d_i / d0)^(−γ)`` (the exponent model), or
                   ``g_i = h_i · 10^(−PL_i/10)`` with a 3GPP TR 38.901 path loss PL_i
                   (UMi-Street Canyon, UMa: :mod:`mecsim.channel.pathloss`)
Uplink rate        ``r_U,i = B_i · log2(1 + p_i·g_i / (I_U + N0·B_i))``
Downlink rate      ``r_D,i = B_D · log2(1 + p_S·g_i / (I_D + N0·B_D))``

Every model has the same two calls (:class:`ChannelModel`): ``draw_clients`` once per
run (client properties: distance, bandwidth, power) and ``draw_round`` once per round
(per client-round draws: fading, interference, hence rates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike

from .pathloss import RECORD_KEYS as PATH_LOSS_RECORD_KEYS
from .pathloss import LargeScaleDraw, Tr38901PathLoss
from .units import db_to_linear, dbm_to_w, linear_to_db

InterferenceUnit = Literal["W", "mW", "dBm", "noise"]
_UNITS = ("W", "mW", "dBm", "noise")


def large_scale_gain(
    distance_m: ArrayLike,
    path_loss_db: float = -40.0,
    reference_distance_m: float = 1.0,
    path_loss_exponent: float = 4.0,
    fading_gain: ArrayLike = 1.0,
) -> np.ndarray:
    """Channel power gain ``g = h · 10^(PL0/10) · (d/d0)^(−γ)`` (linear, dimensionless)."""
    d = np.asarray(distance_m, dtype=float)
    return (
        np.asarray(fading_gain, dtype=float)
        * db_to_linear(path_loss_db)
        * (d / reference_distance_m) ** (-path_loss_exponent)
    )


def sinr(
    bandwidth_hz: ArrayLike,
    tx_power_w: ArrayLike,
    gain: ArrayLike,
    interference_w: ArrayLike,
    noise_psd_w_per_hz: ArrayLike,
    snr_offset_db: float = 0.0,
) -> np.ndarray:
    """Effective SINR ``10^(offset/10) · p·g / (I + N0·B)`` (linear)."""
    signal_w = np.asarray(tx_power_w, dtype=float) * np.asarray(gain, dtype=float)
    noise_w = np.asarray(interference_w, dtype=float) + (
        np.asarray(noise_psd_w_per_hz, dtype=float) * np.asarray(bandwidth_hz, dtype=float)
    )
    return db_to_linear(snr_offset_db) * signal_w / noise_w


def shannon_rate_bps(
    bandwidth_hz: ArrayLike,
    tx_power_w: ArrayLike,
    gain: ArrayLike,
    interference_w: ArrayLike,
    noise_psd_w_per_hz: ArrayLike,
    snr_offset_db: float = 0.0,
) -> np.ndarray:
    """Shannon rate ``r = B · log2(1 + 10^(offset/10) · p·g / (I + N0·B))`` in bit/s."""
    s = sinr(bandwidth_hz, tx_power_w, gain, interference_w, noise_psd_w_per_hz, snr_offset_db)
    return np.asarray(bandwidth_hz, dtype=float) * np.log2(1.0 + s)


def interference_to_w(
    value: ArrayLike, unit: str, bandwidth_hz: ArrayLike, noise_psd_w_per_hz: ArrayLike
) -> np.ndarray:
    """Convert interference draws to watts.

    ``unit``: ``"W"``, ``"mW"``, ``"dBm"``, or ``"noise"`` (multiples of the link's thermal
    noise ``N0·B``). Negative draws are clipped at 0 *before* conversion for W, mW and
    noise; a dBm value is always a positive power, so it is not clipped.
    """
    v = np.asarray(value, dtype=float)
    if unit == "dBm":
        return dbm_to_w(v)
    v = np.maximum(v, 0.0)
    if unit == "W":
        return v
    if unit == "mW":
        return v * 1e-3
    if unit == "noise":
        return v * np.asarray(noise_psd_w_per_hz, dtype=float) * np.asarray(bandwidth_hz, float)
    raise ValueError(f"interference unit {unit!r} is not one of {_UNITS}")


@dataclass(frozen=True)
class ClientRadio:
    """Per-client radio properties, drawn once per run (NaN where a model has none).

    With a 3GPP path-loss model (:class:`~mecsim.channel.pathloss.Tr38901PathLoss`) also
    each client's LOS state, shadow fading (dB) and resulting path loss (dB, shadowing
    included); None otherwise.
    """

    distance_m: np.ndarray
    bandwidth_hz: np.ndarray
    tx_power_dbm: np.ndarray
    los: np.ndarray | None = None
    shadow_fading_db: np.ndarray | None = None
    path_loss_db: np.ndarray | None = None
    #: (n, 2) each client's draws for UMa's effective environment height h_E
    #: (mecsim.channel.pathloss); None: h_E = 1 m
    environment_u: np.ndarray | None = None

    @property
    def n_clients(self) -> int:
        return len(self.distance_m)

    @classmethod
    def unmodelled(cls, n_clients: int) -> ClientRadio:
        nan = np.full(n_clients, np.nan)
        return cls(nan, nan.copy(), nan.copy())


#: The per client-round channel draws a round records (clients.csv's channel columns,
#: before the transport ones: mecsim.run.rows.CHANNEL_COLUMNS).
RECORD_KEYS = (
    "distance_m",
    "bandwidth_hz",
    "tx_power_dbm",
    "fading_gain",
    "ul_interference_w",
    "dl_interference_w",
    "uplink_rate_bps",
    "downlink_rate_bps",
    "uplink_snr_db",
    "downlink_snr_db",
)


@dataclass(frozen=True)
class RoundChannel:
    """One round's channel for the selected clients (arrays aligned with ``client_ids``).

    ``*_interference_raw`` is the draw in the scenario's unit, ``*_interference_w`` the
    power after clipping/conversion. SNRs are effective (including ``snr_offset_db``).
    """

    client_ids: np.ndarray
    distance_m: np.ndarray
    bandwidth_hz: np.ndarray
    tx_power_dbm: np.ndarray
    fading_gain: np.ndarray
    ul_interference_raw: np.ndarray
    dl_interference_raw: np.ndarray
    ul_interference_w: np.ndarray
    dl_interference_w: np.ndarray
    uplink_rate_bps: np.ndarray
    downlink_rate_bps: np.ndarray
    uplink_snr_db: np.ndarray
    downlink_snr_db: np.ndarray
    #: a channel plugin's own per-client quantities (its ``record_keys``), aligned with
    #: ``client_ids``: extra columns of clients.csv
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    _RECORD_KEYS = RECORD_KEYS

    @classmethod
    def constant_rates(
        cls,
        radio: ClientRadio,
        client_ids: ArrayLike,
        uplink_rate_bps: ArrayLike,
        downlink_rate_bps: ArrayLike,
    ) -> RoundChannel:
        """Rates given directly (fixed-rate or trace models): the radio quantities are NaN."""
        ids = _check_ids(radio, client_ids)
        nan = [np.full(len(ids), np.nan) for _ in range(7)]
        ul, dl = (
            np.broadcast_to(np.asarray(r, float), ids.shape).copy()
            for r in (uplink_rate_bps, downlink_rate_bps)
        )
        return cls(
            ids,
            radio.distance_m[ids],
            radio.bandwidth_hz[ids],
            radio.tx_power_dbm[ids],
            nan[0],
            nan[1],
            nan[2],
            nan[3],
            nan[4],
            ul,
            dl,
            nan[5],
            nan[6],
        )

    def records(self) -> list[dict[str, Any]]:
        """One plain dict per client (Python scalars) for the run's ``clients`` records."""
        # column by column: tolist() of a float64 array gives the Python floats float()
        # gives element by element (the same numbers), without a call per value
        keys = ("client_id", *self._RECORD_KEYS, *self.extra)
        columns = [
            np.asarray(self.client_ids, dtype=np.int64).tolist(),
            *(np.asarray(getattr(self, k), dtype=np.float64).tolist() for k in self._RECORD_KEYS),
            *(np.asarray(v, dtype=np.float64).tolist() for v in self.extra.values()),
        ]
        return [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)]


def _check_ids(radio: ClientRadio, client_ids: ArrayLike) -> np.ndarray:
    ids = np.atleast_1d(np.asarray(client_ids, dtype=np.int64))
    if ids.size and (ids.min() < 0 or ids.max() >= radio.n_clients):
        raise ValueError(f"client ids {ids.tolist()} out of range [0, {radio.n_clients})")
    return ids


class ChannelModel(Protocol):
    """What the run loop calls: client properties once, then one draw per round.

    ``time_s`` is the round's start time (emulated); only trace channels use it.
    """

    def draw_clients(self, n_clients: int, rng: np.random.Generator) -> ClientRadio: ...

    def draw_round(
        self,
        radio: ClientRadio,
        client_ids: ArrayLike,
        rng: np.random.Generator,
        *,
        time_s: float = 0.0,
    ) -> RoundChannel: ...


@dataclass(frozen=True, kw_only=True)
class ShannonChannel:
    """The KAPC Table 4 channel; defaults are the table's values.

    The client power range is ``(23, 30]`` dBm in the paper; we draw uniformly in
    ``[23, 30)`` — the open/closed bound has probability zero and is immaterial.
    Table 4 gives the interference distributions N(1, 4) up and N(1, 9) down (variance 4
    and 9, so std 2 and 3) *without a unit*: ``interference_unit`` names it, default
    ``"noise"`` (multiples of the link's thermal noise ``N0·B``); negative draws are
    clipped at 0 (see :func:`interference_to_w`). ``fading="rayleigh"`` draws the power
    gain ``h = fading_gain · Exp(1)`` per client-round; ``"none"`` keeps ``h = fading_gain``.
    ``downlink_mode``: ``"full"`` gives each client the whole server band at the server's
    power; ``"equal_split"`` gives each of the round's n clients ``B_S / n`` (at the
    server's full power per sub-band, as the paper's per-link formula reads).

    ``path_loss``: None (the default) is Table 4's exponent model (``path_loss_db``,
    ``reference_distance_m``, ``path_loss_exponent``); a
    :class:`~mecsim.channel.pathloss.Tr38901PathLoss` replaces it with a 3GPP TR 38.901
    path loss of the client's distance (the 2D distance), LOS state and shadow fading,
    drawn once per run with the distance (:meth:`draw_clients`), and the exponent fields
    are not used.

    ``snr_offset_db`` (default 0: the literal model) is a *calibration knob* added to every
    SNR. Read literally, Table 4 gives SNR ≈ −11.6 dB at 300 m and round transfers 20–75×
    slower than the times the paper reports; +20 dB (no interference, full downlink band,
    round = slowest of 10 clients) reproduces them (docs/channel.md, "The +20 dB
    calibration"). A scenario setting it must say why.
    """

    uplink_bandwidth_range_hz: tuple[float, float] = (10e6, 30e6)
    tx_power_range_dbm: tuple[float, float] = (23.0, 30.0)
    distance_range_m: tuple[float, float] = (100.0, 500.0)
    path_loss_db: float = -40.0
    reference_distance_m: float = 1.0
    path_loss_exponent: float = 4.0
    fading: Literal["none", "rayleigh"] = "none"
    fading_gain: float = 1.0
    noise_psd_dbm_per_hz: float = -174.0
    interference: bool = True
    interference_unit: InterferenceUnit = "noise"
    ul_interference_mean: float = 1.0
    ul_interference_std: float = 2.0
    dl_interference_mean: float = 1.0
    dl_interference_std: float = 3.0
    server_bandwidth_hz: float = 50e6
    server_tx_power_dbm: float = 30.0
    downlink_mode: Literal["full", "equal_split"] = "full"
    snr_offset_db: float = 0.0
    path_loss: Tr38901PathLoss | None = None
    #: the rate of an SINR (:mod:`mecsim.channel.phy_models`); None: B · log2(1 + SINR)
    phy: Any = None
    #: the receivers' noise figure (dB), added to the thermal noise N0 · B
    noise_figure_db: float = 0.0

    def __post_init__(self) -> None:
        for name in ("uplink_bandwidth_range_hz", "tx_power_range_dbm", "distance_range_m"):
            lo, hi = getattr(self, name)
            if lo > hi or (name != "tx_power_range_dbm" and lo <= 0):
                raise ValueError(f"{name}: need 0 < low <= high (dBm may be <= 0), got {lo, hi}")
        for name, allowed in (
            ("fading", ("none", "rayleigh")),
            ("interference_unit", _UNITS),
            ("downlink_mode", ("full", "equal_split")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {allowed}")
        if self.server_bandwidth_hz <= 0:
            raise ValueError("server_bandwidth_hz must be positive")
        if self.path_loss is not None:
            lo, hi = self.distance_range_m
            if lo < 10.0 or hi > 5000.0:
                raise ValueError(
                    f"distance_range_m: {self.path_loss.model} is valid for 2D distances "
                    f"of 10 m to 5 km (TR 38.901 Table 7.4.1-1), got {lo:g}-{hi:g} m"
                )

    @property
    def noise_psd_w_per_hz(self) -> float:
        """The receiver's noise per Hz: thermal ``N0`` plus the noise figure (W/Hz)."""
        return float(dbm_to_w(self.noise_psd_dbm_per_hz + self.noise_figure_db))

    def draw_clients(
        self,
        n_clients: int,
        rng: np.random.Generator,
        *,
        large_scale_rng: np.random.Generator | None = None,
        distance_m: ArrayLike | None = None,
        large_scale: LargeScaleDraw | None = None,
    ) -> ClientRadio:
        """Draw order: distance (n), uplink bandwidth (n), tx power (n), all uniform.

        With a 3GPP ``path_loss``, then each client's LOS state and shadow fading
        (:meth:`~mecsim.channel.pathloss.Tr38901PathLoss.draw`) from ``large_scale_rng``
        (mecsim's runs give it a stream of the seed of its own), or, without one, from
        ``rng`` after the three draws above; either way those three are unchanged.

        ``distance_m`` (n,): the clients' distances from positions (a scenario's
        geometry); the uniform distance draw is still made, and discarded, so bandwidth
        and power are the same numbers as without it. ``large_scale``: the clients' LOS
        states and shadowing drawn elsewhere (per link, by the geometry), used instead of
        drawing them here.
        """
        d = rng.uniform(*self.distance_range_m, size=n_clients)
        b = rng.uniform(*self.uplink_bandwidth_range_hz, size=n_clients)
        p = rng.uniform(*self.tx_power_range_dbm, size=n_clients)
        if distance_m is not None:
            d = np.asarray(distance_m, dtype=float).copy()
            if d.shape != (n_clients,):
                raise ValueError(f"distance_m: {d.shape} for {n_clients} clients")
        if self.path_loss is None:
            return ClientRadio(d, b, p)
        ls = (
            large_scale
            if large_scale is not None
            else self.path_loss.draw(d, rng if large_scale_rng is None else large_scale_rng)
        )
        pl = self.path_loss.link_path_loss_db(d, ls)
        return ClientRadio(d, b, p, ls.los, ls.shadow_fading_db, pl, ls.environment_u)

    def draw_round(
        self,
        radio: ClientRadio,
        client_ids: ArrayLike,
        rng: np.random.Generator,
        *,
        time_s: float = 0.0,
        ul_interference_w: ArrayLike | None = None,
        dl_interference_w: ArrayLike | None = None,
        ul_cells: np.ndarray | None = None,
        dl_cells: np.ndarray | None = None,
    ) -> RoundChannel:
        """Per client-round draws, in this order: Exp(1) fading (n), uplink interference (n),
        downlink interference (n). All three are always drawn, so switching fading or
        interference off does not shift the random stream of the other draws.

        ``ul_interference_w`` / ``dl_interference_w`` (n,): interference in watts computed
        elsewhere (a geometry's co-channel cells: :mod:`mecsim.emulation.interference`),
        used instead of that direction's draw (which is still made, and discarded); the
        record's raw value is then the power in W.

        ``ul_cells`` / ``dl_cells`` (n,): which clients share one medium in that direction
        this round (equal numbers), for a ``phy`` whose MAC depends on who else sends
        (802.11ax); None: each client's link its own."""
        ids = _check_ids(radio, client_ids)
        n = len(ids)
        exp = rng.exponential(1.0, size=n)
        ul_raw = rng.normal(self.ul_interference_mean, self.ul_interference_std, size=n)
        dl_raw = rng.normal(self.dl_interference_mean, self.dl_interference_std, size=n)
        h = self.fading_gain * (exp if self.fading == "rayleigh" else np.ones(n))
        d, b_ul, p_dbm = radio.distance_m[ids], radio.bandwidth_hz[ids], radio.tx_power_dbm[ids]
        b_dl = np.full(
            n, self.server_bandwidth_hz / (n if self.downlink_mode == "equal_split" else 1)
        )
        n0 = self.noise_psd_w_per_hz
        if self.interference:
            i_ul = interference_to_w(ul_raw, self.interference_unit, b_ul, n0)
            i_dl = interference_to_w(dl_raw, self.interference_unit, b_dl, n0)
        else:
            i_ul, i_dl = np.zeros(n), np.zeros(n)
        if ul_interference_w is not None:
            i_ul = np.asarray(ul_interference_w, dtype=float).reshape(n).copy()
            ul_raw = i_ul
        if dl_interference_w is not None:
            i_dl = np.asarray(dl_interference_w, dtype=float).reshape(n).copy()
            dl_raw = i_dl
        extra: dict[str, np.ndarray] = {}
        if self.path_loss is None:
            g = large_scale_gain(
                d, self.path_loss_db, self.reference_distance_m, self.path_loss_exponent, h
            )
        else:
            if radio.path_loss_db is None or radio.los is None or radio.shadow_fading_db is None:
                raise ValueError(
                    "this channel has a 3GPP path loss, but the clients' radio has none: "
                    "draw it with this channel's draw_clients"
                )
            pl_db = radio.path_loss_db[ids]
            g = h * db_to_linear(-pl_db)
            extra = dict(
                zip(
                    PATH_LOSS_RECORD_KEYS,
                    (pl_db, radio.los[ids].astype(float), radio.shadow_fading_db[ids]),
                    strict=True,
                )
            )
        p_ul, p_dl = dbm_to_w(p_dbm), dbm_to_w(self.server_tx_power_dbm)
        s_ul = sinr(b_ul, p_ul, g, i_ul, n0, self.snr_offset_db)
        s_dl = sinr(b_dl, p_dl, g, i_dl, n0, self.snr_offset_db)
        return RoundChannel(
            ids,
            d,
            b_ul,
            p_dbm,
            h,
            ul_raw,
            dl_raw,
            i_ul,
            i_dl,
            b_ul * np.log2(1.0 + s_ul)
            if self.phy is None
            else self.phy.rates_bps(s_ul, b_ul, ul_cells, "ul"),
            b_dl * np.log2(1.0 + s_dl)
            if self.phy is None
            else self.phy.rates_bps(s_dl, b_dl, dl_cells, "dl"),
            linear_to_db(s_ul),
            linear_to_db(s_dl),
            extra,
        )


@dataclass(frozen=True)
class FixedRateChannel:
    """Constant per-client rates (DC-PFL: 2 Mbps per client). Draws nothing."""

    uplink_rate_bps: float
    downlink_rate_bps: float

    def __post_init__(self) -> None:
        if not (self.uplink_rate_bps > 0 and self.downlink_rate_bps > 0):
            raise ValueError("fixed rates must be positive")

    def draw_clients(self, n_clients: int, rng: np.random.Generator) -> ClientRadio:
        return ClientRadio.unmodelled(n_clients)

    def draw_round(
        self,
        radio: ClientRadio,
        client_ids: ArrayLike,
        rng: np.random.Generator,
        *,
        time_s: float = 0.0,
    ) -> RoundChannel:
        return RoundChannel.constant_rates(
            radio, client_ids, self.uplink_rate_bps, self.downlink_rate_bps
        )
