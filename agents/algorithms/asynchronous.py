"""Asynchronous servers: what the server does with one update as it arrives.

FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019, Alg. 1 and
Sec. 5.2): every update is mixed into the global model on arrival,

    x_t = (1 - α_t) x_{t-1} + α_t x_new,     α_t = α · s(t - τ)

where ``τ`` is the version the client trained on and ``t - τ`` its staleness; the
staleness functions ``s`` are

    constant:    s(t - τ) = 1
    polynomial:  s_a(t - τ) = (t - τ + 1)^(-a)
    hinge:       s_{a,b}(t - τ) = 1 if t - τ <= b, else 1 / (a (t - τ - b) + 1)

FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022, Alg. 1): the server adds each client's change ``Δ_i = y_i - x_τi`` weighted
by ``s(t - τ_i) = 1 / sqrt(1 + t - τ_i)`` to a buffer; after ``K`` updates it takes one
step of size ``η_g`` along their mean,

    x_{t+1} = x_t + η_g · (1/K) Σ_i Δ_i / sqrt(1 + t - τ_i)

(the paper writes ``Δ_i`` as the start minus the end of the local training and subtracts
it; the sign convention is the only difference).

Staleness here is counted in versions: the server's versions made between the client's
download and its update's arrival (0: nothing changed meanwhile). Everything is plain
numpy, accumulated in float64 and stored in float32, so a run is reproducible to the
bit; nothing here knows of Ray, SimPy or the clock (mecsim.run.async_run drives it).

A user's own asynchronous server subclasses :class:`AsyncServer`, implements
:meth:`AsyncServer.on_update` (and :meth:`SemiSync.flush`'s like for mode semi_sync) and
is registered in the ``mecsim.async_servers`` group, as these three are; a scenario names
it as ``aggregation.server`` (docs/extending.md, "Your own asynchronous server").
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict


def staleness_weight(function: str, staleness: int, a: float = 0.5, b: int = 4) -> float:
    """FedAsync's ``s(t - τ)`` (Xie et al. 2019, Sec. 5.2) of an update ``staleness``
    versions stale."""
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0")
    if function == "constant":
        return 1.0
    if function == "polynomial":
        return float((staleness + 1) ** (-a))
    if function == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"unknown staleness function {function!r}")


def fedbuff_weight(staleness: int) -> float:
    """FedBuff's staleness weight ``1 / sqrt(1 + t - τ)`` (Nguyen et al. 2022, Sec. 3)."""
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0")
    return 1.0 / math.sqrt(1.0 + staleness)


def mix(global_weights: np.ndarray, client_weights: np.ndarray, alpha_t: float) -> np.ndarray:
    """``(1 - α_t) x + α_t x_new`` in float64, stored in float32."""
    out = (1.0 - alpha_t) * global_weights.astype(np.float64) + alpha_t * client_weights.astype(
        np.float64
    )
    return out.astype(np.float32)


@dataclass
class Update:
    """One client's update as it reaches the server."""

    client_id: int
    weights: np.ndarray  # the client's model after local training (flat, float32)
    base: np.ndarray  # the model version it trained from
    trained_on: int  # that version's number
    num_samples: int


class AsyncServerParams(BaseModel):
    """The base of an asynchronous server's ``Params`` (``aggregation.server.params`` in a
    scenario): none, and any given is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AsyncServer(ABC):
    """The server of an asynchronous mode: the global model, its version, and what it
    does with each update (:meth:`on_update`). State is the instance's attributes but
    :attr:`config` and :attr:`params` (a checkpoint keeps them all: numbers, strings,
    numpy arrays, and lists and dicts of them).

    ``config`` is the scenario's ``aggregation:`` section, ``params`` its
    ``aggregation.server.params``, validated by :attr:`Params` (``self.params`` is the
    Params instance). The run builds the server as ``cls(init_weights, config, params)``:
    a subclass that overrides ``__init__`` takes the same three and calls this one."""

    name: ClassVar[str] = ""
    #: the parameters a scenario may give it (a pydantic model: every field with a default
    #: and a description)
    Params: ClassVar[type[BaseModel]] = AsyncServerParams

    def __init__(
        self, init_weights: np.ndarray, config: Any, params: dict[str, Any] | None = None
    ) -> None:
        self.weights = np.array(init_weights, dtype=np.float32, copy=True)
        self.version = 0
        self.config = config
        self.params = self.Params(**(params or {}))

    @abstractmethod
    def on_update(self, update: Update, staleness: int) -> bool:
        """Take one update ``staleness`` versions stale (finite: the run drops any other);
        True when it made a new version of :attr:`weights` (then :attr:`version` is one
        more), False when it only kept it (a buffer)."""

    def aggregate_flops(self, num_elements: int) -> float:
        """FLOPs of one :meth:`on_update` on a model of ``num_elements`` elements."""
        return 3.0 * num_elements

    def factor(self, staleness: int) -> float:
        """The weight the update gets for its staleness (recorded per update)."""
        return 1.0


class FedAsync(AsyncServer):
    """FedAsync: ``x_t = (1 - α_t) x_{t-1} + α_t x_new``, ``α_t = α · s(t - τ)``."""

    name = "async"

    def factor(self, staleness: int) -> float:
        s = self.config.staleness
        return self.config.alpha * staleness_weight(s.function, staleness, s.a, s.b)

    def on_update(self, update: Update, staleness: int) -> bool:
        self.weights = mix(self.weights, update.weights, self.factor(staleness))
        self.version += 1
        return True


class FedBuff(AsyncServer):
    """FedBuff: a buffer of ``K`` staleness-weighted deltas, then one server step."""

    name = "buffered"

    def __init__(
        self, init_weights: np.ndarray, config: Any, params: dict[str, Any] | None = None
    ) -> None:
        super().__init__(init_weights, config, params)
        self.buffer = np.zeros(self.weights.shape, dtype=np.float64)
        self.buffered = 0

    def factor(self, staleness: int) -> float:
        return fedbuff_weight(staleness)

    def on_update(self, update: Update, staleness: int) -> bool:
        delta = update.weights.astype(np.float64) - update.base.astype(np.float64)
        self.buffer += self.factor(staleness) * delta
        self.buffered += 1
        if self.buffered < self.config.buffer_size:
            return False
        step = self.config.server_lr * self.buffer / self.buffered
        with np.errstate(over="ignore"):  # a step past float32 is inf: the run checks
            self.weights = (self.weights.astype(np.float64) + step).astype(np.float32)
        self.buffer[...] = 0.0
        self.buffered = 0
        self.version += 1
        return True

    def aggregate_flops(self, num_elements: int) -> float:
        # the delta, its weighting and the add; the step (divide, scale, add) once per K
        return 3.0 * num_elements + 3.0 * num_elements / self.config.buffer_size


class SemiSync(AsyncServer):
    """Semi-synchronous: every ``period_s`` the server averages the models that arrived
    in the period, weighted by their clients' samples (FedAvg over the arrivals),

        x_{t+1} = sum_k n_k y_k / sum_k n_k      (k: the updates of period t)

    A period with no arrival makes no version. The run calls :meth:`flush` at the end of
    every period."""

    name = "semi_sync"

    def __init__(
        self, init_weights: np.ndarray, config: Any, params: dict[str, Any] | None = None
    ) -> None:
        super().__init__(init_weights, config, params)
        self.sum = np.zeros(self.weights.shape, dtype=np.float64)
        self.samples = 0

    def on_update(self, update: Update, staleness: int) -> bool:
        self.sum += float(update.num_samples) * update.weights.astype(np.float64)
        self.samples += int(update.num_samples)
        return False

    def flush(self) -> bool:
        """The period's end: a new version when anything arrived."""
        if self.samples == 0:
            return False
        self.weights = (self.sum / self.samples).astype(np.float32)
        self.sum[...] = 0.0
        self.samples = 0
        self.version += 1
        return True

    def aggregate_flops(self, num_elements: int) -> float:
        return 2.0 * num_elements  # one multiply and one add per element


#: The asynchronous servers by ``aggregation.mode`` (each mode's own server, when the
#: scenario names none in ``aggregation.server``).
ASYNC_SERVERS: dict[str, type[AsyncServer]] = {
    "async": FedAsync,
    "buffered": FedBuff,
    "semi_sync": SemiSync,
}
