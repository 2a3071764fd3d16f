"""Client hosts: one process trains many virtual clients in turn.

A :class:`ClientHost` keeps, for each client it hosts, its data (normalised tensors) and
its private state between rounds (a personal model, optimiser moments, private layers:
whatever the algorithm stores in ``ctx.state``). One model instance is shared by all the
host's clients: a client's state is loaded into it before it trains. 100 clients never
mean 100 processes: the run loop places them on a small pool of hosts.

The class is plain Python; :mod:`mecsim.run.backends` wraps it in a Ray actor (or calls it
in-process for tests), so the same code runs in both.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

import mecsim.registry as registry
from mecsim.agents.algorithms import (
    AlgorithmError,
    ClientContext,
    ClientResult,
    ClientTask,
    TrainConfig,
    algorithm_classes,
)
from mecsim.agents.algorithms.base import call_user, check_upload
from mecsim.agents.compressors import RESIDUAL_KEY, compress_upload, compressor
from mecsim.agents.models import build_model, model_layout, store_flat
from mecsim.agents.state import BlobSink, decode, encode
from mecsim.agents.training import StepCosts
from mecsim.data import DataPools, normalise


@dataclass(frozen=True)
class HostSetup:
    """Everything a host needs to build its clients (sent once, when it starts)."""

    model_name: str
    in_shape: tuple[int, int, int]
    num_classes: int
    algorithm: str
    algorithm_params: dict[str, Any]
    train: TrainConfig
    seed: int
    init_weights: np.ndarray
    torch_threads: int = 1
    plugins: registry.Portable | None = None  # the driver's plugin files (registry.portable)
    call_timeout_s: float | None = None  # each call into the algorithm's code, at most
    compressor: str | None = None  # what uploads become on the air (agents.compressors)
    compressor_params: dict[str, Any] | None = None

    def keeps_residual(self) -> bool:
        """Whether the compressor keeps a residual per client (error feedback): the
        clients then keep state, and are not lent to other hosts."""
        if self.compressor is None:
            return False
        return compressor(self.compressor, self.compressor_params).keeps_residual


def client_seed(seed: int, rnd: int, client_id: int, purpose: int = 0) -> int:
    """A 63-bit seed for (scenario seed, round, client): the same wherever the client runs."""
    state = np.random.SeedSequence([seed, rnd, client_id, purpose]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


class ClientHost:
    def __init__(
        self, setup: HostSetup, pools: DataPools, clients: dict[int, tuple[np.ndarray, np.ndarray]]
    ) -> None:
        torch.set_num_threads(setup.torch_threads)
        registry.restore(setup.plugins)
        self.setup = setup
        torch.manual_seed(setup.seed)
        self.model = build_model(setup.model_name, setup.in_shape, setup.num_classes)
        self.layout = model_layout(self.model)
        store_flat(self.model, self.layout)  # one copy to load or read a client's model
        self.costs = StepCosts()
        _, client_cls = algorithm_classes(setup.algorithm)
        self.algorithm = client_cls(setup.algorithm_params)
        # a host keeps the data set only if it may be lent clients (see fit)
        self.pools = pools if client_cls.movable() else None
        self.data: dict[int, tuple[torch.Tensor, ...]] = {}
        self.state: dict[int, dict[str, Any]] = {}
        self.compressor = (
            compressor(setup.compressor, setup.compressor_params)
            if setup.compressor is not None
            else None
        )
        # each client's error-feedback residual (its state, beside the algorithm's own)
        self.residuals: dict[int, np.ndarray] = {}
        self._guests: dict[int, tuple[torch.Tensor, ...]] = {}
        for cid, (train_idx, test_idx) in clients.items():
            self.data[cid] = self._client_data(pools, train_idx, test_idx)
            self.state[cid] = {}

    @staticmethod
    def _client_data(
        pools: DataPools, train_idx: np.ndarray, test_idx: np.ndarray
    ) -> tuple[torch.Tensor, ...]:
        name = pools.train.name
        return (
            normalise(pools.train.images[train_idx], name),
            torch.from_numpy(pools.train.labels[train_idx].astype(np.int64)),
            normalise(pools.test.images[test_idx], name),
            torch.from_numpy(pools.test.labels[test_idx].astype(np.int64)),
        )

    def _context(self, cid: int, rnd: int, purpose: int) -> ClientContext:
        if cid in self.data:
            (x_tr, y_tr, x_te, y_te), state = self.data[cid], self.state[cid]
        else:  # a guest (see fit): its data made for this call, no state to keep
            (x_tr, y_tr, x_te, y_te), state = self._guests[cid], {}
        gen = torch.Generator().manual_seed(client_seed(self.setup.seed, rnd, cid, purpose))
        return ClientContext(
            client_id=cid,
            model=self.model,
            layout=self.layout,
            x_train=x_tr,
            y_train=y_tr,
            x_test=x_te,
            y_test=y_te,
            state=state,
            train=self.setup.train,
            generator=gen,
            costs=self.costs,
            init_weights=self.setup.init_weights,
            upload_row=self.upload_row,
        )

    def upload_row(self) -> np.ndarray | None:
        """Where the client being trained may write its full-model upload (see
        :class:`~mecsim.agents.algorithms.base.ClientContext`): in-process, nowhere (None)."""
        return None

    def fit(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        guests: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> list[ClientResult]:
        """Train each task's client. For the clients in ``lost`` (an emulated crash) the
        work is lost: their private state is put back as it was before training.

        ``guests`` (client id -> its train and test sample indices) are clients another
        host keeps, lent to this one to even out a round's work; only an algorithm whose
        clients keep no state between rounds (:meth:`ClientAlgorithm.movable`) is given
        any, and a guest that leaves state behind stops the run."""
        if guests and self.pools is None:
            raise RuntimeError(
                f"algorithm {self.setup.algorithm!r}: its clients keep state "
                "and cannot be lent to another host"
            )
        # cast: pools is None only when there are no guests (checked above)
        self._guests = {
            cid: self._client_data(cast(DataPools, self.pools), *idx)
            for cid, idx in (guests or {}).items()
        }
        try:
            return [self._fit_one(rnd, task, lost) for task in tasks]
        finally:
            self._guests = {}

    def _fit_one(self, rnd: int, task: ClientTask, lost: frozenset[int]) -> ClientResult:
        cid = task.client_id
        guest = cid not in self.data
        saved = copy.deepcopy(self.state[cid]) if cid in lost and not guest else None
        ctx = self._context(cid, rnd, purpose=0)
        # CPU generator only: torch.manual_seed also seeds (lazily) every accelerator
        # backend, which costs ~1 ms a call
        torch.random.default_generator.manual_seed(
            client_seed(self.setup.seed, rnd, cid, purpose=1)
        )
        start = time.perf_counter()
        result = call_user(
            self.setup.algorithm,
            f"{self.algorithm.call_name(task)} of client {cid}",
            self.algorithm.fit,
            ctx,
            task,
            rnd=rnd,
            timeout_s=self.setup.call_timeout_s,
        )
        if not isinstance(result, ClientResult) or result.client_id != cid:
            raise AlgorithmError(
                f"algorithm {self.setup.algorithm!r}: {self.algorithm.call_name(task)} of "
                f"client {cid} in round {rnd + 1} returned "
                f"{type(result).__name__}"
                + (f" of client {result.client_id}" if isinstance(result, ClientResult) else "")
                + ", not its ClientResult"
            )
        check_upload(self.setup.algorithm, result, None)
        if self.compressor is not None:
            self._compress(rnd, task, result, lost)
        result.host_seconds = time.perf_counter() - start
        if guest and ctx.state:
            raise RuntimeError(
                f"client {cid} of algorithm {self.setup.algorithm!r} trained on a host "
                f"that does not keep it and left state behind ({sorted(ctx.state)}): "
                "its client class must not be movable"
            )
        if saved is not None:
            self.state[cid] = saved
        return self.detach(result)

    def _compress(
        self, rnd: int, task: ClientTask, result: ClientResult, lost: frozenset[int]
    ) -> None:
        """The upload as the scenario's compressor sends it (see
        :func:`~mecsim.agents.compressors.compress_upload`); the client's residual kept
        (error feedback) unless its work is lost."""
        assert self.compressor is not None and self.setup.compressor is not None
        cid = task.client_id
        keeps = self.compressor.keeps_residual
        _, residual = compress_upload(
            self.compressor,
            self.setup.compressor,
            self.setup.algorithm,
            rnd,
            task.weights,
            result,
            self.residuals.get(cid) if keeps else None,
            client_seed(self.setup.seed, rnd, cid, purpose=3),
        )
        if keeps and residual is not None and cid not in lost:
            self.residuals[cid] = residual

    def detach(self, result: ClientResult) -> ClientResult:
        """Called on each client's result as soon as it has trained: a hook for where the
        upload is kept until the server needs it (under Ray: the object store, so a host
        never holds more than one client's update). In-process: nothing to do."""
        return result

    def fit_split(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        guests: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> tuple[list[ClientResult], dict[int, np.ndarray]]:
        """:meth:`fit`, with the uploaded weights returned apart from the small rest.

        Under Ray the two parts become two objects: the run loop fetches only the small
        part (op-traces, counts) and hands the weights' reference to the edge server, so
        model updates travel host -> server once, not via the driver.
        """
        results = self.fit(rnd, tasks, lost, guests)
        weights = {}
        for r in results:
            if r.weights is not None:
                weights[r.client_id] = r.weights
                r.weights = None
        return results, weights

    def evaluate(self, rnd: int, tasks: list[ClientTask]) -> list[tuple[Any, ...]]:
        """(client_id, accuracy, loss, test samples[, extras]) for each task; ``extras``
        (a dict) only when the algorithm's evaluate returns one."""
        out: list[tuple[Any, ...]] = []
        for task in tasks:
            ctx = self._context(task.client_id, rnd, purpose=2)
            where = f"evaluate of client {task.client_id}"
            got = call_user(
                self.setup.algorithm,
                where,
                self.algorithm.evaluate,
                ctx,
                task,
                rnd=rnd,
                timeout_s=self.setup.call_timeout_s,
            )
            if not isinstance(got, tuple) or len(got) not in (2, 3):
                raise AlgorithmError(
                    f"algorithm {self.setup.algorithm!r}: {where} in round {rnd + 1} "
                    f"returned {type(got).__name__}, not (accuracy, loss[, extras])"
                )
            acc, loss, *extras = got
            out.append((task.client_id, acc, loss, int(ctx.y_test.shape[0]), *extras))
        return out

    def state_dict(
        self, known_blobs: set[str] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every hosted client's private state (``ctx.state``) and the host's cache of
        measured step costs, encoded for a checkpoint (see :mod:`mecsim.agents.state`): (tree,
        new blobs), as :meth:`mecsim.agents.server.CentralServer.state_dict`.

        The client algorithm object itself holds only what its parameters determine; the
        shared model instance is loaded with a client's state before each use.
        """
        sink = BlobSink(known_blobs) if known_blobs is not None else None
        clients: dict[int, dict[str, Any]] = self.state
        if self.residuals:  # error feedback: each client's residual beside its state
            clients = {
                cid: {**st, RESIDUAL_KEY: self.residuals[cid]} if cid in self.residuals else st
                for cid, st in self.state.items()
            }
        tree = encode({"clients": clients, "costs": self.costs._by_batch}, "host", sink)
        return tree, (sink.new if sink else {})

    def load_state_dict(self, encoded: dict[str, Any]) -> None:
        """Restore the states of this host's clients from a checkpoint holding (at least)
        them; clients the checkpoint does not name start empty."""
        state = decode(encoded)
        clients = state["clients"]
        self.state = {cid: dict(clients.get(cid, {})) for cid in self.state}
        self.residuals = {
            cid: np.asarray(st.pop(RESIDUAL_KEY), dtype=np.float32)
            for cid, st in self.state.items()
            if RESIDUAL_KEY in st
        }
        self.costs._by_batch = dict(state["costs"])

    def pid(self) -> int:
        return os.getpid()

    def rss_bytes(self) -> int:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
