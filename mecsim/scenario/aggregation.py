"""The ``aggregation:`` section: when the server aggregates (docs/async.md).

- ``sync`` (the default): rounds, as always: the server waits for the round's clients.
- ``async``: FedAsync (Xie, Koyejo and Gupta, 2019): every update is mixed into the
  global model as it arrives, ``x_t = (1 - α_t) x_{t-1} + α_t x_new`` with
  ``α_t = α · s(t - τ)``, ``s`` a staleness function (constant, polynomial, hinge).
- ``buffered``: FedBuff (Nguyen et al., AISTATS 2022): the server buffers ``buffer_size``
  client deltas, each weighted ``1 / sqrt(1 + staleness)``, and then takes one step of
  size ``server_lr`` along their mean.
- ``semi_sync``: every ``period_s`` emulated seconds the server averages the models that
  arrived in the period (weighted by samples, as FedAvg); clients still training go on
  and arrive in a later period.

In the asynchronous modes the emulated clock drives the run (mecsim.run.async_run):
each client cycles download -> train -> upload on its own, and ``rounds`` counts the
server's model versions. ``server`` names another server than the mode's own (a plugin
of the ``mecsim.async_servers`` group, docs/extending.md). This module imports nothing
of mecsim but the registry: the schema imports it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import mecsim.registry as registry

#: The staleness functions of FedAsync (Xie et al. 2019, Sec. 5.2), by name.
STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class StalenessConfig(_Strict):
    """``s(t - τ)`` of FedAsync: how much an update that is ``t - τ`` versions stale
    counts (Xie et al. 2019, Sec. 5.2)."""

    function: Literal["constant", "polynomial", "hinge"] = Field(
        default="polynomial",
        description="constant: s = 1; polynomial: s = (t - τ + 1)^(-a); hinge: s = 1 "
        "while t - τ <= b, else 1 / (a (t - τ - b) + 1)",
    )
    a: float = Field(
        default=0.5, ge=0, le=100, description="exponent (polynomial) or slope (hinge)"
    )
    b: int = Field(
        default=4, ge=0, le=10**6, description="versions of staleness the hinge forgives"
    )


#: Each asynchronous mode's own server (its ``mecsim.async_servers`` name): what runs when
#: ``aggregation.server`` is null.
MODE_SERVERS = {"async": "fedasync", "buffered": "fedbuff", "semi_sync": "semi_sync"}


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


class AsyncServerConfig(_Strict):
    """An asynchronous server of the ``mecsim.async_servers`` group in place of the
    mode's own, and its parameters (validated by the server class's ``Params``)."""

    name: str = Field(
        description="fedasync, fedbuff, semi_sync, or a plugin (`mecsim plugins --kind "
        "async_server`)"
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="the server's parameters (its Params)"
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        reg = registry.ASYNC_SERVERS
        if name not in reg:
            raise ValueError(f"unknown {reg.kind} {name!r}; known: {', '.join(reg.names())}")
        reg.get(name)  # PluginError (a ValueError): a conflict, fails to import, no on_update
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> AsyncServerConfig:
        params_model = getattr(registry.ASYNC_SERVERS.get(self.name), "Params", None)
        if params_model is not None:
            try:
                params_model(**self.params)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(
                    f"params.{_dotted(err['loc'])}: {err['msg']} (async_server {self.name})"
                ) from None
        return self


class AggregationConfig(_Strict):
    """When the server aggregates: in synchronous rounds (the default) or as updates
    arrive, in emulated time (docs/async.md)."""

    mode: Literal["sync", "async", "buffered", "semi_sync"] = Field(
        default="sync",
        description="sync: rounds; async: FedAsync, every update mixed in on arrival; "
        "buffered: FedBuff, a server step every buffer_size updates; semi_sync: the "
        "models that arrived averaged every period_s",
    )
    alpha: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="async: FedAsync's mixing weight α (0 < α <= 1), scaled by the "
        "staleness function",
    )
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    buffer_size: int = Field(
        default=10,
        ge=1,
        le=10**6,
        description="buffered: FedBuff's K, the updates the server buffers per step",
    )
    server_lr: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="buffered: FedBuff's server learning rate η_g",
    )
    period_s: float = Field(
        default=10.0,
        gt=0,
        le=1e9,
        description="semi_sync: emulated seconds between the server's aggregations",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=10**9,
        description="clients training at once (FedBuff's concurrency); null: every client",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        le=10**9,
        description="an update more versions stale than this is dropped on arrival; null: none is",
    )
    server: AsyncServerConfig | None = Field(
        default=None,
        description="an asynchronous server of the mecsim.async_servers group (a plugin) "
        "in place of the mode's own; null: the mode's own (async: fedasync, buffered: "
        "fedbuff, semi_sync: semi_sync)",
    )

    @model_validator(mode="after")
    def _fields_of_its_mode(self) -> AggregationConfig:
        """A field of the other mode set to a non-default value is a mistake, not a
        no-op: it is refused, naming it."""
        defaults = AggregationConfig.model_construct()
        only = {
            "async": ("alpha", "staleness"),
            "buffered": ("buffer_size", "server_lr"),
            "semi_sync": ("period_s",),
        }
        for mode, names in only.items():
            if self.mode == mode:
                continue
            for name in names:
                if name in self.model_fields_set and getattr(self, name) != getattr(
                    defaults, name, None
                ):
                    raise ValueError(f"{name} is a setting of mode {mode}, and mode is {self.mode}")
        if self.mode == "sync":
            for name in ("concurrency", "max_staleness", "server"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is a setting of the asynchronous modes")
        if self.server is not None:
            self._server_fits(self.server.name)
        return self

    def _server_fits(self, name: str) -> None:
        """A built-in server runs in its own mode only (it reads that mode's settings); a
        server under mode semi_sync must have ``flush()`` (called every ``period_s``)."""
        cls = registry.ASYNC_SERVERS.get(name)
        own = {server: mode for mode, server in MODE_SERVERS.items()}
        if name in own and own[name] != self.mode:
            raise ValueError(
                f"server.name: {name} is mode {own[name]}'s own server (it reads that "
                f"mode's settings); use mode: {own[name]}, and no server"
            )
        if self.mode == "semi_sync" and not callable(getattr(cls, "flush", None)):
            raise ValueError(
                f"server.name: async_server {name!r} has no flush(), which mode semi_sync "
                f"calls every period_s to make a version; use mode async or buffered, or "
                "give it a flush()"
            )

    def server_name(self) -> str:
        """The ``mecsim.async_servers`` name of the server that runs (an asynchronous
        mode's)."""
        return self.server.name if self.server is not None else MODE_SERVERS[self.mode]

    def clocked(self) -> bool:
        """Does the emulated clock drive the run (an asynchronous mode)?"""
        return self.mode != "sync"
