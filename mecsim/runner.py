"""The round loop, written once: plan -> execute -> time -> aggregate -> record.

1. **Plan**: the algorithm's server side picks the round's clients and what each downloads.
2. **Execute**: the selected clients train for real on their hosts; each returns its
   update and its op-trace.
3. **Time**: the SimPy engine plays the op-traces through the round's network and the
   device CPUs; with a deadline, late clients are dropped before aggregation.
4. **Aggregate**: the server aggregates what made the deadline (measured: wall time,
   FLOPs, RSS); its emulated time comes from the edge server's device profile.
5. **Record**: observers (records, metrics, progress) receive the round's rows.

Observers implement :class:`RunObserver`'s do-nothing hooks; the loop knows nothing of
files, Prometheus or progress bars.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agents.algorithms import TrainConfig, algorithm_classes
from agents.host import HostSetup
from agents.models import build_model, get_flat, model_layout
from agents.training import make_optimizer, measured_step
from mecsim import faults, torch_rng
from mecsim.chaos import kill_point
from mecsim.checkpoint import Checkpoint, CheckpointStore, scenario_digest
from mecsim.data import heterogeneity_dkl, load_dataset, partition
from mecsim.devices import DeviceProfile
from mecsim.energy import client_energy, round_energy
from mecsim.engine import time_round
from mecsim.execution import (
    ActorFailure,
    ExecutorState,
    LocalExecutor,
    PlacementTimeout,
    RayExecutor,
)
from mecsim.network import NetworkModel, device_profiles
from mecsim.observers import RunInfo, RunObserver  # noqa: F401 - re-exported
from mecsim.ops import Compute, op_to_dict, trace_bytes, trace_flops
from mecsim.scenario import Scenario

MiB = 1024 * 1024


class ScenarioInfeasible(Exception):
    """The scenario cannot run as written (e.g. the model does not fit a device's RAM)."""


@dataclass
class RunSetup:
    info: RunInfo
    executor: Any
    network: NetworkModel
    server_profile: DeviceProfile
    slowdown: np.ndarray  # per-client compute slow-down of emulated stragglers (1: none)
    # the uploads are streamed into the aggregate while the clients train (see
    # streams_aggregation): which clients a round aggregates is known before it is timed
    streams: bool = False


def streams_aggregation(scenario: Scenario) -> bool:
    """Can a round's uploads be folded into the aggregate while its clients train?

    Only when the algorithm can aggregate in parts (``ServerAlgorithm.streams_aggregation``,
    a flat algorithm) and which clients a round aggregates is known before the round is
    timed: every client that trains and does not crash or drop out (faults drawn before
    training). A deadline, ``faults.wait_for_fraction``, link or edge-server outages and
    rate traces (a rate of 0 stalls a client for ever) decide it from the timing: the
    uploads are then held until the round is timed. ``execution.stream_aggregation: off``
    always holds them. The run loop checks every streamed round's timed clients against
    the prediction.
    """
    server_cls, _ = algorithm_classes(scenario.algorithm.name)
    f = scenario.faults
    return (scenario.execution.stream_aggregation == "auto"
            and server_cls.aggregates_in_parts() and server_cls.Edge is None
            and scenario.deadline_s is None
            and scenario.channel.model != "trace"
            and (f is None or (f.wait_for_fraction >= 1 and not f.link_outages
                               and not f.edge_server_outages)))


def _step_cost(model: torch.nn.Module, in_shape, num_classes: int, train: TrainConfig):
    """FLOPs and memory of one training step at the scenario's batch size (before the run)."""
    x = torch.zeros((train.batch_size, *in_shape))
    y = torch.arange(train.batch_size) % num_classes
    opt = make_optimizer(train.optimizer, model.parameters(), train.lr, train.momentum)
    _, cost = measured_step(model, opt, x, y, None)
    return cost


def prepare(scenario: Scenario, run_id: str, out_dir, *, hosts: int | None = None,
            backend: str | None = None, ray_address: str | None = None) -> RunSetup:
    """Load data, partition, build the model and network, start hosts and the server."""
    seed = scenario.seed
    n = scenario.topology.clients
    data_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    ds = scenario.dataset
    pools = load_dataset(ds.name, ds.root, ds.train_size, ds.test_size, data_rng)
    part_params = ds.partition.model_dump(exclude={"method"})
    parts = partition(pools, n, ds.partition.method, data_rng, **part_params)

    in_shape = tuple(int(s) for s in pools.train.images.shape[1:])
    num_classes = pools.train.num_classes
    with torch_rng.seeded(seed):  # no other thread draws from torch's generator meanwhile
        model = build_model(scenario.model.name, in_shape, num_classes)
    layout = model_layout(model)
    init_weights = get_flat(model, layout)
    t = scenario.training
    train = TrainConfig(t.epochs, t.batch_size, t.optimizer, t.lr, t.momentum, t.weight_decay)

    profiles = device_profiles(scenario)
    client_devices = scenario.client_profiles()
    with torch_rng.untouched():  # a model (and a step) measured, not trained
        cost = _step_cost(build_model(scenario.model.name, in_shape, num_classes), in_shape,
                          num_classes, train)
    for name in sorted(set(client_devices)):
        ram = profiles[name].ram_bytes
        if cost.memory_bytes > ram:
            raise ScenarioInfeasible(
                f"model {scenario.model.name} needs {cost.memory_bytes / MiB:.1f} MiB per "
                f"training step at batch {t.batch_size}, but device profile {name!r} has "
                f"{ram / MiB:.0f} MiB of RAM")

    n_hosts = max(1, min(hosts or scenario.execution.hosts or os.cpu_count() or 1, n))
    host_clients: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(n_hosts)]
    for cid in range(n):
        host_clients[cid % n_hosts][cid] = (parts.train[cid], parts.test[cid])
    setup = HostSetup(scenario.model.name, in_shape, num_classes, scenario.algorithm.name,
                      dict(scenario.algorithm.params), train, seed, init_weights)
    server_kwargs = dict(
        algorithm=scenario.algorithm.name, layout=layout, init_weights=init_weights,
        client_samples={cid: len(parts.train[cid]) for cid in range(n)},
        fraction=scenario.topology.participation, params=dict(scenario.algorithm.params),
        seed=seed, edge_server_of={cid: scenario.edge_server_of(cid) for cid in range(n)},
    )
    backend = backend or scenario.execution.backend
    if backend == "ray":
        try:
            executor = RayExecutor(server_kwargs, setup, pools, host_clients,
                                   ray_address or scenario.execution.ray_address)
        except PlacementTimeout as exc:
            raise RunFailed(str(exc)) from None
    else:
        executor = LocalExecutor(server_kwargs, setup, pools, host_clients)
    info = RunInfo(run_id, scenario, out_dir, layout.size, layout.nbytes, cost.memory_bytes,
                   cost.flops, client_devices,
                   extra={"hosts": n_hosts, "backend": backend,
                          # the optimiser's element-wise update, part of step_flops
                          "step_optimizer_flops": cost.optimizer_flops,
                          "train_samples": [len(p) for p in parts.train],
                          "test_samples": [len(p) for p in parts.test],
                          # D-bar_KL of DC-PFL (Eq. 1-2) over the clients' train labels
                          "label_dkl": heterogeneity_dkl(parts.label_histograms(pools)[0])})
    network = NetworkModel(scenario, profiles)
    slowdown = faults.slowdown_factors(scenario.faults, seed, n)
    return RunSetup(info, executor, network, profiles[scenario.devices.edge_server], slowdown,
                    streams_aggregation(scenario))


def _mean(values: list[float]) -> float:
    """Mean ignoring NaN (a client without test data has NaN accuracy)."""
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _status(cid: int, completed: set[int], rejected: set[int], rf: faults.RoundFaults,
            finish_s: float) -> str:
    if cid in rf.outage or (cid not in completed and np.isinf(finish_s)):
        return "outage"
    if cid in rf.crash_at:
        return "crashed"
    if cid in rf.dropout:
        return "dropped_out"
    if cid not in completed:
        return "dropped_deadline"
    return "rejected_nonfinite" if cid in rejected else "completed"


def run_round(rs: RunSetup, rnd: int, elapsed_s: float, *, plan_next: bool = False
              ) -> tuple[dict, list[dict], dict]:
    """One round; returns (round row, client rows, op-traces record).

    ``plan_next``: the run loop goes straight on to the next round (no checkpoint in
    between, not the last round), so, when this round does not evaluate either, the
    executor is asked to plan it ahead (:meth:`LocalExecutor.plan_ahead`)."""
    sc = rs.info.scenario
    last = rnd == sc.rounds - 1
    evaluates = (rnd + 1) % sc.evaluation.every == 0 or last
    plan_ahead = plan_next and not evaluates  # the last round always evaluates
    wall0 = time.perf_counter()
    selected, tasks = rs.executor.plan(rnd)
    rf = faults.draw_round(sc.faults, sc.seed, rnd, selected)
    # a client whose link is down all round cannot receive the model: it does not train
    trained = [t for t in tasks if t.client_id not in rf.outage]
    # streamed: the clients the round will aggregate, known before it is timed
    fold = frozenset(t.client_id for t in trained) - set(rf.failed) if rs.streams else None
    results = rs.executor.fit(rnd, trained, frozenset(rf.crash_at), fold=fold)
    train_wall = time.perf_counter() - wall0
    if plan_ahead and rs.streams:  # the server has been asked for all of this round's work
        rs.executor.plan_ahead(rnd + 1)
    traces = {r.client_id: r.trace for r in results}
    for cid, at in rf.crash_at.items():
        traces[cid] = faults.crash_trace(traces[cid], at)
    for cid in rf.dropout:
        traces[cid] = faults.dropout_trace(traces[cid])
    for t in tasks:
        if t.client_id in rf.outage:
            traces[t.client_id] = faults.outage_trace(t.download_nbytes)
    traces = {cid: traces[cid] for cid in sorted(traces)}
    specs, servers, net, channel_rows = rs.network.round(rnd, selected, elapsed_s)
    specs = faults.apply_to_specs(specs, sc.faults, rs.slowdown, elapsed_s, rf.outage)
    failed = set(rf.failed)
    wait_for = faults.wait_for_count(sc.faults, len(selected))

    timing = time_round(traces, specs, servers, net, failed=failed, wait_for=wait_for)
    completed_ids = {c.client_id for c in timing.clients if c.completed}
    if fold is not None and completed_ids != fold:
        raise RuntimeError(
            f"round {rnd}: the aggregate was streamed for clients that the timing did not "
            f"complete ({sorted(fold - completed_ids)[:5]}) or without clients it did "
            f"({sorted(completed_ids - fold)[:5]}); set execution.stream_aggregation: off "
            "and report this scenario")
    agg = rs.executor.aggregate(rnd, [r for r in results if r.client_id in completed_ids])
    if plan_ahead and not rs.streams:
        rs.executor.plan_ahead(rnd + 1)
    rejected = set(agg.rejected)
    aggregate_s = rs.server_profile.compute_time_s(agg.flops, 0)
    timing = time_round(traces, specs, servers, net, aggregate_s=aggregate_s, failed=failed,
                        wait_for=wait_for)

    evals: dict[int, tuple[float, float]] = {}
    eval_extras: dict[int, dict[str, float]] = {}  # an algorithm's own per-client figures
    if evaluates:
        who = list(range(sc.topology.clients)) if sc.evaluation.clients == "all" else selected
        for cid, acc, loss, _, *extra in rs.executor.evaluate(rnd, who):
            evals[cid] = (acc, loss)
            if extra:
                eval_extras[cid] = extra[0]

    by_id = {r.client_id: r for r in results}
    tl_by_id = {c.client_id: c for c in timing.clients}
    statuses: dict[int, str] = {}
    client_rows: list[dict[str, Any]] = []
    for cid in sorted(set(selected) | set(evals)):
        row: dict[str, Any] = {"run_id": rs.info.run_id, "round": rnd, "client_id": cid,
                               "device": rs.info.client_devices[cid],
                               "edge_server": sc.edge_server_of(cid),
                               "selected": cid in tl_by_id}
        if cid in tl_by_id:
            tl = tl_by_id[cid]
            statuses[cid] = status = _status(cid, completed_ids, rejected, rf, tl.finish_s)
            up, down = trace_bytes(traces[cid])
            row.update(status=status, completed=status == "completed",
                       start_s=tl.start_s, finish_s=tl.finish_s,
                       download_s=tl.download_s, compute_s=tl.compute_s,
                       upload_s=tl.upload_s, server_compute_s=tl.server_compute_s,
                       bytes_up=up, bytes_down=down)
            if cid in by_id:
                r = by_id[cid]
                flops, steps = r.flops, r.steps
                if cid in rf.crash_at:  # the device did only the part before its crash
                    flops = trace_flops(traces[cid])[0]
                    steps = sum(op.batches for op in traces[cid] if isinstance(op, Compute))
                row.update(gflops=flops / 1e9, steps=steps,
                           num_samples=r.num_samples, train_loss=r.train_loss,
                           peak_memory_mb=r.peak_memory_bytes / MiB,
                           host_train_s=r.host_seconds)
            row.update(channel_rows.get(cid, {}))
            row.update(client_energy(rs.network.devices[cid], tl, traces[cid], specs[cid],
                                     timing.round_time_s))
        if cid in evals:
            row["accuracy"], row["test_loss"] = evals[cid]
        client_rows.append(row)

    def count(status: str) -> int:
        return sum(s == status for s in statuses.values())

    accs = [a for a, _ in evals.values() if not np.isnan(a)]
    up_total = sum(trace_bytes(t)[0] for t in traces.values())
    down_total = sum(trace_bytes(t)[1] for t in traces.values())
    round_row = {
        "run_id": rs.info.run_id, "round": rnd, "algorithm": sc.algorithm.name,
        "selected": len(selected), "completed": count("completed"),
        "dropped": len(selected) - count("completed"),
        "dropped_deadline": count("dropped_deadline"), "crashed": count("crashed"),
        "dropped_out": count("dropped_out"), "outage": count("outage"),
        "rejected": count("rejected_nonfinite"), "faults": 0,
        "round_time_s": timing.round_time_s, "dl_time_s": timing.download_s,
        "client_time_s": timing.client_s, "ul_time_s": timing.upload_s,
        "server_time_s": timing.server_s, "backhaul_time_s": timing.backhaul_s,
        "idle_time_s": timing.idle_s,
        "elapsed_s": elapsed_s + timing.round_time_s,
        "bytes_up": up_total, "bytes_down": down_total,
        **round_energy(c for c in client_rows if c.get("selected")),
        "client_gflops": sum(trace_flops(traces[r.client_id])[0] if r.client_id in rf.crash_at
                             else r.flops for r in results) / 1e9,
        "server_gflops": agg.flops / 1e9,
        "server_rss_mb": agg.rss_bytes / MiB,
        "client_peak_mb": max((r.peak_memory_bytes for r in results), default=0) / MiB,
        "mean_accuracy": _mean(accs),
        "min_accuracy": min(accs) if accs else float("nan"),
        "max_accuracy": max(accs) if accs else float("nan"),
        "mean_test_loss": _mean([lo for _, lo in evals.values()]),
        "train_loss": _mean([r.train_loss for r in results]),
        "host_wall_s": float("nan"),  # set last (its place among the columns kept)
        "host_train_wall_s": train_wall,
        "host_aggregate_s": agg.wall_s,
        **agg.metrics,
        **{f"mean_{k}": _mean([e[k] for e in eval_extras.values()])
           for k in sorted({k for e in eval_extras.values() for k in e})},
    }
    trace_record = {
        "round": rnd, "aggregate_flops": agg.flops, "selected": list(selected),
        "clients": {str(cid): [op_to_dict(op) for op in tr] for cid, tr in traces.items()},
    }
    if failed or rf.outage:  # what replay needs to re-time a faulted round the same way
        trace_record["failed"] = {str(c): st for c, st in sorted(rf.failed.items())}
        trace_record["outage"] = sorted(rf.outage)
    # the whole round in this process, its records built (not yet written) included
    round_row["host_wall_s"] = time.perf_counter() - wall0
    return round_row, client_rows, trace_record


class RunFailed(Exception):
    """The run cannot go on (e.g. its actors keep dying); its finished rounds are kept."""


#: Actor deaths recovered from without a round finishing in between before giving up.
MAX_RECOVERIES = 3

_SAME_COLUMNS = ("selected", "completed", "bytes_up", "bytes_down", "client_gflops",
                 "elapsed_s", "mean_accuracy", "train_loss")


class _Loop:
    """The rounds of one run, with checkpoints and recovery from actor deaths."""

    def __init__(self, rs: RunSetup, observers, store: CheckpointStore | None,
                 start: Checkpoint | None, prior_rows: list[dict[str, Any]],
                 should_stop: Callable[[], bool | str] | None) -> None:
        self.rs, self.observers, self.store = rs, list(observers), store
        self.should_stop = should_stop
        self.rows = list(prior_rows)
        self.rnd = start.rounds_done if start else 0
        self.elapsed_s = start.elapsed_s if start else 0.0
        self.base = start  # the newest checkpoint of this history (None: the start)
        sc = rs.info.scenario
        self.every = sc.checkpoint.every if store is not None else 0

    def _emit(self, name: str, *args: Any) -> None:
        for obs in self.observers:
            getattr(obs, name)(self.rs.info, *args)

    def _checkpoint(self) -> None:
        assert self.store is not None
        st = self.rs.executor.state(self.store.blob_keys())
        ckpt = Checkpoint(self.rnd, self.elapsed_s, st.server, st.clients, st.costs,
                          blobs=st.blobs, edges=st.edges)
        path = self.store.save(ckpt)
        self.base = Checkpoint(ckpt.rounds_done, ckpt.elapsed_s, None, {}, None, path)
        self._emit("on_checkpoint", self.rnd, self.store.last_bytes, self.store.last_seconds)

    def _recover(self, failure: ActorFailure) -> None:
        """New actors, restored from the newest checkpoint (or the run's start); the
        rounds after it are re-executed without being recorded again."""
        rs = self.rs
        try:
            rs.executor.restart()
        except PlacementTimeout as exc:
            raise RunFailed(f"{exc}, after {failure}") from None
        self._emit("on_placement", self.rnd, rs.executor.placement())
        target = self.rnd
        if self.base is not None:
            ckpt = self.store.load(self.base.path) if self.base.path is not None else self.base
            rs.executor.load_state(ExecutorState(ckpt.server, ckpt.clients, ckpt.costs,
                                                 edges=ckpt.edges))
            redo, elapsed = ckpt.rounds_done, ckpt.elapsed_s
        else:
            redo, elapsed = 0, 0.0
        for r in range(redo, target):
            row, _, _ = run_round(rs, r, elapsed)
            elapsed = row["elapsed_s"]
            recorded = self.rows[r] if r < len(self.rows) else None
            if recorded is not None and any(
                    not _same(row[k], recorded.get(k)) for k in _SAME_COLUMNS):
                print(f"mecsim: warning: round {r + 1}, re-executed after an actor died, "
                      "differs from its record", file=sys.stderr)
        self.elapsed_s = elapsed

    def run(self) -> str:
        """Run the remaining rounds; returns ``finished`` or ``cancelled``."""
        sc = self.rs.info.scenario
        faults_in_round, recoveries = 0, 0
        while self.rnd < sc.rounds:
            kill_point(f"round-start:{self.rnd}")
            try:
                checkpoint_next = bool(self.every) and (self.rnd + 1) % self.every == 0
                row, client_rows, traces = run_round(self.rs, self.rnd, self.elapsed_s,
                                                     plan_next=not checkpoint_next)
            except ActorFailure as exc:
                faults_in_round, recoveries = faults_in_round + 1, recoveries + 1
                self._emit("on_fault", self.rnd, str(exc))
                if recoveries > MAX_RECOVERIES:
                    raise RunFailed(f"actors died {recoveries} times without a round "
                                    f"finishing in between (last: {exc})") from exc
                self._recover(exc)
                continue
            row["faults"] = faults_in_round
            faults_in_round = recoveries = 0
            self.rows.append(row)
            self.elapsed_s = row["elapsed_s"]
            self.rnd += 1
            self._emit("on_round_end", row, client_rows, traces)
            kill_point(f"round-end:{self.rnd - 1}")
            if self.every and (self.rnd % self.every == 0 or self.rnd == sc.rounds):
                while True:
                    try:
                        self._checkpoint()
                        break
                    except ActorFailure as exc:
                        # counted in the next round's row (this one's is written)
                        faults_in_round, recoveries = faults_in_round + 1, recoveries + 1
                        self._emit("on_fault", self.rnd - 1, str(exc))
                        if recoveries > MAX_RECOVERIES:
                            raise RunFailed(f"actors died {recoveries} times while "
                                            f"checkpointing (last: {exc})") from exc
                        self._recover(exc)
            if self.should_stop is not None and self.rnd < sc.rounds:
                stop = self.should_stop()
                if stop:
                    return stop if stop in ("cancelled", "interrupted") else "cancelled"
        return "finished"


def _same(a: Any, b: Any) -> bool:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return a == b
    return fa == fb or (np.isnan(fa) and np.isnan(fb))


@dataclass
class ResumePoint:
    """Where a run continues: its newest usable checkpoint (None: from the start) and the
    round rows already recorded up to it."""

    checkpoint: Checkpoint | None
    rows: list[dict[str, Any]]


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """While the rounds run, what this process held before them (torch, Ray, the data,
    the set-up) is exempt from Python's cyclic garbage collector, whose full collections
    would otherwise walk it all, a stall of tens of milliseconds in the rounds they fall
    in. Afterwards it is collectable again (a service runs many runs in one process)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run(scenario: Scenario, run_id: str, out_dir=None, observers: list[RunObserver] = (),
        *, should_stop: Callable[[], bool | str] | None = None,
        resume: ResumePoint | None = None, **prepare_kwargs) -> list[dict[str, Any]]:
    """Run every round of ``scenario``; returns the round rows.

    With ``out_dir``, a checkpoint is written after every ``checkpoint.every`` rounds
    (and after the last) to ``out_dir/checkpoints``. ``resume`` continues a run from
    its checkpoint (see :mod:`mecsim.runfolder`). ``should_stop`` is asked after every
    round; when it returns True (or ``"cancelled"``, or ``"interrupted"``: the status the
    run then gets) the run stops there, keeping the rounds done (the service cancelling a
    run, or stopping). A Ray actor that dies is re-created and restored
    from the last checkpoint, and the round re-executed (``faults`` column).

    Observers hear how the run ends: ``on_run_end`` when every round is done,
    ``on_run_stopped`` otherwise (then the exception, if any, propagates).
    """
    rs = prepare(scenario, run_id, out_dir, **prepare_kwargs)
    store = None
    if out_dir is not None and scenario.checkpoint.every > 0:
        store = CheckpointStore(out_dir, run_id, scenario_digest(scenario),
                                scenario.checkpoint.keep)
    start = resume.checkpoint if resume else None
    loop = _Loop(rs, observers, store, start, resume.rows if resume else [], should_stop)
    try:
        if start is not None:
            rs.executor.load_state(ExecutorState(start.server, start.clients, start.costs,
                                                 edges=start.edges))
        rs.info.resumed_from = loop.rnd
        if resume is not None:
            loop._emit("on_run_resume", list(loop.rows))
        else:
            loop._emit("on_run_start")
        loop._emit("on_placement", loop.rnd, rs.executor.placement())
        with _heap_frozen():
            status = loop.run()
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        message = "" if status == "interrupted" else f"{type(exc).__name__}: {exc}"
        try:
            loop._emit("on_run_stopped", loop.rows, status, message)
        finally:
            rs.executor.close()
        raise
    try:
        if status == "finished":
            loop._emit("on_run_end", loop.rows)
        else:
            loop._emit("on_run_stopped", loop.rows, status, "")
    finally:
        rs.executor.close()
    return loop.rows
