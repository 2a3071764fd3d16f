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
from typing import Any

from mecsim.devices import DeviceProfile
from mecsim.engine import ClientSpec, ClientTimeline, RateSchedule
from mecsim.ops import Download, OpTrace, Upload

#: Energy columns of clients.* and rounds.* (joules; rounds: summed over selected clients).
ENERGY_KEYS = ("energy_j", "energy_compute_j", "energy_radio_j", "energy_idle_j")
_PARTS = ("compute", "radio", "idle")


def _air_time_s(trace: OpTrace, op_type: type, rate: float | RateSchedule,
                latency_s: float, elapsed_s: float) -> float:
    ops = [op for op in trace if isinstance(op, op_type) and op.nbytes > 0]
    if not ops:
        return 0.0
    if isinstance(rate, RateSchedule):  # dedicated link: elapsed = bits at the schedule + L
        return max(0.0, elapsed_s - len(ops) * latency_s) if math.isfinite(elapsed_s) else 0.0
    if rate <= 0:
        return 0.0  # the link is down: nothing goes over the air
    return sum(8.0 * op.nbytes for op in ops) / rate


def client_energy(profile: DeviceProfile, timeline: ClientTimeline, trace: OpTrace,
                  spec: ClientSpec, round_time_s: float) -> dict[str, float]:
    """The :data:`ENERGY_KEYS` of one selected client's round (see the module docstring)."""
    nan = dict.fromkeys(ENERGY_KEYS, math.nan)
    powers = (profile.active_power_w, profile.idle_power_w, profile.radio_tx_power_w,
              profile.radio_rx_power_w)
    if any(p is None for p in powers):
        return nan
    p_active, p_idle, p_tx, p_rx = (float(p) for p in powers)
    window_s = round_time_s if not math.isfinite(timeline.finish_s) else max(
        round_time_s, timeline.finish_s)
    if not math.isfinite(window_s):
        return nan
    compute_s = timeline.compute_s
    if not math.isfinite(compute_s):  # stuck computing: until the round ends
        others = (timeline.download_s, timeline.upload_s, timeline.server_compute_s,
                  timeline.backhaul_s)
        compute_s = max(0.0, window_s - sum(t for t in others if math.isfinite(t)))
    air_up = _air_time_s(trace, Upload, spec.uplink_rate_bps, spec.uplink_latency_s,
                         timeline.upload_s)
    air_down = _air_time_s(trace, Download, spec.downlink_rate_bps, spec.downlink_latency_s,
                           timeline.download_s)
    e_compute = p_active * compute_s
    e_radio = p_tx * air_up + p_rx * air_down
    e_idle = p_idle * max(0.0, window_s - compute_s)
    return {"energy_j": e_compute + e_radio + e_idle, "energy_compute_j": e_compute,
            "energy_radio_j": e_radio, "energy_idle_j": e_idle}


def round_energy(client_rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The :data:`ENERGY_KEYS` of a round: sums over its selected clients' energies."""
    rows = list(client_rows)
    return {k: float(sum(float(r[k]) for r in rows)) for k in ENERGY_KEYS}


def energy_parts() -> tuple[str, ...]:
    """(compute, radio, idle): the parts of ``energy_j`` (``energy_<part>_j``)."""
    return _PARTS
