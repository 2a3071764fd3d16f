"""The ``faults:`` section: emulated crashes, drop-outs, stragglers and outages
(docs/reliability.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mecsim.scenario.schema.base import (
    EmulatedSeconds,
    Fraction,
    PositiveEmulatedSeconds,
    Probability,
    SlowdownRange,
    _Strict,
)


class StragglerConfig(_Strict):
    fraction: Probability = Field(
        default=0.0, description="share of the clients that straggle (drawn once per run)"
    )
    slowdown: SlowdownRange = Field(
        default=(2.0, 4.0),
        description="compute slow-down factor "
        "(>= 1) of a straggler, uniform in [lo, hi], drawn once "
        "per straggler",
    )


class LinkOutage(_Strict):
    start_s: EmulatedSeconds = Field(description="emulated seconds since the run started")
    duration_s: PositiveEmulatedSeconds
    clients: Literal["all"] | list[Annotated[int, Field(ge=0)]] = "all"
    direction: Literal["both", "uplink", "downlink"] = "both"


class EdgeServerOutage(_Strict):
    edge_server: int = Field(ge=0)
    start_s: EmulatedSeconds = Field(description="emulated seconds since the run started")
    duration_s: PositiveEmulatedSeconds


class FaultsConfig(_Strict):
    """Emulated faults, drawn from the scenario seed (see docs/reliability.md)."""

    crash_prob: Probability = Field(
        default=0.0,
        description="per client-round: the device crashes during local training; its work is lost",
    )
    dropout_prob: Probability = Field(
        default=0.0, description="per client-round: the client trains, then leaves before uploading"
    )
    outage_prob: Probability = Field(
        default=0.0, description="per client-round: the client's link is down for the whole round"
    )
    straggler: StragglerConfig | None = None
    link_outages: list[LinkOutage] = Field(default_factory=list)
    edge_server_outages: list[EdgeServerOutage] = Field(default_factory=list)
    wait_for_fraction: Fraction = Field(
        default=1.0,
        description="aggregate once this fraction of "
        "the selected clients has delivered (MTFL step 5); "
        "later ones are dropped",
    )
