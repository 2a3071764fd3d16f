"""Energy of a client's round, in joules, from its device profile's power figures.

Every second of a selected client's round window is spent in one of four states:

- **computing** (local training, ``compute_s``): the board draws ``active_power_w``
  (all cores loaded);
- **asleep** (``energy.idle_policy: sleep``, the default): from the client's own finish
  (its last upload sent, or its crash or drop-out) to the round's end the board draws
  ``sleep_power_w`` (a profile without one cannot sleep and idles);
- otherwise **idle** — transferring, waiting for its share of a medium, for the edge
  server's work (split learning), for the backhaul, for the latency, for the round to end
  under ``idle_policy: idle`` — the board draws ``idle_power_w``,
- and while its radio is on the air it draws ``P_radio_tx`` (transmitting) or
  ``radio_rx_power_w`` (receiving) *on top of* that.

With ``W`` the window (the round's end, or the client's own finish if later: a client
dropped at a deadline still spends its energy), ``t_c`` the compute seconds, ``t_f`` the
client's finish, ``a_up`` / ``a_down`` the air time of its uploads / downloads:

    P_radio_tx = P_tx / eta_PA + P_circuit        P_tx = 10^((tx_power_dbm - 30) / 10) W
    t_sleep   = W - t_f  (idle_policy sleep, t_f finite; else 0)
    E_compute = P_active · t_c
    E_radio   = P_radio_tx · a_up + P_rx · a_down
    E_idle    = P_idle · (W − t_c − t_sleep)
    E_sleep   = P_sleep · t_sleep
    E         = E_compute + E_radio + E_idle + E_sleep

``tx_power_dbm`` is the radiated power the scenario's channel gives the client (the
Shannon channel's per-client draw) or, for a channel without one (fixed-rate, trace), the
profile's ``radio_tx_power_dbm``; a profile with a measured ``radio_tx_power_w`` uses
that instead of the formula.

Air time is the time the radio actually sends or receives: ``8·bytes / r_air`` on a link
with a constant rate, where ``r_air = max(goodput, (1 − p) · rate)`` — the link's own
rate with the retransmissions of a loss rate ``p`` (each packet is sent until it gets
through: ``1 / (1 − p)`` transmissions on average), and never more air time than the
transfer takes at its goodput. So a loss-limited transfer (goodput = the Mathis bound,
far below the link rate) is on the air only ``8·bytes / ((1 − p) · rate)`` of its time,
and idles the rest (waiting for acknowledgements and the congestion window); without
loss ``r_air`` is the goodput. On a shared medium air time is the solo time, not the
longer time the transfer takes while sharing; a broadcast is received by each client at
its own rate (its own air time, as the engine times it). For a rate schedule (trace
channels) air time is the transfer time less the latency of each transfer. A link at 0
bit/s carries nothing: no air time. A client that never finishes (an outage) is counted
until the round ends; when the round itself never ends, its energy is NaN. A profile
without power figures gives NaN energy (the round's sums are then NaN too).

Unselected clients are outside the round's figures under either policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from mecsim.emulation.devices import DeviceProfile
from mecsim.emulation.engine import ClientSpec, ClientTimeline, TimeVaryingRate
from mecsim.emulation.ops import Download, OpTrace, Upload

#: Energy columns of clients.* and rounds.* (joules; rounds: summed over selected clients).
ENERGY_KEYS = (
    "energy_j",
    "energy_compute_j",
    "energy_radio_j",
    "energy_idle_j",
    "energy_sleep_j",
)
_PARTS = ("compute", "radio", "idle", "sleep")

IdlePolicy = Literal["idle", "sleep"]
#: The columns of :func:`power_array`: watts of each client.
POWER_COLUMNS = ("active", "idle", "radio_tx", "radio_rx", "sleep")


def dbm_to_w(dbm: float) -> float:
    """``10^((dBm − 30) / 10)`` W: 30 dBm = 1 W, 23 dBm = 0.1995 W."""
    return float(10.0 ** ((dbm - 30.0) / 10.0))


def radio_tx_power_w(profile: DeviceProfile, tx_power_dbm: float = math.nan) -> float | None:
    """The radio's draw above idle while transmitting: ``P_tx / eta_PA + P_circuit`` with
    ``P_tx`` from ``tx_power_dbm`` (the channel's, or, NaN, the profile's
    ``radio_tx_power_dbm``); the profile's measured ``radio_tx_power_w`` where it has one;
    None where it has neither."""
    if profile.radio_tx_power_w is not None:
        return float(profile.radio_tx_power_w)
    eta, circuit = profile.radio_pa_efficiency, profile.radio_circuit_power_w
    dbm = tx_power_dbm if math.isfinite(tx_power_dbm) else profile.radio_tx_power_dbm
    if eta is None or circuit is None or dbm is None or not math.isfinite(dbm):
        return None
    return dbm_to_w(float(dbm)) / float(eta) + float(circuit)


def client_power(profile: DeviceProfile, tx_power_dbm: float = math.nan) -> tuple[float, ...]:
    """Watts of a client, as :data:`POWER_COLUMNS` (NaN where the profile has none)."""
    tx = radio_tx_power_w(profile, tx_power_dbm)
    return tuple(
        math.nan if w is None else float(w)
        for w in (
            profile.active_power_w,
            profile.idle_power_w,
            tx,
            profile.radio_rx_power_w,
            profile.sleep_power_w,
        )
    )


def air_rate_bps(goodput_bps: Any, rate_bps: Any, loss_rate: float) -> Any:
    """``max(goodput, (1 − p) · rate)``: the rate at which a transfer's bits occupy the
    radio (its link rate with ``1 / (1 − p)`` transmissions per packet), never below the
    goodput (air time is never longer than the transfer). Equal to the goodput without
    loss (``p = 0``: goodput = rate)."""
    return np.maximum(goodput_bps, (1.0 - loss_rate) * np.asarray(rate_bps, dtype=float))


def _air_time_s(
    trace: OpTrace,
    op_type: type[Download] | type[Upload],
    rate: float | TimeVaryingRate,
    latency_s: float,
    elapsed_s: float,
    air_rate: float | None,
) -> float:
    ops = [op for op in trace if isinstance(op, op_type) and op.nbytes > 0]
    if not ops:
        return 0.0
    if isinstance(rate, TimeVaryingRate):
        if air_rate is None or math.isnan(air_rate):  # elapsed = bits at the schedule + L
            return max(0.0, elapsed_s - len(ops) * latency_s) if math.isfinite(elapsed_s) else 0.0
        # a moving client on a shared medium: the elapsed time holds the other flows'
        # shares too; its bits at its air rate at the round's start
        return sum(8.0 * op.nbytes for op in ops) / air_rate if air_rate > 0 else 0.0
    if rate <= 0:
        return 0.0  # the link is down: nothing goes over the air
    return sum(8.0 * op.nbytes for op in ops) / (rate if air_rate is None else air_rate)


def client_energy(
    profile: DeviceProfile,
    timeline: ClientTimeline,
    trace: OpTrace,
    spec: ClientSpec,
    round_time_s: float,
    *,
    idle_policy: IdlePolicy,
    tx_power_dbm: float = math.nan,
    air_rates_bps: Sequence[float] | None = None,
) -> dict[str, float]:
    """The :data:`ENERGY_KEYS` of one selected client's round (see the module docstring).

    ``air_rates_bps``: (up, down) :func:`air_rate_bps` of the client's links (None: the
    spec's rates, i.e. no loss)."""
    nan = dict.fromkeys(ENERGY_KEYS, math.nan)
    p_active, p_idle, p_tx, p_rx, p_sleep = client_power(profile, tx_power_dbm)
    if any(math.isnan(p) for p in (p_active, p_idle, p_tx, p_rx)):
        return nan
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
    asleep = idle_policy == "sleep" and not math.isnan(p_sleep)
    sleep_s = window_s - timeline.finish_s if asleep and math.isfinite(timeline.finish_s) else 0.0
    air_up_rate, air_down_rate = (None, None) if air_rates_bps is None else air_rates_bps
    air_up = _air_time_s(
        trace,
        Upload,
        spec.uplink_rate_bps,
        spec.uplink_latency_s,
        timeline.upload_s,
        air_up_rate,
    )
    air_down = _air_time_s(
        trace,
        Download,
        spec.downlink_rate_bps,
        spec.downlink_latency_s,
        timeline.download_s,
        air_down_rate,
    )
    e_compute = p_active * compute_s
    e_radio = p_tx * air_up + p_rx * air_down
    e_idle = p_idle * max(0.0, window_s - compute_s - sleep_s)
    e_sleep = p_sleep * sleep_s if asleep else 0.0
    return {
        "energy_j": e_compute + e_radio + e_idle + e_sleep,
        "energy_compute_j": e_compute,
        "energy_radio_j": e_radio,
        "energy_idle_j": e_idle,
        "energy_sleep_j": e_sleep,
    }


def round_energy(client_rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The :data:`ENERGY_KEYS` of a round: sums over its selected clients' energies."""
    rows = list(client_rows)
    return {k: float(sum(float(r[k]) for r in rows)) for k in ENERGY_KEYS}


def energy_parts() -> tuple[str, ...]:
    """(compute, radio, idle, sleep): the parts of ``energy_j`` (``energy_<part>_j``)."""
    return _PARTS


def round_energy_arrays(
    power_w: np.ndarray,
    times_s: np.ndarray,
    bits: np.ndarray,
    n_ops: np.ndarray,
    rates_bps: np.ndarray,
    latency_s: np.ndarray,
    round_time_s: float,
    idle_policy: IdlePolicy,
) -> dict[str, float]:
    """:func:`round_energy` of :func:`client_energy` for a whole round at once, in numpy
    (what replays and sweeps use: no per-client Python work beyond building the arrays).

    One row per selected client: ``power_w`` (:data:`POWER_COLUMNS`, NaN where the profile
    has none: :func:`power_array`), ``times_s`` (download, compute, upload, server compute,
    backhaul, finish), ``bits`` and ``n_ops`` (up, down: bits sent and transfers with
    bytes), ``rates_bps`` (up, down :func:`air_rate_bps`; NaN for a rate schedule) and
    ``latency_s`` (up, down). Equal to summing :func:`client_energy` over the clients
    (``tests/unit/emulation/test_energy.py`` checks it)."""
    if len(times_s) == 0:
        return dict.fromkeys(ENERGY_KEYS, 0.0)
    p_active, p_idle, p_tx, p_rx, p_sleep = power_w.T
    asleep = ~np.isnan(p_sleep) if idle_policy == "sleep" else np.zeros(len(power_w), bool)
    if (
        math.isfinite(round_time_s)
        and np.isfinite(times_s).all()
        and np.isfinite(power_w[:, :4]).all()
        and (rates_bps > 0).all()
    ):
        # the common case: every client finished over constant, working links (the same
        # arithmetic as below, without the branches; n = 0 transfers have 0 bits)
        compute_s, finish_s = times_s[:, 1], times_s[:, 5]
        window_s = np.maximum(round_time_s, finish_s)
        sleep_s = np.where(asleep, window_s - finish_s, 0.0)
        parts = np.empty((5, len(power_w)))  # ENERGY_KEYS' order: total, then the parts
        np.multiply(p_active, compute_s, out=parts[1])
        parts[2] = p_tx * (bits[:, 0] / rates_bps[:, 0]) + p_rx * (bits[:, 1] / rates_bps[:, 1])
        parts[3] = p_idle * np.maximum(0.0, window_s - compute_s - sleep_s)
        parts[4] = np.where(asleep, p_sleep * sleep_s, 0.0)
        parts[0] = parts[1] + parts[2] + parts[3] + parts[4]
        # each part summed in client order, one addition after the other, as round_energy
        # sums clients (accumulate is sequential; + 0.0 as sum()'s start turns -0.0 to 0.0)
        sums = (np.add.accumulate(parts, axis=1)[:, -1] + 0.0).tolist()
        return dict(zip(ENERGY_KEYS, sums, strict=True))
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
        asleep &= np.isfinite(finish_s)
        sleep_s = np.where(asleep, window_s - finish_s, 0.0)
        air = []
        for k, elapsed_s in ((0, upload_s), (1, download_s)):
            rate, lat, n = rates_bps[:, k], latency_s[:, k], n_ops[:, k]
            schedule = np.where(np.isfinite(elapsed_s), np.maximum(0.0, elapsed_s - n * lat), 0.0)
            constant = np.where(rate > 0, bits[:, k] / rate, 0.0)
            air.append(np.where(n == 0, 0.0, np.where(np.isnan(rate), schedule, constant)))
        e_compute = p_active * compute_s
        e_radio = p_tx * air[0] + p_rx * air[1]
        e_idle = p_idle * np.maximum(0.0, window_s - compute_s - sleep_s)
        e_sleep = np.where(asleep, p_sleep * sleep_s, 0.0)
        total = e_compute + e_radio + e_idle + e_sleep
    bad = ~np.isfinite(window_s) | np.isnan(power_w[:, :4]).any(axis=1)
    out = {}
    for key, values in zip(ENERGY_KEYS, (total, e_compute, e_radio, e_idle, e_sleep), strict=True):
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


def power_array(
    profiles: Iterable[DeviceProfile], tx_power_dbm: Iterable[float] | None = None
) -> np.ndarray:
    """:func:`client_power` of each profile (with each client's ``tx_power_dbm``; None or
    NaN: the profile's own): shape (n, 5), columns :data:`POWER_COLUMNS`."""
    profiles = list(profiles)
    dbm = [math.nan] * len(profiles) if tx_power_dbm is None else [float(d) for d in tx_power_dbm]
    return np.array(
        [client_power(p, d) for p, d in zip(profiles, dbm, strict=True)], dtype=float
    ).reshape(-1, len(POWER_COLUMNS))
