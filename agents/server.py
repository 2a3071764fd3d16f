"""The servers: the central server plans rounds and aggregates; an edge server of a
hierarchical algorithm keeps its own edge-level state and aggregates its own clients.

:class:`CentralServer` holds the algorithm's server side (``ServerAlgorithm``) and the
selection generator. A flat algorithm (FedAvg, KAPC, ...) has nothing else: its one
server does everything. A hierarchical one (PHSFL, HSFL: ``ServerAlgorithm.Edge`` set)
also has one :class:`EdgeServer` per edge server, holding that edge server's side
(``EdgeAlgorithm``): it fills in what its clients download, fetches their uploads and
aggregates them, and reports to the central server.

Plain classes; :mod:`mecsim.run.backends` runs each as a Ray actor (its own process, so its
resident memory is that server's memory, measured with psutil as the KAPC paper does) or
all of them in-process for tests.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import psutil

import mecsim.registry as registry
from mecsim.agents.algorithms import (
    AggregateStats,
    ClientResult,
    ClientTask,
    EdgeReport,
    algorithm_classes,
)
from mecsim.agents.algorithms.base import (
    call_user,
    check_models,
    check_upload,
    finite_upload,
    returned,
)
from mecsim.agents.models import ModelLayout
from mecsim.agents.state import BlobSink, decode, encode


@dataclass(frozen=True)
class AggregateReport:
    flops: float
    wall_s: float  # measured host seconds of the aggregation (hierarchical: the slowest
    # edge server's and the central server's)
    rss_bytes: int  # resident memory of the (central) server process after aggregating
    metrics: dict[str, float]  # the algorithm's own per-round figures
    rejected: tuple[int, ...] = ()  # clients whose upload held NaN or inf: not aggregated


@dataclass
class _Stream:
    """A streamed aggregation in progress (never checkpointed: it lives within a round)."""

    rnd: int
    acc: Any  # the algorithm's accumulator
    rejected: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    last_id: int = -1  # the last client folded: parts come in client-id order


class _ServerProcess:
    """What every server process has: uploads delivered by reference, a checkpointable
    state, its process id and resident memory."""

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    algorithm: Any  # the algorithm's server (ServerAlgorithm) or edge (EdgeAlgorithm) side
    algorithm_name = ""
    call_timeout_s: float | None = None  # each call into the algorithm's code, at most

    def _call(self, where: str, rnd: int, fn: Any, *args: Any) -> Any:
        """A call into the algorithm's code: named in errors, bounded in time
        (:func:`~mecsim.agents.algorithms.base.call_user`)."""
        return call_user(
            self.algorithm_name, where, fn, *args, rnd=rnd, timeout_s=self.call_timeout_s
        )

    def _check_uploads(self, results: list[ClientResult]) -> None:
        """Refuse uploads of the wrong shape or dtype before anything is aggregated
        (:func:`~mecsim.agents.algorithms.base.check_upload`: AlgorithmError, one line)."""
        size = self.algorithm.upload_size()
        for r in results:
            check_upload(self.algorithm_name, r, size)

    def _check_models(self, rnd: int, where: str) -> None:
        """The server's output, checked after it aggregated (:func:`check_models`)."""
        models = self._call("models", rnd, self.algorithm.models)
        check_models(
            self.algorithm_name, models, f"{where} of round {rnd + 1}", self.algorithm.layout
        )

    def fetch(self, uploads: list[Any]) -> list[Any]:
        """The uploads themselves, from what the hosts handed over (a hook: under Ray they
        are object-store references, fetched here as read-only zero-copy arrays)."""
        return uploads

    def _attach_uploads(
        self, results: list[ClientResult], weights_by_host: tuple[dict[int, Any], ...]
    ) -> None:
        """Put the uploads of ``results`` (the clients that made it) back in them, fetched
        from what the hosts delivered apart (see ClientHost.fit_split)."""
        refs = {cid: w for part in weights_by_host for cid, w in part.items()}
        wanted = [r.client_id for r in results if r.client_id in refs]
        fetched = dict(zip(wanted, self.fetch([refs[c] for c in wanted]), strict=True))
        for r in results:
            r.weights = fetched.get(r.client_id)

    def state_dict(
        self, known_blobs: set[str] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state, encoded for a checkpoint: (tree, new blobs). With ``known_blobs``
        (the digests a checkpoint folder holds), large arrays are references, and only
        those not yet stored come back as blobs."""
        sink = BlobSink(known_blobs) if known_blobs is not None else None
        tree = encode(self._state(), "server", sink)
        return tree, (sink.new if sink else {})

    def load_state_dict(self, encoded: dict[str, Any]) -> Any:  # None here; see CentralServer
        self._load(decode(encoded))

    def pid(self) -> int:
        return os.getpid()

    def rss_bytes(self) -> int:
        return int(psutil.Process(os.getpid()).memory_info().rss)


class CentralServer(_ServerProcess):
    """The algorithm's server side: selection, planning, (global) aggregation, evaluation.
    Of a flat algorithm, the one server (it is then the edge server itself)."""

    def __init__(
        self,
        algorithm: str,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
        seed: int,
        edge_server_of: dict[int, int] | None = None,
        plugins: registry.Portable | None = None,
        rounds: int | None = None,
        edge_server_ids: list[int] | None = None,
        call_timeout_s: float | None = None,
    ) -> None:
        registry.restore(plugins)  # plugin files and import-string folders of the driver
        server_cls, _ = algorithm_classes(algorithm)
        self.algorithm_name = algorithm
        self.call_timeout_s = call_timeout_s
        self.algorithm = server_cls(layout, init_weights, client_samples, fraction, params)
        if edge_server_of is not None:  # which edge server serves each client (topology)
            self.algorithm.edge_server_of = dict(edge_server_of)
        if edge_server_ids is not None:  # clients move: every edge server, each round
            self.algorithm.edge_server_ids = [int(b) for b in edge_server_ids]
        self.algorithm.seed = int(seed)
        self.algorithm.rounds = None if rounds is None else int(rounds)  # the run's length
        self._stream: _Stream | None = None  # a round's streamed aggregation, while it runs
        # selection draws come from their own stream of the scenario seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E1EC7]))
        self._available: list[int] | None = None  # the clients online (availability:)

    def associate(self, edge_server_of: dict[int, int]) -> None:
        """The round's serving edge server of every client (clients that move: the
        association at the round's start), before the round is planned: the algorithm
        groups the round's clients by it (``ServerAlgorithm.edge_server_of``)."""
        self.algorithm.edge_server_of = {int(c): int(b) for c, b in edge_server_of.items()}

    def available(self, clients: list[int] | None) -> None:
        """The clients online at the next round's start: :meth:`plan` selects among
        them only (None: among all)."""
        self._available = None if clients is None else [int(c) for c in clients]

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask], dict[int, Any]]:
        """(selected clients, their tasks, what each edge server is sent); of a
        hierarchical algorithm, the edge servers fill in the tasks (EdgeServer.plan).
        With clients :meth:`available`, the algorithm selects among them: it sees only
        their samples while it selects (an offline client is not selected)."""
        if self._available is None:
            selected = self._call("select", rnd, self.algorithm.select, rnd, self.rng)
        else:
            every = self.algorithm.client_samples
            online = set(self._available)
            self.algorithm.client_samples = {c: n for c, n in every.items() if c in online}
            try:
                selected = self._call("select", rnd, self.algorithm.select, rnd, self.rng)
            finally:
                self.algorithm.client_samples = every
        tasks = self._call("configure_fit", rnd, self.algorithm.configure_fit, rnd, selected)
        returned(self.algorithm_name, "configure_fit", rnd, tasks, list)
        downlinks = (
            self._call("configure_edges", rnd, self.algorithm.configure_edges, rnd)
            if self.algorithm.Edge
            else {}
        )
        return selected, tasks, downlinks

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        """Aggregate the results whose uploads are finite; an update holding any NaN or
        inf (a diverged client) is rejected, never aggregated. With every update
        rejected the algorithm aggregates nothing and its model stays as it was."""
        self._check_uploads(results)
        rejected = tuple(sorted(r.client_id for r in results if not finite_upload(r)))
        kept = [r for r in results if r.client_id not in rejected]
        start = time.perf_counter()
        stats = self._call(
            "aggregate_fit",
            rnd,
            self.algorithm.aggregate_fit,
            rnd,
            sorted(kept, key=lambda r: r.client_id),
        )
        returned(self.algorithm_name, "aggregate_fit", rnd, stats, AggregateStats)
        wall = time.perf_counter() - start
        self._check_models(rnd, "aggregate_fit")
        return AggregateReport(stats.flops, wall, self.rss_bytes(), dict(stats.metrics), rejected)

    def aggregate_split(
        self, rnd: int, results: list[ClientResult], *weights_by_host: dict[int, Any]
    ) -> AggregateReport:
        """:meth:`aggregate` with the uploads delivered apart (see ClientHost.fit_split);
        only the uploads of ``results`` (the clients that made it) are fetched."""
        self._attach_uploads(results, weights_by_host)
        return self.aggregate(rnd, results)

    # streaming aggregation (ServerAlgorithm.streams_aggregation): the uploads are folded
    # into the aggregate in parts, in client-id order, while the clients still train

    def stream_begin(self, rnd: int) -> None:
        """Start the round's streamed aggregation (any unfinished one is dropped)."""
        acc = self._call("begin_aggregate", rnd, self.algorithm.begin_aggregate, rnd)
        self._stream = _Stream(rnd, acc)

    def stream_fold(self, rnd: int, keep: frozenset[int], results: list[ClientResult]) -> int:
        """Fold the uploads of ``results`` whose clients are in ``keep`` (those the round
        will aggregate), in client-id order after every earlier part's; an upload holding
        NaN or inf is rejected, as in :meth:`aggregate`. Each folded upload is let go.
        Returns how many were folded."""
        stream = self._stream
        if stream is None or stream.rnd != rnd:
            raise RuntimeError(f"round {rnd}: no streamed aggregation was begun")
        part = sorted((r for r in results if r.client_id in keep), key=lambda r: r.client_id)
        if part and part[0].client_id <= stream.last_id:
            raise RuntimeError(
                f"round {rnd}: client {part[0].client_id} folded out of "
                f"client-id order (after {stream.last_id})"
            )
        self._check_uploads(part)
        start = time.perf_counter()
        rejected = self._call("fold", rnd, self.algorithm.fold_finite, stream.acc, part)
        stream.rejected += rejected
        stream.wall_s += time.perf_counter() - start
        if part:
            stream.last_id = part[-1].client_id
        for r in results:
            r.weights = None
        return len(part) - len(rejected)

    def stream_fold_split(
        self, rnd: int, keep: frozenset[int] | None, n_hosts: int, *parts: Any
    ) -> int:
        """:meth:`stream_fold` of one part from ``n_hosts`` hosts: their results (as
        ClientHost.fit_split returns them) then their uploads, by reference. ``keep``
        None: every client of the part."""
        results = [r for part in parts[:n_hosts] for r in part]
        if keep is None:
            keep = frozenset(r.client_id for r in results)
        wanted = [r for r in results if r.client_id in keep]
        self._attach_uploads(wanted, parts[n_hosts:])
        return self.stream_fold(rnd, keep, wanted)

    def stream_end(self, rnd: int) -> AggregateReport:
        """Finish the streamed aggregation: the report :meth:`aggregate` would give."""
        stream, self._stream = self._stream, None
        if stream is None or stream.rnd != rnd:
            raise RuntimeError(f"round {rnd}: no streamed aggregation was begun")
        start = time.perf_counter()
        stats = self._call("end_aggregate", rnd, self.algorithm.end_aggregate, rnd, stream.acc)
        returned(self.algorithm_name, "end_aggregate", rnd, stats, AggregateStats)
        wall = stream.wall_s + time.perf_counter() - start
        self._check_models(rnd, "end_aggregate")
        return AggregateReport(
            stats.flops, wall, self.rss_bytes(), dict(stats.metrics), tuple(sorted(stream.rejected))
        )

    def aggregate_edges(
        self, rnd: int, results: list[ClientResult], *reports: EdgeReport
    ) -> AggregateReport:
        """A hierarchical algorithm's central aggregation, from the edge servers' reports
        (one per edge server, in edge-server order); ``results`` are every client's that
        made it, without uploads. The clients an edge server rejected are left out."""
        by_server = dict(zip(self.edge_servers(), reports, strict=True))
        rejected = tuple(sorted(c for rep in reports for c in rep.rejected))
        kept = sorted(
            (r for r in results if r.client_id not in rejected), key=lambda r: r.client_id
        )
        start = time.perf_counter()
        stats = self._call(
            "aggregate_edges", rnd, self.algorithm.aggregate_edges, rnd, kept, by_server
        )
        returned(self.algorithm_name, "aggregate_edges", rnd, stats, AggregateStats)
        # the edge servers aggregate side by side: the slowest one, then the central one
        wall = time.perf_counter() - start + max((rep.wall_s for rep in reports), default=0.0)
        self._check_models(rnd, "aggregate_edges")
        return AggregateReport(stats.flops, wall, self.rss_bytes(), dict(stats.metrics), rejected)

    def edge_servers(self) -> list[int]:
        """The edge servers (each an EdgeServer), in order: those serving clients, or,
        when clients move, every one of the topology."""
        if self.algorithm.edge_server_ids is not None:
            return list(self.algorithm.edge_server_ids)
        return sorted(set(self.algorithm.edge_server_of.values()))

    def _state(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm.state_dict(), "rng": self.rng}

    def _load(self, state: dict[str, Any]) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
        self.rng = state["rng"]

    def load_state_dict(self, encoded: dict[str, Any]) -> dict[int, Any]:
        """Restore the state; returns the edge servers' states (encoded) that a checkpoint
        written before they had states of their own kept in the algorithm's (else {})."""
        state = decode(encoded)
        legacy = (
            self.algorithm.legacy_edge_states(state["algorithm"]) if self.algorithm.Edge else {}
        )
        self._load(state)
        return {b: encode({"algorithm": st}, "edge") for b, st in legacy.items()}

    def evaluation_tasks(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        tasks = self._call(
            "configure_evaluate", rnd, self.algorithm.configure_evaluate, rnd, clients
        )
        returned(self.algorithm_name, "configure_evaluate", rnd, tasks, list)
        return tasks

    def close(self) -> None:
        """The run is over: the algorithm lets go of what it holds (see
        :meth:`ServerAlgorithm.close`)."""
        self.algorithm.close()


class EdgeServer(_ServerProcess):
    """One edge server of a hierarchical algorithm: its ``EdgeAlgorithm``, built from the
    same arguments as the central server, for the clients it serves."""

    def __init__(
        self,
        edge_server: int,
        algorithm: str,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
        seed: int,
        edge_server_of: dict[int, int] | None = None,
        plugins: registry.Portable | None = None,
        rounds: int | None = None,  # the central server's business; accepted with the rest
        edge_server_ids: list[int] | None = None,  # likewise
        call_timeout_s: float | None = None,
    ) -> None:
        registry.restore(plugins)
        self.call_timeout_s = call_timeout_s
        server_cls, _ = algorithm_classes(algorithm)
        if server_cls.Edge is None:
            raise ValueError(f"{algorithm} is a flat algorithm: it has no edge servers' side")
        serves = edge_server_of or dict.fromkeys(client_samples, 0)
        mine = {c: n for c, n in client_samples.items() if serves[c] == edge_server}
        self.edge_server = edge_server
        self.algorithm_name = algorithm
        self.algorithm = server_cls.Edge(edge_server, layout, mine, params)

    def plan(self, rnd: int, tasks: list[ClientTask], downlink: Any) -> list[ClientTask]:
        """Its clients' tasks with what it sends them filled in."""
        where = f"configure_fit of edge server {self.edge_server}"
        out = self._call(where, rnd, self.algorithm.configure_fit, rnd, tasks, downlink)
        returned(self.algorithm_name, where, rnd, out, list)
        return out

    def aggregate(self, rnd: int, results: list[ClientResult]) -> EdgeReport:
        """Aggregate its clients' results whose uploads are finite (as the central server
        of a flat algorithm does); the rejected ones are named in the report."""
        self._check_uploads(results)
        rejected = tuple(sorted(r.client_id for r in results if not finite_upload(r)))
        kept = sorted(
            (r for r in results if r.client_id not in rejected), key=lambda r: r.client_id
        )
        start = time.perf_counter()
        where = f"aggregate_fit of edge server {self.edge_server}"
        report = self._call(where, rnd, self.algorithm.aggregate_fit, rnd, kept)
        returned(self.algorithm_name, where, rnd, report, EdgeReport)
        wall = time.perf_counter() - start
        self._check_models(rnd, where)
        return replace(report, rejected=rejected, wall_s=wall)

    def aggregate_split(
        self, rnd: int, results: list[ClientResult], *weights_by_host: dict[int, Any]
    ) -> EdgeReport:
        """:meth:`aggregate` with the uploads delivered apart: it fetches its own
        clients' uploads, straight from the hosts' references."""
        self._attach_uploads(results, weights_by_host)
        return self.aggregate(rnd, results)

    def _state(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm.state_dict()}

    def _load(self, state: dict[str, Any]) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
