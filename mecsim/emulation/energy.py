"""Energy of a client's round, in joules, from its device profile's power figures.

Every second of a selected client's round window is spent in one of three states:

- **computing** (local training, ``compute_s``): the board draws ``active_power_w``
  (all cores loaded);
- otherwise — transferring, waiting for its share of a medium, for the edge server's
  work (split learning), for the backhaul, or for the round to end — the board draws
  ``idle_power_w``,
- and while its radio is on the air it draws ``radio_tx_power_w`` (transmitting) or
  ``radio_rx_power_w`` (receiving) *on top of* that.

So, with ``W`` the window (the round's end, or the client's own finish if later: a
client dropped at a deadline still spends its energy), ``t_c`` the compute seconds and
``a_up`` / ``a_down`` the air time of its uploads / downloads:

    E_compute = P_active · t_c
    E_radio   = P_tx · a_up + P_rx · a_down
    E_idle    = P_idle · (W − t_c)
    E         = E_compute + E_radio + E_idle

Air time is the time the radio actually sends or receives: ``8·bytes / goodput`` on a
link with a constant rate (on a shared medium that is the solo time, not the longer
time the transfer takes while sharing), and for a rate schedule (trace channels) the
transfer time less the latency of each transfer. A link at 0 bit/s carries nothing:
no air time. A client that never finishes (an outage) is counted until the round ends;
when the round itself never ends, its energy is NaN. A profile without power figures
gives NaN energy (the round's sums are then NaN too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from mecsim.emulation.devices import DeviceProfile
from mecsim.emulation.engine import ClientSpec, ClientTimeline, RateSchedule
from mecsim.emulation.ops import Download, OpTrace, Upload

#: Energy columns of clients.* and rounds.* (joules; rounds: summed over selected clients).
ENERGY_KEYS = ("energy_j", "energy_compute_j", "energy_radio_j", "energy_idle_j")
_PARTS = ("compute", "radio", "idle")


def _air_time_s(
    trace: OpTrace,
    op_type: type[Download] | type[Upload],
    rate: float | RateSchedule,
    latency_s: float,
    elapsed_s: float,
) -> float:
    ops = [op for op in trace if isinstance(op, op_type) and op.nbytes > 0]
    if not ops:
        return 0.0
    if isinstance(rate, RateSchedule):  # dedicated link: elapsed = bits at the schedule + L
        return max(0.0, elapsed_s - len(ops) * latency_s) if math.isfinite(elapsed_s) else 0.0
    if rate <= 0:
        return 0.0  # the link is down: nothing goes over the air
    return sum(8.0 * op.nbytes for op in ops) / rate


def client_energy(
    profile: DeviceProfile,
    timeline: ClientTimeline,
    trace: OpTrace,
    spec: ClientSpec,
    round_time_s: float,
) -> dict[str, float]:
    """The :data:`ENERGY_KEYS` of one selected client's round (see the module docstring)."""
    nan = dict.fromkeys(ENERGY_KEYS, math.nan)
    powers = (
        profile.active_power_w,
        profile.idle_power_w,
        profile.radio_tx_power_w,
        profile.radio_rx_power_w,
    )
    if any(p is None for p in powers):
        return nan
    p_active, p_idle, p_tx, p_rx = (float(p) for p in cast("tuple[float, ...]", powers))
    window_s = (
        round_time_s
        if not math.isfinite(timeline.finish_s)
        else max(round_time_s, timeline.finish_s)
    )
    if not math.isfinite(window_s):
        return nan
    compute_s = timeline.compute_s
    if not math.isfinite(compute_s):  # stuck computing: until the round ends
        others = (
            timeline.download_s,
            timeline.upload_s,
            timeline.server_compute_s,
            timeline.backhaul_s,
        )
        compute_s = max(0.0, window_s - sum(t for t in others if math.isfinite(t)))
    air_up = _air_time_s(
        trace, Upload, spec.uplink_rate_bps, spec.uplink_latency_s, timeline.upload_s
    )
    air_down = _air_time_s(
        trace, Download, spec.downlink_rate_bps, spec.downlink_latency_s, timeline.download_s
    )
    e_compute = p_active * compute_s
    e_radio = p_tx * air_up + p_rx * air_down
    e_idle = p_idle * max(0.0, window_s - compute_s)
    return {
        "energy_j": e_compute + e_radio + e_idle,
        "energy_compute_j": e_compute,
        "energy_radio_j": e_radio,
        "energy_idle_j": e_idle,
    }


def round_energy(client_rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The :data:`ENERGY_KEYS` of a round: sums over its selected clients' energies."""
    rows = list(client_rows)
    return {k: float(sum(float(r[k]) for r in rows)) for k in ENERGY_KEYS}


def energy_parts() -> tuple[str, ...]:
    """(compute, radio, idle): the parts of ``energy_j`` (``energy_<part>_j``)."""
    return _PARTS


def round_energy_arrays(
    power_w: np.ndarray,
    times_s: np.ndarray,
    bits: np.ndarray,
    n_ops: np.ndarray,
    rates_bps: np.ndarray,
    latency_s: np.ndarray,
    round_time_s: float,
) -> dict[str, float]:
    """:func:`round_energy` of :func:`client_energy` for a whole round at once, in numpy
    (what replays and sweeps use: no per-client Python work beyond building the arrays).

    One row per selected client: ``power_w`` (active, idle, tx, rx; NaN where the profile
    has none), ``times_s`` (download, compute, upload, server compute, backhaul, finish),
    ``bits`` and ``n_ops`` (up, down: bits sent and transfers with bytes), ``rates_bps``
    (up, down; NaN for a rate schedule) and ``latency_s`` (up, down). Equal to summing
    :func:`client_energy` over the clients (``tests/test_energy.py`` checks it)."""
    if len(times_s) == 0:
        return dict.fromkeys(ENERGY_KEYS, 0.0)
    p_active, p_idle, p_tx, p_rx = power_w.T
    if (
        math.isfinite(round_time_s)
        and np.isfinite(times_s).all()
        and np.isfinite(power_w).all()
        and (rates_bps > 0).all()
    ):
        # the common case: every client finished over constant, working links (the same
        # arithmetic as below, without the branches; n = 0 transfers have 0 bits)
        compute_s, finish_s = times_s[:, 1], times_s[:, 5]
        window_s = np.maximum(round_time_s, finish_s)
        e_compute = p_active * compute_s
        e_radio = p_tx * (bits[:, 0] / rates_bps[:, 0]) + p_rx * (bits[:, 1] / rates_bps[:, 1])
        e_idle = p_idle * np.maximum(0.0, window_s - compute_s)
        return {
            key: float(sum(values.tolist()))
            for key, values in zip(
                ENERGY_KEYS, (e_compute + e_radio + e_idle, e_compute, e_radio, e_idle), strict=True
            )
        }
    download_s, compute_s, upload_s, server_s, backhaul_s, finish_s = times_s.T
    with np.errstate(invalid="ignore", divide="ignore"):
        window_s = np.where(np.isfinite(finish_s), np.maximum(round_time_s, finish_s), round_time_s)
        others = (
            np.where(np.isfinite(download_s), download_s, 0.0)
            + np.where(np.isfinite(upload_s), upload_s, 0.0)
            + np.where(np.isfinite(server_s), server_s, 0.0)
            + np.where(np.isfinite(backhaul_s), backhaul_s, 0.0)
        )
        compute_s = np.where(np.isfinite(compute_s), compute_s, np.maximum(0.0, window_s - others))
        air = []
        for k, elapsed_s in ((0, upload_s), (1, download_s)):
            rate, lat, n = rates_bps[:, k], latency_s[:, k], n_ops[:, k]
            schedule = np.where(np.isfinite(elapsed_s), np.maximum(0.0, elapsed_s - n * lat), 0.0)
            constant = np.where(rate > 0, bits[:, k] / rate, 0.0)
            air.append(np.where(n == 0, 0.0, np.where(np.isnan(rate), schedule, constant)))
        e_compute = p_active * compute_s
        e_radio = p_tx * air[0] + p_rx * air[1]
        e_idle = p_idle * np.maximum(0.0, window_s - compute_s)
        total = e_compute + e_radio + e_idle
    bad = ~np.isfinite(window_s) | np.isnan(power_w).any(axis=1)
    out = {}
    for key, values in zip(ENERGY_KEYS, (total, e_compute, e_radio, e_idle), strict=True):
        values = np.where(bad, np.nan, values)
        out[key] = float(sum(values.tolist()))  # in client order, as round_energy sums
    return out


def transfer_arrays(traces: Iterable[OpTrace]) -> tuple[np.ndarray, np.ndarray]:
    """(bits, transfers with bytes) of each trace's uploads and downloads, shape (n, 2),
    summed as :func:`client_energy` sums them."""
    bits, n_ops = [], []
    for trace in traces:
        up = [op for op in trace if isinstance(op, Upload) and op.nbytes > 0]
        down = [op for op in trace if isinstance(op, Download) and op.nbytes > 0]
        bits.append((sum(8.0 * op.nbytes for op in up), sum(8.0 * op.nbytes for op in down)))
        n_ops.append((len(up), len(down)))
    return (np.array(bits, dtype=float).reshape(-1, 2), np.array(n_ops, dtype=float).reshape(-1, 2))


def power_array(profiles: Iterable[DeviceProfile]) -> np.ndarray:
    """(active, idle, tx, rx) watts of each profile, NaN where it has none: shape (n, 4)."""
    return np.array(
        [
            [
                math.nan if w is None else float(w)
                for w in (p.active_power_w, p.idle_power_w, p.radio_tx_power_w, p.radio_rx_power_w)
            ]
            for p in profiles
        ],
        dtype=float,
    ).reshape(-1, 4)
