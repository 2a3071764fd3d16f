"""The two sides of a Flower app on mecsim (see :mod:`mecsim.agents.algorithms.flower`).

:class:`Bridge` runs the ServerApp in a thread of the central server's process and hands
each batch of messages its strategy sends through :class:`MecsimGrid` to mecsim's round
loop, one batch at a time: the app's thread and the loop never run at once (each waits on
a queue for the other). :class:`ClientRunner` executes one message with a client's
ClientApp on the client's host and measures what it cost.

Imports Flower: only loaded when a scenario names the ``flower`` algorithm.
"""

from __future__ import annotations

import functools
import importlib
import logging
import queue
import random
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.flop_counter import FlopCounterMode

import mecsim.registry as registry
from mecsim.agents.algorithms.base import (
    ROUND_STAGE,
    AlgorithmError,
    ClientContext,
    ClientTask,
)
from mecsim.agents.algorithms.flower_app import (
    ACCURACY_KEYS,
    LOSS_KEYS,
    FlowerApp,
    FlowerAppError,
    FlowerParams,
    from_wire,
    reply_arrays_finite,
    reply_metric,
    to_wire,
)
from mecsim.agents.training import optimizer_step_flops

#: the Flower run id every message of a mecsim run carries
RUN_ID = 1
#: how often the ServerApp may ask for the node ids between two batches before mecsim
#: decides it waits for more nodes than the scenario has (Flower's sample_nodes asks
#: once a second while it waits)
MAX_NODE_POLLS = 5


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


_LOADED: dict[tuple[str, str, str | None], tuple[Any, Any]] = {}


def load_components(app: FlowerApp) -> tuple[ServerApp, ClientApp]:
    """The app's ServerApp and ClientApp objects (imported once per process; the app's
    folder, if any, is put on ``sys.path`` first, as ``flwr run`` does)."""
    field = "app" if app.app_dir is not None else None
    components = (
        ("serverapp", app.serverapp, ServerApp),
        ("clientapp", app.clientapp, ClientApp),
    )
    for name, ref, _ in components:  # where imports are refused (a service): before any
        try:
            registry.check_import(ref, f"algorithm.params.{field or name}")
        except registry.ImportRefused as exc:
            raise FlowerAppError(str(exc)) from None
    key = (app.serverapp, app.clientapp, app.app_dir)
    if key in _LOADED:
        return _LOADED[key]
    if app.app_dir is not None and app.app_dir not in sys.path:
        sys.path.insert(0, app.app_dir)
    loaded = []
    for name, ref, cls in components:
        where = f"algorithm.params.{field or name}"
        module_name, _, attr = ref.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the app's own import-time code (SystemExit too),
            # or a wrong name: one line naming the field
            raise FlowerAppError(f"{where}: cannot load {name} {ref!r}: {_one_line(exc)}") from None
        if not isinstance(obj, cls):
            raise FlowerAppError(
                f"{where}: {name} {ref!r} is a {type(obj).__name__}, not a Flower {cls.__name__}"
            )
        loaded.append(obj)
    # Flower's classic API (a ServerApp from server_fn, or from a config and a strategy
    # of flwr.server.strategy; a ClientApp from client_fn with a NumPyClient) runs too:
    # the strategy under Flower's DefaultWorkflow (see _run_classic), whose batches are
    # mecsim's. A Server object of the app's own runs its clients from threads of its
    # own, one message at a time, which mecsim's batches do not model
    if getattr(loaded[0], "_main", None) is None and getattr(loaded[0], "_server", None):
        raise FlowerAppError(
            f"algorithm.params.{field or 'serverapp'}: {app.serverapp!r} is a ServerApp "
            "with a Server of its own (ServerApp(server=...)), which sends its messages "
            "one client at a time from threads of its own; mecsim runs a classic "
            "ServerApp's strategy with Flower's DefaultWorkflow: give the ServerApp only "
            "its config and strategy (or a server_fn returning them)"
        )
    _LOADED[key] = (loaded[0], loaded[1])
    return _LOADED[key]


def _run_classic(server_app: ServerApp, grid: MecsimGrid, context: Context, clients: int) -> None:
    """A ServerApp of Flower's classic API (``ServerApp(server_fn=...)``, or
    ``ServerApp(config=..., strategy=...)``): its strategy runs under Flower's own
    ``DefaultWorkflow`` with a ``LegacyContext``, as Flower's ``start_grid`` would run it,
    except that each round's fit and evaluate instructions go out as one batch each
    (``grid.send_and_receive``), which mecsim times as one round; a ``Server`` of the
    app's own is refused (it messages one client at a time from its own threads)."""
    from contextlib import nullcontext

    from flwr.server import LegacyContext
    from flwr.server.workflow import DefaultWorkflow

    grid.classic = True  # Flower's node-updating thread polls the node ids for ever
    lifespan = getattr(server_app, "_lifespan", None)
    with lifespan(context) if lifespan is not None else nullcontext():
        server_fn = getattr(server_app, "_server_fn", None)
        if server_fn is not None:
            components = server_fn(context)
            server = getattr(components, "server", None)
            config = getattr(components, "config", None)
            strategy = getattr(components, "strategy", None)
            manager = getattr(components, "client_manager", None)
        else:
            server = getattr(server_app, "_server", None)
            config = getattr(server_app, "_config", None)
            strategy = getattr(server_app, "_strategy", None)
            manager = getattr(server_app, "_client_manager", None)
        if server is not None:
            raise FlowerAppError(
                "the ServerApp's server_fn returns a Server of its own "
                "(ServerAppComponents(server=...)), which sends its messages one client at "
                "a time from threads of its own; return only its config and strategy"
            )
        _check_min_clients(strategy, clients)
        if strategy is not None:
            _watch_classic_evaluate(strategy, grid)
        legacy = LegacyContext(
            context=context, config=config, strategy=strategy, client_manager=manager
        )
        DefaultWorkflow()(grid, legacy)


def _first(metrics: Any, keys: tuple[str, ...]) -> float | None:
    """The first of ``keys`` in ``metrics`` (a dict or a MetricRecord) that is a number."""
    for key in keys:
        value = metrics.get(key) if metrics is not None else None
        if isinstance(value, (int, float)):
            return float(value)
    return None


def _watch_classic_evaluate(strategy: Any, grid: MecsimGrid) -> None:
    """Keep what a classic strategy's centralised ``evaluate`` (its ``evaluate_fn``)
    returns, ``(loss, metrics)`` per server round, in the bridge."""
    original = strategy.evaluate

    def evaluate(server_round: int, parameters: Any) -> Any:
        res = original(server_round, parameters)
        if res is not None:
            loss, metrics = res
            grid._bridge.central[int(server_round)] = (
                _first(metrics, ACCURACY_KEYS),
                float(loss) if isinstance(loss, (int, float)) else None,
            )
        return res

    strategy.evaluate = evaluate


def _watch_evaluate_fn() -> None:
    """Keep what a Message-API strategy's ``evaluate_fn`` returns (the centralised
    evaluation: a MetricRecord per server round) in the bridge of the Grid it runs on:
    ``Strategy.start`` wrapped once per process, and so is the ``start`` of every
    subclass that overrides it (Flower's advanced-pytorch example's ``CustomFedAvg``
    runs its own round loop and never calls ``Strategy.start``), whether defined
    before this call or after (apps on other Grids: unchanged; a Grid the app wraps,
    passing attributes through, still counts as mecsim's)."""
    from flwr.serverapp.strategy import Strategy

    def subclasses(cls: type) -> list[type]:
        found: list[type] = []
        subs: list[type] = cls.__subclasses__()
        for sub in subs:
            found += [sub, *subclasses(sub)]
        return found

    for cls in (Strategy, *subclasses(Strategy)):
        if "start" in vars(cls):
            _watch_start(cls)
    if getattr(Strategy, "_mecsim_watch_subclasses", False):
        return

    def init_subclass(cls: Any, **kwargs: Any) -> None:
        super(Strategy, cls).__init_subclass__(**kwargs)
        if "start" in vars(cls):
            _watch_start(cls)

    Strategy.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    Strategy._mecsim_watch_subclasses = True  # type: ignore[attr-defined]


def _watch_start(cls: type) -> None:
    """Wrap ``cls.start`` (its own) so that its ``evaluate_fn`` keyword's results land in
    the bridge; once (an ``evaluate_fn`` already wrapped, as a subclass's ``start``
    passes it on to ``super().start``, is not wrapped again)."""
    original = vars(cls)["start"]
    if getattr(original, "_mecsim_watch", False):
        return

    def start(self: Any, grid: Any, *args: Any, **kwargs: Any) -> Any:
        fn = kwargs.get("evaluate_fn")
        # mecsim's Grid, or an app's wrapper of it that passes its attributes through
        bridge = getattr(grid, "_bridge", None)
        if isinstance(bridge, Bridge) and fn is not None and not hasattr(fn, "_mecsim"):

            def evaluate_fn(server_round: int, arrays: Any) -> Any:
                res = fn(server_round, arrays)
                if res is not None:
                    bridge.central[int(server_round)] = (
                        _first(res, ACCURACY_KEYS),
                        _first(res, LOSS_KEYS),
                    )
                return res

            evaluate_fn._mecsim = True  # type: ignore[attr-defined]
            kwargs["evaluate_fn"] = evaluate_fn
        return original(self, grid, *args, **kwargs)

    functools.update_wrapper(start, original, updated=())
    start._mecsim_watch = True  # type: ignore[attr-defined]
    cls.start = start  # type: ignore[attr-defined]


def _check_min_clients(strategy: Any, clients: int) -> None:
    """Refuse a classic strategy that waits for more clients than the scenario has (its
    client manager would wait for a day)."""
    seen = set()
    while strategy is not None and id(strategy) not in seen:
        seen.add(id(strategy))
        for attr in ("min_available_clients", "min_fit_clients", "min_evaluate_clients"):
            want = getattr(strategy, attr, None)
            if isinstance(want, int) and want > clients:
                raise FlowerAppError(
                    f"the strategy's {attr} is {want}, more than the scenario's {clients} "
                    "clients (topology.clients)"
                )
        strategy = getattr(strategy, "strategy", None)  # a wrapper's (DP) inner strategy


def _category(message: Message) -> str:
    return message.metadata.message_type.split(".")[0]


def _group(batch: dict[int, Message]) -> str:
    """The batch's ``group_id`` (Flower's server round: every workflow and strategy of
    Flower sets it to ``str(server_round)``), "" when its messages carry none or differ."""
    groups = {m.metadata.group_id for m in batch.values()}
    return groups.pop() if len(groups) == 1 else ""


def _records(message: Message) -> tuple[str, ...]:
    """The names of a message's records (arrays, metrics, configs), sorted: what tells
    messages of one kind that do different work apart (SecAgg+'s setup, share keys and
    unmask stages carry a config record only; its masked-vectors stage the model too)."""
    content = message.content
    return tuple(
        sorted(
            [f"a:{k}" for k in content.array_records]
            + [f"m:{k}" for k in content.metric_records]
            + [f"c:{k}" for k in content.config_records]
        )
    )


class _RunOver(BaseException):
    """Raised in the ServerApp's thread when mecsim's run ends before the app does (a
    BaseException, so that the app's own ``except Exception`` does not swallow it)."""


_RUN_OVER = object()


class Bridge:
    """The ServerApp's thread and the batches it sends (see the module docstring)."""

    def __init__(self, app: FlowerApp, nodes: dict[int, int], seed: int, log_level: str) -> None:
        self.app = app
        self.node_of = dict(nodes)
        self.client_of = {node: cid for cid, node in nodes.items()}
        self.seed = int(seed)
        self.log_level = log_level.upper()
        self._to_loop: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._to_app: queue.Queue[Any] = queue.Queue()
        self._pending: dict[int, Message] | None = None  # the app's next batch, by client
        self._batch: dict[int, Message] = {}  # the batch mecsim is executing
        # the round's train batches so far: the group_id of its first, its clients, and
        # whether the last batch was one of them (a further train batch of the same
        # group right after it is a stage of the round: SecAgg+'s)
        self._group = ""
        self._round_clients: set[int] = set()
        self._in_training = False
        self._stage = False  # the batch mecsim is executing is such a stage
        self._finished = False
        self._round = -1
        self._batches = 0
        self._thread: threading.Thread | None = None
        self.closed = False
        #: the server's centralised evaluation (a Message-API strategy's ``evaluate_fn``,
        #: a classic strategy's ``evaluate``) by Flower's server round: (accuracy, loss)
        self.central: dict[int, tuple[float | None, float | None]] = {}

    # ---- the app's thread

    def start(self) -> None:
        server_app, _ = load_components(self.app)
        logging.getLogger("flwr").setLevel(self.log_level)
        self._thread = threading.Thread(
            target=self._main, args=(server_app,), name="mecsim-flower-serverapp", daemon=True
        )
        self._thread.start()
        self._next()  # the first batch, or the app's end

    def _main(self, server_app: ServerApp) -> None:
        try:
            from flwr.supercore.task_identity import TaskIdentity
        except ImportError:  # pragma: no cover - Flower releases without it
            pass
        else:
            TaskIdentity.task_id = 1
            TaskIdentity.run_id = RUN_ID
            TaskIdentity.node_id = SUPERLINK_NODE_ID
        # what the strategy samples (random.sample of node ids) and the ServerApp draws
        # (its initial model): from the scenario seed
        random.seed(self.seed)
        np.random.seed(self.seed % 2**32)
        torch.manual_seed(self.seed)
        context = Context(
            run_id=RUN_ID,
            node_id=SUPERLINK_NODE_ID,
            node_config={},
            state=RecordDict(),
            run_config=dict(self.app.run_config),
        )
        grid = MecsimGrid(self)
        _watch_evaluate_fn()
        try:
            if getattr(server_app, "_main", None) is None:
                _run_classic(server_app, grid, context, len(self.node_of))
            else:
                server_app(grid=grid, context=context)
        except _RunOver:
            return
        except BaseException as exc:  # the app's own code: reported by the loop's side
            self._to_loop.put(("error", exc))
            return
        self._to_loop.put(("done", None))

    def exchange(self, messages: list[Message]) -> list[Message]:
        """In the app's thread: hand a batch to mecsim, wait for its replies. The global
        generators (Python's, numpy's, torch's) are the app's own across the wait: the
        clients' draws in between, in this process, do not move them, so the app draws
        the same in-process and under Ray."""
        states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self._to_loop.put(("batch", messages))
        replies = self._to_app.get()
        if replies is _RUN_OVER:
            raise _RunOver
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        return replies

    # ---- mecsim's side

    def _next(self) -> None:
        """Wait for the app's next batch (or its end, or its failure)."""
        assert self._thread is not None
        while True:
            try:
                kind, payload = self._to_loop.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise AlgorithmError(
                        "algorithm 'flower': the ServerApp's thread ended without a reply"
                    ) from None
        if kind == "error":
            raise AlgorithmError(
                f"algorithm 'flower': the ServerApp failed: {_one_line(payload)}"
            ) from payload
        if kind == "done":
            self._finished, self._pending = True, None
            return
        self._pending = self._by_client(payload)

    def _by_client(self, messages: list[Message]) -> dict[int, Message]:
        batch: dict[int, Message] = {}
        categories = {_category(m) for m in messages}
        if len(categories) > 1:
            raise AlgorithmError(
                f"algorithm 'flower': the ServerApp sent {' and '.join(sorted(categories))} "
                "messages in one batch; mecsim runs one kind of message per batch"
            )
        self._batches += 1
        for i, msg in enumerate(messages):
            node = msg.metadata.dst_node_id
            if node not in self.client_of:
                raise AlgorithmError(
                    f"algorithm 'flower': the ServerApp sent a message to node {node}, "
                    f"which is none of the scenario's {len(self.client_of)} clients' nodes"
                )
            cid = self.client_of[node]
            if cid in batch:
                raise AlgorithmError(
                    f"algorithm 'flower': the ServerApp sent two messages to node {node} "
                    "in one batch; mecsim runs one message per client per batch"
                )
            if not msg.metadata.message_id:
                msg.metadata.__dict__["_message_id"] = f"{self._batches}.{i}"
            batch[cid] = msg
        return batch

    def select(self, rnd: int) -> list[int]:
        """The clients of the round's next batch: at a round's start, its train batch;
        within the round, the batch that followed (none when the next is the next
        round's train batch, or the app has ended). A train batch right after the
        round's train batch, with the same ``group_id``, is a stage of the round (tasks
        marked :data:`ROUND_STAGE`): Flower's ``SecAggPlusWorkflow`` sends its four stages
        so, all ``group_id`` = the server round, and its next round under the next."""
        new_round = rnd != self._round
        pending = self._pending
        if pending is None:
            if new_round:
                raise AlgorithmError(
                    f"algorithm 'flower': the ServerApp ended after {rnd} rounds of train "
                    "messages, before the scenario's rounds (its num-server-rounds is the "
                    "scenario's rounds: does the ServerApp read it?)"
                )
            return []
        category = _category(next(iter(pending.values()))) if pending else "train"
        if new_round:
            if category != "train":
                hint = (
                    " (a classic strategy without initial_parameters asks a client for "
                    "them: give the strategy initial_parameters)"
                    if category == "get_parameters"
                    else ""
                )
                raise AlgorithmError(
                    f"algorithm 'flower': the ServerApp sent {category} messages before "
                    f"the train messages of round {rnd + 1}; a mecsim round starts with a "
                    f"batch of train messages{hint}"
                )
            self._round = rnd
            self._group = _group(pending)
            self._round_clients = set(pending)
            self._stage = False
        elif category == "train":
            # a stage of the round's training (SecAgg+'s share keys, collect masked
            # vectors, unmask) when it follows the round's train batches directly and
            # carries their group_id; any other train batch is the next round's
            if not (self._in_training and self._group and _group(pending) == self._group):
                return []
            strangers = sorted(set(pending) - self._round_clients)
            if strangers:
                raise AlgorithmError(
                    f"algorithm 'flower': the ServerApp sent a further batch of train "
                    f"messages of round {rnd + 1} (group_id {self._group!r}) to client "
                    f"{strangers[0]}, which its round's first train batch did not include; "
                    "mecsim charges a round's stages to the clients it selected"
                )
            self._stage = True
        else:
            self._stage = False
        self._in_training = category == "train"
        self._batch, self._pending = pending, None
        return sorted(pending)

    def tasks(self, selected: list[int]) -> list[ClientTask]:
        n = len(self.node_of)
        tasks = []
        for cid in selected:
            wire = to_wire(self._batch[cid])
            config = {
                "flower_message": wire,
                "flower_category": _category(self._batch[cid]),
                "flower_app": self.app,
                "node_id": self.node_of[cid],
                "num_partitions": n,
            }
            if self._stage:
                config[ROUND_STAGE] = True
            tasks.append(ClientTask(cid, None, len(wire), config=config))
        return tasks

    def answer(self, replies: dict[int, bytes]) -> None:
        """Give the batch's replies (as they came over the wire) to the app, an error
        reply for each client that gave none (dropped), and wait for its next batch."""
        out = []
        for i, (cid, msg) in enumerate(sorted(self._batch.items())):
            wire = replies.get(cid)
            if wire is not None:
                reply = from_wire(wire)
            else:
                reply = Message(
                    Error(
                        code=ErrorCode.NODE_UNAVAILABLE,
                        reason="mecsim: no reply: the client was dropped by the emulated "
                        "network or device (deadline, crash, dropout or outage)",
                    ),
                    reply_to=msg,
                )
            reply.metadata.__dict__["_message_id"] = f"{msg.metadata.message_id}.r{i}"
            out.append(reply)
        self._batch = {}
        self._to_app.put(out)
        self._next()

    def close(self) -> None:
        """End the app's thread if mecsim's run ended first."""
        self.closed = True
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._to_app.put(_RUN_OVER)
            thread.join(timeout=10.0)


class MecsimGrid(Grid):
    """The Grid a ServerApp talks to on mecsim: its messages go to mecsim's round loop."""

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._run = Run.create_empty(RUN_ID)
        self._pushed: list[Message] = []
        self._replies: dict[str, Message] = {}
        self._polls = 0
        #: a classic ServerApp's: Flower's node-updating thread polls every 5 s, and the
        #: client manager itself waits for the clients its strategy needs
        self.classic = False

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        if self._bridge.closed:  # ends Flower's node-updating thread of a classic app
            from flwr.supercore.run import RunNotRunningException

            raise RunNotRunningException
        # the app's own thread waiting for nodes (a strategy's sampling); a thread of
        # Flower's (DefaultWorkflow's node updates, from a Message-API main too) polls
        # as it pleases
        if threading.current_thread() is self._bridge._thread:
            self._polls += 1
        if self._polls > MAX_NODE_POLLS and not self.classic:
            raise RuntimeError(
                f"the ServerApp keeps asking for nodes: it waits for more than the "
                f"scenario's {len(self._bridge.node_of)} clients (topology.clients; the "
                "strategy's min_available_nodes?)"
            )
        return list(self._bridge.node_of.values())

    def _send(self, messages: list[Message]) -> list[Message]:
        self._polls = 0
        return self._bridge.exchange(messages)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            if not msg.metadata.message_id:
                msg.metadata.__dict__["_message_id"] = f"p{len(self._pushed)}.{id(msg)}"
            self._pushed.append(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self._pushed:
            batch, self._pushed = self._pushed, []
            for reply in self._send(batch):
                self._replies[reply.metadata.reply_to_message_id] = reply
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        batch = list(messages)
        if not batch:
            return []
        return self._send(batch)


class _Tally:
    """While a ClientApp runs: its optimizer steps, and its modules' forward calls with
    the elements of their tensor inputs (global hooks: cheap, one Python call per module
    call, unlike the FLOP counter's one per tensor operation)."""

    def __init__(self) -> None:
        self.steps = 0
        self.calls = 0
        self.elements = 0
        self.optimizer_flops = 0.0  # the steps' element-wise updates (not in the counter)
        self.uncounted: str | None = None  # an optimiser with no per-parameter count

    def _step(self, optimizer: Any, *_: Any) -> None:
        self.steps += 1
        try:
            self.optimizer_flops += optimizer_step_flops(optimizer)
        except ValueError:  # not SGD or Adam: its update is not charged (docs/flower.md)
            self.uncounted = type(optimizer).__name__

    def _forward(self, module: Any, args: Any) -> None:
        self.calls += 1
        self.elements += sum(a.numel() for a in args if isinstance(a, torch.Tensor))

    def __enter__(self) -> _Tally:
        self._hooks = [
            register_optimizer_step_post_hook(self._step),
            register_module_forward_pre_hook(self._forward),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for hook in self._hooks:
            hook.remove()

    def signature(self) -> tuple[int, int, int]:
        return (self.steps, self.calls, self.elements)


def _scaled_flops(counted: tuple[tuple[int, int, int], float], now: tuple[int, int, int]) -> float:
    """The FLOPs of a ClientApp call that was not counted, from the counted call of the
    same client and kind: the same when it did the same work (the same optimizer steps
    and modules' forward calls over as many input elements), else scaled by the input
    elements (a model's FLOPs grow with the samples it processes: exact for linear and
    convolution layers)."""
    signature, flops = counted
    if now == signature or signature[2] == 0:
        return flops
    return flops * now[2] / signature[2]


@dataclass
class Outcome:
    """What one ClientApp call cost and returned."""

    category: str
    reply: bytes  # as it goes over the wire (mecsim.agents.algorithms.flower_app.to_wire)
    flops: float
    steps: int
    values: int  # floating-point values in the reply's arrays
    num_examples: int
    train_loss: float
    accuracy: float | None
    loss: float | None
    peak_memory_bytes: int


class ClientRunner:
    """Executes a message with a client's ClientApp on its host."""

    def __init__(self, params: FlowerParams) -> None:
        self.params = params
        # (client, message category, the names of its records) -> the work signature and
        # FLOPs of the call that was counted (see _scaled_flops): SecAgg+'s stages are
        # all train messages, and only one of them (its arrays and config) trains
        self._counted: dict[
            tuple[int, str, tuple[str, ...]], tuple[tuple[int, int, int], float]
        ] = {}
        self._warned: set[str] = set()  # optimisers said to have no FLOP count

    def handle(self, ctx: ClientContext, config: dict[str, Any]) -> Outcome:
        """Execute the message in ``config`` (a task's) with the client's ClientApp."""
        app: FlowerApp = config["flower_app"]
        message = from_wire(config["flower_message"])
        _, client_app = load_components(app)
        if not self._counted:  # the first message on this host (setLevel clears caches)
            logging.getLogger("flwr").setLevel(self.params.log_level.upper())
        context = ctx.state.get("flower_context")
        if context is None:
            context = Context(
                run_id=RUN_ID,
                node_id=int(config["node_id"]),
                node_config={
                    "partition-id": ctx.client_id,
                    "num-partitions": int(config["num_partitions"]),
                },
                state=RecordDict(),
                run_config=dict(app.run_config),
            )
        # the ClientApp's own draws (numpy's and Python's global generators; torch's
        # is seeded by the host) come from the client's seed for the round
        seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator))
        random.seed(seed)
        np.random.seed(seed % 2**32)
        category = _category(message)
        with _Tally() as tally:
            key = (ctx.client_id, category, _records(message))
            counted = self._counted.get(key)
            if counted is None or self.params.flops == "every_message":
                with FlopCounterMode(display=False) as counter:
                    reply = client_app(message=message, context=context)
                flops = float(counter.get_total_flops())
                self._counted[key] = (tally.signature(), flops)
            else:
                reply = client_app(message=message, context=context)
                flops = _scaled_flops(counted, tally.signature())
        # the optimiser's element-wise updates, which the FLOP counter does not see, as
        # for built-in algorithms (optimizer_step_flops): every call, from the step hook
        flops += tally.optimizer_flops
        if tally.uncounted and tally.uncounted not in self._warned:
            self._warned.add(tally.uncounted)
            logging.getLogger(__name__).warning(
                "the ClientApp steps a %s, whose element-wise update mecsim has no FLOP "
                "count for (SGD and Adam have one): its updates are not charged",
                tally.uncounted,
            )
        if not isinstance(reply, Message):
            raise TypeError(f"the ClientApp returned a {type(reply).__name__}, not a Message")
        if reply.has_error():
            raise RuntimeError(f"the ClientApp replied with an error: {reply.error.reason}")
        if not reply_arrays_finite(reply):
            raise ValueError("the ClientApp's reply holds NaN or inf (in its arrays or metrics)")
        ctx.state["flower_context"] = context
        values = sum(
            int(np.prod(array.shape))
            for record in reply.content.array_records.values()
            for array in record.values()
        )
        num_examples = reply_metric(reply, ("num-examples", "num_examples"))
        train_loss = reply_metric(reply, ("train_loss", "loss")) if category == "train" else None
        return Outcome(
            category=category,
            reply=to_wire(reply),
            flops=flops,
            steps=tally.steps,
            values=values,
            num_examples=int(num_examples or 0),
            train_loss=float("nan") if train_loss is None else train_loss,
            accuracy=reply_metric(reply, ACCURACY_KEYS) if category != "train" else None,
            loss=reply_metric(reply, LOSS_KEYS) if category != "train" else None,
            # not measured: a ClientApp's tensors are its own (see docs/flower.md)
            peak_memory_bytes=0,
        )
