"""What every link has, whatever its rate model: latency, jitter, loss and transport
(:class:`LinkTransport`), and the ``backhaul:`` section (each edge server's wired link
to the central server)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

import mecsim.registry as registry
from mecsim.scenario.schema.base import _Strict


class LinkTransport(_Strict):
    """Latency, jitter, packet loss and transport of one link class (uplink, downlink or
    backhaul).

    The latency is drawn per client-round as ``max(0, latency_s + jitter_s * U[-1, 1])``
    from the scenario seed. ``transport: tcp`` (the default) times each transfer as a
    finite TCP flow on an open connection: header bytes on the wire, slow start from
    ``initial_window_segments``, the connection's set-up and, with a loss rate, the
    expected loss recovery and congestion avoidance of ``congestion_control``
    (:mod:`mecsim.channel.tcp`). ``transport: ideal`` keeps ``latency + 8*n / goodput``,
    a loss rate limiting the goodput to the Mathis et al. bound
    ``min(rate, 8*MSS/(RTT*sqrt(p)) * sqrt(3/2))`` (docs/channel.md, "Transport").
    """

    latency_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="one-way propagation + queueing delay added to every transfer (s)",
    )
    jitter_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="latency varies per client-round "
        "uniformly in [latency_s - jitter_s, latency_s + jitter_s], "
        "clipped at 0 (s)",
    )
    loss_rate: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="packet-loss probability: tcp, a finite flow's expected time over "
        "sample paths of its loss recovery (docs/channel.md); ideal, the Mathis et al. "
        "bound on the goodput",
    )
    transport: Literal["tcp", "ideal"] = Field(
        default="tcp",
        description="tcp: a finite TCP flow per transfer (headers, slow start, set-up, "
        "loss recovery); ideal: latency + 8*bytes/goodput, for papers that time bits/rate "
        "(docs/channel.md)",
    )
    mss_bytes: int | None = Field(
        default=None,
        gt=0,
        le=65495,
        description="TCP payload per segment (bytes); null: 1448 under tcp (a 1,500-byte "
        "MTU with timestamps), 1460 under ideal (what its Mathis bound assumes)",
    )
    header_bytes: int = Field(
        default=52,
        ge=0,
        le=65535,
        description="tcp: bytes on the wire per segment besides its payload (IPv4 20 + TCP "
        "20 + timestamps 12)",
    )
    initial_window_segments: int = Field(
        default=10,
        ge=1,
        le=10000,
        description="tcp: the initial congestion window in segments (RFC 6928: 10)",
    )
    connection: Literal["persistent", "new", "tls"] = Field(
        default="persistent",
        description="tcp: persistent (FL clients keep their connection: no set-up), new "
        "(one round trip of handshake per transfer) or tls (two)",
    )
    congestion_control: Literal["cubic", "newreno"] = Field(
        default="cubic", description="tcp: the congestion control whose loss recovery is timed"
    )
    min_rto_s: float = Field(
        default=0.2,
        gt=0,
        le=60,
        description="tcp: the retransmission timeout's floor (s; Linux 0.2, RFC 6298 1.0)",
    )
    queue: Literal["fq_codel", "fifo"] = Field(
        default="fq_codel",
        description="tcp: the bottleneck's queue. fq_codel (Linux's and ns-3's default) "
        "drops from the queue slow start leaves once it has stood above 5 ms for 100 ms "
        "(one-way latencies from about 24 ms), and the window's cut idles the link; fifo "
        "(a deep drop-tail buffer, as on many cellular links) never drops and keeps the "
        "link busy (docs/channel.md, Transport)",
    )

    def segment_bytes(self) -> int:
        """The MSS in force: ``mss_bytes``, or the transport's (tcp 1448, ideal 1460)."""
        if self.mss_bytes is not None:
            return self.mss_bytes
        return TCP_MSS_BYTES if self.tcp() else IDEAL_MSS_BYTES

    def tcp(self) -> bool:
        """Are this link's transfers finite TCP flows (``transport: tcp``)?"""
        return self.transport == "tcp"


#: the MSS of an ideal link's Mathis bound when none is given (bytes)
IDEAL_MSS_BYTES = 1460
#: a TCP link's when none is given: a 1,500-byte MTU less IPv4, TCP and timestamps (bytes)
TCP_MSS_BYTES = 1448


def personalised_downloads(algorithm: str) -> bool:
    """Do the algorithm's clients download different bytes (its server class's
    ``personalised_downloads``)?"""
    server_cls, _ = registry.algorithm(algorithm)
    return bool(getattr(server_cls, "personalised_downloads", False))


def _check_client_loss(uplink: LinkTransport, downlink: LinkTransport) -> None:
    """A loss rate needs a round trip: TCP's loss recovery runs in round trips, and the
    Mathis bound (``transport: ideal``) divides by the RTT."""
    if uplink.latency_s + downlink.latency_s > 0:
        return
    for name, link in (("uplink", uplink), ("downlink", downlink)):
        if link.loss_rate > 0:
            raise ValueError(
                f"{name}.loss_rate: a loss rate needs a round-trip time (TCP recovers "
                "losses in round trips; RTT = uplink.latency_s + downlink.latency_s); "
                "set a latency_s > 0"
            )


class BackhaulConfig(LinkTransport):
    """Each edge server's wired link to the central server (RTT = 2 * latency)."""

    bandwidth_bps: float = Field(default=1e9, ge=1, description="at least 1 b/s")
    latency_s: float = Field(
        default=0.005, ge=0, le=3600, description="one-way latency of each transfer (s)"
    )

    @model_validator(mode="after")
    def _loss_needs_rtt(self) -> BackhaulConfig:
        if self.loss_rate > 0 and self.latency_s == 0:
            raise ValueError(
                "loss_rate: a loss rate needs a round-trip time (TCP recovers losses "
                "in round trips; RTT = 2 * latency_s); set latency_s > 0"
            )
        return self
