"""The ``availability:`` section: when each client is online (docs/async.md, "Availability").

- ``always`` (the default): every client is online for the whole run.
- ``exponential``: each client alternates online and offline periods whose durations are
  exponential with means ``mean_online_s`` and ``mean_offline_s``, drawn from its own
  stream of the scenario's seed; at time 0 it is online with the stationary probability
  ``mean_online_s / (mean_online_s + mean_offline_s)``.
- ``trace``: the intervals of a trace file in FedScale's availability-trace layout
  (``client_behave_trace``: per client ``active`` and ``inactive``, the starts and ends of
  its online intervals in seconds, repeating every ``finish_time``), written as JSON
  (:mod:`mecsim.emulation.availability` reads it).

This module imports nothing of mecsim: the schema imports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AvailabilityConfig(_Strict):
    """When each client is online: always, exponential on/off periods, or a trace."""

    model: Literal["always", "exponential", "trace"] = Field(
        default="always",
        description="always: every client online throughout; exponential: on/off periods "
        "of exponential durations (mean_online_s, mean_offline_s); trace: the online "
        "intervals of a FedScale-style availability trace (trace)",
    )
    mean_online_s: float = Field(
        default=600.0,
        gt=0,
        le=1e9,
        description="exponential: mean duration of an online period (emulated s)",
    )
    mean_offline_s: float = Field(
        default=60.0,
        gt=0,
        le=1e9,
        description="exponential: mean duration of an offline period (emulated s)",
    )
    trace: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="trace: a JSON file {client: {active: [s...], inactive: [s...], "
        "finish_time: s}} (FedScale's client_behave_trace layout); relative paths are "
        "relative to the scenario file",
    )

    @model_validator(mode="after")
    def _fields_of_its_model(self) -> AvailabilityConfig:
        if self.model == "trace" and self.trace is None:
            raise ValueError("model trace needs trace: the trace file")
        if self.model != "trace" and self.trace is not None:
            raise ValueError(f"trace is a setting of model trace, and model is {self.model}")
        if self.model != "exponential":
            defaults = AvailabilityConfig.model_construct()
            for name in ("mean_online_s", "mean_offline_s"):
                if getattr(self, name) != getattr(defaults, name):
                    raise ValueError(
                        f"{name} is a setting of model exponential, and model is {self.model}"
                    )
        return self

    def limited(self) -> bool:
        """Are clients ever offline?"""
        return self.model != "always"
