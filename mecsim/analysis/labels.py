"""Human labels, with units, for scenario paths and sweep metrics (figures and tables).

:func:`axis` turns a dotted scenario path (``channel.uplink.bandwidth_hz``) or a sweep
column (``round_time_mean_s``) into an :class:`Axis`: a label a person reads, the unit
shown, and the factor from the stored value to the shown one (Hz -> MHz, s -> ms, bytes
-> MiB). Paths and columns not listed get a label from their words and the unit from
their suffix (``_s``, ``_hz``, ``_bps``, ``_j``, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class Axis:
    label: str  # what it is, without the unit
    unit: str = ""  # the unit shown ("" for counts and ratios)
    scale: float = 1.0  # shown = stored * scale
    zero_based: bool = True  # a quantity >= 0 whose axis should start at 0

    @property
    def text(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label


_LINK = {"uplink": "uplink", "downlink": "downlink"}
# the last part of a path, after the link direction (uplink./downlink.) where there is one
_PATH_FIELDS: dict[str, Axis] = {
    "bandwidth_hz": Axis("bandwidth", "MHz", 1e-6),
    "rate_bps": Axis("rate", "Mbit/s", 1e-6),
    "tx_power_dbm": Axis("transmit power", "dBm", zero_based=False),
    "latency_s": Axis("latency", "ms", 1e3),
    "jitter_s": Axis("latency jitter", "ms", 1e3),
    "loss_rate": Axis("packet-loss rate", "%", 100.0),
    "mss_bytes": Axis("TCP MSS", "bytes"),
}
_PATHS: dict[str, Axis] = {
    "channel.snr_offset_db": Axis("SNR offset", "dB", zero_based=False),
    "channel.distance_m": Axis("client distance", "m"),
    "channel.path_loss_exponent": Axis("path-loss exponent"),
    "channel.path_loss_db": Axis("path-loss constant", "dB", zero_based=False),
    "channel.noise_psd_dbm_per_hz": Axis("noise PSD", "dBm/Hz", zero_based=False),
    "channel.path_loss.model": Axis("path-loss model"),
    "channel.path_loss.carrier_ghz": Axis("carrier frequency", "GHz"),
    "channel.path_loss.bs_height_m": Axis("base-station height", "m"),
    "channel.path_loss.ut_height_m": Axis("client antenna height", "m"),
    "channel.path_loss.los": Axis("LOS state"),
    "channel.path_loss.shadowing": Axis("shadow fading"),
    "channel.downlink.mode": Axis("downlink discipline"),
    "deadline_s": Axis("round deadline", "s"),
    "backhaul.bandwidth_bps": Axis("backhaul bandwidth", "Mbit/s", 1e-6),
    "topology.participation": Axis("participation (fraction of clients a round)"),
    "training.lr": Axis("learning rate"),
    "training.epochs": Axis("local epochs"),
    "training.batch_size": Axis("batch size"),
}
_METRICS: dict[str, Axis] = {
    "round_time_mean_s": Axis("mean round time", "s"),
    "round_time_median_s": Axis("median round time", "s"),
    "round_time_p95_s": Axis("95th-percentile round time", "s"),
    "round_time_min_s": Axis("shortest round", "s"),
    "round_time_max_s": Axis("longest round", "s"),
    "dl_time_mean_s": Axis("mean download time a round (critical path)", "s"),
    "client_time_mean_s": Axis("mean client compute time a round (critical path)", "s"),
    "ul_time_mean_s": Axis("mean upload time a round (critical path)", "s"),
    "server_time_mean_s": Axis("mean server time a round", "s"),
    "backhaul_time_mean_s": Axis("mean backhaul time a round", "s"),
    "idle_time_mean_s": Axis("mean idle time a round", "s"),
    "total_time_s": Axis("total emulated time", "s"),
    "time_to_target_s": Axis("emulated time to the target accuracy", "s"),
    "rounds_to_target": Axis("rounds to the target accuracy"),
    "final_accuracy": Axis("final mean user accuracy", "%", 100.0),
    "bytes_up": Axis("uploaded, whole run", "MiB", 1 / MiB),
    "bytes_down": Axis("downloaded, whole run", "MiB", 1 / MiB),
    "energy_mean_j": Axis("client energy a round (all selected clients)", "J"),
    "energy_compute_mean_j": Axis("client compute energy a round", "J"),
    "energy_radio_mean_j": Axis("client radio energy a round", "J"),
    "energy_idle_mean_j": Axis("client idle energy a round", "J"),
    "energy_sleep_mean_j": Axis("client sleep energy a round", "J"),
    "energy_total_j": Axis("client energy, whole run", "kJ", 1e-3),
    "dropped": Axis("client-rounds dropped at the deadline"),
}
_SUFFIX_UNITS = (
    ("_dbm_per_hz", "dBm/Hz", 1.0),
    ("_dbm", "dBm", 1.0),
    ("_db", "dB", 1.0),
    ("_hz", "Hz", 1.0),
    ("_bps", "bit/s", 1.0),
    ("_bytes", "bytes", 1.0),
    ("_mb", "MiB", 1.0),  # mecsim's *_mb columns (server_rss_mb, ...) hold MiB
    ("_j", "J", 1.0),
    ("_w", "W", 1.0),
    ("_m", "m", 1.0),
    ("_s", "s", 1.0),
)


def _generic(name: str) -> Axis:
    for suffix, unit, scale in _SUFFIX_UNITS:
        if name.endswith(suffix):
            words = name[: -len(suffix)]
            return Axis(
                re.sub(r"[._]+", " ", words).strip(),
                unit,
                scale,
                zero_based=unit not in ("dB", "dBm", "dBm/Hz"),
            )
    return Axis(re.sub(r"[._]+", " ", name).strip())


def axis(name: str) -> Axis:
    """The :class:`Axis` of a scenario path or a sweep column."""
    if name in _METRICS:
        return _METRICS[name]
    if name in _PATHS:
        return _PATHS[name]
    parts = name.split(".")
    m = re.fullmatch(r"devices\.clients\.(\d+)\.profile", name)
    if m:
        return Axis(f"device profile of client group {m.group(1)}")
    if parts[-1] in _PATH_FIELDS:
        field = _PATH_FIELDS[parts[-1]]
        where = next((_LINK[p] for p in parts if p in _LINK), parts[0])
        return Axis(f"{where} {field.label}", field.unit, field.scale, field.zero_based)
    return _generic(name)


def value_text(value: object) -> str:
    """A grid value as a person reads it: ``null`` for None/NaN, numbers with %g."""
    if value is None or (isinstance(value, float) and value != value):
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def setting_text(name: str, value: object) -> str:
    """``uplink latency = 20 ms``: a grid path and its value, scaled to the shown unit."""
    ax = axis(name)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        shown = f"{value * ax.scale:g}" + (f" {ax.unit}" if ax.unit else "")
    else:
        shown = value_text(value)
    return f"{ax.label} = {shown}"
