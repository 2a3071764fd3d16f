"""The service API's request and response models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mecsim.interfaces.service.sweep_runner import DEFAULT_METRIC

ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,99}$"


PLOT_PATTERN = r"^[A-Za-z0-9_-]{1,100}$"


#: A run's status (the service's store keeps the same six).
RunStatus = Literal["queued", "running", "finished", "failed", "cancelled", "interrupted"]


class RunRequest(BaseModel):
    """A scenario to run, with optional overrides."""

    model_config = ConfigDict(extra="forbid")
    scenario: str | dict[str, Any] | None = Field(
        None,
        description="the scenario: YAML or JSON text, or a mapping; null: the embedded "
        "default scenario (as `mecsim run` without a file)",
    )
    rounds: int | None = Field(None, ge=1, le=1_000_000, description="override the rounds")
    set: dict[str, Any] = Field(
        default_factory=dict,
        description="dotted-path overrides, e.g. "
        '{"channel.uplink.bandwidth_hz": 5e6, "devices.clients.0.profile": "rpi2b"}',
    )


class Problem(BaseModel):
    field: str = Field(description="the scenario field (dotted path) the problem is in")
    msg: str


class Problems(BaseModel):
    detail: list[Problem]


class Message(BaseModel):
    detail: str


class Submitted(BaseModel):
    id: str
    url: str
    status: str


class HistoryEntry(BaseModel):
    status: str
    at: datetime
    note: str | None = None


class RunView(BaseModel):
    id: str
    url: str
    name: str
    algorithm: str
    status: RunStatus
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    rounds_done: int
    rounds_planned: int
    last_round: dict[str, Any] | None = Field(
        description="the last finished round's row (as in rounds.csv)"
    )
    best_accuracy: float | None = Field(description="best mean user accuracy so far")
    emulated_s: float | None = Field(description="emulated seconds elapsed")
    eta_s: float | None = Field(
        description="host seconds left: mean host wall time per round x rounds left (running runs)"
    )
    error: str | None
    attempts: int
    cancel_requested: bool
    plots: list[str]
    history: list[HistoryEntry]


class RunList(BaseModel):
    runs: list[RunView]
    total: int
    limit: int
    offset: int


class FileEntry(BaseModel):
    name: str
    bytes: int


class SweepRequest(BaseModel):
    """A what-if sweep over finished runs, in ``mecsim sweep``'s grid syntax."""

    model_config = ConfigDict(extra="forbid")
    runs: list[Annotated[str, Field(pattern=ID_PATTERN)]] = Field(min_length=1, max_length=50)
    set: list[str] = Field(
        default_factory=list,
        max_length=10,
        description="grid axes, each PATH=V1,V2,... or PATH=START:STOP:COUNT",
    )
    metric: str = DEFAULT_METRIC
    target_accuracy: float | None = Field(None, gt=0, le=1)


class SweepView(BaseModel):
    id: str
    url: str
    status: str
    created_at: datetime
    finished_at: datetime | None
    runs: list[str]
    set: list[str]
    metric: str
    target_accuracy: float | None
    error: str | None
    table: list[dict[str, Any]] | None = Field(description="sweep.csv's rows, when finished")
