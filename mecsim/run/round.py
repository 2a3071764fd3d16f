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

import math
import time
from typing import Any

import numpy as np

from mecsim.agents.algorithms import algorithm_classes
from mecsim.emulation import faults
from mecsim.emulation.energy import client_energy, round_energy
from mecsim.emulation.ops import Compute, Handoff, op_to_dict, trace_bytes, trace_flops
from mecsim.emulation.timing import emulate_round
from mecsim.run.rows import timing_columns
from mecsim.run.setup import MiB, RunSetup


def _mean(values: list[float]) -> float:
    """Mean ignoring NaN (a client without test data has NaN accuracy)."""
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


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
    plan_ahead = plan_next and not evaluates and not drives
    wall0 = time.perf_counter()
    # a hierarchical algorithm whose clients move: its edge servers group the clients
    # served at the round's start (known: it depends only on elapsed_s), and what each
    # client that handed over had at its old edge server moves to the new one
    handoffs = _associate(rs, rnd, elapsed_s) if rs.hierarchy_moves else {}
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
    traces = {r.client_id: r.trace for r in results}
    for cid, at in rf.crash_at.items():
        traces[cid] = faults.crash_trace(traces[cid], at)
    for cid in rf.dropout:
        traces[cid] = faults.dropout_trace(traces[cid])
    for t in tasks:
        if t.client_id in rf.outage:
            traces[t.client_id] = faults.outage_trace(t.download_nbytes)
    for cid, op in handoffs.items():  # first: the new edge server waits for the state
        if cid in traces:
            traces[cid] = (op, *traces[cid])
    traces = {cid: traces[cid] for cid in sorted(traces)}
    emulated = emulate_round(
        rs.network, sc.faults, rs.slowdown, rnd, selected, elapsed_s, rf.outage, rf.failed
    )
    timing = emulated.time(traces)
    completed_ids = {c.client_id for c in timing.clients if c.completed}
    if fold is not None and completed_ids != fold:
        raise RuntimeError(
            f"round {rnd}: the aggregate was streamed for clients that the timing did not "
            f"complete ({sorted(fold - completed_ids)[:5]}) or without clients it did "
            f"({sorted(completed_ids - fold)[:5]}); set execution.stream_aggregation: off "
            "and report this scenario"
        )
    agg = rs.executor.aggregate(rnd, [r for r in results if r.client_id in completed_ids])
    if plan_ahead and not rs.streams:
        rs.executor.plan_ahead(rnd + 1)
    rejected = set(agg.rejected)
    timing = emulated.time(traces, rs.server_profile.aggregate_time_s(agg.flops))

    # each selected client's (up, down) air rates, in selection order (the round's links
    # as emulate_round drew them: mecsim.emulation.energy.air_rate_bps)
    air_rates = rs.network.round_links[0].tolist()
    evals: dict[int, tuple[float, float]] = {}
    eval_extras: dict[int, dict[str, float]] = {}  # an algorithm's own per-client figures
    follow_up: dict[str, float] = {}
    if drives:
        evals, follow_up = _follow_up_batches(rs, rnd, elapsed_s + timing.round_time_s)
    elif evaluates:
        who = list(range(sc.topology.clients)) if sc.evaluation.clients == "all" else selected
        for cid, acc, loss, _, *extra in rs.executor.evaluate(rnd, who):
            evals[cid] = (acc, loss)
            if extra:
                eval_extras[cid] = extra[0]

    by_id = {r.client_id: r for r in results}
    sizes = {cid: trace_bytes(t) for cid, t in traces.items()}  # (bytes up, bytes down)
    tl_by_id = {c.client_id: c for c in timing.clients}
    position = {cid: i for i, cid in enumerate(selected)}
    # clients that move: who handed over at this round's start (NetworkModel.move_to)
    cells = rs.network.round_cells if rs.network.moving is not None else None
    moved = None if cells is None else cells.handovers
    statuses: dict[int, str] = {}
    client_rows: list[dict[str, Any]] = []
    for cid in sorted(set(selected) | set(evals)):
        row: dict[str, Any] = {
            "run_id": rs.info.run_id,
            "round": rnd,
            "client_id": cid,
            "device": rs.info.client_devices[cid],
            # the serving edge server at the round's start (clients that move may change)
            "edge_server": int(rs.network.edge_server[cid]),
            "selected": cid in tl_by_id,
        }
        if cid in tl_by_id:
            tl = tl_by_id[cid]
            statuses[cid] = status = _status(cid, completed_ids, rejected, rf, tl.finish_s)
            up, down = sizes[cid]
            row.update(
                status=status,
                completed=status == "completed",
                start_s=tl.start_s,
                finish_s=tl.finish_s,
                download_s=tl.download_s,
                compute_s=tl.compute_s,
                upload_s=tl.upload_s,
                server_compute_s=tl.server_compute_s,
                bytes_up=up,
                bytes_down=down,
            )
            if cid in by_id:
                r = by_id[cid]
                flops, steps = r.flops, r.steps
                if cid in rf.crash_at:  # the device did only the part before its crash
                    flops = trace_flops(traces[cid])[0]
                    steps = sum(op.batches for op in traces[cid] if isinstance(op, Compute))
                row.update(
                    gflops=flops / 1e9,
                    steps=steps,
                    num_samples=r.num_samples,
                    train_loss=r.train_loss,
                    peak_memory_mb=r.peak_memory_bytes / MiB,
                    host_train_s=r.host_seconds,
                )
            row.update(emulated.channel_rows.get(cid, {}))
            row.update(
                client_energy(
                    rs.network.devices[cid],
                    tl,
                    traces[cid],
                    emulated.specs[cid],
                    timing.round_time_s,
                    idle_policy=sc.energy.idle_policy,
                    tx_power_dbm=float(rs.network.tx_power_dbm[cid]),
                    air_rates_bps=air_rates[position[cid]],
                )
            )
        if cid in evals:
            row["accuracy"], row["test_loss"] = evals[cid]
        if moved is not None:  # 1: this client changed edge server at the round's start
            row["handovers"] = int(moved[cid])
        if rs.hierarchy_moves:  # the bytes of its state moved old -> new edge server
            row["handover_bytes"] = handoffs[cid].nbytes if cid in handoffs else 0
        client_rows.append(row)

    def count(status: str) -> int:
        return sum(s == status for s in statuses.values())

    accs = [a for a, _ in evals.values() if not np.isnan(a)]
    up_total = sum(up for up, _ in sizes.values())
    down_total = sum(down for _, down in sizes.values())
    round_row = {
        "run_id": rs.info.run_id,
        "round": rnd,
        "algorithm": sc.algorithm.name,
        "selected": len(selected),
        "completed": count("completed"),
        "dropped": len(selected) - count("completed"),
        "dropped_deadline": count("dropped_deadline"),
        "crashed": count("crashed"),
        "dropped_out": count("dropped_out"),
        "outage": count("outage"),
        "rejected": count("rejected_nonfinite"),
        "faults": 0,
        **timing_columns(timing, elapsed_s),
        "bytes_up": up_total,
        "bytes_down": down_total,
        **round_energy(c for c in client_rows if c.get("selected")),
        "client_gflops": sum(
            trace_flops(traces[r.client_id])[0] if r.client_id in rf.crash_at else r.flops
            for r in results
        )
        / 1e9,
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
        **({} if moved is None else {"handovers": int(moved.sum())}),
        **(
            {"handover_bytes": sum(op.nbytes for op in handoffs.values())}
            if rs.hierarchy_moves
            else {}
        ),
        **follow_up,
        **{
            f"mean_{k}": _mean([e[k] for e in eval_extras.values()])
            for k in sorted({k for e in eval_extras.values() for k in e})
        },
    }
    trace_record = {
        "round": rnd,
        "aggregate_flops": agg.flops,
        "selected": list(selected),
        "clients": {str(cid): [op_to_dict(op) for op in tr] for cid, tr in traces.items()},
    }
    if rf.failed or rf.outage:  # what replay needs to re-time a faulted round the same way
        trace_record["failed"] = {str(c): st for c, st in sorted(rf.failed.items())}
        trace_record["outage"] = sorted(rf.outage)
    # the whole round in this process, its records built (not yet written) included
    round_row["host_wall_s"] = time.perf_counter() - wall0
    return round_row, client_rows, trace_record


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
    rs: RunSetup, rnd: int, at_s: float
) -> tuple[dict[int, tuple[float, float]], dict[str, float]]:
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
    centralised evaluation)."""
    sc = rs.info.scenario
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
            return evals, columns
        results = rs.executor.fit(rnd, tasks)
        traces = {r.client_id: r.trace for r in sorted(results, key=lambda r: r.client_id)}
        emulated = emulate_round(rs.network, sc.faults, rs.slowdown, rnd, selected, at_s, (), ())
        timing = emulated.time(traces)
        done = {c.client_id for c in timing.clients if c.completed}
        agg = rs.executor.aggregate(rnd, [r for r in results if r.client_id in done])
        timing = emulated.time(traces, rs.server_profile.aggregate_time_s(agg.flops))
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
