"""The algorithm interface: one server-side class, one client-side class per algorithm.

The round loop (:mod:`mecsim.run.loop`) is written once and calls, in order:

1. ``server.select(round, rng)`` — which clients take part;
2. ``server.configure_fit(round, selected)`` — one :class:`ClientTask` each: what the
   client downloads (weights, which layers, how many bytes) and its round config;
3. ``client.fit(ctx, task)`` on the client's host — real local training, returning a
   :class:`ClientResult` with what it uploads and its op-trace;
4. ``server.aggregate_fit(round, results)`` — with the results that made the deadline;
5. ``server.configure_evaluate`` / ``client.evaluate`` — user accuracy on each client's
   own test data.

A hierarchical algorithm (edge servers that keep models of their own, e.g. PHSFL) also
has an edge side, :class:`EdgeAlgorithm`, one instance per edge server (under Ray, each in
an actor of its own): step 2 becomes ``server.configure_fit`` + ``server.configure_edges``
(what the central server sends each edge server) + ``edge.configure_fit`` (the edge server
fills in what its clients download), and step 4 becomes ``edge.aggregate_fit`` (each edge
server with its own clients' uploads) + ``server.aggregate_edges`` (the central server
with the edge servers' reports).

Nothing here knows about Ray or SimPy: algorithms are plain classes, testable
in-process. State that lives on a client between rounds (a personal model, optimiser
moments, private layers) lives in ``ctx.state``, a dict the host keeps per client.
"""

from __future__ import annotations

import contextvars
import ctypes
import queue
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias, TypeVar, cast

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from mecsim.agents.models import ModelLayout, set_flat
from mecsim.agents.training import StepCosts, TrainStats, evaluate, model_optimizer, train_epochs
from mecsim.emulation.ops import Compute, Download, OpTrace, Upload

#: What :meth:`ClientAlgorithm.evaluate` returns: (accuracy, loss), maybe with a dict of
#: the algorithm's own per-client figures.
EvalResult: TypeAlias = tuple[float, float] | tuple[float, float, dict[str, float]]


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0


@dataclass
class ClientTask:
    """What the server sends one client for one round."""

    client_id: int
    weights: np.ndarray | None  # flat model state (see mecsim.agents.models), None: nothing sent
    download_nbytes: int  # bytes on the air for this download (only what is sent counts)
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientResult:
    """What one client returns after local training."""

    client_id: int
    weights: np.ndarray | None  # flat state uploaded; None: nothing uploaded
    upload_nbytes: int
    num_samples: int
    train_loss: float
    trace: OpTrace
    flops: float
    steps: int
    peak_memory_bytes: int
    host_seconds: float = 0.0  # measured wall time of this client's training on the host
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientContext:
    """Everything a client algorithm may use on the host for one client."""

    client_id: int
    model: nn.Module  # a model instance shared by the host's clients: load state before use
    layout: ModelLayout
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    state: dict[str, Any]  # persists on the host between rounds
    train: TrainConfig
    generator: torch.Generator  # seeded from (scenario seed, round, client)
    costs: StepCosts
    init_weights: np.ndarray  # the common initial model (read-only)
    # where the host wants this client's full-model upload written (a row of a buffer it
    # reuses; see mecsim.run.backends.actors.ClientHostActor), or None: ask once, and only for an
    # upload the algorithm keeps no reference to (the row is overwritten next round)
    upload_row: Callable[[], np.ndarray | None] = lambda: None


class NoParams(BaseModel):
    """Hyper-parameters of an algorithm (``algorithm.params`` in a scenario).

    Each algorithm declares a subclass with typed, documented fields and defaults; the
    scenario is validated against it, so a misspelt or ill-typed hyper-parameter is
    reported with its field name before anything runs.
    """

    # allow_inf_nan=False: a hyper-parameter is a finite number (no .inf / .nan)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True)
class AggregateStats:
    flops: float  # server FLOPs of aggregation (see each algorithm for how they are counted)
    # algorithm-specific per-round figures; keys must be listed in the server class's
    # ``round_metrics`` (they become columns of rounds.csv and Prometheus series)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EdgeReport:
    """What one edge server sends the central server after aggregating its clients."""

    flops: float  # its aggregation's FLOPs
    aggregated: int  # how many of its clients' uploads it aggregated
    model: np.ndarray | None = None  # its model, when the central server needs it
    # filled in by the edge server process around the algorithm (mecsim.agents.server):
    rejected: tuple[int, ...] = ()  # its clients whose upload held NaN or inf
    wall_s: float = 0.0  # measured host seconds of its aggregation


class EdgeAlgorithm(ABC):
    """Edge-server side of a hierarchical algorithm: the state one edge server alone keeps
    (e.g. its edge model) and the steps it takes with its own clients. Flat algorithms
    have none (``ServerAlgorithm.Edge`` is None): their one server does everything."""

    Params: ClassVar[type[BaseModel]] = NoParams  # the server side's
    #: attributes set from the construction arguments (the scenario): not checkpointed
    static_attributes: ClassVar[tuple[str, ...]] = (
        "edge_server",
        "layout",
        "params",
        "client_samples",
    )

    def __init__(
        self,
        edge_server: int,
        layout: ModelLayout,
        client_samples: dict[int, int],
        params: dict[str, Any],
    ) -> None:
        self.edge_server = edge_server
        self.layout = layout
        self.client_samples = dict(client_samples)  # of this edge server's clients
        self.params = self.Params(**params)

    def configure_fit(self, rnd: int, tasks: list[ClientTask], downlink: Any) -> list[ClientTask]:
        """This edge server's clients' tasks, as the central server planned them, with
        what the edge server sends them filled in; ``downlink`` is what the central
        server sent this edge server for the round (``ServerAlgorithm.configure_edges``)."""
        return tasks

    @abstractmethod
    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> EdgeReport:
        """Aggregate this edge server's clients' results (maybe none) for the central
        server."""

    def upload_size(self) -> int | None:
        """As :meth:`ServerAlgorithm.upload_size`: the whole flat model by default."""
        return self.layout.size

    def models(self) -> dict[str, Any]:
        """As :meth:`ServerAlgorithm.models`: the models this edge server keeps and sends
        its clients (checked finite after each of its aggregations); none by default."""
        return {}

    @classmethod
    def handover_state_nbytes(cls, params: BaseModel, num_samples: int) -> int:
        """What moves with a client that hands over: the bytes of the per-client state
        this edge server keeps for a client of ``num_samples`` training samples, which
        its new edge server needs (docs/mobility.md, "Handover"). The run moves them
        old edge server -> central server -> new edge server over the backhaul at the
        round's start (a :class:`~mecsim.emulation.ops.Handoff` op first in the
        client's op-trace). The edge model itself does not move: the client downloads
        its new edge server's model as it does every round. Default 0: the edge server
        keeps nothing per client (only the latencies of the two hops are charged)."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`ServerAlgorithm.state_dict`: every attribute but the static ones."""
        return {k: v for k, v in vars(self).items() if k not in self.static_attributes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


class AlgorithmError(RuntimeError):
    """An algorithm's own code failed, or broke its contract (an upload of the wrong shape
    or dtype): ``str()`` is one line naming the algorithm and the client. The run fails
    with it (exit 1); its finished rounds are kept, and it resumes after a fix."""


#: the attribute mecsim's Ctrl-C / SIGTERM handler (``mecsim.run.interrupts``) sets on
#: the KeyboardInterrupt it raises, and on itself: a KeyboardInterrupt without it, raised
#: while that handler is installed, did not come from a signal but from code
SIGNAL_MARK = "mecsim_from_signal"


def from_signal(exc: KeyboardInterrupt) -> bool:
    """Did ``exc`` come from the user (Ctrl-C, SIGTERM), as far as can be told? Yes when
    mecsim's handler raised it; no when that handler is installed and did not (the
    algorithm's own code raised it); yes otherwise (Python's own handler: it may be)."""
    if getattr(exc, SIGNAL_MARK, False):
        return True
    try:
        handler = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        return True
    return not getattr(handler, SIGNAL_MARK, False)


class UserCodeExit(AlgorithmError):
    """An algorithm's own code raised what is not an Exception (:func:`user_code`)."""


def _call_repr(exc: BaseException) -> str:
    return " ".join(repr(exc).split())[:300]


@contextmanager
def user_code(algorithm: str, where: str) -> Iterator[None]:
    """Around a call into an algorithm's own code (a plugin's too): what it raises that
    is not an :class:`Exception` — ``SystemExit`` (``sys.exit(0)`` included), a
    ``KeyboardInterrupt`` no signal raised, a ``BaseException`` of its own — becomes an
    :class:`AlgorithmError`, one line naming the algorithm and where: the run fails
    (exit 1), it does not end as if it had succeeded or been interrupted. Exceptions pass
    through unchanged (each call site names them its own way); a real Ctrl-C or SIGTERM
    stops the run as before. (:func:`call_user` also names Exceptions and bounds the
    call's time.)"""
    try:
        yield
    except Exception:
        raise
    except KeyboardInterrupt as exc:
        if from_signal(exc):
            raise
        raise UserCodeExit(
            f"algorithm {algorithm}: {where} raised {_call_repr(exc)} (user code)"
        ) from exc
    except BaseException as exc:
        raise UserCodeExit(
            f"algorithm {algorithm}: {where} raised {_call_repr(exc)} (user code)"
        ) from exc


class CallTimeout(AlgorithmError):
    """A call into an algorithm's code did not return within ``execution.call_timeout_s``
    (:func:`call_user`): the run fails; the call is abandoned (see :class:`_Watchdog`)."""


class CallAbandoned(BaseException):
    """Raised, where it can be, in the thread of a call that overran its time: it stops
    code that runs Python bytecode (a loop); code blocked in C (a sleep, a lock, I/O, a
    long torch operation) goes on until it returns, or until the process ends."""


_T = TypeVar("_T")

#: A key of :attr:`ClientTask.config` (a server that drives its rounds): set, the task's
#: batch is a further stage of the round's training, which the run loop charges in the
#: round (its time, bytes, FLOPs and energy: docs/flower.md), not beside it as an
#: evaluation
ROUND_STAGE = "round_stage"


class _Overran(Exception):
    """The watchdog's own: the call did not return in time."""


class _Worker:
    """The thread that runs one caller thread's calls into user code, one at a time."""

    def __init__(self, caller: threading.Thread) -> None:
        self.caller = caller
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.abandoned = False
        self.thread = threading.Thread(target=self._run, name="mecsim-user-code", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.abandoned:
                try:
                    job = self.jobs.get(timeout=30.0)
                except queue.Empty:
                    if not self.caller.is_alive():  # its caller is gone: so is it
                        return
                    continue
                fn, args, kwargs, context, grad, out = job
                try:
                    torch.set_grad_enabled(grad)
                    out.put((True, context.run(fn, *args, **kwargs)))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                    out.put((False, exc))
                del job, fn, args, kwargs, out
        except CallAbandoned:  # raised in it after its call overran: it ends here
            return


class _Watchdog:
    """Runs calls into user code in a worker thread (a daemon; one per calling thread,
    made anew when a call overran) and waits for each at most its timeout. A call that
    overruns is abandoned: its thread is left (Python cannot kill a thread),
    :class:`CallAbandoned` is raised in it at its next bytecode, and the next call gets
    a new thread. The caller's context variables (numpy's error state) and torch's grad
    mode go with the call; the global generators are the process's, as in the caller."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.abandoned = 0  # calls abandoned in this process (tests)
        self.left: list[threading.Thread] = []  # their threads, the last few (tests)

    def call(self, fn: Callable[..., _T], args: Any, kwargs: Any, timeout_s: float) -> _T:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None or worker.abandoned or not worker.thread.is_alive():
            worker = self._local.worker = _Worker(threading.current_thread())
        out: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        worker.jobs.put(
            (fn, args, kwargs, contextvars.copy_context(), torch.is_grad_enabled(), out)
        )
        try:
            ok, value = out.get(timeout=timeout_s)
        except queue.Empty:
            self._abandon(worker)
            raise _Overran from None
        except BaseException:  # Ctrl-C while waiting: the call is left behind too
            self._abandon(worker)
            raise
        if ok:
            return cast(_T, value)
        raise value

    def _abandon(self, worker: _Worker) -> None:
        worker.abandoned = True
        self._local.worker = None
        thread = worker.thread
        with self._lock:
            self.abandoned += 1
            self.left = [*self.left[-7:], thread]
        if thread.ident is not None and thread.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(CallAbandoned)
            )


_WATCHDOG = _Watchdog()


def call_user(
    algorithm: str,
    where: str,
    fn: Callable[..., _T],
    *args: Any,
    rnd: int | None = None,
    timeout_s: float | None = None,
    **kwargs: Any,
) -> _T:
    """``fn(*args, **kwargs)``, a call into an algorithm's own code (a plugin's, a Flower
    app's), named: whatever it raises becomes one line naming the algorithm, the call
    (``where``) and the round (``rnd``, 0-based; said 1-based) — an
    :class:`AlgorithmError` (an Exception, or one it raised itself, passes as it is), a
    :class:`UserCodeExit` (what is not an Exception, as :func:`user_code`); a real Ctrl-C
    or SIGTERM passes. With ``timeout_s`` (``execution.call_timeout_s``) the call runs in
    :class:`_Watchdog`'s thread and one that has not returned by then is a
    :class:`CallTimeout`."""
    in_round = "" if rnd is None else f" in round {rnd + 1}"
    try:
        if timeout_s is None:
            return fn(*args, **kwargs)
        return _WATCHDOG.call(fn, args, kwargs, timeout_s)
    except _Overran:
        raise CallTimeout(
            f"algorithm {algorithm!r}: {where}{in_round} did not return within "
            f"{timeout_s:g} s (execution.call_timeout_s); the run stops here, the call "
            "is abandoned"
        ) from None
    except AlgorithmError:
        raise
    except Exception as exc:
        raise AlgorithmError(
            f"algorithm {algorithm!r} failed in {where}{in_round}: {_one_line(exc)}"
        ) from exc
    except KeyboardInterrupt as exc:
        if from_signal(exc):
            raise
        raise UserCodeExit(
            f"algorithm {algorithm}: {where}{in_round} raised {_call_repr(exc)} (user code)"
        ) from exc
    except BaseException as exc:
        raise UserCodeExit(
            f"algorithm {algorithm}: {where}{in_round} raised {_call_repr(exc)} (user code)"
        ) from exc


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def returned(algorithm: str, where: str, rnd: int | None, value: Any, kind: type) -> None:
    """Refuse what a call returned when it is not a ``kind`` (an aggregate_fit that
    returns None): one line naming the algorithm, the call and the round."""
    if not isinstance(value, kind):
        in_round = "" if rnd is None else f" in round {rnd + 1}"
        raise AlgorithmError(
            f"algorithm {algorithm!r}: {where}{in_round} returned {type(value).__name__}, "
            f"not {kind.__name__}"
        )


def check_upload(algorithm: str, result: ClientResult, expected_size: int | None) -> None:
    """Refuse, before aggregation, an upload that is not a 1-D floating-point array of
    ``expected_size`` elements (None: the algorithm's uploads vary in size)."""
    w = result.weights
    if w is None:
        return
    if not isinstance(w, np.ndarray) or w.ndim != 1 or w.dtype.kind != "f":
        what = f"a {w.ndim}-D {w.dtype} array" if isinstance(w, np.ndarray) else type(w).__name__
        raise AlgorithmError(
            f"algorithm {algorithm!r}: client {result.client_id} uploaded {what}, not a "
            "1-D floating-point array (refused before aggregation)"
        )
    if expected_size is not None and w.size != expected_size:
        raise AlgorithmError(
            f"algorithm {algorithm!r}: client {result.client_id} uploaded {w.size} "
            f"values, the server expects {expected_size} (refused before aggregation); "
            "clients that upload part of the model: override the server class's "
            "upload_size() to return that part's size, or None when it varies"
        )


def all_finite(value: Any) -> bool:
    """Is every floating-point number in ``value`` (arrays, tensors, floats, and dicts,
    lists and tuples of them) finite?"""
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    if isinstance(value, float):
        return np.isfinite(value)
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(all_finite(v) for v in value)
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    return True


def check_models(algorithm: str, models: dict[str, Any], where: str, layout: Any = None) -> None:
    """AlgorithmError, one line naming the algorithm, ``where`` (the call and the round)
    and the first model and layer holding NaN or inf, when one of ``models`` (a
    server's :meth:`ServerAlgorithm.models`) is not finite: a server that hands its
    clients a NaN model would otherwise go on, every later upload rejected."""
    for name, value in models.items():
        if all_finite(value):
            continue
        detail = ""
        if isinstance(value, np.ndarray) and layout is not None and value.size == layout.size:
            flat = value.reshape(-1)
            bad = [
                layout.layer_names[i]
                for i in range(layout.num_layers)
                if any(not np.isfinite(flat[sl]).all() for sl in layout.layer_slices(i))
            ]
            kinds = ", ".join(
                k
                for k, hit in (("NaN", np.isnan(flat).any()), ("inf", np.isinf(flat).any()))
                if hit
            )
            shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
            detail = f": {kinds} in layer{'s' if len(bad) > 1 else ''} {shown}"
        raise AlgorithmError(
            f"algorithm {algorithm!r}: {where} left the server's model {name!r} not "
            f"finite{detail} (the round is not recorded; the run stops and keeps its last "
            "good checkpoint)"
        )


def finite_upload(result: ClientResult) -> bool:
    """Is everything the client uploaded (its weights and any arrays in ``extra``) finite?"""
    return all_finite(result.weights) and all_finite(result.extra)


class ServerAlgorithm(ABC):
    """Server side of an algorithm. Subclasses override what differs; only
    :meth:`aggregate_fit` must be written (a hierarchical algorithm's central server
    writes :meth:`aggregate_edges` instead and says so in its ``aggregate_fit``).

    Every class-level flag has the safe default: not personalised, no streaming, no
    dependence on emulated time, no edge side. Setting one that the code does not honour
    is what ``mecsim check`` (:mod:`mecsim.testing`) catches."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type[BaseModel]] = NoParams  # shared with the client side
    #: the edge-server side of a hierarchical algorithm; None: a flat algorithm
    Edge: ClassVar[type[EdgeAlgorithm] | None] = None
    round_metrics: ClassVar[tuple[str, ...]] = ()  # names of AggregateStats.metrics keys
    # True when the algorithm's decisions depend on emulated time (e.g. on which clients
    # a deadline dropped beyond the aggregation itself): replay then marks re-timed rounds
    # as inexact instead of reporting them as exact
    uses_emulated_time: ClassVar[bool] = False
    # True when the clients of a round download different bytes (a personalised model, a
    # group's model, per-batch gradients): K concurrent unicasts, not one broadcast. With
    # the Shannon channel's `downlink.mode: auto` the server's band is then time-shared
    # among the downloads (docs/channel.md)
    personalised_downloads: ClassVar[bool] = False
    #: True when :meth:`aggregate_fit` can be fed in parts, in client-id order
    #: (:meth:`begin_aggregate`, :meth:`fold` per part, :meth:`end_aggregate`), with the
    #: same result: the run loop then streams the uploads into the aggregate while the
    #: clients train, instead of holding them all (``execution.stream_aggregation``)
    streams_aggregation: ClassVar[bool] = False
    #: True when the server's own code drives the rounds (a Flower ServerApp): after the
    #: round's aggregation the run loop asks :meth:`select` again, within the same round,
    #: and plans, executes, times and aggregates each further batch it returns (e.g. a
    #: strategy's evaluate messages) until it returns none; the clients' accuracies then
    #: come from those batches (``ClientResult.extra["flower_accuracy"]`` and
    #: ``["flower_loss"]``), not from :meth:`ClientAlgorithm.evaluate`. A further batch
    #: whose tasks carry :data:`ROUND_STAGE` in their config is a stage of the round's
    #: training (SecAgg+'s key exchange, masked vectors, unmasking): it is charged in the
    #: round's own columns (time, bytes, FLOPs, energy), not beside it
    drives_rounds: ClassVar[bool] = False
    #: False when the server's state cannot be checkpointed (say why in
    #: :attr:`checkpoint_refusal`): a scenario with ``checkpoint.every`` > 0 is refused
    #: before it starts
    checkpointable: ClassVar[bool] = True
    checkpoint_refusal: ClassVar[str] = ""

    def __init__(
        self,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
    ) -> None:
        self.layout = layout
        self.weights = init_weights.copy()  # the global model
        self.client_samples = dict(client_samples)
        self.fraction = fraction
        self.params = self.Params(**params)
        # client -> edge server; the run loop sets the scenario's topology after construction
        self.edge_server_of: dict[int, int] = dict.fromkeys(self.client_samples, 0)
        # the edge servers of a hierarchical algorithm (each an EdgeServer), set by the
        # run loop when clients move (edge_server_of then changes round by round: the
        # round's serving edge servers); None: those in edge_server_of
        self.edge_server_ids: list[int] | None = None
        # the scenario seed, set by the run loop after construction: an algorithm that draws
        # at random (e.g. KAPC's initial relation cube) derives its own stream from it
        self.seed = 0
        # the run's number of rounds (scenario.rounds), set by the run loop after
        # construction; None when unknown (a server built on its own, e.g. in a test)
        self.rounds: int | None = None

    #: attributes set from the construction arguments (the scenario): not checkpointed
    static_attributes: ClassVar[tuple[str, ...]] = (
        "layout",
        "params",
        "client_samples",
        "fraction",
        "edge_server_of",
        "edge_server_ids",
        "seed",
        "rounds",
    )

    def state_dict(self) -> dict[str, Any]:
        """Everything the server keeps between rounds, for a checkpoint.

        By default every attribute but :attr:`static_attributes` (an algorithm's state is
        its attributes: arrays, numbers, dicts, lists, small dataclasses; see
        :mod:`mecsim.agents.state`). Override both methods if an algorithm holds anything else.
        """
        return {k: v for k, v in vars(self).items() if k not in self.static_attributes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (on an instance built from the same
        scenario)."""
        for key, value in state.items():
            setattr(self, key, value)

    def close(self) -> None:  # noqa: B027 - a hook: most algorithms hold nothing more
        """Let go of what the server holds besides its state (a thread, a process), when
        the run ends. Nothing by default."""

    @classmethod
    def check_scenario(
        cls,
        params: Any,
        *,
        train: TrainConfig,
        model: nn.Module,
        layout: ModelLayout,
        clients: int,
        participation: float,
    ) -> list[tuple[str, str]]:
        """What this algorithm cannot run with in the rest of the scenario, found before
        anything starts (``mecsim validate`` and the pre-flight of ``mecsim run``):
        ``(field, message)`` pairs, the field a dotted scenario path. ``params`` is the
        validated :attr:`Params`, ``model`` a fresh model for the scenario's data. The
        default finds nothing."""
        return []

    @classmethod
    def run_notes(cls, rows: list[dict[str, Any]], params: Any) -> list[str]:
        """Warnings about a run, read from its round rows (``rounds.csv``), printed under
        its summary and report tables: e.g. a mechanism of the algorithm that never acted.
        None by default."""
        return []

    def select(self, rnd: int, rng: np.random.Generator) -> list[int]:
        """Uniform sampling without replacement of max(1, round(fraction * N)) clients."""
        ids = np.array(sorted(self.client_samples))
        k = max(1, int(round(self.fraction * len(ids))))
        if k >= len(ids):
            return ids.tolist()
        return sorted(rng.choice(ids, size=k, replace=False).tolist())

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        return [ClientTask(c, self.weights, self.layout.nbytes) for c in selected]

    def models(self) -> dict[str, Any]:
        """The models the server keeps and hands its clients, by name: the global model
        (``weights``) by default. An algorithm that keeps more (group, cluster or
        personalised models) names them too. After every aggregation the server checks
        that each is finite (:func:`check_models`): a NaN or inf there fails the run,
        naming the algorithm and the round, before the round is recorded or
        checkpointed."""
        weights = getattr(self, "weights", None)
        return {} if weights is None else {"weights": weights}

    def upload_size(self) -> int | None:
        """How many values a client's upload holds (``ClientResult.weights``, when it
        uploads any): uploads of another size are refused before aggregation. The whole
        flat model by default; None when an algorithm's uploads vary (e.g. a selection
        of layers)."""
        return self.layout.size

    @abstractmethod
    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        """Aggregate the round's results (those that made the deadline and are finite,
        in client-id order; maybe none) into the server's state, e.g. ``self.weights``;
        returns the aggregation's FLOPs and the algorithm's own round metrics."""

    @classmethod
    def aggregates_in_parts(cls) -> bool:
        """:attr:`streams_aggregation`, as the class that last defined the aggregation
        says: a subclass that overrides :meth:`aggregate_fit` (e.g. k-means clustering
        over FedAvg) does not stream unless it sets the flag again itself."""
        for klass in cls.__mro__:
            own = vars(klass)
            if "aggregate_fit" in own or "streams_aggregation" in own:
                return bool(own.get("streams_aggregation", False))
        return False

    def begin_aggregate(self, rnd: int) -> Any:
        """A streaming aggregation's accumulator (``streams_aggregation`` only)."""
        raise NotImplementedError

    def fold(self, acc: Any, results: list[ClientResult]) -> None:
        """Add these results (the next ones in client-id order) to the accumulator."""
        raise NotImplementedError

    def fold_finite(self, acc: Any, results: list[ClientResult]) -> list[int]:
        """:meth:`fold` of the results whose uploads are finite (see :func:`finite_upload`);
        returns the client ids of the others, which are left out. An algorithm may
        override it to check while it folds (FedAvg: one pass over each upload)."""
        rejected = [r.client_id for r in results if not finite_upload(r)]
        self.fold(acc, [r for r in results if r.client_id not in rejected])
        return rejected

    def end_aggregate(self, rnd: int, acc: Any) -> AggregateStats:
        """Finish the round's aggregation from the accumulator, as :meth:`aggregate_fit`."""
        raise NotImplementedError

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        """Which model each client evaluates (the global one, by default)."""
        return [ClientTask(c, self.weights, 0) for c in clients]

    # hierarchical algorithms only (``Edge`` set): the central server's side

    def configure_edges(self, rnd: int) -> dict[int, Any]:
        """What the central server sends each edge server before the round's tasks
        (``EdgeAlgorithm.configure_fit``'s ``downlink``; an edge server not named gets
        None)."""
        return {}

    def aggregate_edges(
        self, rnd: int, results: list[ClientResult], reports: dict[int, EdgeReport]
    ) -> AggregateStats:
        """The central server's aggregation, from every edge server's report; ``results``
        are the aggregated clients' results without their uploads (counts, op-traces)."""
        raise NotImplementedError

    def legacy_edge_states(self, state: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Edge servers' states kept in the server's state by checkpoints written before
        the edge servers had states of their own: taken out of ``state`` (decoded) and
        returned by edge server. None by default."""
        return {}


class ClientAlgorithm(ABC):
    """Client side of an algorithm: local training (:meth:`fit`, the one method that
    must be written) and evaluation."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type[BaseModel]] = NoParams  # the same class as the server side's
    #: Set (by a class itself: it is not inherited, see :meth:`movable`) when the
    #: algorithm's clients keep nothing between rounds (``ctx.state`` stays empty), so
    #: that any host can train any of them with the same result.
    keeps_no_state: ClassVar[bool] = False
    #: True when every fit uploads the whole flat model (``result.weights``, as many values
    #: as ``task.weights``) as the op-trace's one ``Upload`` of its ``nbytes``: a scenario's
    #: ``compressor`` may then encode the update against ``task.weights``
    #: (docs/compressors.md). A scenario naming a compressor with another algorithm is
    #: refused before it starts.
    compressible_uploads: ClassVar[bool] = False
    #: The ``what`` of op-trace ``Compute`` / ``ServerCompute`` ops whose FLOPs the
    #: algorithm counts by hand for work that ``fit`` does not run under torch (numpy
    #: arithmetic, work the round's evaluation performs): the conformance kit's ``flops``
    #: property, which measures ``fit`` with torch's FLOP counter, leaves them out.
    hand_counted_flops: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = self.Params(**params)

    @classmethod
    def movable(cls) -> bool:
        """Whether a round may train this class's clients on hosts other than their own
        (to even out the hosts' work): only when the class itself says its clients keep
        no state, not a subclass that may keep some (FedProx over FedAvg)."""
        return bool(vars(cls).get("keeps_no_state", False))

    @abstractmethod
    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        """Train client ``ctx.client_id`` for one round from what ``task`` brought
        (``task.weights``; load them into ``ctx.model`` first: the model is shared by the
        host's clients) and return what it uploads with its op-trace
        (:func:`trained_result` builds the usual one). Draw randomness only from
        ``ctx.generator``; keep what must outlive the round in ``ctx.state``."""

    def call_name(self, task: ClientTask) -> str:
        """What :meth:`fit` of ``task`` is called in errors (``fit``; a Flower client:
        the ClientApp's ``train`` or ``evaluate``)."""
        return "fit"

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> EvalResult:
        """(accuracy, loss) on the client's own test data of the model in ``task``.

        An algorithm may return a third element, ``{name: value}`` of its own per-client
        figures; the round row then carries ``mean_<name>`` over the evaluated clients,
        and each ``mean_<name>`` must be listed in the server class's ``round_metrics``.
        """
        if task.weights is not None:
            set_flat(ctx.model, ctx.layout, task.weights)
        return evaluate(ctx.model, ctx.x_test, ctx.y_test)


def local_sgd(ctx: ClientContext, extra_loss=None, cost_key: str = "") -> TrainStats:
    """Train ``ctx.model`` in place with the scenario's optimiser for E epochs (all its
    parameters that require grad: freeze a layer with ``requires_grad_(False)`` and
    restore it after). FLOPs and memory are measured on the first step of each batch
    size and kind of step and reused after (``cost_key``: see
    :func:`mecsim.agents.training.train_epochs`)."""
    t = ctx.train
    opt = model_optimizer(ctx.model, t.optimizer, t.lr, t.momentum, t.weight_decay)
    return train_epochs(
        ctx.model,
        opt,
        ctx.x_train,
        ctx.y_train,
        epochs=t.epochs,
        batch_size=t.batch_size,
        generator=ctx.generator,
        costs=ctx.costs,
        extra_loss=extra_loss,
        cost_key=cost_key,
    )


def standard_trace(download_nbytes: int, stats: TrainStats, upload_nbytes: int) -> OpTrace:
    """The op-trace of a classic FL round: receive, train, send (zero-byte ops omitted)."""
    ops: list = []
    if download_nbytes:
        ops.append(Download(download_nbytes))
    ops.append(Compute(stats.flops, stats.steps))
    if upload_nbytes:
        ops.append(Upload(upload_nbytes))
    return tuple(ops)


def trained_result(
    ctx: ClientContext,
    stats: TrainStats,
    *,
    weights: np.ndarray | None,
    upload_nbytes: int,
    download_nbytes: int,
    started_at: float,
    extra: dict[str, Any] | None = None,
) -> ClientResult:
    """The result of a classic FL client round: ``stats`` of its local training, the
    standard receive-train-send op-trace, and the host time since ``started_at``
    (a ``time.perf_counter()`` reading)."""
    return ClientResult(
        client_id=ctx.client_id,
        weights=weights,
        upload_nbytes=upload_nbytes,
        num_samples=int(ctx.y_train.shape[0]),
        train_loss=stats.mean_loss,
        trace=standard_trace(download_nbytes, stats, upload_nbytes),
        flops=stats.flops,
        steps=stats.steps,
        peak_memory_bytes=stats.peak_memory_bytes,
        host_seconds=time.perf_counter() - started_at,
        extra=dict(extra or {}),
    )
