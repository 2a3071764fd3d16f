"""Moving links built by hand for the engine's tests: a client on a straight line
(:func:`straight_track`) and its :class:`~mecsim.emulation.moving_rate.MovingLinks` to one
site (:func:`moving_links`), under the channel of
benchmarks/approximations/mobility_piecewise.py: 10 MHz, SNR = 87 − 40 log10 d dB
(PL0 = −40 dB at 1 m, exponent 4, k = 10^12.7 so that k · 10^−4 · d^−4 = 10^8.7 d^−4)."""

from __future__ import annotations

import math

import numpy as np

from mecsim.emulation.handover import ClientPositions
from mecsim.emulation.mobility import Area
from mecsim.emulation.mobility.traces import NodeTrack
from mecsim.emulation.moving_rate import MovingLinks
from mecsim.scenario.mobility import MobilityConfig

BANDWIDTH_HZ = 10e6
K = 10**12.7  # SINR per unit path-loss gain


def straight_track(start_xy: tuple[float, float], velocity: tuple[float, float]) -> NodeTrack:
    """A straight line at constant velocity for 2,000 s (a trace of two samples)."""
    x0, y0 = start_xy
    vx, vy = velocity
    xy = np.array([[x0, y0], [x0 + 2000 * vx, y0 + 2000 * vy]], dtype=float)
    return NodeTrack("0", np.array([0.0, 2000.0]), xy, 1)


def moving_links(
    track: NodeTrack,
    site: tuple[float, float],
    step_s: float,
    round_start_s: float = 0.0,
    *,
    k: float = K,
    bandwidth_hz: float = BANDWIDTH_HZ,
    exponent: float = 4.0,
    path_loss_db: float = -40.0,
    cap_bps: float = math.inf,
) -> MovingLinks:
    config = MobilityConfig(
        model="trace", step_s=step_s, trace={"format": "ns2", "path": "unused.tcl"}
    )
    initial = track.position_at(np.array([0.0]))
    positions = ClientPositions(
        config, initial, Area.of_size(1e5, 1e5), 0, tracks=[track], trace_end_s=math.inf
    )
    return MovingLinks(
        positions,
        round_start_s,
        np.array([0]),
        np.array([site], dtype=float),
        np.array([bandwidth_hz]),
        np.array([k]),
        np.array([cap_bps]),
        path_loss_db=path_loss_db,
        reference_distance_m=1.0,
        path_loss_exponent=exponent,
    )
