"""Latency, jitter and packet loss of a link, and the TCP goodput they allow.

What emulated-network testbeds set with ``tc netem`` (delay, jitter, loss), as numbers:

- **latency**: a transfer of ``n`` bytes over a link of goodput ``g`` bit/s and one-way
  latency ``L`` (propagation + queueing) takes ``L + 8·n / g`` seconds (the last byte
  arrives ``L`` after it was sent; a persistent connection is assumed, so no handshake);
- **jitter**: per client-round, ``L = max(0, latency_s + jitter_s · u)`` with ``u`` drawn
  uniformly in [−1, 1] from the scenario seed (netem's ``delay TIME JITTER`` without a
  distribution table is uniform as well);
- **loss**: a packet-loss rate ``p`` limits a TCP flow to the Mathis et al. bound
  (Mathis, Semke, Mahdavi, Ott, "The macroscopic behavior of the TCP congestion
  avoidance algorithm", ACM CCR 27(3), 1997, Eq. 3):

      goodput = min(rate, MSS·8 / (RTT·√p) · C),   C = √(3/2)

  capped by the link's rate; ``p = 0`` (or ``RTT = 0``) leaves the link rate unchanged.
  RTT is the flow's round trip: for a client link, data goes one way and ACKs the other,
  ``RTT = uplink latency + downlink latency``; for the wired backhaul ``2 · latency``.
  On a shared medium the bound caps each flow, not the medium: a capped flow needs only
  ``goodput / rate`` of the medium's time, which is shared max-min fairly among the
  flows (water-filling: ``mecsim.emulation.engine.sharing``, docs/channel.md).

Pure numpy; vectorised over clients.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["MATHIS_C", "jittered_latency_s", "mathis_goodput_bps", "transfer_time_s"]

#: The constant of the Mathis et al. bound for periodic loss and delayed ACKs off: √(3/2).
MATHIS_C = math.sqrt(1.5)


def mathis_goodput_bps(
    rate_bps: ArrayLike, rtt_s: ArrayLike, loss_rate: ArrayLike, mss_bytes: ArrayLike = 1460
) -> np.ndarray:
    """``min(rate, 8·MSS / (RTT·√p) · √(3/2))`` in bit/s; the rate itself where ``p = 0``
    or ``RTT <= 0`` (no loss, or no round trip to limit the window)."""
    rate = np.asarray(rate_bps, dtype=float)
    rtt = np.asarray(rtt_s, dtype=float)
    p = np.asarray(loss_rate, dtype=float)
    if np.any((p < 0) | (p >= 1)):
        # cast: mypy warns that bytes (an ArrayLike) would show as b'...'; none come here
        raise ValueError(f"loss_rate must be in [0, 1), got {cast(object, loss_rate)}")
    limited = (p > 0) & (rtt > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(
            limited,
            8.0 * np.asarray(mss_bytes, dtype=float) * MATHIS_C / (rtt * np.sqrt(p)),
            np.inf,
        )
    return np.minimum(rate, bound)


def jittered_latency_s(latency_s: float, jitter_s: float, u: ArrayLike) -> np.ndarray:
    """``max(0, latency_s + jitter_s · u)`` for draws ``u`` in [−1, 1]."""
    return np.maximum(0.0, latency_s + jitter_s * np.asarray(u, dtype=float))


def transfer_time_s(
    nbytes: ArrayLike, goodput_bps: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """``latency_s + 8·nbytes / goodput_bps`` (0 for 0 bytes; inf for a goodput of 0)."""
    bits = 8.0 * np.asarray(nbytes, dtype=float)
    g = np.asarray(goodput_bps, dtype=float)
    with np.errstate(divide="ignore"):
        t = np.where(bits > 0, np.where(g > 0, bits / g, np.inf) + latency_s, 0.0)
    return t
