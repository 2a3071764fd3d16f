"""Everything in this process: the in-process executor (tests, debugging, profiling).

It drives the same plain classes as the Ray executor (:class:`~mecsim.agents.host.ClientHost`,
:class:`~mecsim.agents.server.CentralServer` and, for a hierarchical algorithm, one
:class:`~mecsim.agents.server.EdgeServer` per edge server) through the same steps, so a run
gives the same records with either.
"""

from __future__ import annotations

from typing import Any

from mecsim.agents.algorithms import ClientResult, ClientTask
from mecsim.agents.host import ClientHost, HostSetup
from mecsim.agents.server import AggregateReport, CentralServer, EdgeServer
from mecsim.data import DataPools
from mecsim.run.backends.balance import stream_parts
from mecsim.run.backends.base import (
    ClientData,
    ClientMap,
    Evaluation,
    ExecutorState,
    RoundAborted,
    StopCheck,
    abort_status,
    collect,
)


class LocalExecutor:
    """Everything in this process (an :class:`~mecsim.run.backends.base.Executor`)."""

    def __init__(
        self,
        server_kwargs: dict[str, Any],
        setup: HostSetup,
        pools: DataPools,
        host_clients: list[ClientData],
    ) -> None:
        self._args = (server_kwargs, setup, pools, host_clients)
        self.clients = ClientMap(server_kwargs, setup, host_clients)
        self._streaming = False
        self._abort_check: StopCheck | None = None
        self._start()

    def _start(self) -> None:
        server_kwargs, setup, pools, host_clients = self._args
        self.server = CentralServer(**server_kwargs)
        self.edges = {b: EdgeServer(b, **server_kwargs) for b in self.clients.edge_ids}
        self.hosts = [ClientHost(setup, pools, clients) for clients in host_clients]

    def abort_when(self, check: StopCheck | None) -> None:
        """See :meth:`~mecsim.run.backends.base.Executor.abort_when`: asked between host
        calls (in one process a client's training cannot be interrupted)."""
        self._abort_check = check

    def _between_hosts(self) -> None:
        if self._abort_check is not None:
            stop = self._abort_check()
            if stop:
                raise RoundAborted(abort_status(stop))

    def restart(self) -> None:
        """New servers and hosts in their initial state (then :meth:`load_state`)."""
        self.server.close()
        self._start()

    def state(self, known_blobs: set[str] | None = None) -> ExecutorState:
        """The state to checkpoint; with ``known_blobs``, large arrays by reference."""
        return collect(
            self.server.state_dict(known_blobs),
            [h.state_dict(known_blobs) for h in self.hosts],
            {b: e.state_dict(known_blobs) for b, e in self.edges.items()},
        )

    def load_state(self, st: ExecutorState) -> None:
        edges = self.clients.edge_states(st, self.server.load_state_dict(st.server))
        for b, edge in self.edges.items():
            edge.load_state_dict(edges[b])
        for host, hs in zip(self.hosts, self.clients.host_states(st), strict=True):
            host.load_state_dict(hs)

    def associate(self, edge_server_of: dict[int, int]) -> None:
        """See :meth:`~mecsim.run.backends.base.Executor.associate`."""
        self.clients.associate(edge_server_of)
        self.server.associate(edge_server_of)

    def available(self, clients: list[int] | None) -> None:
        """See :meth:`~mecsim.run.backends.base.Executor.available`."""
        self.server.available(clients)

    def plan_ahead(self, rnd: int, chain: bool = False) -> None:
        """Say that the next call to the servers will be :meth:`plan` of round ``rnd``
        (no evaluation, checkpoint or other server call comes first): under Ray the
        central server then plans it at once, while this process times the round that
        ends (and, with ``chain``, the hosts start on it). In-process there is nothing
        to overlap."""

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        """The round's clients and tasks: planned by the central server, filled in by
        the edge servers of a hierarchical algorithm."""
        selected, tasks, downlinks = self.server.plan(rnd)
        if not self.edges:
            return selected, tasks
        groups = self.clients.by_edge(tasks)
        parts = [edge.plan(rnd, groups[b], downlinks.get(b)) for b, edge in self.edges.items()]
        return selected, self.clients.in_task_order(tasks, parts)

    def fit(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        fold: frozenset[int] | None = None,
    ) -> list[ClientResult]:
        """Train the tasks' clients. With ``fold`` (the clients the round will aggregate:
        a flat algorithm whose ``streams_aggregation`` is set), the uploads are streamed
        into the server's aggregate part by part while the clients train, and the
        results come back without them; :meth:`aggregate` then finishes it."""
        self._streaming = fold is not None
        if fold is not None:
            return self._fit_streamed(rnd, tasks, lost, fold)
        out: list[ClientResult] = []
        for h, (group, guests) in self.clients.assign(tasks).items():
            self._between_hosts()
            out += self.hosts[h].fit(rnd, group, lost, guests)
        return sorted(out, key=lambda r: r.client_id)

    def _fit_streamed(
        self, rnd: int, tasks: list[ClientTask], lost: frozenset[int], fold: frozenset[int]
    ) -> list[ClientResult]:
        self.server.stream_begin(rnd)
        out: list[ClientResult] = []
        for part in stream_parts(tasks):
            results: list[ClientResult] = []
            for h, (group, guests) in self.clients.assign(part).items():
                self._between_hosts()
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
        groups = self.clients.by_edge(results)
        reports = [edge.aggregate(rnd, groups[b]) for b, edge in self.edges.items()]
        return self.server.aggregate_edges(rnd, results, *reports)

    def evaluate(self, rnd: int, clients: list[int]) -> list[Evaluation]:
        tasks = self.server.evaluation_tasks(rnd, clients)
        out = []
        for h, group in self.clients.by_host(tasks).items():
            out += self.hosts[h].evaluate(rnd, group)
        return sorted(out)

    def evaluate_tasks(self, rnd: int, tasks: list[ClientTask]) -> list[Evaluation]:
        out = []
        for h, group in self.clients.by_host(tasks).items():
            out += self.hosts[h].evaluate(rnd, group)
        return sorted(out)

    def take_uploads(self) -> dict[int, Any]:
        return {}  # the results carry their uploads

    def host_rss_bytes(self) -> list[int]:
        return [self.hosts[0].rss_bytes()] if self.hosts else []

    def placement(self) -> list[dict[str, Any]]:
        """Where each host runs and which clients it hosts (in-process: no node)."""
        return [
            {
                "host": h,
                "node_id": None,
                "node_ip": None,
                "num_cpus": None,
                "clients": sorted(clients),
            }
            for h, clients in enumerate(self.clients.host_clients)
        ]

    def close(self) -> None:
        self.server.close()
