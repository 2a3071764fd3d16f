"""What a link's SINR is worth in bits per second: the rate abstraction of a Shannon-type
channel (``channel.phy.model``), one small class per model with one main method.

``rates_bps(sinr, bandwidth_hz, cells, link)`` turns each client's SINR (linear) and band
into the rate its transfers see. ``cells`` groups the clients that share one medium this
round (the same number: one cell), ``None`` when each has its own: only a MAC that
depends on who else sends (802.11ax's DCF) reads it. ``link`` is ``"ul"`` or ``"dl"``.

- :class:`ShannonPhy` — ``B · log2(1 + SINR)`` (mecsim's model before this one existed,
  and the KAPC paper's): no modulation caps it;
- :class:`TruncatedShannonPhy` — 3GPP TR 36.942 Annex A.2,
  ``B · min(α · log2(1 + SINR), Thr_MAX)``, 0 below SINR_MIN (its uplink and downlink
  defaults differ);
- :class:`WifiAxPhy` — 802.11ax: the HE-MCS ns-3's ``IdealWifiManager`` picks for the
  SNR (its thresholds, asked of ns-3.37's PHY), and the rate on the air a station gets
  in its cell with the MAC's overheads (preamble, backoff, collisions, block acks, the AP's
  TCP ACKs: :func:`~mecsim.channel.phy.wifi_station_rates_bps`);
- :class:`NrPhy` — 5G NR: the CQI of the SINR (TS 38.214 tables), its spectral
  efficiency over the carrier's PRBs with TS 38.306's overhead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from mecsim.channel.phy import (
    TR36942_DOWNLINK,
    TR36942_UPLINK,
    ampdu_mpdus,
    he_mcs_for_snr,
    nr_rate_for_sinr_bps,
    truncated_shannon_bps,
    wifi_mpdu_air_s,
    wifi_station_rates_bps,
)

__all__ = ["NrPhy", "ShannonPhy", "TruncatedShannonPhy", "WifiAxPhy"]

Link = Literal["ul", "dl"]


def _db(sinr: ArrayLike) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(sinr, dtype=float))


@dataclass(frozen=True)
class ShannonPhy:
    """``B · log2(1 + SINR)``."""

    def rates_bps(
        self, sinr: ArrayLike, bandwidth_hz: ArrayLike, cells: np.ndarray | None, link: Link
    ) -> np.ndarray:
        return np.asarray(bandwidth_hz, dtype=float) * np.log2(1.0 + np.asarray(sinr, float))


@dataclass(frozen=True)
class TruncatedShannonPhy:
    """TR 36.942 A.2; ``None`` takes the annex's value for the link (uplink α 0.4,
    Thr_MAX 2.0 b/s/Hz; downlink α 0.6, 4.4 b/s/Hz; SINR_MIN −10 dB both)."""

    alpha: float | None = None
    sinr_min_db: float | None = None
    max_spectral_efficiency: float | None = None

    def parameters(self, link: Link) -> tuple[float, float, float]:
        """(α, SINR_MIN dB, Thr_MAX b/s/Hz) in force on ``link``."""
        a, s, t = TR36942_UPLINK if link == "ul" else TR36942_DOWNLINK
        return (
            a if self.alpha is None else self.alpha,
            s if self.sinr_min_db is None else self.sinr_min_db,
            t if self.max_spectral_efficiency is None else self.max_spectral_efficiency,
        )

    def rates_bps(
        self, sinr: ArrayLike, bandwidth_hz: ArrayLike, cells: np.ndarray | None, link: Link
    ) -> np.ndarray:
        alpha, sinr_min_db, thr = self.parameters(link)
        return truncated_shannon_bps(_db(sinr), bandwidth_hz, alpha, sinr_min_db, thr)


#: 802.11ax channel widths (MHz)
WIFI_AX_WIDTHS_MHZ = (20, 40, 80, 160)


@dataclass(frozen=True)
class WifiAxPhy:
    """802.11ax (HE SU): ``spatial_streams`` 1-4, guard interval 800/1600/3200 ns; the
    band must be a channel width of 20, 40, 80 or 160 MHz."""

    spatial_streams: int = 1
    guard_interval_ns: int = 800

    def mcs(self, sinr: ArrayLike, width_mhz: int) -> np.ndarray:
        """The HE-MCS of each SINR (−1: below MCS 0's threshold, out of range)."""
        return he_mcs_for_snr(_db(sinr), width_mhz, self.spatial_streams)

    def rates_bps(
        self, sinr: ArrayLike, bandwidth_hz: ArrayLike, cells: np.ndarray | None, link: Link
    ) -> np.ndarray:
        s = np.atleast_1d(np.asarray(sinr, dtype=float))
        band = np.broadcast_to(np.asarray(bandwidth_hz, dtype=float), s.shape)
        out = np.zeros(s.shape)
        groups = np.arange(len(s)) if cells is None else np.asarray(cells)
        for width_hz in np.unique(band):
            width = int(round(width_hz / 1e6))
            if width not in WIFI_AX_WIDTHS_MHZ or abs(width * 1e6 - width_hz) > 1.0:
                raise ValueError(
                    f"802.11ax has channel widths of {WIFI_AX_WIDTHS_MHZ} MHz, "
                    f"not {width_hz / 1e6:g}"
                )
            on = band == width_hz
            mcs = self.mcs(s[on], width)
            grp = groups[on]
            rates = np.zeros(len(mcs))
            for g in np.unique(grp):  # each cell's stations contend with each other
                at = grp == g
                rates[at] = wifi_station_rates_bps(
                    mcs[at], width, self.spatial_streams, self.guard_interval_ns
                )
            out[on] = rates
        return out.reshape(np.shape(sinr))

    def exchanges(
        self, snr_db: ArrayLike, bandwidth_hz: ArrayLike
    ) -> tuple[np.ndarray, np.ndarray]:
        """What a TCP flow reads of each station's MAC (:class:`~mecsim.channel.tcp.TcpFlow`):
        the air time one more MPDU of its own adds to the cell's cycle
        (:func:`~mecsim.channel.phy.wifi_mpdu_air_s`) and ``k``, the MPDUs an A-MPDU of
        its rate carries (:func:`~mecsim.channel.phy.ampdu_mpdus`). (0, 1) for a station
        out of range (its rate is 0 and its transfers never end anyway)."""
        snr = np.atleast_1d(np.asarray(snr_db, dtype=float))
        band = np.broadcast_to(np.asarray(bandwidth_hz, dtype=float), snr.shape)
        air = np.zeros(snr.shape)
        mpdus = np.ones(snr.shape)
        for width_hz in np.unique(band):
            on = band == width_hz
            width = int(round(width_hz / 1e6))
            mcs = he_mcs_for_snr(snr[on], width, self.spatial_streams)
            m = np.maximum(mcs, 0)
            k = ampdu_mpdus(m, width, self.spatial_streams, self.guard_interval_ns)
            per = wifi_mpdu_air_s(m, width, self.spatial_streams, self.guard_interval_ns)
            air[on] = np.where(mcs >= 0, per, 0.0)
            mpdus[on] = np.where(mcs >= 0, k, 1.0)
        return air, mpdus


@dataclass(frozen=True)
class NrPhy:
    """5G NR on a carrier of the link's bandwidth: ``subcarrier_spacing_khz`` (15/30/60
    in FR1, 60/120 in FR2), MIMO ``layers``, CQI ``cqi_table`` 1 (64QAM) or 2 (256QAM)."""

    subcarrier_spacing_khz: int = 30
    layers: int = 1
    cqi_table: int = 2
    frequency_range: int = 1

    def rates_bps(
        self, sinr: ArrayLike, bandwidth_hz: ArrayLike, cells: np.ndarray | None, link: Link
    ) -> np.ndarray:
        s = np.atleast_1d(np.asarray(sinr, dtype=float))
        band = np.broadcast_to(np.asarray(bandwidth_hz, dtype=float), s.shape)
        out = np.zeros(s.shape)
        for width_hz in np.unique(band):
            on = band == width_hz
            out[on] = nr_rate_for_sinr_bps(
                _db(s[on]),
                int(round(width_hz / 1e6)),
                self.subcarrier_spacing_khz,
                self.layers,
                link,
                self.frequency_range,
                self.cqi_table,
            )
        return out.reshape(np.shape(sinr))
