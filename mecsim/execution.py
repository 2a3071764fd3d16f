"""Where clients and servers run: Ray actors, or in-process.

Both executors drive the same plain classes (:class:`agents.host.ClientHost`,
:class:`agents.server.CentralServer` and, for a hierarchical algorithm, one
:class:`agents.server.EdgeServer` per edge server) through the same steps; Ray is only a
thin wrapper around them, so a run gives the same records with either backend (a test
checks it).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from agents.algorithms import ClientResult, ClientTask, algorithm_classes
from agents.host import ClientHost, HostSetup
from agents.server import AggregateReport, CentralServer, EdgeServer
from agents.state import decode, encode
from mecsim import shared_model, shared_uploads
from mecsim.data import DataPools

ClientData = dict[int, tuple[np.ndarray, np.ndarray]]

#: Ray's switch for "this machine is not part of a cluster": Ray then takes the loopback
#: address as the node's address, and its GCS, raylet, object manager, workers and agents
#: listen on 127.0.0.1 only (checked with psutil in tests/test_ray_security.py).
RAY_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayAttachError(ValueError):
    """The Ray cluster named by ``execution.ray_address`` refused us (bad input: a setting)."""


def _attach(ray, kwargs: dict[str, Any], address: str) -> None:
    """``ray.init`` on an existing cluster; a token-authentication refusal becomes one
    clear line instead of Ray's chained tracebacks."""
    try:
        if _is_loopback_address(address):
            _init_ray_on_loopback(ray, kwargs)
        else:
            ray.init(**kwargs)
    except ConnectionError as exc:
        # Ray wraps the refusal (AuthenticationError: InvalidAuthToken) in a RuntimeError's
        # text, inside the ConnectionError
        chain, cause = [], exc
        while cause is not None and len(chain) < 10:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        if not any("InvalidAuthToken" in text or "AuthenticationError" in text
                   for text in chain):
            raise
        raise RayAttachError(
            f"execution.ray_address: the Ray cluster at {address} refused the connection "
            "(InvalidAuthToken): it uses token authentication; set RAY_AUTH_MODE=token and "
            "give this process the cluster's token (RAY_AUTH_TOKEN_PATH=FILE, RAY_AUTH_TOKEN, "
            "or ~/.ray/auth_token); see the README's Ray section") from None


def _is_loopback_address(address: str) -> bool:
    """Is ``[ray://]HOST:PORT`` on this machine's loopback interface?"""
    import ipaddress
    import socket

    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    try:
        infos = socket.getaddrinfo(host, None)
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
    except (OSError, ValueError):
        return False


def _init_ray_on_loopback(ray, kwargs: dict[str, Any]) -> None:
    """``ray.init`` for a Ray instance of our own, reachable from this machine only (or
    attaching to one on loopback: Ray would otherwise rewrite 127.0.0.1 to the machine's
    network address and look for the head there)."""
    from ray._private import ray_constants

    saved_env = os.environ.get(RAY_SINGLE_MACHINE_ENV)
    saved_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[RAY_SINGLE_MACHINE_ENV] = "0"  # inherited by the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # read when this process picks its address
    try:
        ray.init(**kwargs)
    finally:  # later attaches from this process to a real cluster are unaffected
        if saved_env is None:
            os.environ.pop(RAY_SINGLE_MACHINE_ENV, None)
        else:
            os.environ[RAY_SINGLE_MACHINE_ENV] = saved_env
        if saved_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const


#: Clients per part of a streamed aggregation: the hosts train a part's clients, the
#: server folds their uploads while the hosts train the next part (at most
#: :data:`STREAM_PARTS_IN_FLIGHT` parts' uploads exist at once).
STREAM_PART_CLIENTS = 256
STREAM_PARTS_IN_FLIGHT = 2
if shared_uploads.SLOTS < STREAM_PARTS_IN_FLIGHT:  # part p reuses the slot of part p - SLOTS
    raise ImportError("mecsim.shared_uploads.SLOTS < STREAM_PARTS_IN_FLIGHT")


def stream_parts(tasks: list[ClientTask], size: int | None = None
                 ) -> list[list[ClientTask]]:
    """The tasks in client-id order, cut into parts of ``size`` (default
    :data:`STREAM_PART_CLIENTS`)."""
    size = size or STREAM_PART_CLIENTS
    ordered = sorted(tasks, key=lambda t: t.client_id)
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


def balance_hosts(groups: dict[int, list[ClientTask]], work: dict[int, float],
                  n_hosts: int) -> dict[int, list[ClientTask]]:
    """Even out a host call's work: move a client from the busiest host to the least busy
    while that shortens the longer of the two (the client whose work is nearest half the
    gap, the lowest id among equals), so that a round with random participation does not
    wait for the host that happened to get most of the selected clients. ``work`` is a
    client's expected training steps (plus one for its fixed cost). Deterministic; each
    host's tasks in client-id order; hosts left without a task are not listed."""
    out = {h: sorted(groups.get(h, []), key=lambda t: t.client_id) for h in range(n_hosts)}
    load = {h: sum(work[t.client_id] for t in ts) for h, ts in out.items()}
    for _ in range(sum(len(ts) for ts in out.values())):
        hi = max(out, key=lambda h: (load[h], -h))
        lo = min(out, key=lambda h: (load[h], h))
        gap = load[hi] - load[lo]
        best = None
        for t in out[hi]:
            w = work[t.client_id]
            if 0 < w < gap and (best is None or
                                abs(gap / 2 - w) < abs(gap / 2 - work[best.client_id])):
                best = t
        if best is None:
            break
        w = work[best.client_id]
        out[hi].remove(best)
        out[lo].append(best)
        out[lo].sort(key=lambda t: t.client_id)
        load[hi] -= w
        load[lo] += w
    return {h: ts for h, ts in out.items() if ts}


#: How long the host actors may wait for room in the Ray cluster (when a run starts, or
#: after a node died) before the run stops with :class:`PlacementTimeout`.
PLACEMENT_TIMEOUT_S = 120.0

#: Ray counts resources in steps of 1/10,000.
_RAY_RESOURCE_STEP = 10_000


class PlacementTimeout(RuntimeError):
    """The Ray cluster had no room for the host actors within :data:`PLACEMENT_TIMEOUT_S`."""


def host_cpus(node_cpus: list[float], n_hosts: int) -> float:
    """CPUs each of ``n_hosts`` host actors asks for on nodes with ``node_cpus`` CPUs.

    One CPU when the nodes have room for a one-CPU actor per host; otherwise (e.g. after
    a node died) the largest share ``r`` that still fits all of them, a node with ``c`` CPUs
    holding ``floor(c / r)`` hosts: 2 hosts on one surviving 1-CPU node ask for 0.5 each,
    3 hosts on two 1-CPU nodes 0.5 each. Raises ValueError when the nodes have no CPU.
    """
    def fits(r: float) -> bool:
        return sum(math.floor(c / r + 1e-9) for c in node_cpus) >= n_hosts

    shares = {1.0} | {c / k for c in node_cpus if c > 0 for k in range(1, n_hosts + 1)}
    for share in sorted(shares, reverse=True):
        r = math.floor(min(share, 1.0) * _RAY_RESOURCE_STEP) / _RAY_RESOURCE_STEP
        if r > 0 and fits(r):
            return r
    raise ValueError(f"no CPU for {n_hosts} host actor(s) on nodes with {node_cpus} CPUs")


def _alive_node_cpus(ray) -> dict[str, float]:
    """``{node id: CPUs}`` of the cluster's live nodes, as the GCS knows them."""
    return {n["NodeID"]: float(n.get("Resources", {}).get("CPU", 0.0))
            for n in ray.nodes() if n.get("Alive")}


class ActorFailure(RuntimeError):
    """A Ray actor (a client host, an edge server or the central server) died mid-run:
    its process was killed, ran out of memory, or its node went away. The run loop
    re-creates the actors, restores them from the last checkpoint and re-executes from
    there."""


@dataclass
class ExecutorState:
    """Encoded state of the central server, of every client and of every edge server of a
    hierarchical algorithm (see :mod:`agents.state`); large arrays may be blob
    references, with the blobs not yet stored in ``blobs``."""

    server: Any
    clients: dict[int, Any]
    costs: Any
    blobs: dict[str, Any] = field(default_factory=dict)
    edges: dict[int, Any] = field(default_factory=dict)


def _collect(server: tuple[Any, dict], hosts: list[tuple[Any, dict]],
             edges: dict[int, tuple[Any, dict]]) -> ExecutorState:
    blobs = dict(server[1])
    for _, new in [*hosts, *edges.values()]:
        blobs.update(new)
    return ExecutorState(server[0],
                         {cid: st for tree, _ in hosts for cid, st in tree["clients"].items()},
                         _merge_costs([tree["costs"] for tree, _ in hosts]), blobs,
                         {b: tree for b, (tree, _) in edges.items()})


def _edge_ids(server_kwargs: dict[str, Any]) -> list[int]:
    """The edge servers that get a process of their own: those serving clients, when the
    algorithm is hierarchical (a flat algorithm's edge servers keep no state)."""
    server_cls, _ = algorithm_classes(server_kwargs["algorithm"])
    if server_cls.Edge is None:
        return []
    serves = server_kwargs.get("edge_server_of") or {}
    return sorted(set(serves.values())) or [0]


def _merge_costs(encoded: list[Any]) -> Any:
    merged: dict = {}
    for enc in encoded:
        merged.update(decode(enc))
    return encode(merged, "costs")


#: A host call whose clients' uploads together take at most this many bytes keeps them
#: until the call returns, then hands them over as one object (one copy into the object
#: store, ~0.02 ms per 2NN update); a larger call puts each upload in the store as soon as
#: its client has trained (~0.5-0.9 ms per 2NN update), so the host never holds more
#: than one. 64 MiB: 80 2NN updates (a 100-client round on 2 hosts is held); a streamed
#: part of 256 such clients (128 a host) is not, which keeps memory per selected client
#: where it was (held, 1,000 selected clients peaked ~0.7 GB higher).
HOLD_UPLOADS_BYTES = 64 * 2**20

#: Streamed uploads of a host on the central server's node go through a shared-memory
#: file instead of the object store (see :mod:`mecsim.shared_uploads`); same records.
SHARED_UPLOADS = True
#: Whether a flat algorithm's global model reaches hosts on the central server's node
#: through a shared-memory file (:mod:`mecsim.shared_model`), instead of the object store.
SHARED_MODEL = True


def _freeze_heap() -> None:
    """Exempt what an actor holds once set up (torch, numpy, its algorithm, its clients'
    data) from Python's garbage collector: a full collection otherwise walks all of it,
    ~0.1 s in a server actor, a stall of every round it falls in (measured: 100-client
    FedAvg rounds of 0.22 s took 0.36-0.43 s one round in three). Objects made later are
    collected as usual."""
    gc.collect()
    gc.freeze()


class ClientHostActor(ClientHost):
    """A client host in a Ray actor. The uploads of a call's clients reach the server that
    aggregates them (its edge server's actor, or the central one) through the object
    store, where that server reads them in place: together in one object when they fit in
    :data:`HOLD_UPLOADS_BYTES`, else each put there as soon as its client has trained, so
    that the host holds one update at a time. A streamed call to a host on the central
    server's node may instead name a slot of the host's shared-memory file
    (:mod:`mecsim.shared_uploads`): the uploads are written there and only where they are
    travels."""

    _hold_uploads = False
    _fitting = False  # within fit: upload_row hands out rows only then
    _upload_rows: np.ndarray = np.empty((0, 0), dtype=np.float32)
    _own_rows: np.ndarray = np.empty((0, 0), dtype=np.float32)

    def __init__(self, setup: HostSetup, pools: DataPools,
                 clients: dict[int, tuple[np.ndarray, np.ndarray]],
                 hold_uploads_bytes: int = HOLD_UPLOADS_BYTES,
                 uploads_path: str | None = None) -> None:
        super().__init__(setup, pools, clients)
        self.hold_uploads_bytes = hold_uploads_bytes
        self.uploads_path = uploads_path
        self._arena: shared_uploads.UploadArena | None = None
        self._slot: int | None = None  # the shared slot asked for by the current call
        self._shared = False  # whether this call's rows are in the shared file
        _freeze_heap()

    def _shared_rows(self, slot: int, n_rows: int) -> np.ndarray | None:
        """Rows in slot ``slot`` of the host's shared file (made on first use), or None
        when there is none: no path given, or the file or its memory cannot be had (e.g.
        a full ``/dev/shm``); the host then keeps to the object store, with a warning."""
        if self.uploads_path is None:
            return None
        try:
            if self._arena is None:
                self._arena = shared_uploads.UploadArena(Path(self.uploads_path),
                                                         self.hold_uploads_bytes)
            return self._arena.rows(slot, n_rows, self.layout.size)
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "host uploads go through the object store (%s: %s)", self.uploads_path, exc)
            self.uploads_path = None
            return None

    def fit(self, rnd: int, tasks: list[ClientTask], lost: frozenset[int] = frozenset(),
            guests: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
            ) -> list[ClientResult]:
        tasks = _resolve_weights(tasks)
        self._fitting = True
        self._hold_uploads = len(tasks) * self.layout.nbytes <= self.hold_uploads_bytes
        self._held = 0
        self._shared = False
        if self._hold_uploads:
            rows = None
            if self._slot is not None:
                rows = self._shared_rows(self._slot, len(tasks))
            if rows is not None:
                self._upload_rows, self._shared = rows, True
            else:
                if len(self._own_rows) < len(tasks):
                    self._own_rows = np.empty((len(tasks), self.layout.size), dtype=np.float32)
                self._upload_rows = self._own_rows
        try:
            return super().fit(rnd, tasks, lost, guests)
        finally:
            self._fitting = False

    def upload_row(self) -> np.ndarray | None:
        """The next row of the upload buffer when this call's uploads are held: an
        algorithm that writes its upload there (FedAvg's get_flat) saves the copy
        :meth:`detach` would make."""
        if (not self._fitting or not self._hold_uploads
                or self._held >= len(self._upload_rows)):
            return None
        return self._upload_rows[self._held]

    def _is_row(self, w: Any, i: int) -> bool:
        """Whether ``w`` is row ``i`` of this call's upload buffer."""
        return (isinstance(w, np.ndarray) and i < len(self._upload_rows)
                and w.shape == (self.layout.size,) and w.dtype == np.float32
                and w.ctypes.data == self._upload_rows[i].ctypes.data)

    def detach(self, result: ClientResult) -> ClientResult:
        import ray

        w = result.weights
        if w is None:
            return result
        if not self._hold_uploads:
            result.weights = ray.put(w)
        elif self._is_row(w, self._held):
            self._held += 1  # written in place by the algorithm (see upload_row)
        elif w.shape == (self.layout.size,) and w.dtype == np.float32:
            # a held full-model upload moves into a row of a buffer the host keeps: the
            # memory of the copy that get_flat made is then reused by the next client's,
            # instead of fresh pages (page faults: ~0.3 ms per 2NN upload in an actor).
            # Safe because Ray has copied a call's return value to the object store
            # before the actor runs its next call (and a shared slot is not written
            # again before the server has folded it: see mecsim.shared_uploads).
            row = self._upload_rows[self._held]
            row[...] = w
            result.weights = row
            self._held += 1
        return result

    def fit_split(self, rnd: int, tasks: list[ClientTask], lost: frozenset[int] = frozenset(),
                  guests: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
                  shared_slot: int | None = None) -> tuple[list[ClientResult], Any]:
        """:meth:`ClientHost.fit_split`; uploads held in the buffer's rows travel as one
        array (:class:`UploadRows`: one copy into the object store, not one per client),
        or, with ``shared_slot``, stay in that slot of the host's shared file and only
        their place travels (:class:`~mecsim.shared_uploads.SharedUploadRows`)."""
        self._slot = shared_slot
        try:
            results, weights = super().fit_split(rnd, tasks, lost, guests)
        finally:
            self._slot = None
        if not (self._hold_uploads and weights and len(weights) == self._held):
            return results, weights
        if not all(isinstance(w, np.ndarray) for w in weights.values()):
            return results, weights
        base = self._upload_rows.ctypes.data
        row_bytes = self.layout.nbytes
        at = {c: (w.ctypes.data - base) // row_bytes for c, w in weights.items()}
        if sorted(at.values()) != list(range(self._held)) or not all(
                self._is_row(w, at[c]) for c, w in weights.items()):
            return results, weights
        order = sorted(weights, key=at.__getitem__)  # row order
        if self._shared and self._arena is not None and shared_slot is not None:
            return results, shared_uploads.SharedUploadRows(
                str(self._arena.path), self._arena.offset(shared_slot), order,
                self.layout.size)
        return results, UploadRows(order, self._upload_rows[:self._held])

    def evaluate(self, rnd: int, tasks: list[ClientTask]) -> list[tuple[int, float, float, int]]:
        return super().evaluate(rnd, _resolve_weights(tasks))

    def node(self) -> dict[str, str]:
        """The Ray node this host runs on: its id and IP address."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}


#: A task's weights of at least this many bytes go to the hosts as one object-store
#: reference per distinct array (:func:`_weights_by_reference`), not inside every host
#: call's arguments (Ray's own limit for passing an argument inline is 100 KiB).
SHARE_WEIGHTS_BYTES = 100 * 1024


def _weights_by_reference(ray, tasks: list[ClientTask]) -> list[ClientTask]:
    """The tasks with each large weights array put in the object store once and carried
    as its reference: the global model that every task of a round shares is then copied
    once, not serialised into each host's call (~1.5 ms per call for the 2NN) and
    deserialised again by each host."""
    put: dict[int, Any] = {}
    out = []
    for t in tasks:
        w = t.weights
        if isinstance(w, np.ndarray) and w.nbytes >= SHARE_WEIGHTS_BYTES:
            if id(w) not in put:
                put[id(w)] = ray.put(w)
            t = replace(t, weights=put[id(w)])
        out.append(t)
    return out


def _resolve_weights(tasks: list[ClientTask]) -> list[ClientTask]:
    """Tasks whose weights came as references (see :func:`_weights_by_reference`) with
    the arrays in their place (read in place from the object store, read-only)."""
    import ray

    if any(isinstance(t.weights, shared_model.SharedModel) for t in tasks):
        tasks = [replace(t, weights=t.weights.array())
                 if isinstance(t.weights, shared_model.SharedModel) else t for t in tasks]
    refs = list({t.weights: None for t in tasks if isinstance(t.weights, ray.ObjectRef)})
    if not refs:
        return tasks
    arrays = dict(zip(refs, ray.get(refs), strict=True))
    return [replace(t, weights=arrays[t.weights]) if isinstance(t.weights, ray.ObjectRef)
            else t for t in tasks]


@dataclass(frozen=True)
class UploadRows:
    """A host call's uploads in one array: row i is the upload of ``client_ids[i]``
    (read like the ``{client_id: upload}`` dict a host otherwise hands over)."""

    client_ids: list[int]
    rows: np.ndarray

    def items(self) -> Iterator[tuple[int, np.ndarray]]:
        return zip(self.client_ids, self.rows, strict=True)


def _fetch_from_store(uploads: list[Any]) -> list[Any]:
    """The uploads: those handed over by reference fetched from the object store, those
    that came in a host's object as they are (see :class:`ClientHostActor`)."""
    import ray

    at = [i for i, u in enumerate(uploads) if isinstance(u, ray.ObjectRef)]
    if not at:
        return list(uploads)
    out = list(uploads)
    for i, value in zip(at, ray.get([uploads[i] for i in at]), strict=True):
        out[i] = value
    return out


class CentralServerActor(CentralServer):
    """The central server in a Ray actor (of a flat algorithm, the one server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _freeze_heap()

    def plan_by_reference(self, rnd: int, on_board: bool = False
                          ) -> tuple[list[int], list[ClientTask]]:
        """A flat algorithm's :meth:`plan`, its large task weights put in the object
        store here, once each (:func:`_weights_by_reference`): the driver then passes
        references on to the hosts without ever reading the model. With ``on_board``
        (every host is on this node and :meth:`open_board` made the board), a model all
        tasks share is written to the board instead (:mod:`mecsim.shared_model`)."""
        import ray

        selected, tasks, _ = self.plan(rnd)
        if on_board and self._board is not None and not self._board_failed:
            shared = self._on_board(rnd, tasks)
            if shared is not None:
                return selected, shared
        return selected, _weights_by_reference(ray, tasks)

    _board: shared_model.ModelBoard | None = None
    _board_failed = False

    def open_board(self, path: str, size: int) -> bool:
        """Make the global model's board at ``path`` for models of ``size`` floats, before
        any plan may use it (the executor removes the file when it stops its actors: made
        later by a plan still running, it would outlive that clean-up). False, with a
        warning, when it cannot be had (e.g. a full ``/dev/shm``)."""
        try:
            self._board = shared_model.ModelBoard(Path(path), size)
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "the global model goes through the object store (%s: %s)", path, exc)
            return False
        return True

    def _on_board(self, rnd: int, tasks: list[ClientTask]) -> list[ClientTask] | None:
        """The tasks with their one shared model on the board, or None when they do not
        share one float32 model of the board's size (another size: said once, and the
        board is given up)."""
        assert self._board is not None
        shared = {id(t.weights): t.weights for t in tasks}
        if len(shared) != 1:
            return None
        (w,) = shared.values()
        if (not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 1
                or w.nbytes < SHARE_WEIGHTS_BYTES):
            return None
        try:
            where = self._board.put(rnd, w)
        except ValueError as exc:
            logging.getLogger(__name__).warning(
                "the global model goes through the object store (%s)", exc)
            self._board_failed = True
            return None
        return [replace(t, weights=where) for t in tasks]

    def node_id(self) -> str:
        """The Ray node this server runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def fetch(self, uploads: list[Any]) -> list[Any]:
        return _fetch_from_store(uploads)


class EdgeServerActor(EdgeServer):
    """One edge server of a hierarchical algorithm in a Ray actor: it fetches its own
    clients' uploads from the object store and reports to the central server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _freeze_heap()

    def fetch(self, uploads: list[Any]) -> list[Any]:
        return _fetch_from_store(uploads)


class LocalExecutor:
    """Everything in this process: for tests, debugging and profiling."""

    def __init__(self, server_kwargs: dict[str, Any], setup: HostSetup, pools: DataPools,
                 host_clients: list[ClientData]) -> None:
        self._init(server_kwargs, setup, pools, host_clients)
        self._start()

    def _init(self, server_kwargs: dict[str, Any], setup: HostSetup, pools: DataPools,
              host_clients: list[ClientData]) -> None:
        self._args = (server_kwargs, setup, pools, host_clients)
        self.host_clients = host_clients
        self.host_of = {cid: h for h, clients in enumerate(host_clients) for cid in clients}
        self.edge_ids = _edge_ids(server_kwargs)
        serves = server_kwargs.get("edge_server_of") or {}
        self.edge_of = {cid: serves.get(cid, 0) for cid in self.host_of}
        self.edges: dict[int, Any] = {}
        self._streaming = False
        _, client_cls = algorithm_classes(setup.algorithm)
        # a round's clients may be lent to other hosts only when they keep no state
        self._movable = client_cls.movable() and len(host_clients) > 1
        t = setup.train
        self._work = {cid: math.ceil(n / t.batch_size) * t.epochs + 1
                      for cid, n in (server_kwargs.get("client_samples") or {}).items()}

    def _assign(self, tasks: list[ClientTask]
                ) -> dict[int, tuple[list[ClientTask], dict[int, Any] | None]]:
        """The tasks of a host call by host, with the guests each host is lent (see
        :meth:`agents.host.ClientHost.fit`): the clients' own hosts, evened out by
        :func:`balance_hosts` when the algorithm's clients can move."""
        groups = self._by_host(tasks)
        if not self._movable or not self._work:
            return {h: (group, None) for h, group in groups.items()}
        groups = balance_hosts(groups, self._work, len(self.host_clients))
        out: dict[int, tuple[list[ClientTask], dict[int, Any] | None]] = {}
        for h, group in groups.items():
            guests = {t.client_id: self.host_clients[self.host_of[t.client_id]][t.client_id]
                      for t in group if self.host_of[t.client_id] != h}
            out[h] = (group, guests or None)
        return out

    def _start(self) -> None:
        server_kwargs, setup, pools, host_clients = self._args
        self.server = CentralServer(**server_kwargs)
        self.edges = {b: EdgeServer(b, **server_kwargs) for b in self.edge_ids}
        self.hosts = [ClientHost(setup, pools, clients) for clients in host_clients]

    def restart(self) -> None:
        """New servers and hosts in their initial state (then :meth:`load_state`)."""
        self._start()

    def state(self, known_blobs: set[str] | None = None) -> ExecutorState:
        """The state to checkpoint; with ``known_blobs``, large arrays by reference."""
        return _collect(self.server.state_dict(known_blobs),
                        [h.state_dict(known_blobs) for h in self.hosts],
                        {b: e.state_dict(known_blobs) for b, e in self.edges.items()})

    def _host_states(self, st: ExecutorState) -> list[dict[str, Any]]:
        return [{"clients": {cid: st.clients[cid] for cid in clients if cid in st.clients},
                 "costs": st.costs} for clients in self.host_clients]

    def _edge_states(self, st: ExecutorState, legacy: dict[int, Any]) -> dict[int, Any]:
        """Each edge server's state: from ``st``, or from what an older checkpoint kept in
        the central server's state (``legacy``)."""
        edges = st.edges or legacy
        missing = [b for b in self.edge_ids if b not in edges]
        if missing:
            raise ValueError(f"the checkpoint holds no state of edge server(s) {missing}")
        return edges

    def load_state(self, st: ExecutorState) -> None:
        edges = self._edge_states(st, self.server.load_state_dict(st.server))
        for b, edge in self.edges.items():
            edge.load_state_dict(edges[b])
        for host, hs in zip(self.hosts, self._host_states(st), strict=True):
            host.load_state_dict(hs)

    def _by_host(self, tasks: list[ClientTask]) -> dict[int, list[ClientTask]]:
        grouped: dict[int, list[ClientTask]] = defaultdict(list)
        for task in tasks:
            grouped[self.host_of[task.client_id]].append(task)
        return grouped

    def _by_edge(self, items: list[Any]) -> dict[int, list[Any]]:
        """Tasks or results by edge server, every edge server present (maybe empty)."""
        grouped: dict[int, list[Any]] = {b: [] for b in self.edge_ids}
        for item in items:
            grouped[self.edge_of[item.client_id]].append(item)
        return grouped

    @staticmethod
    def _in_task_order(tasks: list[ClientTask], parts: list[list[ClientTask]]
                       ) -> list[ClientTask]:
        filled = {t.client_id: t for part in parts for t in part}
        return [filled[t.client_id] for t in tasks]

    def plan_ahead(self, rnd: int) -> None:
        """Say that the next call to the servers will be :meth:`plan` of round ``rnd``
        (no evaluation, checkpoint or other server call comes first): under Ray the
        central server then plans it at once, while this process times the round that
        ends. In-process there is nothing to overlap."""

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        """The round's clients and tasks: planned by the central server, filled in by
        the edge servers of a hierarchical algorithm."""
        selected, tasks, downlinks = self.server.plan(rnd)
        if not self.edges:
            return selected, tasks
        groups = self._by_edge(tasks)
        parts = [edge.plan(rnd, groups[b], downlinks.get(b)) for b, edge in self.edges.items()]
        return selected, self._in_task_order(tasks, parts)

    def fit(self, rnd: int, tasks: list[ClientTask], lost: frozenset[int] = frozenset(),
            fold: frozenset[int] | None = None) -> list[ClientResult]:
        """Train the tasks' clients. With ``fold`` (the clients the round will aggregate:
        a flat algorithm whose ``streams_aggregation`` is set), the uploads are streamed
        into the server's aggregate part by part while the clients train, and the
        results come back without them; :meth:`aggregate` then finishes it."""
        self._streaming = fold is not None
        if fold is not None:
            return self._fit_streamed(rnd, tasks, lost, fold)
        out: list[ClientResult] = []
        for h, (group, guests) in self._assign(tasks).items():
            out += self.hosts[h].fit(rnd, group, lost, guests)
        return sorted(out, key=lambda r: r.client_id)

    def _fit_streamed(self, rnd: int, tasks: list[ClientTask], lost: frozenset[int],
                      fold: frozenset[int]) -> list[ClientResult]:
        self.server.stream_begin(rnd)
        out: list[ClientResult] = []
        for part in stream_parts(tasks):
            results: list[ClientResult] = []
            for h, (group, guests) in self._assign(part).items():
                results += self.hosts[h].fit(rnd, group, lost, guests)
            keep = fold.intersection(t.client_id for t in part)
            self.server.stream_fold(rnd, keep, results)  # lets go of every upload
            out += results
        return sorted(out, key=lambda r: r.client_id)

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        """The central server aggregates (for a hierarchical algorithm, from the reports
        of the edge servers, each aggregating its own clients first); after a streamed
        :meth:`fit`, it finishes the aggregate it has folded (``results`` must then be
        the clients of its ``fold``: the run loop checks)."""
        if self._streaming:
            self._streaming = False
            return self.server.stream_end(rnd)
        if not self.edges:
            return self.server.aggregate(rnd, results)
        groups = self._by_edge(results)
        reports = [edge.aggregate(rnd, groups[b]) for b, edge in self.edges.items()]
        return self.server.aggregate_edges(rnd, results, *reports)

    def evaluate(self, rnd: int, clients: list[int]) -> list[tuple[int, float, float, int]]:
        tasks = self.server.evaluation_tasks(rnd, clients)
        out = []
        for h, group in self._by_host(tasks).items():
            out += self.hosts[h].evaluate(rnd, group)
        return sorted(out)

    def host_rss_bytes(self) -> list[int]:
        return [self.hosts[0].rss_bytes()] if self.hosts else []

    def placement(self) -> list[dict[str, Any]]:
        """Where each host runs and which clients it hosts (in-process: no node)."""
        return [{"host": h, "node_id": None, "node_ip": None, "num_cpus": None,
                 "clients": sorted(clients)} for h, clients in enumerate(self.host_clients)]

    def close(self) -> None:
        pass


class RayExecutor(LocalExecutor):
    """Host actors, a central-server actor and, for a hierarchical algorithm, one actor
    per edge server (no CPU reserved: servers) in a Ray cluster.

    The host actors are spread over the cluster's nodes (a placement group with the
    SPREAD strategy: as many nodes as there are hosts, as evenly as the nodes allow),
    one CPU each when the live nodes have that many, else an equal share that fits (see
    :func:`host_cpus`): after a node died, its hosts are re-created on the nodes left.
    Waiting for room is bounded by :data:`PLACEMENT_TIMEOUT_S`.

    Every call that waits on an actor turns the death of an actor (its process killed,
    out of memory, its node gone) into :class:`ActorFailure`; :meth:`restart` kills what
    is left of the actors and starts new ones.
    """

    def __init__(self, server_kwargs: dict[str, Any], setup: HostSetup, pools: DataPools,
                 host_clients: list[ClientData], ray_address: str | None = None) -> None:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING,
                                          configure_logging=False, log_to_driver=True)
            if ray_address:
                kwargs["address"] = ray_address
                _attach(ray, kwargs, ray_address)
            else:
                kwargs["num_cpus"] = max(len(host_clients), os.cpu_count() or 1)
                _init_ray_on_loopback(ray, kwargs)
            self._owns_ray = True
        else:
            self._owns_ray = False
        self._ray = ray
        self._init(server_kwargs, setup, pools, host_clients)
        self._pools_ref = ray.put(pools)
        self._uploads_prefix: str | None = None  # this start's shared upload files
        self._all_prefixes: list[str] = []  # every start's: swept again on close
        self._shared_hosts: set[int] = set()  # hosts on the central server's node
        if shared_uploads.available():
            shared_uploads.remove_stale()
        self.server, self.hosts = None, []
        self._group: Any = None  # the hosts' placement group
        self._host_cpus = 1.0
        self._host_nodes: list[dict[str, str]] = []
        self._board = False  # whether the global model goes through a shared file
        self._planned: tuple[int, Any] | None = None  # (round, its plan) asked for ahead
        self._folds: list[Any] = []  # a streamed round's folds not yet waited for
        self._start()

    def _start(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self._ray
        server_kwargs, setup, _, host_clients = self._args
        self._place_hosts(len(host_clients))
        central_actor = ray.remote(num_cpus=0, max_restarts=0)(CentralServerActor)
        edge_actor = ray.remote(num_cpus=0, max_restarts=0)(EdgeServerActor)
        self.server = central_actor.remote(**server_kwargs)
        self.edges = {b: edge_actor.remote(b, **server_kwargs) for b in self.edge_ids}
        host_actor = ray.remote(num_cpus=self._host_cpus, max_restarts=0)(ClientHostActor)
        prefix = self._uploads_prefix = (
            shared_uploads.executor_prefix(os.urandom(4).hex())
            if SHARED_UPLOADS and shared_uploads.available() else None)
        if prefix:
            self._all_prefixes.append(prefix)
        self.hosts = [host_actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                          self._group, placement_group_bundle_index=h)).remote(
                          setup, self._pools_ref, clients, HOLD_UPLOADS_BYTES,
                          str(shared_uploads.SHM_DIR / f"{prefix}{h}") if prefix else None)
                      for h, clients in enumerate(host_clients)]
        self._weight_refs: list[Any] = []
        self._stream_end: Any = None  # a streamed round's stream_end, submitted early
        self._folds, self._streaming, self._planned = [], False, None  # of actors gone
        # surface start-up errors here
        self._get([self.server.rss_bytes.remote(),
                   *(e.rss_bytes.remote() for e in self.edges.values())])
        self._host_nodes = self._get([h.node.remote() for h in self.hosts])
        server_node = self._get(self.server.node_id.remote())
        self._shared_hosts = {h for h, node in enumerate(self._host_nodes)
                              if prefix and node["node_id"] == server_node}
        # the global model through a shared file only when every host can map it, and
        # on this process's machine, where the clean-up (remove, remove_stale) looks
        self._board = False
        if (SHARED_MODEL and prefix and len(self._shared_hosts) == len(self.hosts)
                and server_node == ray.get_runtime_context().get_node_id()):
            path = shared_uploads.SHM_DIR / f"{prefix}{shared_model.NAME}"
            self._board = self._get(self.server.open_board.remote(
                str(path), server_kwargs["layout"].size))

    def _place_hosts(self, n_hosts: int) -> None:
        """Reserve room for the hosts: a SPREAD placement group sized to the live nodes,
        planned again whenever the set of live nodes changes (a node that died is still
        listed as alive for a while), waiting at most :data:`PLACEMENT_TIMEOUT_S`."""
        from ray.util.placement_group import placement_group, remove_placement_group

        ray = self._ray
        deadline = time.monotonic() + PLACEMENT_TIMEOUT_S
        nodes: dict[str, float] = {}
        while True:
            nodes = _alive_node_cpus(ray)
            try:
                cpus = host_cpus(list(nodes.values()), n_hosts)
            except ValueError:
                cpus = 0.0
            group = placement_group([{"CPU": cpus}] * n_hosts, strategy="SPREAD") \
                if cpus > 0 else None
            while time.monotonic() < deadline:
                if group is not None and group.wait(timeout_seconds=1):
                    self._group, self._host_cpus = group, cpus
                    return
                if group is None:
                    time.sleep(1)
                if _alive_node_cpus(ray) != nodes:
                    break  # a node joined or died: plan again
            if group is not None:
                remove_placement_group(group)
            if time.monotonic() >= deadline:
                break
        seen = ", ".join(f"{node_id[:8]}: {cpus:g}" for node_id, cpus in nodes.items())
        raise PlacementTimeout(
            f"the Ray cluster had no room for {n_hosts} host actor(s) within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s (its live nodes and their CPUs: {seen or 'none'})")

    def placement(self) -> list[dict[str, Any]]:
        """Where each host actor runs (node id and IP), its CPUs and its clients."""
        return [{"host": h, **node, "num_cpus": self._host_cpus, "clients": sorted(clients)}
                for h, (node, clients) in enumerate(zip(self._host_nodes, self.host_clients,
                                                        strict=True))]

    def _get(self, refs: Any) -> Any:
        """``ray.get``, with an actor's death raised as :class:`ActorFailure`."""
        from ray import exceptions as rex

        try:
            return self._ray.get(refs)
        except (rex.RayActorError, rex.ObjectLostError, rex.OwnerDiedError,
                rex.WorkerCrashedError, rex.NodeDiedError) as exc:
            raise ActorFailure(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        except rex.RayTaskError as exc:
            # a task whose arguments came from an actor that died, maybe through another
            # task (the central server's aggregation of an edge server's report)
            deaths = (rex.RayActorError, rex.ObjectLostError, rex.OwnerDiedError,
                      rex.WorkerCrashedError, rex.NodeDiedError)
            cause: Any = exc
            for _ in range(4):
                inner = cause.as_instanceof_cause() \
                    if hasattr(cause, "as_instanceof_cause") else cause
                if isinstance(inner, deaths):
                    raise ActorFailure(f"{type(getattr(cause, 'cause', inner)).__name__}") \
                        from exc
                cause = getattr(cause, "cause", None)
                if not isinstance(cause, rex.RayTaskError):
                    break
            raise

    def _kill_all(self) -> None:
        for actor in [self.server, *self.edges.values(), *self.hosts]:
            if actor is None:
                continue
            try:
                self._ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead or unreachable: nothing to kill
                pass
        if self._uploads_prefix is not None:
            shared_uploads.remove(self._uploads_prefix)
            self._uploads_prefix = None
        self._shared_hosts = set()
        self._board = False
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._group)  # its CPUs go back to the cluster
            except Exception:  # noqa: BLE001 - the cluster is going away: nothing to free
                pass
            self._group = None

    def restart(self) -> None:
        self._kill_all()
        self._start()

    def plan_ahead(self, rnd: int) -> None:
        """A flat algorithm's plan of round ``rnd`` is asked for now (see
        :meth:`LocalExecutor.plan_ahead`): the server actor, which runs calls in order,
        plans right after finishing the aggregate, and the next :meth:`plan` finds it
        done instead of waiting a round trip (~4 ms a round)."""
        if not self.edges:
            self._planned = (rnd, self.server.plan_by_reference.remote(rnd, self._board))

    def _no_plan_ahead(self, what: str) -> None:
        """A server call other than the plan asked for ahead would see the server's
        state after that plan (its client selection drawn): a bug, not a fault."""
        if self._planned is not None:
            raise RuntimeError(f"{what} after round {self._planned[0]} was planned ahead")

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        ahead, self._planned = self._planned, None
        if ahead is not None:
            if ahead[0] != rnd:
                raise RuntimeError(f"round {rnd} planned, but round {ahead[0]} was planned "
                                   "ahead")
            return self._get(ahead[1])
        if not self.edges:
            return self._get(self.server.plan_by_reference.remote(rnd, self._board))
        selected, tasks, downlinks = self._get(self.server.plan.remote(rnd))
        groups = self._by_edge(tasks)
        stored: dict[int, Any] = {}  # one object-store copy of what several receive
        refs = []
        for b, edge in self.edges.items():
            down = downlinks.get(b)
            if down is not None:
                if id(down) not in stored:
                    stored[id(down)] = self._ray.put(down)
                down = stored[id(down)]
            refs.append(edge.plan.remote(rnd, groups[b], down))
        return selected, self._in_task_order(tasks, self._get(refs))

    def fit(self, rnd: int, tasks: list[ClientTask], lost: frozenset[int] = frozenset(),
            fold: frozenset[int] | None = None) -> list[ClientResult]:
        """Results without their weights; the weights stay in the object store (streamed:
        the server actor fetches each part's from there and folds them)."""
        self._streaming = fold is not None
        if fold is not None:
            return self._fit_streamed(rnd, tasks, lost, fold)
        meta_refs, self._weight_refs = [], []
        tasks = _weights_by_reference(self._ray, tasks)
        for h, (group, guests) in self._assign(tasks).items():
            meta, weights = self.hosts[h].fit_split.options(num_returns=2).remote(
                rnd, group, lost, guests)
            meta_refs.append(meta)
            self._weight_refs.append(weights)
        out = [r for part in self._get(meta_refs) for r in part]
        return sorted(out, key=lambda r: r.client_id)

    def _fit_streamed(self, rnd: int, tasks: list[ClientTask], lost: frozenset[int],
                      fold: frozenset[int]) -> list[ClientResult]:
        """Part by part: the hosts train a part's clients, the server actor folds their
        uploads (read from the object store) while the hosts go on with the next part; at
        most :data:`STREAM_PARTS_IN_FLIGHT` parts are submitted ahead of the server."""
        self._no_plan_ahead("a streamed fit")
        tasks = _weights_by_reference(self._ray, tasks)
        begun = False
        meta_refs: list[Any] = []
        folds: list[Any] = []
        if STREAM_PARTS_IN_FLIGHT > shared_uploads.SLOTS:
            raise RuntimeError("more streamed parts in flight than shared upload slots")
        for p, part in enumerate(stream_parts(tasks)):
            # part p may write slot p % SLOTS of a host's shared file: part p - SLOTS,
            # the last to use it, has been folded (waited for below) before this submit
            slot = p % shared_uploads.SLOTS
            metas, uploads = [], []
            for h, (group, guests) in self._assign(part).items():
                meta, weights = self.hosts[h].fit_split.options(num_returns=2).remote(
                    rnd, group, lost, guests,
                    shared_slot=slot if h in self._shared_hosts else None)
                metas.append(meta)
                uploads.append(weights)
            if not begun:  # after the first hosts' calls: they start training sooner
                self.server.stream_begin.remote(rnd)  # the actor runs our calls in order
                begun = True
            keep = fold.intersection(t.client_id for t in part)
            folds.append(self.server.stream_fold_split.remote(rnd, keep, len(metas),
                                                              *metas, *uploads))
            meta_refs += metas
            if len(folds) >= STREAM_PARTS_IN_FLIGHT:
                self._get(folds.pop(0))
        if not begun:  # no client to train
            self.server.stream_begin.remote(rnd)
        # the aggregate is finished as soon as the last part is folded (the actor runs
        # calls in order): the run loop times the round meanwhile, and aggregate() only
        # waits for the folds left and fetches it, instead of a round trip to the server
        # after the timing
        self._stream_end = self.server.stream_end.remote(rnd)
        self._folds = folds
        out = [r for part in self._get(meta_refs) for r in part]
        return sorted(out, key=lambda r: r.client_id)

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        """Each edge server fetches its own clients' uploads from the object store and
        aggregates them; its report goes to the central server as a reference (not
        through this process). A flat algorithm's central server fetches them all.
        After a streamed :meth:`fit`, the central server finishes what it folded."""
        if self._streaming:
            self._streaming = False
            ended, self._stream_end = self._stream_end, None
            folds, self._folds = self._folds, []
            if ended is None:
                self._no_plan_ahead("an aggregation")
                ended = self.server.stream_end.remote(rnd)
            # a fold's error (not only the end's) is raised here
            return self._get([*folds, ended])[-1]
        self._no_plan_ahead("an aggregation")
        refs, self._weight_refs = self._weight_refs, []
        if not self.edges:
            return self._get(self.server.aggregate_split.remote(rnd, results, *refs))
        groups = self._by_edge(results)
        reports = [edge.aggregate_split.remote(rnd, groups[b], *refs)
                   for b, edge in self.edges.items()]
        return self._get(self.server.aggregate_edges.remote(rnd, results, *reports))

    def evaluate(self, rnd: int, clients: list[int]) -> list[tuple[int, float, float, int]]:
        self._no_plan_ahead("an evaluation")
        tasks = _weights_by_reference(
            self._ray, self._get(self.server.evaluation_tasks.remote(rnd, clients)))
        refs = [self.hosts[h].evaluate.remote(rnd, g) for h, g in self._by_host(tasks).items()]
        return sorted(x for part in self._get(refs) for x in part)

    def state(self, known_blobs: set[str] | None = None) -> ExecutorState:
        self._no_plan_ahead("a checkpoint")
        server, *rest = self._get([self.server.state_dict.remote(known_blobs),
                                   *(e.state_dict.remote(known_blobs)
                                     for e in self.edges.values()),
                                   *(h.state_dict.remote(known_blobs) for h in self.hosts)])
        n = len(self.edges)
        return _collect(server, rest[n:], dict(zip(self.edges, rest[:n], strict=True)))

    def load_state(self, st: ExecutorState) -> None:
        edges = self._edge_states(st, self._get(self.server.load_state_dict.remote(st.server)))
        refs = [edge.load_state_dict.remote(edges[b]) for b, edge in self.edges.items()]
        refs += [host.load_state_dict.remote(hs)
                 for host, hs in zip(self.hosts, self._host_states(st), strict=True)]
        self._get(refs)

    def host_rss_bytes(self) -> list[int]:
        return self._get([h.rss_bytes.remote() for h in self.hosts])

    def actor_pids(self) -> dict[str, list[int]]:
        """Process ids of the central-server actor, of the edge-server actors (in edge
        server order; none for a flat algorithm) and of the host actors."""
        return {"server": [self._get(self.server.pid.remote())],
                "edges": self._get([e.pid.remote() for e in self.edges.values()]),
                "hosts": self._get([h.pid.remote() for h in self.hosts])}

    def close(self) -> None:
        self._kill_all()
        # a host killed while it made its file (ray.kill does not wait) may have made it
        # after its start's sweep: every start's files are swept again
        for prefix in self._all_prefixes:
            shared_uploads.remove(prefix)
        if self._owns_ray:
            self._ray.shutdown()
