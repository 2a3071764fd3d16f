"""Rates a real PHY gives, and how an 802.11ax cell shares them (numpy only).

Four pieces, each vectorised over clients (arrays of SINR in dB, ``sinr_db``):

* :func:`truncated_shannon_bps` -- 3GPP TR 36.942 Annex A.2's attenuated and truncated
  Shannon bound (the LTE link-adaptation curve system studies use).
* 802.11ax (HE) rates: :func:`he_rate_bps` from the HE-MCS table, :func:`he_mcs_for_snr`
  with the SNR thresholds ns-3.37's ``IdealWifiManager`` uses (asked of ns-3 itself,
  ``data/wifi_he_snr_thresholds.json``), :func:`wifi_snr_db` for the SNR ns-3 computes.
* 5G NR: TS 38.214 CQI tables, TS 38.306 section 4.1.2's rate formula, TS 38.101-1/-2
  PRB counts (:func:`nr_rate_bps`, :func:`nr_peak_rate_bps`).
* An 802.11ax cell's MAC: :func:`wifi_cell_goodput_bps` (each station's TCP goodput when
  ``n`` stations upload at once) and :func:`wifi_cell_upload_times_s` (when each of them
  finishes), after Bianchi (JSAC 2000) and Heusse et al. (INFOCOM 2003), with ns-3.37's
  802.11ax defaults; validated against ``validation/ns3/wifi_cell.cc``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# --------------------------------------------------------------------------------------
# 3GPP TR 36.942 Annex A.2: attenuated, truncated Shannon bound
# --------------------------------------------------------------------------------------

#: TR 36.942 A.2 defaults (downlink, Table A.2.1.1-1): alpha, SINR_MIN (dB), Thr_MAX (b/s/Hz)
TR36942_DOWNLINK = (0.6, -10.0, 4.4)
#: TR 36.942 A.2 defaults (uplink, Table A.2.1.1-2): alpha, SINR_MIN (dB), Thr_MAX (b/s/Hz)
TR36942_UPLINK = (0.4, -10.0, 2.0)


def truncated_shannon_bps(
    sinr_db: ArrayLike,
    bandwidth_hz: ArrayLike,
    alpha: float = 0.6,
    sinr_min_db: float = -10.0,
    max_se_bps_per_hz: float = 4.4,
) -> FloatArray:
    """TR 36.942 A.2: ``B · min(α·log2(1+SINR), Thr_MAX)``, 0 below ``SINR_MIN``.

    Defaults are the annex's downlink values; :data:`TR36942_UPLINK` holds the uplink ones.
    """
    sinr_lin = 10.0 ** (np.asarray(sinr_db, dtype=float) / 10.0)
    se = np.minimum(alpha * np.log2(1.0 + sinr_lin), max_se_bps_per_hz)
    se = np.where(np.asarray(sinr_db, dtype=float) < sinr_min_db, 0.0, se)
    return np.asarray(bandwidth_hz, dtype=float) * se


# --------------------------------------------------------------------------------------
# IEEE 802.11ax (HE) PHY
# --------------------------------------------------------------------------------------

#: HE-MCS 0-11 (IEEE 802.11ax-2021 Tables 27-55..): (bits per subcarrier, code rate)
HE_MCS = (
    (1, 1 / 2),  # BPSK
    (2, 1 / 2),  # QPSK
    (2, 3 / 4),
    (4, 1 / 2),  # 16-QAM
    (4, 3 / 4),
    (6, 2 / 3),  # 64-QAM
    (6, 3 / 4),
    (6, 5 / 6),
    (8, 3 / 4),  # 256-QAM
    (8, 5 / 6),
    (10, 3 / 4),  # 1024-QAM
    (10, 5 / 6),
)
HE_BITS_PER_SUBCARRIER = np.array([m[0] for m in HE_MCS], dtype=float)
HE_CODE_RATE = np.array([m[1] for m in HE_MCS], dtype=float)
#: data subcarriers of a full-width HE SU PPDU (RU 242/484/996/2x996)
HE_DATA_SUBCARRIERS = {20: 234, 40: 468, 80: 980, 160: 1960}
HE_SYMBOL_S = 12.8e-6  # without guard interval

# HE SU preamble as ns-3.37 times it (HePhy): L-STF 8 + L-LTF 8 + L-SIG 4 + RL-SIG 4
# + HE-SIG-A 8 + HE-STF 4 µs, then one 8 µs HE-LTF per LTF (1, 2, 4, 4 LTFs for 1-4 SS)
HE_SU_PREAMBLE_FIXED_S = 36e-6
HE_LTF_S = 8e-6
HE_LTFS_FOR_NSS = {1: 1, 2: 2, 3: 4, 4: 4}

BOLTZMANN_NS3_J_PER_K = 1.3803e-23  # the constant ns-3's InterferenceHelper uses
NOISE_TEMPERATURE_K = 290.0


def he_symbol_s(gi_ns: float = 800) -> float:
    """HE OFDM symbol with guard interval: 12.8 µs + 0.8/1.6/3.2 µs."""
    return HE_SYMBOL_S + gi_ns * 1e-9


def he_data_bits_per_symbol(
    mcs: ArrayLike, channel_width_mhz: int = 20, nss: int = 1
) -> FloatArray:
    """N_DBPS: data subcarriers · bits per subcarrier · code rate · spatial streams."""
    m = np.asarray(mcs, dtype=np.int64)
    return (
        HE_DATA_SUBCARRIERS[channel_width_mhz] * HE_BITS_PER_SUBCARRIER[m] * HE_CODE_RATE[m] * nss
    )


def he_rate_bps(
    mcs: ArrayLike, channel_width_mhz: int = 20, nss: int = 1, gi_ns: float = 800
) -> FloatArray:
    """HE SU PHY data rate (b/s); e.g. MCS 11, 20 MHz, 1 SS, GI 0.8 µs: 143.4 Mb/s."""
    return he_data_bits_per_symbol(mcs, channel_width_mhz, nss) / he_symbol_s(gi_ns)


def wifi_noise_dbm(channel_width_mhz: ArrayLike, noise_figure_db: float = 7.0) -> FloatArray:
    """Receiver noise as ns-3 computes it: k·290 K·(channel width) · noise figure (dBm).

    ns-3 uses the nominal channel width (20/40/80/160 MHz, guard bands included) and
    k = 1.3803e-23 J/K: -173.98 dBm/Hz, so -93.97 dBm in 20 MHz with 7 dB.
    """
    width_hz = np.asarray(channel_width_mhz, dtype=float) * 1e6
    noise_w = BOLTZMANN_NS3_J_PER_K * NOISE_TEMPERATURE_K * width_hz
    return 10.0 * np.log10(noise_w * 1e3) + noise_figure_db


def log_distance_loss_db(
    distance_m: ArrayLike,
    exponent: float = 3.0,
    reference_loss_db: float = 46.6777,
    reference_distance_m: float = 1.0,
) -> FloatArray:
    """ns-3's LogDistancePropagationLossModel (its defaults: 3, 46.6777 dB at 1 m)."""
    d = np.maximum(np.asarray(distance_m, dtype=float), reference_distance_m)
    return reference_loss_db + 10.0 * exponent * np.log10(d / reference_distance_m)


def wifi_snr_db(
    distance_m: ArrayLike,
    tx_power_dbm: float = 20.0,
    channel_width_mhz: int = 20,
    noise_figure_db: float = 7.0,
    path_loss_exponent: float = 3.0,
    reference_loss_db: float = 46.6777,
) -> FloatArray:
    """The SNR ns-3 computes at the receiver for a station ``distance_m`` away (dB)."""
    rx_dbm = tx_power_dbm - log_distance_loss_db(distance_m, path_loss_exponent, reference_loss_db)
    return rx_dbm - wifi_noise_dbm(channel_width_mhz, noise_figure_db)


THRESHOLDS_PATH = Path(__file__).parent / "data" / "wifi_he_snr_thresholds.json"


@cache
def _he_thresholds_linear(channel_width_mhz: int, nss: int) -> FloatArray:
    table = json.loads(THRESHOLDS_PATH.read_text())
    by_mcs = {
        e["mcs"]: e["snr_threshold"]
        for e in table["entries"]
        if e["channel_width_mhz"] == channel_width_mhz and e["nss"] == nss
    }
    return np.array([by_mcs.get(m, np.inf) for m in range(len(HE_MCS))], dtype=float)


def he_snr_thresholds_db(channel_width_mhz: int = 20, nss: int = 1) -> FloatArray:
    """ns-3.37 IdealWifiManager's SNR threshold (dB) of HE MCS 0-11 (inf if not allowed)."""
    return 10.0 * np.log10(_he_thresholds_linear(channel_width_mhz, nss))


def he_mcs_for_snr(snr_db: ArrayLike, channel_width_mhz: int = 20, nss: int = 1) -> IntArray:
    """The MCS IdealWifiManager picks: the fastest whose threshold is below the SNR.

    -1 where even MCS 0's threshold is not met (ns-3 would then still send at MCS 0,
    its default mode, and lose frames). Strictly below, as ns-3 compares (``<``), in
    linear units.
    """
    snr_lin = 10.0 ** (np.asarray(snr_db, dtype=float) / 10.0)
    thresholds = _he_thresholds_linear(channel_width_mhz, nss)
    # rates grow with the MCS index, so the fastest admissible MCS is the last one below
    met = thresholds[None, :] < np.ravel(snr_lin)[:, None]
    mcs = np.where(met.any(axis=1), met.shape[1] - 1 - np.argmax(met[:, ::-1], axis=1), -1)
    return mcs.reshape(np.shape(snr_lin)).astype(np.int64)


def he_rate_for_snr_bps(
    snr_db: ArrayLike, channel_width_mhz: int = 20, nss: int = 1, gi_ns: float = 800
) -> FloatArray:
    """PHY rate of the MCS :func:`he_mcs_for_snr` picks (0 b/s below MCS 0's threshold)."""
    mcs = he_mcs_for_snr(snr_db, channel_width_mhz, nss)
    rate = he_rate_bps(np.maximum(mcs, 0), channel_width_mhz, nss, gi_ns)
    return np.where(mcs >= 0, rate, 0.0)


def he_su_ppdu_s(
    psdu_bytes: ArrayLike,
    mcs: ArrayLike,
    channel_width_mhz: int = 20,
    nss: int = 1,
    gi_ns: float = 800,
) -> FloatArray:
    """HE SU PPDU duration: preamble + ceil((16 + 8·L + 6) / N_DBPS) data symbols."""
    n_dbps = he_data_bits_per_symbol(mcs, channel_width_mhz, nss)
    bits = 16.0 + 8.0 * np.asarray(psdu_bytes, dtype=float) + 6.0
    symbols = np.ceil(bits / n_dbps)
    preamble_s = HE_SU_PREAMBLE_FIXED_S + HE_LTF_S * HE_LTFS_FOR_NSS[nss]
    return preamble_s + symbols * he_symbol_s(gi_ns)


def legacy_ofdm_ppdu_s(psdu_bytes: ArrayLike, rate_bps: ArrayLike) -> FloatArray:
    """802.11a (non-HT) PPDU: 20 µs preamble + 4 µs symbols of ``rate · 4 µs`` bits."""
    bits_per_symbol = np.asarray(rate_bps, dtype=float) * 4e-6
    bits = 16.0 + 8.0 * np.asarray(psdu_bytes, dtype=float) + 6.0
    return 20e-6 + np.ceil(bits / bits_per_symbol) * 4e-6


# --------------------------------------------------------------------------------------
# 5G NR: TS 38.214 CQI tables, TS 38.306 4.1.2 rate, TS 38.101 PRBs
# --------------------------------------------------------------------------------------

#: TS 38.214 Table 5.2.2.1-2 (CQI table 1, up to 64QAM): (Qm, code rate × 1024), CQI 1-15
NR_CQI_TABLE_1 = (
    (2, 78), (2, 120), (2, 193), (2, 308), (2, 449), (2, 602),
    (4, 378), (4, 490), (4, 616),
    (6, 466), (6, 567), (6, 666), (6, 772), (6, 873), (6, 948),
)  # fmt: skip
#: TS 38.214 Table 5.2.2.1-3 (CQI table 2, up to 256QAM): (Qm, code rate × 1024), CQI 1-15
NR_CQI_TABLE_2 = (
    (2, 78), (2, 193), (2, 449),
    (4, 378), (4, 490), (4, 616),
    (6, 466), (6, 567), (6, 666), (6, 772), (6, 873),
    (8, 711), (8, 797), (8, 885), (8, 948),
)  # fmt: skip

#: TS 38.306 4.1.2 overhead OH: (link, frequency range) -> OH
NR_OVERHEAD = {("dl", 1): 0.14, ("dl", 2): 0.18, ("ul", 1): 0.08, ("ul", 2): 0.10}
NR_R_MAX = 948 / 1024

#: N_RB of the maximum transmission bandwidth configuration, {SCS kHz: {bandwidth MHz: N_RB}}:
#: FR1 from TS 38.101-1 Table 5.3.2-1, FR2 (60/120 kHz at 50 MHz and up) TS 38.101-2 5.3.2-1
NR_PRBS_FR1 = {
    15: {5: 25, 10: 52, 15: 79, 20: 106, 25: 133, 30: 160, 40: 216, 50: 270},
    30: {5: 11, 10: 24, 15: 38, 20: 51, 25: 65, 30: 78, 40: 106, 50: 133, 60: 162,
         70: 189, 80: 217, 90: 245, 100: 273},
    60: {10: 11, 15: 18, 20: 24, 25: 31, 30: 38, 40: 51, 50: 65, 60: 79, 70: 93, 80: 107,
         90: 121, 100: 135},
}  # fmt: skip
NR_PRBS_FR2 = {
    60: {50: 66, 100: 132, 200: 264},
    120: {50: 32, 100: 66, 200: 132, 400: 264},
}
NrLink = Literal["dl", "ul"]


def nr_cqi_efficiency(cqi: ArrayLike, table: int = 2) -> FloatArray:
    """Spectral efficiency Qm · R of a 4-bit CQI (b/s/Hz per layer); 0 for CQI 0."""
    rows = NR_CQI_TABLE_2 if table == 2 else NR_CQI_TABLE_1
    se = np.array([0.0] + [qm * r / 1024 for qm, r in rows])
    return se[np.asarray(cqi, dtype=np.int64)]


def nr_prbs(bandwidth_mhz: int, scs_khz: int, frequency_range: int = 1) -> int:
    """N_RB for a (channel bandwidth, subcarrier spacing) pair (TS 38.101-1/-2)."""
    table = NR_PRBS_FR1 if frequency_range == 1 else NR_PRBS_FR2
    return table[scs_khz][bandwidth_mhz]


def nr_numerology(scs_khz: int) -> int:
    """μ of a subcarrier spacing: 15 · 2^μ kHz."""
    return int(round(math.log2(scs_khz / 15)))


def piro_snr_gap(ber: float = 5e-5) -> float:
    """SNR gap Γ = -ln(5·BER)/1.5 of the MQAM bound (Piro et al. 2011; ns-3 LteAmc)."""
    return -math.log(5.0 * ber) / 1.5


def nr_cqi_for_sinr(sinr_db: ArrayLike, table: int = 2, ber: float = 5e-5) -> IntArray:
    """The highest CQI whose efficiency is ≤ log2(1 + SINR/Γ), Γ = :func:`piro_snr_gap`.

    The mapping of ns-3's LTE module (LteAmc, "PiroEW2010", target BER 5e-5), applied to
    the NR CQI tables; 0 (out of range) if not even CQI 1 fits.
    """
    sinr_lin = 10.0 ** (np.asarray(sinr_db, dtype=float) / 10.0)
    se = np.log2(1.0 + sinr_lin / piro_snr_gap(ber))
    table_se = nr_cqi_efficiency(np.arange(1, 16), table)
    return np.searchsorted(table_se, se, side="right").astype(np.int64)


def nr_rate_bps(
    efficiency_bps_per_hz: ArrayLike,
    n_prb: int,
    scs_khz: int,
    layers: int = 1,
    link: NrLink = "dl",
    frequency_range: int = 1,
) -> FloatArray:
    """TS 38.306 4.1.2 with ``Qm·f·Rmax`` replaced by an efficiency (per layer):

    ``layers · SE · N_PRB · 12 / T_s^μ · (1 − OH)``, ``T_s^μ = 1e-3 / (14 · 2^μ)`` s.
    """
    mu = nr_numerology(scs_khz)
    symbol_s = 1e-3 / (14 * 2**mu)
    oh = NR_OVERHEAD[(link, frequency_range)]
    res_per_s = n_prb * 12 / symbol_s
    return layers * np.asarray(efficiency_bps_per_hz, dtype=float) * res_per_s * (1.0 - oh)


def nr_peak_rate_bps(
    n_prb: int,
    scs_khz: int,
    layers: int = 4,
    qm: int = 8,
    link: NrLink = "dl",
    frequency_range: int = 1,
    scaling_factor: float = 1.0,
) -> float:
    """TS 38.306 4.1.2 for one carrier: ``layers·Qm·f·Rmax·N_PRB·12/T_s·(1−OH)``."""
    se = qm * scaling_factor * NR_R_MAX
    return float(nr_rate_bps(se, n_prb, scs_khz, layers, link, frequency_range))


def nr_rate_for_sinr_bps(
    sinr_db: ArrayLike,
    bandwidth_mhz: int,
    scs_khz: int,
    layers: int = 1,
    link: NrLink = "dl",
    frequency_range: int = 1,
    table: int = 2,
) -> FloatArray:
    """The NR rate at an SINR: CQI by :func:`nr_cqi_for_sinr`, PRBs of the full carrier."""
    se = nr_cqi_efficiency(nr_cqi_for_sinr(sinr_db, table), table)
    n_prb = nr_prbs(bandwidth_mhz, scs_khz, frequency_range)
    return nr_rate_bps(se, n_prb, scs_khz, layers, link, frequency_range)


# --------------------------------------------------------------------------------------
# An 802.11ax cell: n stations upload over TCP at once
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WifiCellMac:
    """802.11ax EDCA (AC_BE) and TCP framing, at ns-3.37's defaults."""

    slot_s: float = 9e-6
    sifs_s: float = 16e-6
    aifsn: int = 3
    cw_min: int = 15
    cw_max: int = 1023
    max_ampdu_bytes: int = 65_535  # WifiMac BE_MaxAmpduSize
    ba_window_mpdus: int = 64  # HeConfiguration MpduBufferSize
    max_ppdu_s: float = 5.484e-3  # aPPDUMaxTime of HE
    mss_bytes: int = 1448
    ip_packet_bytes: int = 1500  # MSS + 20 IP + 20 TCP + 12 timestamps
    tcp_ack_ip_bytes: int = 52
    segments_per_tcp_ack: int = 2  # delayed ACKs
    mac_overhead_bytes: int = 38  # QoS data header 26 + LLC/SNAP 8 + FCS 4
    ampdu_delimiter_bytes: int = 4
    block_ack_bytes: int = 32  # compressed Block Ack, 64-MPDU bitmap, with FCS
    # ns-3's basic rates in 5 GHz (6, 12, 24 Mb/s): the Block Ack goes at the highest one
    # not above the data MCS's non-HT reference rate
    basic_rates_bps: tuple[float, ...] = (6e6, 12e6, 24e6)
    # the time a collision takes, as a fraction of the mean data exchange: 1 in Bianchi's
    # model; calibrated on the ns-3.37 cell (10 stations, 20 MHz, 5-60 m; see
    # validation/wifi_compare.py: 1.0 gives +14 %, 0.6 -1 %), where part of a collided
    # A-MPDU still gets through (ns-3 decodes each MPDU on its own SINR)
    collision_cost: float = 0.6


#: non-HT reference rate of HE MCS 0-11 (802.11ax 27.3.7; ns-3 HePhy)
HE_NON_HT_REFERENCE_BPS = np.array(
    [6e6, 12e6, 18e6, 24e6, 36e6, 48e6, 54e6, 54e6, 54e6, 54e6, 54e6, 54e6]
)


def bianchi_collision_probability(n_contenders: int, cw_min: int = 15, cw_max: int = 1023) -> float:
    """Bianchi's (JSAC 2000) conditional collision probability p for n saturated stations.

    Solves ``τ = 2(1−2p) / ((1−2p)(W+1) + pW(1−(2p)^m))``, ``p = 1 − (1−τ)^(n−1)``,
    ``W = CWmin + 1``, ``m = log2((CWmax+1)/W)``, by bisection on p.
    """
    if n_contenders <= 1:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        p = 0.5 * (lo + hi)
        if p - (1.0 - (1.0 - bianchi_tau(p, cw_min, cw_max)) ** (n_contenders - 1)) < 0:
            lo = p
        else:
            hi = p
    return 0.5 * (lo + hi)


def bianchi_tau(p: float, cw_min: int = 15, cw_max: int = 1023) -> float:
    """Bianchi's transmission probability in a slot, given the collision probability p."""
    w = cw_min + 1
    m = round(math.log2((cw_max + 1) / w))
    if abs(1.0 - 2.0 * p) < 1e-12:
        return 2.0 / (w + 1.0 + p * w * m)  # the limit at p = 1/2
    return 2.0 * (1.0 - 2.0 * p) / ((1.0 - 2.0 * p) * (w + 1) + p * w * (1.0 - (2.0 * p) ** m))


def _pad4(n_bytes: ArrayLike) -> FloatArray:
    return 4.0 * np.ceil(np.asarray(n_bytes, dtype=float) / 4.0)


def ampdu_mpdus(
    mcs: ArrayLike,
    channel_width_mhz: int = 20,
    nss: int = 1,
    gi_ns: float = 800,
    mac: WifiCellMac | None = None,
) -> FloatArray:
    """Data MPDUs per A-MPDU: min(BA window, max A-MPDU bytes, the PPDU's max duration)."""
    mac = mac or WifiCellMac()
    subframe = _pad4(mac.ip_packet_bytes + mac.mac_overhead_bytes + mac.ampdu_delimiter_bytes)
    by_size = np.floor(mac.max_ampdu_bytes / subframe)
    preamble_s = HE_SU_PREAMBLE_FIXED_S + HE_LTF_S * HE_LTFS_FOR_NSS[nss]
    symbols = np.floor((mac.max_ppdu_s - preamble_s) / he_symbol_s(gi_ns))
    bits = symbols * he_data_bits_per_symbol(mcs, channel_width_mhz, nss) - 22.0
    by_time = np.floor(bits / 8.0 / subframe)
    return np.maximum(1.0, np.minimum(np.minimum(by_size, by_time), mac.ba_window_mpdus))


def _exchange_s(
    psdu_bytes: FloatArray,
    mcs: IntArray,
    channel_width_mhz: int,
    nss: int,
    gi_ns: float,
    mac: WifiCellMac,
) -> FloatArray:
    """AIFS + PPDU + SIFS + Block Ack: one successful channel access, without backoff."""
    reference = HE_NON_HT_REFERENCE_BPS[mcs]
    basic = np.array(mac.basic_rates_bps)
    ba_rate = basic[np.maximum(np.searchsorted(basic, reference, side="right") - 1, 0)]
    aifs_s = mac.sifs_s + mac.aifsn * mac.slot_s
    return (
        aifs_s
        + he_su_ppdu_s(psdu_bytes, mcs, channel_width_mhz, nss, gi_ns)
        + mac.sifs_s
        + legacy_ofdm_ppdu_s(mac.block_ack_bytes, ba_rate)
    )


def _station_cycles_s(
    m: IntArray, channel_width_mhz: int, nss: int, gi_ns: float, mac: WifiCellMac
) -> tuple[FloatArray, FloatArray]:
    """(k_i, T_i): each station's data MPDUs per A-MPDU and its share of the cell's cycle
    — its own exchange, the AP's exchange returning its TCP ACKs, and two accesses' idle
    and collision time (Bianchi with the stations and the AP contending)."""
    n = m.size
    k = ampdu_mpdus(m, channel_width_mhz, nss, gi_ns, mac)
    data_subframe = _pad4(mac.ip_packet_bytes + mac.mac_overhead_bytes + mac.ampdu_delimiter_bytes)
    ack_subframe = _pad4(mac.tcp_ack_ip_bytes + mac.mac_overhead_bytes + mac.ampdu_delimiter_bytes)
    n_acks = np.ceil(k / mac.segments_per_tcp_ack)
    data_s = _exchange_s(k * data_subframe, m, channel_width_mhz, nss, gi_ns, mac)
    ack_s = _exchange_s(n_acks * ack_subframe, m, channel_width_mhz, nss, gi_ns, mac)
    contenders = n + 1
    p = bianchi_collision_probability(contenders, mac.cw_min, mac.cw_max)
    tau = bianchi_tau(p, mac.cw_min, mac.cw_max)
    p_tr = 1.0 - (1.0 - tau) ** contenders
    p_s = contenders * tau * (1.0 - tau) ** (contenders - 1) / p_tr
    idle_per_success_s = mac.slot_s * (1.0 - p_tr) / (p_tr * p_s)
    collision_s = mac.collision_cost * float(np.mean(data_s))
    overhead_per_success_s = idle_per_success_s + (1.0 - p_s) / p_s * collision_s
    return k, data_s + ack_s + 2.0 * overhead_per_success_s


def wifi_mpdu_air_s(
    mcs: ArrayLike,
    channel_width_mhz: int = 20,
    nss: int = 1,
    gi_ns: float = 800,
    mac: WifiCellMac | None = None,
) -> FloatArray:
    """The air time one more MPDU adds to a station's share of the cell's cycle (s): its
    subframe in the station's A-MPDU and half a TCP ACK's in the access point's (one
    ACK per two segments), from :func:`_station_cycles_s`' exchanges of ``k`` and 1
    MPDUs: ``(T(k) − T(1)) / (k − 1)`` (0 where ``k`` is 1). What an exchange costs
    beyond ``k`` of these — AIFS, backoff, preambles, SIFS, block acks, idle and
    collision time — is its fixed part, paid however few MPDUs it carries."""
    mac = mac or WifiCellMac()
    m = np.atleast_1d(np.asarray(mcs, dtype=np.int64))
    k = ampdu_mpdus(m, channel_width_mhz, nss, gi_ns, mac)
    data_subframe = _pad4(mac.ip_packet_bytes + mac.mac_overhead_bytes + mac.ampdu_delimiter_bytes)
    ack_subframe = _pad4(mac.tcp_ack_ip_bytes + mac.mac_overhead_bytes + mac.ampdu_delimiter_bytes)

    def own_s(n_mpdus: FloatArray) -> FloatArray:
        acks = n_mpdus / mac.segments_per_tcp_ack
        return _exchange_s(
            n_mpdus * data_subframe, m, channel_width_mhz, nss, gi_ns, mac
        ) + _exchange_s(np.ceil(acks) * ack_subframe, m, channel_width_mhz, nss, gi_ns, mac)

    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.where(k > 1, (own_s(k) - own_s(np.ones_like(k))) / (k - 1.0), 0.0)
    return np.asarray(per, dtype=float).reshape(np.shape(mcs))


def wifi_cell_goodput_bps(
    mcs: ArrayLike,
    channel_width_mhz: int = 20,
    nss: int = 1,
    gi_ns: float = 800,
    mac: WifiCellMac | None = None,
) -> FloatArray:
    """Each station's TCP goodput (b/s) when every station in ``mcs`` uploads at once.

    Every channel access wins with the same probability whoever holds it (DCF/EDCA, as
    Heusse et al. observe), so a cycle of the cell is one access per station, each an
    A-MPDU of :func:`ampdu_mpdus` data MPDUs, plus one access of the AP per station to
    return its TCP ACKs (one per two segments) in an A-MPDU at the station's MCS. Each
    access costs AIFS + PPDU + SIFS + Block Ack; idle backoff slots and collisions come
    from Bianchi's model with the n stations and the AP contending (n + 1): per success,
    ``σ(1−P_tr)/(P_tr·P_s)`` idle time and ``(1−P_s)/P_s`` collisions lasting the mean data
    exchange. Station i delivers ``k_i · MSS`` per cycle, so the goodputs are equal when
    the k_i are (the performance anomaly) and the cell's total falls with n.
    """
    mac = mac or WifiCellMac()
    m = np.atleast_1d(np.asarray(mcs, dtype=np.int64))
    if m.size == 0:
        return np.zeros(0)
    k, own_s = _station_cycles_s(m, channel_width_mhz, nss, gi_ns, mac)
    cycle_s = float(np.sum(own_s))
    return np.asarray(k * mac.mss_bytes * 8.0 / cycle_s, dtype=float).reshape(np.shape(mcs))


def wifi_cell_upload_times_s(
    upload_bytes: ArrayLike,
    mcs: ArrayLike,
    channel_width_mhz: int = 20,
    nss: int = 1,
    gi_ns: float = 800,
    mac: WifiCellMac | None = None,
) -> FloatArray:
    """When each station's upload ends (s), all starting together.

    Stations share the cell as :func:`wifi_cell_goodput_bps` says for the stations still
    uploading; when one finishes the rest are re-rated (a phase per finishing station).
    """
    remaining_bits = np.atleast_1d(np.asarray(upload_bytes, dtype=float)) * 8.0
    m = np.broadcast_to(np.atleast_1d(np.asarray(mcs, dtype=np.int64)), remaining_bits.shape)
    done_s = np.zeros(remaining_bits.shape)
    active = remaining_bits > 0
    now_s = 0.0
    while active.any():
        idx = np.flatnonzero(active)
        rate = wifi_cell_goodput_bps(m[idx], channel_width_mhz, nss, gi_ns, mac)
        step_s = float(np.min(remaining_bits[idx] / rate))
        now_s += step_s
        remaining_bits[idx] -= rate * step_s
        finished = idx[remaining_bits[idx] <= 1e-6 * rate * step_s + 1e-9]
        finished = finished if finished.size else idx[[np.argmin(remaining_bits[idx])]]
        done_s[finished] = now_s
        active[finished] = False
    return done_s.reshape(np.shape(np.asarray(upload_bytes, dtype=float) * np.ones(np.shape(mcs))))


def wifi_station_rates_bps(
    mcs: ArrayLike,
    channel_width_mhz: int = 20,
    nss: int = 1,
    gi_ns: float = 800,
    mac: WifiCellMac | None = None,
) -> FloatArray:
    """Each station's rate on the air of one 802.11ax cell whose stations in ``mcs`` all
    send (b/s of IP packets per second of the cell's time the station's exchanges take).

    The cycle of :func:`wifi_cell_goodput_bps` split by whose it is: station i's share is
    its own A-MPDU exchange, the AP's exchange returning its TCP ACKs and two accesses'
    idle and collision time, ``T_i``; it carries ``k_i`` packets of ``ip_packet_bytes``,
    so its rate is ``8 · k_i · ip_packet_bytes / T_i``. Timed as a medium that shares
    its time among the stations sending (processor sharing, what mecsim's shared cell
    does), n stations that start together with equal uploads end when the cell has spent
    ``Σ T_i`` per cycle on them, as under DCF: the last upload is DCF's (within a few %
    of ns-3's, docs/validation.md); nearer stations end earlier than DCF's equal
    throughput would let them. A station with no MCS (out of range, ``mcs < 0``): 0 b/s.
    """
    mac = mac or WifiCellMac()
    m_in = np.atleast_1d(np.asarray(mcs, dtype=np.int64))
    out = np.zeros(m_in.shape, dtype=float)
    ok = m_in >= 0
    if not ok.any():
        return out.reshape(np.shape(mcs))
    k, own_s = _station_cycles_s(m_in[ok], channel_width_mhz, nss, gi_ns, mac)
    out[ok] = 8.0 * k * mac.ip_packet_bytes / own_s
    return out.reshape(np.shape(mcs))
