"""The round loop, written once: plan -> execute -> time -> aggregate -> record.

1. **Plan and train** (:func:`train`): the algorithm's server side picks the round's
   clients and what each downloads; the round's faults are drawn; the selected clients
   train for real on their hosts, each returning its update and its op-trace.
2. **Time and aggregate** (:func:`time_and_aggregate`): the SimPy engine plays the
   op-traces (:func:`round_traces`: with the faults applied) through the round's network
   and the device CPUs; with a deadline, late clients are dropped before aggregation. The
   server aggregates what made the deadline (measured: wall time, FLOPs, RSS); its
   emulated time comes from the edge server's device profile.
3. **Evaluate** (:func:`evaluate`): the clients' accuracy when the round evaluates, or the
   follow-up batches of a server that drives its rounds.
4. **Record**: the round's rows (:mod:`mecsim.run.rows`), which observers (records,
   metrics, progress) receive.

Observers implement :class:`RunObserver`'s do-nothing hooks; the loop knows nothing of
files, Prometheus or progress bars.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mecsim.agents.algorithms import ROUND_STAGE, ClientResult, ClientTask, algorithm_classes
from mecsim.agents.server import AggregateReport
from mecsim.emulation import faults
from mecsim.emulation.energy import client_energy
from mecsim.emulation.engine import RoundTiming
from mecsim.emulation.ops import Handoff, OpTrace, op_to_dict, trace_bytes
from mecsim.emulation.timing import EmulatedRound, emulate_round
from mecsim.run.rows import (
    Evaluations,
    StageBatch,
    add_stages,
    client_row,
    round_row,
    stage_totals,
    trace_record,
)
from mecsim.run.setup import RunFailed, RunSetup


@dataclass
class Trained:
    """What :func:`train` leaves for the rest of the round."""

    selected: list[int]  # in selection order
    tasks: list[ClientTask]  # one per selected client, as planned
    faults: faults.RoundFaults
    results: list[ClientResult]  # of the clients that trained (not those in an outage)
    handoffs: dict[int, Handoff]  # client -> the move of its state (hierarchy, moving)
    fold: frozenset[int] | None  # streamed: the clients the aggregate was folded for
    wall_s: float  # host seconds from the round's start to the end of training


@dataclass
class Aggregated:
    """What :func:`time_and_aggregate` leaves: the round as timed and aggregated."""

    emulated: EmulatedRound
    timing: RoundTiming  # with the server's aggregation time
    completed: set[int]  # clients that made the deadline
    report: AggregateReport


def run_round(
    rs: RunSetup, rnd: int, elapsed_s: float, *, plan_next: bool = False
) -> tuple[dict, list[dict], dict]:
    """One round; returns (round row, client rows, op-traces record).

    ``plan_next``: the run loop goes straight on to the next round (no checkpoint in
    between, not the last round), so, when this round does not evaluate either, the
    executor is asked to plan it ahead (:meth:`LocalExecutor.plan_ahead`)."""
    sc = rs.info.scenario
    last = rnd == sc.rounds - 1
    drives = rs.drives_rounds  # the server asks for more batches after the aggregation
    evaluates = ((rnd + 1) % sc.evaluation.every == 0 or last) and not drives
    # the last round always evaluates; a server that drives its rounds is asked again
    # (clients online at a round's start are known only once the round before is timed)
    plan_ahead = plan_next and not evaluates and not drives and rs.availability is None
    wall0 = time.perf_counter()
    tr = train(rs, rnd, elapsed_s, plan_ahead=plan_ahead, wall0=wall0)
    traces = round_traces(tr)
    ag = time_and_aggregate(rs, rnd, elapsed_s, tr, traces, plan_ahead=plan_ahead)
    first_s = ag.timing.round_time_s  # the round's first batch
    # each selected client's (up, down) air rates, in selection order: the links of the
    # round's first batch as emulate_round drew them (mecsim.emulation.energy.air_rate_bps),
    # read before a follow-up batch (a driving server's) draws its own
    air_rates = rs.network.round_links[0].tolist()
    ev = evaluate(rs, rnd, tr.selected, evaluates, at_s=elapsed_s + first_s, first_s=first_s)
    client_rows, statuses = _client_rows(rs, rnd, tr, traces, ag, ev, air_rates, elapsed_s)
    timing = ag.timing
    if ev.stages:  # further stages of the round's training (SecAgg+'s): in its columns
        timing = add_stages(timing, ev.stages, client_rows, statuses)
    row = round_row(
        run_id=rs.info.run_id,
        rnd=rnd,
        algorithm=sc.algorithm.name,
        selected=tr.selected,
        statuses=statuses,
        timing=timing,
        elapsed_s=elapsed_s,
        traces=traces,
        client_rows=client_rows,
        results=tr.results,
        crashed=tr.faults.crash_at,
        report=ag.report,
        evaluations=ev,
        train_wall_s=tr.wall_s,
        handovers=_moved(rs),
        handoffs=tr.handoffs if rs.hierarchy_moves else None,
    )
    record = trace_record(rnd, ag.report.flops, tr.selected, traces, tr.faults)
    if ev.stages:
        for key, value in stage_totals(ev.stages).items():
            row[key] += value
        if np.isnan(row["train_loss"]):  # the stage that trained reported it
            row["train_loss"] = _mean_finite(
                [c["train_loss"] for c in client_rows if c.get("selected") and "train_loss" in c]
            )
        # each stage's traces as timed (a replay re-times the first batch only)
        record["stages"] = [
            {
                "start_s": st.start_s,
                "time_s": st.timing.round_time_s,
                "clients": {str(c): [op_to_dict(op) for op in t] for c, t in st.traces.items()},
            }
            for st in ev.stages
        ]
    # the whole round in this process, its records built (not yet written) included
    row["host_wall_s"] = time.perf_counter() - wall0
    return row, client_rows, record


def train(rs: RunSetup, rnd: int, elapsed_s: float, *, plan_ahead: bool, wall0: float) -> Trained:
    """Plan the round, draw its faults and train the selected clients (all but those whose
    link is down all round); with a streamed aggregation and ``plan_ahead``, ask the
    executor to plan the next round while this one is timed."""
    sc = rs.info.scenario
    # a hierarchical algorithm whose clients move: its edge servers group the clients
    # served at the round's start (known: it depends only on elapsed_s), and what each
    # client that handed over had at its old edge server moves to the new one
    handoffs = _associate(rs, rnd, elapsed_s) if rs.hierarchy_moves else {}
    if rs.availability is not None:  # an offline client is not selected
        online = [c for c in range(sc.topology.clients) if rs.availability.online(c, elapsed_s)]
        if not online:
            raise RunFailed(
                f"availability: no client is online at round {rnd}'s start "
                f"({elapsed_s:.1f} emulated s); a round needs one"
            )
        rs.executor.available(online)
    selected, tasks = rs.executor.plan(rnd)
    rf = faults.draw_round(sc.faults, sc.seed, rnd, selected)
    # a client whose link is down all round cannot receive the model: it does not train
    trained = [t for t in tasks if t.client_id not in rf.outage]
    # streamed: the clients the round will aggregate, known before it is timed
    fold = frozenset(t.client_id for t in trained) - set(rf.failed) if rs.streams else None
    results = rs.executor.fit(rnd, trained, frozenset(rf.crash_at), fold=fold)
    train_wall = time.perf_counter() - wall0
    if plan_ahead and rs.streams:  # the server has been asked for all of this round's work
        # with no fault to draw, the next round trains every client planned, folds them
        # all and loses none: its hosts may start from the plan itself (chain=True)
        rs.executor.plan_ahead(rnd + 1, chain=not faults.draws_any(sc.faults))
    return Trained(list(selected), list(tasks), rf, results, handoffs, fold, train_wall)


def round_traces(tr: Trained) -> dict[int, OpTrace]:
    """Each client's op-trace as the engine times it, by client id: a crash cuts it, a
    dropout ends it, an outage replaces it, and a client's handoff comes first (the new
    edge server waits for the state)."""
    rf = tr.faults
    traces = {r.client_id: r.trace for r in tr.results}
    for cid, at in rf.crash_at.items():
        traces[cid] = faults.crash_trace(traces[cid], at)
    for cid in rf.dropout:
        traces[cid] = faults.dropout_trace(traces[cid])
    for t in tr.tasks:
        if t.client_id in rf.outage:
            traces[t.client_id] = faults.outage_trace(t.download_nbytes)
    for cid, op in tr.handoffs.items():
        if cid in traces:
            traces[cid] = (op, *traces[cid])
    return {cid: traces[cid] for cid in sorted(traces)}


def time_and_aggregate(
    rs: RunSetup,
    rnd: int,
    elapsed_s: float,
    tr: Trained,
    traces: dict[int, OpTrace],
    *,
    plan_ahead: bool,
) -> Aggregated:
    """Time the round's traces, aggregate the clients that completed, and time it again
    with the server's aggregation."""
    sc = rs.info.scenario
    rf = tr.faults
    emulated = emulate_round(
        rs.network, sc.faults, rs.slowdown, rnd, tr.selected, elapsed_s, rf.outage, rf.failed
    )
    timing = emulated.time(traces)
    completed = {c.client_id for c in timing.clients if c.completed}
    if tr.fold is not None and completed != tr.fold:
        raise RuntimeError(
            f"round {rnd}: the aggregate was streamed for clients that the timing did not "
            f"complete ({sorted(tr.fold - completed)[:5]}) or without clients it did "
            f"({sorted(completed - tr.fold)[:5]}); set execution.stream_aggregation: off "
            "and report this scenario"
        )
    report = rs.executor.aggregate(rnd, [r for r in tr.results if r.client_id in completed])
    if plan_ahead and not rs.streams:
        rs.executor.plan_ahead(rnd + 1)
    timing = emulated.time(traces, rs.server_profile.aggregate_time_s(report.flops))
    return Aggregated(emulated, timing, completed, report)


def evaluate(
    rs: RunSetup,
    rnd: int,
    selected: list[int],
    evaluates: bool,
    *,
    at_s: float,
    first_s: float = 0.0,
) -> Evaluations:
    """The round's evaluations: a server that drives its rounds sends its follow-up batches
    (from ``at_s``, the end of the round's first batch, which took ``first_s``; further
    stages of its training come first); otherwise, when the round evaluates, every
    client (``evaluation.clients: all``) or the selected ones report accuracy and loss."""
    sc = rs.info.scenario
    ev = Evaluations()
    if rs.drives_rounds:
        ev.scores, ev.follow_up, ev.stages = _follow_up_batches(rs, rnd, at_s, first_s)
    elif evaluates:
        who = list(range(sc.topology.clients)) if sc.evaluation.clients == "all" else selected
        for cid, acc, loss, _, *extra in rs.executor.evaluate(rnd, who):
            ev.scores[cid] = (acc, loss)
            if extra:
                ev.extras[cid] = extra[0]
    return ev


def _status(
    cid: int, completed: set[int], rejected: set[int], rf: faults.RoundFaults, finish_s: float
) -> str:
    if cid in rf.outage or (cid not in completed and np.isinf(finish_s)):
        return "outage"
    if cid in rf.crash_at:
        return "crashed"
    if cid in rf.dropout:
        return "dropped_out"
    if cid not in completed:
        return "dropped_deadline"
    return "rejected_nonfinite" if cid in rejected else "completed"


def _moved(rs: RunSetup) -> np.ndarray | None:
    """Clients that move: 1 for each that changed edge server at the round's start
    (:meth:`NetworkModel.move_to`); None when clients do not move."""
    cells = rs.network.round_cells if rs.network.moving is not None else None
    return None if cells is None else cells.handovers


def _client_rows(
    rs: RunSetup,
    rnd: int,
    tr: Trained,
    traces: dict[int, OpTrace],
    ag: Aggregated,
    ev: Evaluations,
    air_rates: list[list[float]],
    elapsed_s: float = 0.0,
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The client rows of the round (selected or evaluated clients, by id) and the status
    of each selected client; ``air_rates``: each selected client's (up, down) air rates of
    the round's first batch, in selection order."""
    sc = rs.info.scenario
    by_id = {r.client_id: r for r in tr.results}
    timelines = {c.client_id: c for c in ag.timing.clients}
    position = {cid: i for i, cid in enumerate(tr.selected)}
    rejected = set(ag.report.rejected)
    moved = _moved(rs)
    # handover during the round: where each client's transfers were handed over
    during = rs.network.handovers_in_round(tr.selected, elapsed_s, ag.timing.round_time_s)
    statuses: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    for cid in sorted(set(tr.selected) | set(ev.scores)):
        tl = timelines.get(cid)
        energy: dict[str, float] = {}
        if tl is not None:
            statuses[cid] = _status(cid, ag.completed, rejected, tr.faults, tl.finish_s)
            energy = client_energy(
                rs.network.devices[cid],
                tl,
                traces[cid],
                ag.emulated.timed_specs()[cid],
                ag.timing.round_time_s,
                idle_policy=sc.energy.idle_policy,
                tx_power_dbm=float(rs.network.tx_power_dbm[cid]),
                air_rates_bps=air_rates[position[cid]],
            )
        rows.append(
            client_row(
                run_id=rs.info.run_id,
                rnd=rnd,
                client_id=cid,
                device=rs.info.client_devices[cid],
                # the serving edge server at the round's start (clients that move may change)
                edge_server=int(rs.network.edge_server[cid]),
                timeline=tl,
                status=statuses.get(cid),
                trace=traces.get(cid),
                result=by_id.get(cid),
                crashed=cid in tr.faults.crash_at,
                channel={**ag.emulated.channel_rows.get(cid, {}), **during.get(cid, {})},
                energy=energy,
                evaluation=ev.scores.get(cid),
                handovers=None if moved is None else int(moved[cid]),
                handover_bytes=(
                    (tr.handoffs[cid].nbytes if cid in tr.handoffs else 0)
                    if rs.hierarchy_moves
                    else None
                ),
            )
        )
    return rows, statuses


def _associate(rs: RunSetup, rnd: int, elapsed_s: float) -> dict[int, Handoff]:
    """Round ``rnd``'s association (clients that move, at its start ``elapsed_s``) given
    to the executor before the round is planned; returns a Handoff op for each client
    that changed edge server at this start: the state its old edge server kept for it
    (``EdgeAlgorithm.handover_state_nbytes``), moved old -> central -> new edge server.
    Every such client's state moves; only the selected ones' ops are timed (a client
    not in the round waits for nothing)."""
    sc = rs.info.scenario
    moving = rs.network.moving
    assert moving is not None
    rc = rs.network.move_to(rnd, elapsed_s)
    rs.executor.associate({cid: int(b) for cid, b in enumerate(rc.serving)})
    before = moving.history[rnd - 1].serving if rnd > 0 else moving.cells.serving
    edge = algorithm_classes(sc.algorithm.name)[0].Edge
    assert edge is not None
    params = edge.Params(**sc.algorithm.params)
    samples = rs.info.extra["train_samples"]
    return {
        int(cid): Handoff(edge.handover_state_nbytes(params, int(samples[cid])), int(before[cid]))
        for cid in np.flatnonzero(rc.handovers)
    }


def _follow_up_batches(
    rs: RunSetup, rnd: int, at_s: float, first_s: float
) -> tuple[dict[int, tuple[float, float]], dict[str, float], list[StageBatch]]:
    """The batches a server that drives its rounds (``ServerAlgorithm.drives_rounds``: a
    Flower ServerApp) sends after the round's aggregation, until it sends none: each
    planned, executed, timed on the round's links from ``at_s`` (one after the other, no
    emulated faults) and handed back to the server with the replies that made it.
    Returns each client's (accuracy, loss) from its replies and the ``eval_*`` columns:
    how many clients were sent a message, the emulated seconds, bytes and GFLOPs of the
    batches (not in the round's time, bytes or energy: like a built-in algorithm's
    evaluation, they are reported beside the round), ``eval_accuracy_weighted`` (the
    replies' accuracy weighted by their examples, as Flower's strategies weigh it) and
    the metrics the server's aggregation of each batch returned (a Flower ServerApp's
    centralised evaluation). A batch whose tasks are marked ``ROUND_STAGE`` is a further
    stage of the round's training (SecAgg+'s): timed the same way, it is returned as a
    :class:`StageBatch` (with its clients' energy) to be charged in the round's columns,
    not in the ``eval_*`` ones."""
    sc = rs.info.scenario
    round_start_s = at_s - first_s
    stages: list[StageBatch] = []
    evals: dict[int, tuple[float, float]] = {}
    columns: dict[str, float] = {
        "eval_clients": 0,
        "eval_time_s": 0.0,
        "eval_bytes_down": 0,
        "eval_bytes_up": 0,
        "eval_gflops": 0.0,
    }
    weighted = [0.0, 0]  # sum of accuracy x examples, examples (Flower's weighted mean)
    while True:
        selected, tasks = rs.executor.plan(rnd)
        if not tasks:
            return evals, columns, stages
        results = rs.executor.fit(rnd, tasks)
        traces = {r.client_id: r.trace for r in sorted(results, key=lambda r: r.client_id)}
        emulated = emulate_round(rs.network, sc.faults, rs.slowdown, rnd, selected, at_s, (), ())
        timing = emulated.time(traces)
        done = {c.client_id for c in timing.clients if c.completed}
        agg = rs.executor.aggregate(rnd, [r for r in results if r.client_id in done])
        timing = emulated.time(traces, rs.server_profile.aggregate_time_s(agg.flops))
        if any(t.config.get(ROUND_STAGE) for t in tasks):
            stages.append(
                StageBatch(
                    start_s=at_s - round_start_s,
                    timing=timing,
                    traces=traces,
                    results={r.client_id: r for r in results},
                    energy=_stage_energy(rs, selected, emulated, timing, traces),
                )
            )
            at_s += timing.round_time_s
            columns.update(agg.metrics)
            continue
        at_s += timing.round_time_s
        columns.update(agg.metrics)  # the server's figures known after this batch
        columns["eval_clients"] += len(selected)
        columns["eval_time_s"] += timing.round_time_s
        for trace in traces.values():
            up, down = trace_bytes(trace)
            columns["eval_bytes_up"] += up
            columns["eval_bytes_down"] += down
        columns["eval_gflops"] += sum(r.flops for r in results) / 1e9
        for r in results:
            if r.client_id in done and ("flower_accuracy" in r.extra or "flower_loss" in r.extra):
                evals[r.client_id] = (
                    float(r.extra.get("flower_accuracy", float("nan"))),
                    float(r.extra.get("flower_loss", float("nan"))),
                )
                acc = float(r.extra.get("flower_accuracy", float("nan")))
                if r.num_samples > 0 and math.isfinite(acc):  # weighted by examples
                    weighted[0] += acc * r.num_samples
                    weighted[1] += r.num_samples
        if weighted[1]:
            columns["eval_accuracy_weighted"] = weighted[0] / weighted[1]


def _stage_energy(
    rs: RunSetup,
    selected: list[int],
    emulated: EmulatedRound,
    timing: RoundTiming,
    traces: dict[int, OpTrace],
) -> dict[int, dict[str, float]]:
    """Each client's energy in a further stage of the round's training, over the stage's
    time, on the stage's links (as :func:`_client_rows` for the round's first batch)."""
    sc = rs.info.scenario
    air_rates = rs.network.round_links[0].tolist()  # the stage's draw, in selection order
    position = {cid: i for i, cid in enumerate(selected)}
    out = {}
    for tl in timing.clients:
        cid = tl.client_id
        out[cid] = client_energy(
            rs.network.devices[cid],
            tl,
            traces[cid],
            emulated.specs[cid],
            timing.round_time_s,
            idle_policy=sc.energy.idle_policy,
            tx_power_dbm=float(rs.network.tx_power_dbm[cid]),
            air_rates_bps=air_rates[position[cid]],
        )
    return out


def _mean_finite(values: list[float]) -> float:
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")
