"""Where ns-3.37's Cubic leaves slow start: a packet-by-packet replica, held to ns-3.

A research tool for the gap docs/validation.md calls "Long round trips": through
fq_codel, a loss-free flow's slow start overshoots the path and draws drops, and a model
of that needs first the window at which slow start ends. mecsim's own loss-free flow
has no queue (it is a deep FIFO's, and holds to ns-3 through one); this replica is not
part of it. It follows one flow's packets through a bottleneck of ``rate_bps`` and
``delay_s`` each way (a FIFO, no drops), as ``validation/ns3/tcp_flows.cc`` configures
ns-3, and returns the window at which HyStart ends slow start. What it had to copy from
ns-3.37 to agree (found by tracing ns-3's window, ``tcp_flows --trace_cwnd``):

- **HyStart sees the smoothed round trip.** ns-3.37 hands ``PktsAcked`` its
  ``m_lastRtt``, which ``EstimateRtt`` sets to the RTT estimator's estimate (RFC 6298's
  SRTT, gain 1/8), not the sample. The delay test (the minimum of a round's first 8
  "samples" above the least seen plus the threshold) therefore fires about a doubling
  later than on samples.
- **The first data segment is ACKed alone** (the handshake leaves the receiver's delayed-
  ACK count at one): the first round trip's ACKs grow the window 10 -> 19 and hold the
  tenth segment, the "held" slow start of ``channel/tcp.py``.
- Timestamps in milliseconds (RFC 7323, echoing the first unacknowledged segment of a
  delayed pair); delayed ACKs every second segment or after 40 ms; byte counting in slow
  start (+2 a delayed ACK); the ACK-train test (ACKs at most 2 ms apart for longer than
  the least round trip since the round began); HyStart from a window of 16 segments;
  rounds end when an ACK passes the highest sequence sent at the round's start.

``python -m validation.slow_start_replica`` runs ns-3 (``tcp_flows``, a flow through a
FIFO, its window traced) and the replica on 36 paths (one-way delays 10-100 ms,
rates 2-100 Mb/s) and prints both; ``--write`` stores ns-3's exits in
``reference/slow_start_exit.json`` (tests/integration/test_validation.py holds the replica to them).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "reference" / "slow_start_exit.json"
#: the paths of the comparison: one-way delays (s) and bottleneck rates (b/s)
DELAYS_S = (0.01, 0.02, 0.03, 0.05, 0.06, 0.1)
RATES_BPS = (2e6, 5e6, 10e6, 20e6, 50e6, 100e6)

#: tcp_flows.cc's segment: 1,448 bytes of payload, 1,502 on the bottleneck's wire
#: (IPv4 20 + TCP 20 + timestamps 12 + the point-to-point header 2); an ACK's 54
WIRE_BYTES, ACK_WIRE_BYTES = 1502, 54
DELAYED_ACK_TIMEOUT_S = 0.04
HYSTART_LOW_WINDOW = 16
HYSTART_MIN_SAMPLES = 8
HYSTART_ACK_DELTA_S = 0.002
SRTT_GAIN = 1 / 8
#: seconds of sending at the rate (beyond 1 MB) a flow of the ns-3 side lasts: longer
#: than any slow start here
FLOW_S = 2.0


@dataclass(frozen=True)
class Exit:
    """Where slow start ended: the window (segments), which test fired, when (s)."""

    window: float
    test: str  # "delay" or "train" ("none": the flow ended first)
    time_s: float


def hystart_delay_threshold_s(delay_s: float) -> float:
    """tcp_flows.cc's default: Linux's clamp(RTT / 8, 4 ms, 16 ms), RTT = 2 · delay."""
    return min(max(2 * delay_s / 8, 0.004), 0.016)


def slow_start_exit(
    delay_s: float, rate_bps: float, initial_window: int = 10, max_segments: int = 20_000
) -> Exit:
    """Follow a flow's packets until HyStart ends slow start (the module's docstring)."""
    tau = WIRE_BYTES * 8 / rate_bps
    tau_ack = ACK_WIRE_BYTES * 8 / rate_bps
    threshold = hystart_delay_threshold_s(delay_s)
    events: list[tuple[float, int, str, tuple[float, ...]]] = []
    order = itertools.count()

    def at(t: float, kind: str, *data: float) -> None:
        heapq.heappush(events, (t, next(order), kind, data))

    cwnd = float(initial_window)
    next_seq = acked_to = 0  # packets: the next to send, the next the receiver expects
    bottleneck_free = ack_link_free = 0.0
    srtt: float | None = None
    least = math.inf  # HyStart's delay_min
    round_end = 0  # HyStart's end_seq
    round_start = last_ack = 0.0
    round_min = math.inf
    samples = 0
    received = 0
    pending = 1  # segments the receiver has not ACKed: the handshake's one
    pending_ts = -1.0
    timer = 0

    def send(now: float) -> None:
        nonlocal next_seq, bottleneck_free
        while next_seq - acked_to < int(cwnd) and next_seq < max_segments:
            bottleneck_free = max(now, bottleneck_free) + tau
            at(bottleneck_free + delay_s, "data", next_seq, now)
            next_seq += 1

    def ack(now: float, number: int, echo: float) -> None:
        nonlocal ack_link_free
        ack_link_free = max(now, ack_link_free) + tau_ack
        at(ack_link_free + delay_s, "ack", number, echo)

    send(0.0)
    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "data":
            seq, sent = int(data[0]), data[1]
            if seq != received:
                continue
            received += 1
            if pending == 0:
                pending, pending_ts = 1, sent
                timer += 1
                at(now + DELAYED_ACK_TIMEOUT_S, "timer", timer)
            else:
                pending, timer = 0, timer + 1
                ack(now, received, pending_ts if pending_ts >= 0 else sent)
        elif kind == "timer":
            if int(data[0]) == timer and pending:
                pending = 0
                ack(now, received, pending_ts)
        else:
            number, echo = int(data[0]), data[1]
            if number <= acked_to:
                continue
            newly = number - acked_to
            acked_to = number
            sample = max(math.floor(now * 1e3) / 1e3 - math.floor(echo * 1e3) / 1e3, 1e-3)
            srtt = sample if srtt is None else srtt + SRTT_GAIN * (sample - srtt)
            rtt = srtt  # ns-3.37's m_lastRtt: the estimate, not the sample
            least = min(least, rtt)
            if cwnd >= HYSTART_LOW_WINDOW:  # TcpCubic::PktsAcked -> HystartUpdate
                found = ""
                if now - last_ack <= HYSTART_ACK_DELTA_S:
                    last_ack = now
                    if now - round_start > least:
                        found = "train"
                if samples < HYSTART_MIN_SAMPLES:
                    round_min = min(round_min, rtt)
                    samples += 1
                elif round_min > least + threshold:
                    found = found or "delay"
                if found:
                    return Exit(cwnd, found, now)
            if number > round_end:  # TcpCubic::IncreaseWindow -> HystartReset
                round_start = last_ack = now
                round_end = next_seq
                round_min, samples = math.inf, 0
            cwnd += newly  # byte counting in slow start
            send(now)
    return Exit(cwnd, "none", now)


def ns3_exit(delay_s: float, rate_bps: float) -> float | None:
    """ns-3's window when HyStart ends slow start (a flow of 1 MB + :data:`FLOW_S` at the
    rate, through a FIFO, the window traced): ssthresh's first value, when no loss came
    first; None otherwise."""
    from validation import ns3  # deferred: the replica itself needs no ns-3

    rows = ns3.run(
        "tcp_flows",
        bytes=int(rate_bps * FLOW_S / 8) + 1_000_000,
        rate_bps=rate_bps,
        delay_s=delay_s,
        queue_disc="ns3::FifoQueueDisc",
        trace_cwnd=True,
    )
    for row in rows:
        if row.get("trace") == "state":
            return None  # a loss before HyStart fired
        if row.get("trace") == "ssthresh" and row["old"] == 4294967295:
            return row["new"] / 1448
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.slow_start_replica",
        description="Where ns-3.37's Cubic leaves slow start: ns-3 beside a packet-level "
        "replica, on 36 paths.",
    )
    parser.add_argument("--write", action="store_true", help=f"store ns-3's exits in {REFERENCE}")
    args = parser.parse_args(argv)
    cases = []
    for delay, rate in itertools.product(DELAYS_S, RATES_BPS):
        mine = slow_start_exit(delay, rate)
        theirs = ns3_exit(delay, rate)
        cases.append({"delay_s": delay, "rate_bps": rate, "ns3_exit_segments": theirs})
        shown = "-" if theirs is None else f"{theirs:.0f}"
        print(
            f"{delay * 1e3:5.0f} ms {rate / 1e6:5.0f} Mb/s  ns-3 {shown:>6}  "
            f"replica {mine.window:6.0f} ({mine.test})"
        )
    if args.write:
        tmp = REFERENCE.with_name(REFERENCE.name + ".tmp")
        doc = {
            "what": "ns-3.37 Cubic's window (segments) when HyStart ends slow start: a flow "
            "of 1 MB + 2 s at the rate through a FifoQueueDisc (tcp_flows.cc defaults "
            "otherwise); null: a loss came first",
            "cases": cases,
        }
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(REFERENCE)
        print(f"wrote {REFERENCE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
