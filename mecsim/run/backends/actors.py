"""The Ray actors: plain hosts and servers, with the plumbing that moves models and
uploads between them (object store, shared-memory files)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from mecsim.agents.algorithms import ClientResult, ClientTask
from mecsim.agents.host import ClientHost, HostSetup
from mecsim.agents.server import CentralServer, EdgeServer
from mecsim.data import DataPools
from mecsim.run.backends import shared_model, shared_uploads
from mecsim.run.backends.balance import stream_parts
from mecsim.run.backends.base import ClientMap

#: A host call whose clients' uploads together take at most this many bytes keeps them
#: until the call returns, then hands them over as one object (one copy into the object
#: store, ~0.02 ms per 2NN update); a larger call puts each upload in the store as soon as
#: its client has trained (~0.5-0.9 ms per 2NN update), so the host never holds more
#: than one. 64 MiB: 80 2NN updates (a 100-client round on 2 hosts is held); a streamed
#: part of 256 such clients (128 a host) is not, which keeps memory per selected client
#: where it was (held, 1,000 selected clients peaked ~0.7 GB higher).
HOLD_UPLOADS_BYTES = 64 * 2**20


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
    (:mod:`.shared_uploads`): the uploads are written there and only where they are
    travels."""

    _hold_uploads = False
    _fitting = False  # within fit: upload_row hands out rows only then
    _upload_rows: np.ndarray = np.empty((0, 0), dtype=np.float32)
    _own_rows: np.ndarray = np.empty((0, 0), dtype=np.float32)

    def __init__(
        self,
        setup: HostSetup,
        pools: DataPools,
        clients: dict[int, tuple[np.ndarray, np.ndarray]],
        hold_uploads_bytes: int = HOLD_UPLOADS_BYTES,
        uploads_path: str | None = None,
    ) -> None:
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
                self._arena = shared_uploads.UploadArena(
                    Path(self.uploads_path), self.hold_uploads_bytes
                )
            return self._arena.rows(slot, n_rows, self.layout.size)
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "host uploads go through the object store (%s: %s)", self.uploads_path, exc
            )
            self.uploads_path = None
            return None

    def fit(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        guests: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
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
        if not self._fitting or not self._hold_uploads or self._held >= len(self._upload_rows):
            return None
        return self._upload_rows[self._held]

    def _is_row(self, w: Any, i: int) -> bool:
        """Whether ``w`` is row ``i`` of this call's upload buffer."""
        return (
            isinstance(w, np.ndarray)
            and i < len(self._upload_rows)
            and w.shape == (self.layout.size,)
            and w.dtype == np.float32
            and w.ctypes.data == self._upload_rows[i].ctypes.data
        )

    def detach(self, result: ClientResult) -> ClientResult:
        import ray

        w = result.weights
        if w is None:
            return result
        if not self._hold_uploads:
            # in transit to the server: the array's reference (read where it is needed)
            result.weights = cast(Any, ray.put(w))
        elif self._is_row(w, self._held):
            self._held += 1  # written in place by the algorithm (see upload_row)
        elif w.shape == (self.layout.size,) and w.dtype == np.float32:
            # a held full-model upload moves into a row of a buffer the host keeps: the
            # memory of the copy that get_flat made is then reused by the next client's,
            # instead of fresh pages (page faults: ~0.3 ms per 2NN upload in an actor).
            # Safe because Ray has copied a call's return value to the object store
            # before the actor runs its next call (and a shared slot is not written
            # again before the server has folded it: see mecsim.run.backends.shared_uploads).
            row = self._upload_rows[self._held]
            row[...] = w
            result.weights = row
            self._held += 1
        return result

    _client_map: ClientMap | None = None

    def use_client_map(self, clients: ClientMap) -> None:
        """Keep the executor's :class:`ClientMap` for :meth:`fit_planned` (sent once, not
        with every call: 1,000 clients' sample indices take ~3 ms to unpickle)."""
        self._client_map = clients

    def fit_planned(
        self,
        rnd: int,
        plan: tuple[list[int], list[ClientTask]],
        host: int,
        part_clients: int,
        shared_slot: int | None = None,
    ) -> tuple[list[ClientResult], Any]:
        """:meth:`fit_split` of this host's share of round ``rnd``'s first streamed part,
        read off the server's plan (which Ray hands over when the server has made it: see
        :meth:`~mecsim.run.backends.ray_executor.RayExecutor.plan_ahead`): the part
        :func:`~mecsim.run.backends.balance.stream_parts` cuts with ``part_clients``,
        shared out by the :class:`ClientMap` of :meth:`use_client_map` as the executor's
        fit would. No client is lost (no fault can be drawn when rounds are chained)."""
        if self._client_map is None:
            raise RuntimeError("fit_planned before use_client_map")
        _, tasks = plan
        parts = stream_parts(tasks, part_clients)
        group, guests = (
            self._client_map.assign(parts[0]).get(host, ([], None)) if parts else ([], None)
        )
        return self.fit_split(rnd, group, frozenset(), guests, shared_slot=shared_slot)

    def fit_split(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        guests: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
        shared_slot: int | None = None,
    ) -> tuple[list[ClientResult], Any]:
        """:meth:`ClientHost.fit_split`; uploads held in the buffer's rows travel as one
        array (:class:`UploadRows`: one copy into the object store, not one per client),
        or, with ``shared_slot``, stay in that slot of the host's shared file and only
        their place travels (:class:`~mecsim.run.backends.shared_uploads.SharedUploadRows`)."""
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
            self._is_row(w, at[c]) for c, w in weights.items()
        ):
            return results, weights
        order = sorted(weights, key=at.__getitem__)  # row order
        if self._shared and self._arena is not None and shared_slot is not None:
            return results, shared_uploads.SharedUploadRows(
                str(self._arena.path), self._arena.offset(shared_slot), order, self.layout.size
            )
        return results, UploadRows(order, self._upload_rows[: self._held])

    def evaluate(self, rnd: int, tasks: list[ClientTask]) -> list[tuple[int, float, float, int]]:
        return super().evaluate(rnd, _resolve_weights(tasks))

    def node(self) -> dict[str, str]:
        """The Ray node this host runs on: its id and IP address."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
        }


#: A task's weights of at least this many bytes go to the hosts as one object-store
#: reference per distinct array (:func:`_weights_by_reference`), not inside every host
#: call's arguments (Ray's own limit for passing an argument inline is 100 KiB).
SHARE_WEIGHTS_BYTES = 100 * 1024


def weights_by_reference(ray, tasks: list[ClientTask]) -> list[ClientTask]:
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
        tasks = [
            replace(t, weights=t.weights.array())
            if isinstance(t.weights, shared_model.SharedModel)
            else t
            for t in tasks
        ]
    refs = list({t.weights: None for t in tasks if isinstance(t.weights, ray.ObjectRef)})
    if not refs:
        return tasks
    arrays: dict[Any, np.ndarray] = dict(zip(refs, ray.get(cast(Any, refs)), strict=True))
    return [
        replace(t, weights=arrays[t.weights]) if isinstance(t.weights, ray.ObjectRef) else t
        for t in tasks
    ]


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

    def plan_by_reference(
        self, rnd: int, on_board: bool = False
    ) -> tuple[list[int], list[ClientTask]]:
        """A flat algorithm's :meth:`plan`, its large task weights put in the object
        store here, once each (:func:`_weights_by_reference`): the driver then passes
        references on to the hosts without ever reading the model. With ``on_board``
        (every host is on this node and :meth:`open_board` made the board), a model all
        tasks share is written to the board instead (:mod:`mecsim.run.backends.shared_model`)."""
        import ray

        selected, tasks, _ = self.plan(rnd)
        if on_board and self._board is not None and not self._board_failed:
            shared = self._on_board(rnd, tasks)
            if shared is not None:
                return selected, shared
        return selected, weights_by_reference(ray, tasks)

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
                "the global model goes through the object store (%s: %s)", path, exc
            )
            return False
        return True

    def _on_board(self, rnd: int, tasks: list[ClientTask]) -> list[ClientTask] | None:
        """The tasks with their one shared model on the board, or None when they do not
        share one float32 model of the board's size. Another size (an algorithm that
        sends part of the model) is no error: its downloads take Ray's object store, as
        any small model's do; said once at INFO level, and the board is given up."""
        assert self._board is not None
        shared = {id(t.weights): t.weights for t in tasks}
        if len(shared) != 1:
            return None
        (w,) = shared.values()
        if (
            not isinstance(w, np.ndarray)
            or w.dtype != np.float32
            or w.ndim != 1
            or w.nbytes < SHARE_WEIGHTS_BYTES
        ):
            return None
        try:
            where = self._board.put(rnd, w)
        except ValueError:
            logging.getLogger(__name__).info(
                "this algorithm sends models of %d values, not the full model's %d: "
                "they go to the hosts through Ray's object store (as expected; nothing "
                "is wrong)",
                w.size,
                self._board.size,
            )
            self._board_failed = True
            return None
        # in transit to the hosts: where the model is on the board
        return [replace(t, weights=cast(Any, where)) for t in tasks]

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
