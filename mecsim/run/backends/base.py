"""What the run loop asks of an executor, and what both executors share.

:class:`Executor` is the protocol the run loop (:mod:`mecsim.run.round`,
:mod:`mecsim.run.loop`) is written against; :class:`~mecsim.run.backends.local.LocalExecutor`
(in this process) and :class:`~mecsim.run.backends.ray_executor.RayExecutor` (Ray actors)
implement it. What they have in common is not inherited but held: a :class:`ClientMap`
(which host keeps each client, which edge server serves it, how a round's tasks become
host calls), the :class:`ExecutorState` they checkpoint, and :class:`ActorFailure`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mecsim.agents.algorithms import ClientResult, ClientTask, algorithm_classes
from mecsim.agents.host import HostSetup
from mecsim.agents.server import AggregateReport
from mecsim.agents.state import decode, encode
from mecsim.run.backends.balance import balance_hosts

#: A host's clients: client id -> (train sample indices, test sample indices).
ClientData = dict[int, tuple[np.ndarray, np.ndarray]]
#: One client's evaluation: (client id, accuracy, loss, test samples[, extras dict]).
Evaluation = tuple[Any, ...]


class ActorFailure(RuntimeError):
    """A Ray actor (a client host, an edge server or the central server) died mid-run:
    its process was killed, ran out of memory, or its node went away. The run loop
    re-creates the actors, restores them from the last checkpoint and re-executes from
    there."""


#: Actor deaths recovered from without a round (an asynchronous run: a call to the hosts)
#: going through in between before giving up.
MAX_RECOVERIES = 3


class RoundAborted(Exception):
    """The run was told to stop (a user cancelled it, or its server is stopping) while a
    round was in progress: the executor stopped waiting for its actors, the round is
    discarded and the run ends with ``status`` (``cancelled`` or ``interrupted``), its
    finished rounds kept. See :meth:`Executor.abort_when`."""

    def __init__(self, status: str) -> None:
        super().__init__(f"round aborted: {status}")
        self.status = status


#: A run's stop check: False to go on, else the status to stop with (True: cancelled).
StopCheck = Callable[[], "bool | str"]

#: How often a waiting executor asks its stop check (seconds).
ABORT_POLL_S = 0.5


def abort_status(stop: bool | str) -> str:
    return stop if isinstance(stop, str) and stop in ("cancelled", "interrupted") else "cancelled"


@dataclass
class ExecutorState:
    """Encoded state of the central server, of every client and of every edge server of a
    hierarchical algorithm (see :mod:`mecsim.agents.state`); large arrays may be blob
    references, with the blobs not yet stored in ``blobs``."""

    server: Any
    clients: dict[int, Any]
    costs: Any
    blobs: dict[str, Any] = field(default_factory=dict)
    edges: dict[int, Any] = field(default_factory=dict)


class Executor(Protocol):
    """Where a run's clients and servers execute: the steps of a round, the state of a
    checkpoint, and the life of the processes. Both implementations give the same records
    for the same scenario (tests compare them).

    ``actors_can_die`` (a class attribute; absent: False): whether its calls may raise
    :class:`ActorFailure` (Ray's processes; never in-process). An asynchronous run keeps
    what it needs to restore the hosts only then."""

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        """The round's selected clients and their tasks (planned by the central server,
        filled in by the edge servers of a hierarchical algorithm)."""

    def associate(self, edge_server_of: dict[int, int]) -> None:
        """The round's serving edge server of every client, before :meth:`plan` (a
        hierarchical algorithm whose clients move: its edge servers group the round's
        clients by where they are at its start)."""

    def available(self, clients: list[int] | None) -> None:
        """The clients online at the round's start, before :meth:`plan`: the server
        selects among them only (``availability:``; None: among all)."""

    def plan_ahead(self, rnd: int, chain: bool = False) -> None:
        """The next server call will be :meth:`plan` of round ``rnd``: an executor may plan
        it now, overlapping the caller's work (nothing else may reach the server first).
        ``chain``: round ``rnd``'s :meth:`fit` will train every planned client, lose none
        and fold them all (no fault can be drawn), so an executor may start its hosts on
        the plan as soon as the server has made it, without waiting for the caller."""

    def fit(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        fold: frozenset[int] | None = None,
    ) -> list[ClientResult]:
        """Train the tasks' clients (the work of those in ``lost`` is lost: an emulated
        crash). With ``fold``, the uploads of those clients are streamed into the
        aggregate while the others train; :meth:`aggregate` then finishes it."""

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        """Aggregate the results that made it (measured: wall time, FLOPs, RSS)."""

    def evaluate(self, rnd: int, clients: list[int]) -> list[Evaluation]:
        """Each client's model on its own test data."""

    def evaluate_tasks(self, rnd: int, tasks: list[ClientTask]) -> list[Evaluation]:
        """Each task's client evaluates the model the task carries, on its own test data
        (an asynchronous run's versions: its server is not the central server's)."""

    def take_uploads(self) -> dict[int, np.ndarray]:
        """The uploads of the last :meth:`fit` that its results do not carry (under Ray
        they stay in the object store), by client id (an asynchronous run's server, in
        this process, takes them); in-process the results carry them: none."""

    def state(self, known_blobs: set[str] | None = None) -> ExecutorState:
        """The state to checkpoint; with ``known_blobs``, large arrays by reference."""

    def load_state(self, st: ExecutorState) -> None:
        """Restore a checkpoint's state."""

    def restart(self) -> None:
        """New processes in their initial state (then :meth:`load_state`)."""

    def placement(self) -> list[dict[str, Any]]:
        """Where each host runs (node id and IP, CPUs; None in-process), its clients."""

    def host_rss_bytes(self) -> list[int]:
        """Resident memory of each host process."""

    def close(self) -> None:
        """Stop every process the executor started."""

    def abort_when(self, check: StopCheck | None) -> None:
        """While waiting for its clients, servers or hosts, ask ``check`` now and then
        (the Ray executor every :data:`ABORT_POLL_S` seconds, the local one between host
        calls) and raise :class:`RoundAborted` when it says stop; None: never."""


def edge_ids(server_kwargs: dict[str, Any]) -> list[int]:
    """The edge servers that get a process of their own: those serving clients, when the
    algorithm is hierarchical (a flat algorithm's edge servers keep no state)."""
    server_cls, _ = algorithm_classes(server_kwargs["algorithm"])
    if server_cls.Edge is None:
        return []
    if server_kwargs.get("edge_server_ids") is not None:  # clients move: every one
        return [int(b) for b in server_kwargs["edge_server_ids"]]
    serves = server_kwargs.get("edge_server_of") or {}
    return sorted(set(serves.values())) or [0]


class ClientMap:
    """Which host keeps each client and which edge server serves it, and how a round's
    tasks are grouped into host calls and edge servers' parts."""

    def __init__(
        self, server_kwargs: dict[str, Any], setup: HostSetup, host_clients: list[ClientData]
    ) -> None:
        self.host_clients = host_clients
        self.host_of = {cid: h for h, clients in enumerate(host_clients) for cid in clients}
        self.edge_ids = edge_ids(server_kwargs)
        serves = server_kwargs.get("edge_server_of") or {}
        self.edge_of = {cid: serves.get(cid, 0) for cid in self.host_of}
        _, client_cls = algorithm_classes(setup.algorithm)
        # a round's clients may be lent to other hosts only when they keep no state
        # (a compressor with error feedback keeps a residual per client: state too)
        self.movable = client_cls.movable() and len(host_clients) > 1 and not setup.keeps_residual()
        t = setup.train
        self.work = {
            cid: math.ceil(n / t.batch_size) * t.epochs + 1
            for cid, n in (server_kwargs.get("client_samples") or {}).items()
        }

    def associate(self, edge_server_of: dict[int, int]) -> None:
        """The round's serving edge servers (clients that move): :meth:`by_edge` groups
        by them from now on."""
        unknown = sorted({b for b in edge_server_of.values() if b not in self.edge_ids})
        if self.edge_ids and unknown:
            raise ValueError(f"edge server(s) {unknown} serve clients but have no process")
        self.edge_of.update({int(c): int(b) for c, b in edge_server_of.items()})

    def by_host(self, tasks: list[ClientTask]) -> dict[int, list[ClientTask]]:
        grouped: dict[int, list[ClientTask]] = defaultdict(list)
        for task in tasks:
            grouped[self.host_of[task.client_id]].append(task)
        return grouped

    def by_edge(self, items: list[Any]) -> dict[int, list[Any]]:
        """Tasks or results by edge server, every edge server present (maybe empty)."""
        grouped: dict[int, list[Any]] = {b: [] for b in self.edge_ids}
        for item in items:
            grouped[self.edge_of[item.client_id]].append(item)
        return grouped

    def assign(
        self, tasks: list[ClientTask]
    ) -> dict[int, tuple[list[ClientTask], dict[int, Any] | None]]:
        """The tasks of a host call by host, with the guests each host is lent (see
        :meth:`mecsim.agents.host.ClientHost.fit`): the clients' own hosts, evened out by
        :func:`~mecsim.run.backends.balance.balance_hosts` when the algorithm's clients
        can move."""
        groups = self.by_host(tasks)
        if not self.movable or not self.work:
            return {h: (group, None) for h, group in groups.items()}
        groups = balance_hosts(groups, self.work, len(self.host_clients))
        out: dict[int, tuple[list[ClientTask], dict[int, Any] | None]] = {}
        for h, group in groups.items():
            guests = {
                t.client_id: self.host_clients[self.host_of[t.client_id]][t.client_id]
                for t in group
                if self.host_of[t.client_id] != h
            }
            out[h] = (group, guests or None)
        return out

    @staticmethod
    def in_task_order(tasks: list[ClientTask], parts: list[list[ClientTask]]) -> list[ClientTask]:
        filled = {t.client_id: t for part in parts for t in part}
        return [filled[t.client_id] for t in tasks]

    def host_states(self, st: ExecutorState) -> list[dict[str, Any]]:
        return [
            {
                "clients": {cid: st.clients[cid] for cid in clients if cid in st.clients},
                "costs": st.costs,
            }
            for clients in self.host_clients
        ]

    def edge_states(self, st: ExecutorState, legacy: dict[int, Any]) -> dict[int, Any]:
        """Each edge server's state: from ``st``, or from what an older checkpoint kept in
        the central server's state (``legacy``)."""
        edges = st.edges or legacy
        missing = [b for b in self.edge_ids if b not in edges]
        if missing:
            raise ValueError(f"the checkpoint holds no state of edge server(s) {missing}")
        return edges


def collect(
    server: tuple[Any, dict], hosts: list[tuple[Any, dict]], edges: dict[int, tuple[Any, dict]]
) -> ExecutorState:
    """One :class:`ExecutorState` from the servers' and hosts' ``(tree, new blobs)``."""
    blobs = dict(server[1])
    for _, new in [*hosts, *edges.values()]:
        blobs.update(new)
    return ExecutorState(
        server[0],
        {cid: st for tree, _ in hosts for cid, st in tree["clients"].items()},
        _merge_costs([tree["costs"] for tree, _ in hosts]),
        blobs,
        {b: tree for b, (tree, _) in edges.items()},
    )


def _merge_costs(encoded: list[Any]) -> Any:
    merged: dict = {}
    for enc in encoded:
        merged.update(decode(enc))
    return encode(merged, "costs")
