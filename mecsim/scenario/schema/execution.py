"""How a run is carried out and what it keeps: the ``evaluation:``, ``outputs:``,
``metrics:``, ``execution:`` and ``checkpoint:`` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mecsim.scenario.schema.base import Fraction, RunId, _Strict


class EvaluationConfig(_Strict):
    every: int = Field(
        default=1, ge=1, description="evaluate user accuracy every N rounds (and last)"
    )
    clients: Literal["all", "selected"] = "all"
    target_accuracy: list[Fraction] = Field(
        default_factory=list,
        description="target mean user accuracies (fractions, e.g. 0.97): "
        "the run's summary reports the rounds and emulated seconds until each is first "
        "reached (MTFL Table 2's figure), or X",
    )


class OutputsConfig(_Strict):
    dir: str = Field(default="runs", min_length=1)
    run_id: RunId | None = Field(
        default=None,
        description="default: <scenario name>-<timestamp>-<random suffix>; letters, "
        "digits, '-', '_', '.'",
    )
    table_format: Literal["parquet", "csv"] = "parquet"
    save_optraces: bool = True


class MetricsConfig(_Strict):
    enabled: bool = True
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=9464, ge=0, le=65535, description="0 = any free port")
    public: bool = Field(
        default=False,
        description="allow a host that is not a loopback address "
        "(/metrics reachable from other machines; mecsim run "
        "--metrics-public)",
    )


#: execution.call_timeout_s by default: an hour for one client's fit or one aggregation
#: is far beyond real work on a host (a round of the paper scenarios' clients takes
#: seconds), short enough that a hung call does not hold a run (or a service's worker)
#: for days
DEFAULT_CALL_TIMEOUT_S = 3600.0
#: the largest call_timeout_s (a week); null for none
MAX_CALL_TIMEOUT_S = 7 * 86400.0


class ExecutionConfig(_Strict):
    backend: Literal["ray", "local"] = Field(
        default="ray", description="ray: host actors in Ray; local: in-process (tests, debugging)"
    )
    hosts: int | None = Field(default=None, ge=1, description="host actors; default one per core")
    ray_address: str | None = Field(default=None, description="attach to an existing Ray cluster")
    stream_aggregation: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: fold the uploads into the aggregate while the clients "
        "train, when the round's aggregated clients are known before it is timed (no "
        "deadline, no wait_for_fraction, no link or edge-server outages, no rate traces) "
        "and the algorithm can (FedAvg, FedProx, Per-FedAvg); off: hold every upload "
        "until the round is timed. The same bits either way",
    )
    call_timeout_s: float | None = Field(
        default=DEFAULT_CALL_TIMEOUT_S,
        gt=0,
        le=MAX_CALL_TIMEOUT_S,
        description="the longest one call into an algorithm's code may take (s): a "
        "client's fit or evaluate, the server's select, configure_fit, aggregate_fit, "
        "..., a Flower ClientApp's message or the ServerApp's turn; a call still running "
        "then fails the run (exit 1), naming the algorithm, the call and the round. "
        "null: no limit (the calls then run in the caller's thread). See "
        "docs/reliability.md for what a call that overran can still do",
    )


class CheckpointConfig(_Strict):
    every: int = Field(
        default=1,
        ge=0,
        description="checkpoint after every N rounds (and after "
        "the last); 0: never (a killed run then resumes from its start)",
    )
    keep: int = Field(default=2, ge=1, description="how many of the newest checkpoints to keep")
