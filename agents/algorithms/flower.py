"""Flower apps on mecsim: a Flower ServerApp drives the rounds, mecsim runs its messages.

``algorithm: {name: flower, params: {app: path/to/app}}`` runs a Flower app written
with Flower's Message API (a ``ServerApp`` whose strategy sends ``train`` and
``evaluate`` messages through a ``Grid``; a ``ClientApp`` with ``@app.train()`` and
``@app.evaluate()``) unchanged on mecsim's emulated MEC network:

* the ServerApp runs in a thread of the central server's process; the :class:`Grid`
  mecsim gives it hands every batch of messages it sends (``send_and_receive``, or
  ``push_messages`` + ``pull_messages``) to mecsim's round loop and blocks until the
  replies are back;
* a batch of ``train`` messages is a mecsim round: each message is a task for its node's
  client, executed by the ClientApp on the client's host (in-process or a Ray actor),
  charged for the bytes of its records down and up, the FLOPs the ClientApp executed
  (``torch.utils.flop_counter``), the device's CPU time and energy and the channel's air
  time; then the replies that made it go back to the strategy, and a client the emulated
  network or device dropped gets an error reply (Flower's strategies leave those out);
* the batches the strategy sends after it and before its next ``train`` batch (its
  ``evaluate`` messages) are executed in the same round, timed on the round's links
  after the aggregation, and reported in the round's ``eval_*`` columns; each client's
  accuracy and loss come from its evaluate reply's metrics.

Flower node ids map to mecsim clients deterministically from the scenario seed (client
``i`` is the node of ``partition-id`` ``i``, ``num-partitions`` = the scenario's
clients). What Flower's strategies draw at random (``random.sample`` of nodes) is drawn
from Python's ``random`` seeded from the scenario seed and kept apart from the clients'
draws, so a run is the same on every backend.

Flower is optional (``pip install "mecsim[flower]"``); this module imports it only when a
scenario names the algorithm. The thread, the queues and the Grid are in
:mod:`mecsim.agents.algorithms.flower_bridge`, what both sides share in
:mod:`mecsim.agents.algorithms.flower_app`.
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    ServerAlgorithm,
)
from mecsim.agents.algorithms.flower_app import (
    FlowerApp,
    FlowerAppError,
    FlowerParams,
    node_ids,
    resolve_app,
)
from mecsim.emulation.ops import Compute, Download, Upload


class FlowerServer(ServerAlgorithm):
    """The central server's side: the ServerApp's thread and the batches it sends.

    A mecsim round is one batch of ``train`` messages plus the batches that follow it
    before the next ``train`` batch (``select`` is asked again within the same round for
    them: :attr:`drives_rounds`)."""

    name = "flower"
    Params = FlowerParams
    #: Flower messages go to each node on its own: K unicasts, not a broadcast
    personalised_downloads = True
    drives_rounds = True
    checkpointable = False
    checkpoint_refusal = (
        "a Flower ServerApp's state (its main function's running frame: the strategy, "
        "the global arrays) cannot be checkpointed"
    )
    round_metrics = (
        "eval_clients",
        "eval_time_s",
        "eval_bytes_down",
        "eval_bytes_up",
        "eval_gflops",
        # the clients' evaluate replies' accuracy weighted by their examples (Flower's
        # own aggregate_evaluate); mean_accuracy is unweighted, one vote a client
        "eval_accuracy_weighted",
        # the ServerApp's centralised evaluation after the round (its strategy's
        # evaluate_fn), when it has one
        "central_accuracy",
        "central_loss",
    )
    static_attributes = (*ServerAlgorithm.static_attributes, "_bridge", "_app")

    def __init__(self, layout, init_weights, client_samples, fraction, params) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        self._bridge: Any = None
        self._app: FlowerApp | None = None

    @classmethod
    def check_scenario(cls, params, *, train, model, layout, clients, participation):
        try:
            app = resolve_app(params, None)
            # deferred: flwr, an optional dependency
            from mecsim.agents.algorithms.flower_bridge import load_components

            load_components(app)
        except FlowerAppError as exc:
            field, sep, rest = str(exc).partition(": ")
            if sep and field.startswith("algorithm."):
                return [(field, rest)]
            return [("algorithm.name", str(exc))]
        if clients < 1:
            return [("topology.clients", "a Flower app needs at least one client")]
        return []

    def _start(self) -> Any:
        # deferred: flwr, an optional dependency
        from mecsim.agents.algorithms.flower_bridge import Bridge

        params = cast(FlowerParams, self.params)
        self._app = resolve_app(params, self.rounds)
        nodes = node_ids(sorted(self.client_samples), self.seed)
        self._bridge = Bridge(self._app, nodes, self.seed, params.log_level)
        self._bridge.start()
        return self._bridge

    def select(self, rnd: int, rng: np.random.Generator) -> list[int]:
        bridge = self._bridge or self._start()
        return bridge.select(rnd)

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        return self._bridge.tasks(selected)

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        return []  # the ServerApp's evaluate messages are executed as a batch of the round

    def upload_size(self) -> int | None:
        return None  # the replies are Flower messages, not mecsim's flat model

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        """Hand the replies to the ServerApp (an error reply for each client that was
        sent a message and did not make it) and wait for its next batch or its end; the
        strategy's aggregation is the wait. FLOPs: a weighted sum of the replies'
        arrays, 2 per value per reply (the strategy's arithmetic is numpy, not counted)."""
        replies = {r.client_id: r.extra["flower_reply"] for r in results}
        values = sum(int(r.extra.get("flower_values", 0)) for r in results)
        self._bridge.answer(replies)
        # the strategy evaluates centrally (evaluate_fn) before its next round's train
        # messages: known once the app has sent them (or ended), i.e. now
        central = self._bridge.central.pop(rnd + 1, None)
        metrics: dict[str, float] = {}
        if central is not None:
            acc, loss = central
            metrics["central_accuracy"] = float("nan") if acc is None else acc
            metrics["central_loss"] = float("nan") if loss is None else loss
        return AggregateStats(flops=2.0 * values, metrics=metrics)

    def close(self) -> None:
        if self._bridge is not None:
            self._bridge.close()


class FlowerClient(ClientAlgorithm):
    """A client's side: its node's ClientApp, with its Flower ``Context`` kept between
    messages (``context.state``: stateful clients)."""

    name = "flower"
    Params = FlowerParams

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self._runner: Any = None

    def call_name(self, task: ClientTask) -> str:
        return f"the ClientApp's {task.config.get('flower_category', 'train')}"

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        if self._runner is None:
            # deferred: flwr, an optional dependency
            from mecsim.agents.algorithms.flower_bridge import ClientRunner

            self._runner = ClientRunner(cast(FlowerParams, self.params))
        start = time.perf_counter()
        out = self._runner.handle(ctx, task.config)
        what = "train" if out.category == "train" else "evaluate"
        trace = (
            Download(task.download_nbytes, what=f"{what}_message"),
            Compute(out.flops, out.steps, what=what),
            Upload(len(out.reply), what=f"{what}_reply"),
        )
        extra: dict[str, Any] = {"flower_reply": out.reply, "flower_values": out.values}
        if out.accuracy is not None:
            extra["flower_accuracy"] = out.accuracy
        if out.loss is not None:
            extra["flower_loss"] = out.loss
        return ClientResult(
            client_id=ctx.client_id,
            weights=None,
            upload_nbytes=len(out.reply),
            num_samples=out.num_examples,
            train_loss=out.train_loss,
            trace=trace,
            flops=out.flops,
            steps=out.steps,
            peak_memory_bytes=out.peak_memory_bytes,
            host_seconds=time.perf_counter() - start,
            extra=extra,
        )

    def evaluate(self, ctx: ClientContext, task: ClientTask):
        return (float("nan"), float("nan"))  # never asked: configure_evaluate plans nothing


#: registered as ``flower`` (:data:`mecsim.registry.ALGORITHMS`)
FLOWER: tuple[type[ServerAlgorithm], type[ClientAlgorithm]] = (FlowerServer, FlowerClient)
