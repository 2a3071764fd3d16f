"""The Ray executor: host actors, a central-server actor and edge-server actors."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from mecsim.agents.algorithms import AlgorithmError, ClientResult, ClientTask
from mecsim.agents.host import HostSetup
from mecsim.agents.server import AggregateReport
from mecsim.data import DataPools
from mecsim.run.backends import actors, balance, shared_model, shared_uploads
from mecsim.run.backends.actors import (
    CentralServerActor,
    ClientHostActor,
    EdgeServerActor,
    weights_by_reference,
)
from mecsim.run.backends.balance import STREAM_PARTS_IN_FLIGHT, stream_parts
from mecsim.run.backends.base import (
    ABORT_POLL_S,
    ActorFailure,
    ClientData,
    ClientMap,
    Evaluation,
    ExecutorState,
    RoundAborted,
    StopCheck,
    abort_status,
    collect,
)
from mecsim.run.backends.placement import place_hosts
from mecsim.run.backends.ray_start import ensure_ray

#: Streamed uploads of a host on the central server's node go through a shared-memory
#: file instead of the object store (see :mod:`mecsim.run.backends.shared_uploads`); same
#: records.
SHARED_UPLOADS = True
#: Whether a flat algorithm's global model reaches hosts on the central server's node
#: through a shared-memory file (:mod:`mecsim.run.backends.shared_model`), instead of the
#: object store.
SHARED_MODEL = True


@dataclass(frozen=True)
class _Chained:
    """A round's first streamed part, submitted on the server's plan (see
    :meth:`RayExecutor.plan_ahead`): each host's call's result reference, the fold."""

    rnd: int
    metas: list[Any]
    fold: Any


class RayExecutor:
    """Host actors, a central-server actor and, for a hierarchical algorithm, one actor
    per edge server (no CPU reserved: servers) in a Ray cluster.

    The host actors are spread over the cluster's nodes (a placement group with the
    SPREAD strategy: as many nodes as there are hosts, as evenly as the nodes allow),
    one CPU each when the live nodes have that many, else an equal share that fits (see
    :func:`~mecsim.run.backends.placement.host_cpus`): after a node died, its hosts are
    re-created on the nodes left. Waiting for room is bounded by
    :data:`~mecsim.run.backends.placement.PLACEMENT_TIMEOUT_S`.

    Every call that waits on an actor turns the death of an actor (its process killed,
    out of memory, its node gone) into :class:`ActorFailure`; :meth:`restart` kills what
    is left of the actors and starts new ones.
    """

    #: its actors are processes that can die (:class:`ActorFailure`); see
    #: :attr:`~mecsim.run.backends.base.Executor.actors_can_die`
    actors_can_die = True

    def __init__(
        self,
        server_kwargs: dict[str, Any],
        setup: HostSetup,
        pools: DataPools,
        host_clients: list[ClientData],
        ray_address: str | None = None,
    ) -> None:
        import ray  # deferred: see ensure_ray

        self._owns_ray = ensure_ray(ray_address, max(len(host_clients), os.cpu_count() or 1))
        self._ray = ray
        self._args = (server_kwargs, setup, pools, host_clients)
        self.clients = ClientMap(server_kwargs, setup, host_clients)
        self._streaming = False
        self._pools_ref = ray.put(pools)
        self._uploads_prefix: str | None = None  # this start's shared upload files
        self._all_prefixes: list[str] = []  # every start's: swept again on close
        self._shared_hosts: set[int] = set()  # hosts on the central server's node
        if shared_uploads.available():
            shared_uploads.remove_stale()
        self.server: Any = None  # the central server's actor handle (Ray types it Any)
        self.edges: dict[int, Any] = {}  # edge server -> its actor (hierarchical only)
        self.hosts: list[Any] = []
        self._group: Any = None  # the hosts' placement group
        self._host_cpus = 1.0
        self._host_nodes: list[dict[str, str]] = []
        self._board = False  # whether the global model goes through a shared file
        self._planned: tuple[int, Any] | None = None  # (round, its plan) asked for ahead
        self._chained: _Chained | None = None  # a round's first part, started on its plan
        self._map_sent = False  # whether the hosts have the ClientMap (for chaining)
        self.chained_rounds = 0  # rounds whose hosts started on the plan (tests, docs)
        self._folds: list[Any] = []  # a streamed round's folds not yet waited for
        self._abort_check: StopCheck | None = None
        try:
            self._start()
        except BaseException:  # an actor that cannot start: free what did start
            self.close()  # (its hosts hold the placement group's CPUs), then say why
            raise

    def _start(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self._ray
        server_kwargs, setup, _, host_clients = self._args
        self._group, self._host_cpus = place_hosts(ray, len(host_clients))
        central_actor = ray.remote(num_cpus=0, max_restarts=0)(CentralServerActor)
        edge_actor = ray.remote(num_cpus=0, max_restarts=0)(EdgeServerActor)
        self.server = central_actor.remote(**server_kwargs)
        self.edges = {b: edge_actor.remote(b, **server_kwargs) for b in self.clients.edge_ids}
        host_actor = ray.remote(num_cpus=self._host_cpus, max_restarts=0)(ClientHostActor)
        prefix = self._uploads_prefix = (
            shared_uploads.executor_prefix(os.urandom(4).hex())
            if SHARED_UPLOADS and shared_uploads.available()
            else None
        )
        if prefix:
            self._all_prefixes.append(prefix)
        self.hosts = [
            host_actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=h
                )
            ).remote(
                setup,
                self._pools_ref,
                clients,
                actors.HOLD_UPLOADS_BYTES,
                str(shared_uploads.SHM_DIR / f"{prefix}{h}") if prefix else None,
            )
            for h, clients in enumerate(host_clients)
        ]
        self._weight_refs: list[Any] = []
        self._stream_end: Any = None  # a streamed round's stream_end, submitted early
        self._folds, self._streaming, self._planned = [], False, None  # of actors gone
        self._chained, self._map_sent = None, False
        self._planned_ids: list[int] = []  # the clients of the plan asked for ahead
        # surface start-up errors here
        self._get(
            [self.server.rss_bytes.remote(), *(e.rss_bytes.remote() for e in self.edges.values())]
        )
        self._host_nodes = self._get([h.node.remote() for h in self.hosts])
        server_node = self._get(self.server.node_id.remote())
        self._shared_hosts = {
            h
            for h, node in enumerate(self._host_nodes)
            if prefix and node["node_id"] == server_node
        }
        # the global model through a shared file only when every host can map it, and
        # on this process's machine, where the clean-up (remove, remove_stale) looks
        self._board = False
        if (
            SHARED_MODEL
            and prefix
            and len(self._shared_hosts) == len(self.hosts)
            and server_node == ray.get_runtime_context().get_node_id()
        ):
            path = shared_uploads.SHM_DIR / f"{prefix}{shared_model.NAME}"
            self._board = self._get(
                self.server.open_board.remote(str(path), server_kwargs["layout"].size)
            )

    def placement(self) -> list[dict[str, Any]]:
        """Where each host actor runs (node id and IP), its CPUs and its clients."""
        return [
            {"host": h, **node, "num_cpus": self._host_cpus, "clients": sorted(clients)}
            for h, (node, clients) in enumerate(
                zip(self._host_nodes, self.clients.host_clients, strict=True)
            )
        ]

    def abort_when(self, check: StopCheck | None) -> None:
        """See :meth:`~mecsim.run.backends.base.Executor.abort_when`: every wait polls
        ``check`` each :data:`~mecsim.run.backends.base.ABORT_POLL_S` seconds."""
        self._abort_check = check

    def _wait_or_abort(self, refs: Any) -> None:
        """Wait until every ref is ready, asking the stop check meanwhile; a stop raises
        :class:`RoundAborted` (the caller's close kills the actors still working)."""
        pending = list(dict.fromkeys(refs if isinstance(refs, list) else [refs]))
        while pending:
            _, pending = self._ray.wait(pending, num_returns=len(pending), timeout=ABORT_POLL_S)
            if pending and self._abort_check is not None:
                stop = self._abort_check()
                if stop:
                    raise RoundAborted(abort_status(stop))

    def _get(self, refs: Any) -> Any:
        """``ray.get``, with an actor's death raised as :class:`ActorFailure` (and, with a
        stop check, a stop while waiting as :class:`RoundAborted`)."""
        from ray import exceptions as rex

        try:
            if self._abort_check is not None:
                self._wait_or_abort(refs)
            return self._ray.get(refs)
        except (
            rex.RayActorError,
            rex.ObjectLostError,
            rex.OwnerDiedError,
            rex.WorkerCrashedError,
            rex.NodeDiedError,
        ) as exc:
            raise ActorFailure(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        except rex.RayTaskError as exc:
            # a task whose arguments came from an actor that died, maybe through another
            # task (the central server's aggregation of an edge server's report)
            deaths = (
                rex.RayActorError,
                rex.ObjectLostError,
                rex.OwnerDiedError,
                rex.WorkerCrashedError,
                rex.NodeDiedError,
            )
            cause: Any = exc
            for _ in range(4):
                inner = (
                    cause.as_instanceof_cause() if hasattr(cause, "as_instanceof_cause") else cause
                )
                if isinstance(inner, deaths):
                    raise ActorFailure(f"{type(getattr(cause, 'cause', inner)).__name__}") from exc
                if isinstance(inner, AlgorithmError):  # the algorithm's own code: one line
                    original = getattr(cause, "cause", inner)  # (a CallTimeout stays one)
                    kind = type(original) if isinstance(original, AlgorithmError) else None
                    raise (kind or AlgorithmError)(str(original)) from exc
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

    def associate(self, edge_server_of: dict[int, int]) -> None:
        """See :meth:`~mecsim.run.backends.base.Executor.associate` (the central-server
        actor runs its calls in order: this one before the round's plan)."""
        self._no_plan_ahead("an association")
        self.clients.associate(edge_server_of)
        self._map_sent = False  # a chained call would assign with the old map
        self._get(self.server.associate.remote(edge_server_of))

    def available(self, clients: list[int] | None) -> None:
        """See :meth:`~mecsim.run.backends.base.Executor.available` (before the round's
        plan, which is then not planned ahead)."""
        self._no_plan_ahead("the clients online")
        self._get(self.server.available.remote(clients))

    def plan_ahead(self, rnd: int, chain: bool = False) -> None:
        """A flat algorithm's plan of round ``rnd`` is asked for now (see
        :meth:`~mecsim.run.backends.base.Executor.plan_ahead`): the server actor, which runs
        calls in order, plans right after finishing the aggregate, and the next
        :meth:`plan` finds it done instead of waiting a round trip (~4 ms a round).

        With ``chain`` (called while the round before is being streamed: its fold and
        end are already with the server), round ``rnd``'s first streamed part is
        submitted too, each host's call taking the plan by reference: Ray runs it as soon
        as the server has made the plan, and the host picks its share of the part as
        :meth:`fit` would (:meth:`ClientMap.assign` of
        :func:`~mecsim.run.backends.balance.stream_parts`' first part), instead of
        waiting for the aggregate to reach this process, the round's records and the
        next submission (~7 ms a 1,000-client round). :meth:`fit` takes those calls
        over."""
        if self.edges:
            return
        plan = self.server.plan_by_reference.remote(rnd, self._board)
        self._planned = (rnd, plan)
        if chain and self._streaming and self._stream_end is not None:
            self._chained = self._submit_chained(rnd, plan)

    def _submit_chained(self, rnd: int, plan: Any) -> _Chained:
        """Round ``rnd``'s first streamed part on every host, from the plan ``plan`` (a
        reference), and its fold; the server gets them after the round before's end and
        this plan (it runs our calls in order)."""
        if not self._map_sent:  # each host runs our calls in order: this one first
            self._map_sent = True
            for host in self.hosts:
                host.use_client_map.remote(self.clients)
        size = balance.STREAM_PART_CLIENTS  # this process's: the hosts cut the same part
        metas, uploads = [], []
        for h, host in enumerate(self.hosts):
            meta, weights = host.fit_planned.options(num_returns=2).remote(
                rnd,
                plan,
                h,
                size,
                shared_slot=0 if h in self._shared_hosts else None,
            )
            metas.append(meta)
            uploads.append(weights)
        self.server.stream_begin.remote(rnd)
        fold = self.server.stream_fold_split.remote(rnd, None, len(metas), *metas, *uploads)
        return _Chained(rnd, metas, fold)

    def _no_plan_ahead(self, what: str) -> None:
        """A server call other than the plan asked for ahead would see the server's
        state after that plan (its client selection drawn): a bug, not a fault."""
        if self._planned is not None:
            raise RuntimeError(f"{what} after round {self._planned[0]} was planned ahead")

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        ahead, self._planned = self._planned, None
        if ahead is not None:
            if ahead[0] != rnd:
                raise RuntimeError(f"round {rnd} planned, but round {ahead[0]} was planned ahead")
            selected, tasks = self._get(ahead[1])
            self._planned_ids = [t.client_id for t in tasks]
            return selected, tasks
        if not self.edges:
            return self._get(self.server.plan_by_reference.remote(rnd, self._board))
        selected, tasks, downlinks = self._get(self.server.plan.remote(rnd))
        groups = self.clients.by_edge(tasks)
        stored: dict[int, Any] = {}  # one object-store copy of what several receive
        refs = []
        for b, edge in self.edges.items():
            down = downlinks.get(b)
            if down is not None:
                if id(down) not in stored:
                    stored[id(down)] = self._ray.put(down)
                down = stored[id(down)]
            refs.append(edge.plan.remote(rnd, groups[b], down))
        return selected, self.clients.in_task_order(tasks, self._get(refs))

    def fit(
        self,
        rnd: int,
        tasks: list[ClientTask],
        lost: frozenset[int] = frozenset(),
        fold: frozenset[int] | None = None,
    ) -> list[ClientResult]:
        """Results without their weights; the weights stay in the object store (streamed:
        the server actor fetches each part's from there and folds them)."""
        self._streaming = fold is not None
        if fold is not None:
            return self._fit_streamed(rnd, tasks, lost, fold)
        if self._chained is not None:  # its hosts would train the round twice
            raise RuntimeError(f"round {rnd}: held after its hosts were started on the plan")
        meta_refs, self._weight_refs = [], []
        tasks = weights_by_reference(self._ray, tasks)
        for h, (group, guests) in self.clients.assign(tasks).items():
            meta, weights = (
                self.hosts[h].fit_split.options(num_returns=2).remote(rnd, group, lost, guests)
            )
            meta_refs.append(meta)
            self._weight_refs.append(weights)
        out = [r for part in self._get(meta_refs) for r in part]
        return sorted(out, key=lambda r: r.client_id)

    def _fit_streamed(
        self, rnd: int, tasks: list[ClientTask], lost: frozenset[int], fold: frozenset[int]
    ) -> list[ClientResult]:
        """Part by part: the hosts train a part's clients, the server actor folds their
        uploads (read from the object store) while the hosts go on with the next part; at
        most :data:`STREAM_PARTS_IN_FLIGHT` parts are submitted ahead of the server."""
        self._no_plan_ahead("a streamed fit")
        chained, self._chained = self._chained, None
        tasks = weights_by_reference(self._ray, tasks)
        begun = False
        meta_refs: list[Any] = []
        folds: list[Any] = []
        if STREAM_PARTS_IN_FLIGHT > shared_uploads.SLOTS:
            raise RuntimeError("more streamed parts in flight than shared upload slots")
        parts = stream_parts(tasks)
        if chained is not None:
            # the hosts were given the plan's first part (plan_ahead): only what fit
            # would have done with every planned client trained, kept and folded
            planned = self._planned_ids
            if (
                chained.rnd != rnd
                or lost
                or fold != frozenset(t.client_id for t in tasks)
                or planned != [t.client_id for t in tasks]
            ):
                raise RuntimeError(
                    f"round {rnd}: its hosts were started on the plan, but the round "
                    "trains, loses or folds other clients"
                )
            meta_refs, folds, begun = list(chained.metas), [chained.fold], True
            self.chained_rounds += 1
        for p, part in enumerate(parts):
            if chained is not None and p == 0:
                continue
            # part p may write slot p % SLOTS of a host's shared file: part p - SLOTS,
            # the last to use it, has been folded (waited for below) before this submit
            slot = p % shared_uploads.SLOTS
            metas, uploads = [], []
            for h, (group, guests) in self.clients.assign(part).items():
                meta, weights = (
                    self.hosts[h]
                    .fit_split.options(num_returns=2)
                    .remote(
                        rnd,
                        group,
                        lost,
                        guests,
                        shared_slot=slot if h in self._shared_hosts else None,
                    )
                )
                metas.append(meta)
                uploads.append(weights)
            if not begun:  # after the first hosts' calls: they start training sooner
                self.server.stream_begin.remote(rnd)  # the actor runs our calls in order
                begun = True
            keep = fold.intersection(t.client_id for t in part)
            folds.append(
                self.server.stream_fold_split.remote(rnd, keep, len(metas), *metas, *uploads)
            )
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
        groups = self.clients.by_edge(results)
        reports = [
            edge.aggregate_split.remote(rnd, groups[b], *refs) for b, edge in self.edges.items()
        ]
        return self._get(self.server.aggregate_edges.remote(rnd, results, *reports))

    def evaluate(self, rnd: int, clients: list[int]) -> list[Evaluation]:
        self._no_plan_ahead("an evaluation")
        tasks = weights_by_reference(
            self._ray, self._get(self.server.evaluation_tasks.remote(rnd, clients))
        )
        refs = [
            self.hosts[h].evaluate.remote(rnd, g) for h, g in self.clients.by_host(tasks).items()
        ]
        return sorted(x for part in self._get(refs) for x in part)

    def evaluate_tasks(self, rnd: int, tasks: list[ClientTask]) -> list[Evaluation]:
        tasks = weights_by_reference(self._ray, tasks)
        refs = [
            self.hosts[h].evaluate.remote(rnd, g) for h, g in self.clients.by_host(tasks).items()
        ]
        return sorted(x for part in self._get(refs) for x in part)

    def take_uploads(self) -> dict[int, Any]:
        """The last :meth:`fit`'s uploads, fetched from the object store (copies: a
        host reuses its upload buffer in its next call)."""
        refs, self._weight_refs = self._weight_refs, []
        flat = {cid: w for part in self._get(refs) for cid, w in part.items()}
        by_ref = [c for c, w in flat.items() if isinstance(w, self._ray.ObjectRef)]
        if by_ref:
            for c, w in zip(by_ref, self._get([flat[c] for c in by_ref]), strict=True):
                flat[c] = w
        return {c: np.array(w, dtype=np.float32, copy=True) for c, w in flat.items()}

    def state(self, known_blobs: set[str] | None = None) -> ExecutorState:
        self._no_plan_ahead("a checkpoint")
        server, *rest = self._get(
            [
                self.server.state_dict.remote(known_blobs),
                *(e.state_dict.remote(known_blobs) for e in self.edges.values()),
                *(h.state_dict.remote(known_blobs) for h in self.hosts),
            ]
        )
        n = len(self.edges)
        return collect(server, rest[n:], dict(zip(self.edges, rest[:n], strict=True)))

    def load_state(self, st: ExecutorState) -> None:
        legacy = self._get(self.server.load_state_dict.remote(st.server))
        edges = self.clients.edge_states(st, legacy)
        refs = [edge.load_state_dict.remote(edges[b]) for b, edge in self.edges.items()]
        refs += [
            host.load_state_dict.remote(hs)
            for host, hs in zip(self.hosts, self.clients.host_states(st), strict=True)
        ]
        self._get(refs)

    def host_rss_bytes(self) -> list[int]:
        return self._get([h.rss_bytes.remote() for h in self.hosts])

    def actor_pids(self) -> dict[str, list[int]]:
        """Process ids of the central-server actor, of the edge-server actors (in edge
        server order; none for a flat algorithm) and of the host actors."""
        return {
            "server": [self._get(self.server.pid.remote())],
            "edges": self._get([e.pid.remote() for e in self.edges.values()]),
            "hosts": self._get([h.pid.remote() for h in self.hosts]),
        }

    def close(self) -> None:
        self._kill_all()
        # a host killed while it made its file (ray.kill does not wait) may have made it
        # after its start's sweep: every start's files are swept again
        for prefix in self._all_prefixes:
            shared_uploads.remove(prefix)
        if self._owns_ray:
            self._ray.shutdown()
