"""The rows a round leaves in the records: the one list of round columns, the one of
client columns, and the part of a round row its timing decides.

The run loop (:mod:`mecsim.run.round`) fills every column; a replay
(:mod:`mecsim.analysis.replay`) re-computes :data:`REPLAY_COLUMNS` (the same names, a
subset) with the same :func:`timing_columns`. A new timing column is one entry of
:data:`TIMING`; a new round column one name in :data:`ROUND_COLUMNS` (and the value the
round computes for it). The columns that measure the machine running the emulation rather
than the emulated testbed are told by :func:`is_host_column`.

The rows themselves are built here too, from what the round's phases computed
(:func:`client_row`, :func:`round_row`, :func:`trace_record`): the round
(:mod:`mecsim.run.round`) computes, this module lays out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mecsim.channel.wireless import RECORD_KEYS
from mecsim.emulation.energy import ENERGY_KEYS, round_energy
from mecsim.emulation.engine import RoundTiming
from mecsim.emulation.network import TRANSPORT_KEYS
from mecsim.emulation.ops import Compute, OpTrace, op_to_dict, trace_bytes, trace_flops

if TYPE_CHECKING:
    from mecsim.agents.algorithms import ClientResult
    from mecsim.agents.server import AggregateReport
    from mecsim.emulation.engine import ClientTimeline
    from mecsim.emulation.faults import RoundFaults
    from mecsim.emulation.ops import Handoff

MiB = 1024 * 1024

#: Round columns of the critical-path breakdown (emulated seconds), each an attribute of
#: :class:`~mecsim.emulation.engine.RoundTiming`.
TIMING = {
    "round_time_s": "round_time_s",
    "dl_time_s": "download_s",
    "client_time_s": "client_s",
    "ul_time_s": "upload_s",
    "server_time_s": "server_s",
    "backhaul_time_s": "backhaul_s",
    "idle_time_s": "idle_s",
}

ROUND_COLUMNS = [
    "run_id",
    "round",
    "algorithm",
    "selected",
    "completed",
    "dropped",
    "dropped_deadline",
    "crashed",
    "dropped_out",
    "outage",
    "rejected",
    "faults",
    *TIMING,
    "elapsed_s",
    "bytes_up",
    "bytes_down",
    # joules, summed over the round's selected clients (mecsim.emulation.energy)
    *ENERGY_KEYS,
    "client_gflops",
    "server_gflops",
    "server_rss_mb",
    "client_peak_mb",
    "mean_accuracy",
    "min_accuracy",
    "max_accuracy",
    "mean_test_loss",
    "train_loss",
    "host_wall_s",
    "host_train_wall_s",
    "host_aggregate_s",
]
#: What a replay re-computes of a round (the timing, and what it is counted from), and
#: the recorded accuracy beside it.
REPLAY_COLUMNS = [
    c
    for c in ROUND_COLUMNS
    if c
    in (
        "round",
        "selected",
        "completed",
        "dropped",
        *TIMING,
        "elapsed_s",
        "bytes_up",
        "bytes_down",
        *ENERGY_KEYS,
        "mean_accuracy",
    )
]
#: clients.csv's channel columns: the channel's draws (mecsim.channel.wireless), then the
#: latency drawn for the client-round and the goodput the loss rate leaves of the link rate
#: (mecsim.emulation.network.TRANSPORT_KEYS)
CHANNEL_COLUMNS = [*RECORD_KEYS, *TRANSPORT_KEYS]
CLIENT_COLUMNS = [
    "run_id",
    "round",
    "client_id",
    "device",
    "edge_server",
    "selected",
    "status",
    "completed",
    "start_s",
    "finish_s",
    "download_s",
    "compute_s",
    "upload_s",
    "server_compute_s",
    "bytes_up",
    "bytes_down",
    "gflops",
    "steps",
    "num_samples",
    "train_loss",
    "peak_memory_mb",
    "host_train_s",
    "accuracy",
    "test_loss",
    *ENERGY_KEYS,
    *CHANNEL_COLUMNS,
]


#: The host-measured columns without ``host`` among their words: the server process's
#: resident memory (the others are ``host_wall_s``, ``host_train_s``, ...).
HOST_MEASURED = ("server_rss_mb",)


def is_host_column(name: str) -> bool:
    """Whether column ``name`` measures the machine running the emulation (wall seconds,
    resident memory) rather than the emulated testbed: :data:`HOST_MEASURED` and any
    column with ``host`` among its ``_``-separated words (``host_wall_s``, an algorithm's
    ``kapc_plan_host_s``). Such a column differs from run to run of the same scenario, so
    comparisons of records leave it out."""
    return name in HOST_MEASURED or "host" in name.split("_")


def timing_columns(timing: RoundTiming, elapsed_before_s: float) -> dict[str, float]:
    """The round row's :data:`TIMING` columns and ``elapsed_s``, the emulated time since
    the run started once this round has ended."""
    row = {column: getattr(timing, attr) for column, attr in TIMING.items()}
    row["elapsed_s"] = elapsed_before_s + timing.round_time_s
    return row


@dataclass
class Evaluations:
    """A round's evaluations, as :func:`mecsim.run.round.evaluate` gathers them."""

    #: client -> (accuracy, test loss)
    scores: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: client -> an algorithm's own per-client figures (a column ``mean_<name>`` each)
    extras: dict[int, dict[str, float]] = field(default_factory=dict)
    #: the ``eval_*`` columns of a server that drives its rounds (its follow-up batches)
    follow_up: dict[str, float] = field(default_factory=dict)
    #: the further stages of the round's training (a server that drives its rounds:
    #: batches marked ``ROUND_STAGE``), as timed, in order
    stages: list[StageBatch] = field(default_factory=list)


@dataclass
class StageBatch:
    """A further stage of a round's training (SecAgg+'s share keys, masked vectors,
    unmask: :data:`mecsim.agents.algorithms.ROUND_STAGE`), timed on the round's links
    after the stage before it. Its seconds, bytes, FLOPs and energy are added to the
    round's and its clients' columns (:func:`add_stages`)."""

    start_s: float  # from the round's start to this stage's (the stages before it)
    timing: RoundTiming  # with the server's work on the replies
    traces: dict[int, OpTrace]  # per client, by id
    results: dict[int, ClientResult]  # per client, by id
    energy: dict[int, dict[str, float]]  # per client: ENERGY_KEYS of its part


def _mean(values: list[float]) -> float:
    """Mean ignoring NaN (a client without test data has NaN accuracy)."""
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _trained_flops(result: ClientResult, trace: OpTrace, crashed: bool) -> float:
    """A client's FLOPs this round: what it trained, or, when it crashed, only the part of
    its trace before the crash (the device did no more)."""
    return trace_flops(trace)[0] if crashed else result.flops


def client_row(
    *,
    run_id: str,
    rnd: int,
    client_id: int,
    device: str,
    edge_server: int,
    timeline: ClientTimeline | None,
    status: str | None,
    trace: OpTrace | None,
    result: ClientResult | None,
    crashed: bool,
    channel: dict[str, Any],
    energy: dict[str, float],
    evaluation: tuple[float, float] | None,
    handovers: int | None,
    handover_bytes: int | None,
) -> dict[str, Any]:
    """One client's row of clients.csv (:data:`CLIENT_COLUMNS`, then an algorithm's and a
    moving topology's columns). ``timeline`` None: the client was not selected (evaluated
    only); ``result`` None: it did not train (an outage); ``evaluation``: its (accuracy,
    test loss) when the round evaluated it; ``handovers`` (clients that move: 1 if it
    changed edge server at the round's start) and ``handover_bytes`` (hierarchical: the
    bytes of its state moved) are left out when None."""
    row: dict[str, Any] = {
        "run_id": run_id,
        "round": rnd,
        "client_id": client_id,
        "device": device,
        "edge_server": edge_server,
        "selected": timeline is not None,
    }
    if timeline is not None:
        assert trace is not None
        up, down = trace_bytes(trace)
        row.update(
            status=status,
            completed=status == "completed",
            start_s=timeline.start_s,
            finish_s=timeline.finish_s,
            download_s=timeline.download_s,
            compute_s=timeline.compute_s,
            upload_s=timeline.upload_s,
            server_compute_s=timeline.server_compute_s,
            bytes_up=up,
            bytes_down=down,
        )
        if result is not None:
            steps = result.steps
            if crashed:  # the device did only the part before its crash
                steps = sum(op.batches for op in trace if isinstance(op, Compute))
            row.update(
                gflops=_trained_flops(result, trace, crashed) / 1e9,
                steps=steps,
                num_samples=result.num_samples,
                train_loss=result.train_loss,
                peak_memory_mb=result.peak_memory_bytes / MiB,
                host_train_s=result.host_seconds,
            )
        row.update(channel)
        row.update(energy)
    if evaluation is not None:
        row["accuracy"], row["test_loss"] = evaluation
    if handovers is not None:
        row["handovers"] = handovers
    if handover_bytes is not None:
        row["handover_bytes"] = handover_bytes
    return row


def round_row(
    *,
    run_id: str,
    rnd: int,
    algorithm: str,
    selected: list[int],
    statuses: dict[int, str],
    timing: RoundTiming,
    elapsed_s: float,
    traces: dict[int, OpTrace],
    client_rows: list[dict[str, Any]],
    results: list[ClientResult],
    crashed: Collection[int],
    report: AggregateReport,
    evaluations: Evaluations,
    train_wall_s: float,
    handovers: np.ndarray | None,
    handoffs: dict[int, Handoff] | None,
) -> dict[str, Any]:
    """The round's row of rounds.csv (:data:`ROUND_COLUMNS`, then the algorithm's
    metrics, a moving topology's and the evaluations' columns). ``host_wall_s`` is NaN,
    its place kept: the round sets it last. ``handovers``: per client, 1 if it changed
    edge server (clients that move); ``handoffs``: the state moves of a hierarchical
    algorithm whose clients move (None otherwise)."""

    def count(status: str) -> int:
        return sum(s == status for s in statuses.values())

    scores = evaluations.scores
    extras = evaluations.extras
    accs = [a for a, _ in scores.values() if not np.isnan(a)]
    sizes = [trace_bytes(t) for t in traces.values()]
    return {
        "run_id": run_id,
        "round": rnd,
        "algorithm": algorithm,
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
        "bytes_up": sum(up for up, _ in sizes),
        "bytes_down": sum(down for _, down in sizes),
        **round_energy(c for c in client_rows if c.get("selected")),
        "client_gflops": sum(
            _trained_flops(r, traces[r.client_id], r.client_id in crashed) for r in results
        )
        / 1e9,
        "server_gflops": report.flops / 1e9,
        "server_rss_mb": report.rss_bytes / MiB,
        "client_peak_mb": max((r.peak_memory_bytes for r in results), default=0) / MiB,
        "mean_accuracy": _mean(accs),
        "min_accuracy": min(accs) if accs else float("nan"),
        "max_accuracy": max(accs) if accs else float("nan"),
        "mean_test_loss": _mean([lo for _, lo in scores.values()]),
        "train_loss": _mean([r.train_loss for r in results]),
        "host_wall_s": float("nan"),  # set last (its place among the columns kept)
        "host_train_wall_s": train_wall_s,
        "host_aggregate_s": report.wall_s,
        **report.metrics,
        **({} if handovers is None else {"handovers": int(handovers.sum())}),
        **(
            {}
            if handoffs is None
            else {"handover_bytes": sum(op.nbytes for op in handoffs.values())}
        ),
        **evaluations.follow_up,
        **{
            f"mean_{k}": _mean([e[k] for e in extras.values()])
            for k in sorted({k for e in extras.values() for k in e})
        },
    }


def trace_record(
    rnd: int,
    aggregate_flops: float,
    selected: list[int],
    traces: dict[int, OpTrace],
    round_faults: RoundFaults,
) -> dict[str, Any]:
    """The round's line of ``optraces.jsonl``: the traces as timed, and what replay needs
    to re-time a faulted round the same way (the failed clients and those in an outage)."""
    record: dict[str, Any] = {
        "round": rnd,
        "aggregate_flops": aggregate_flops,
        "selected": list(selected),
        "clients": {str(cid): [op_to_dict(op) for op in tr] for cid, tr in traces.items()},
    }
    if round_faults.failed or round_faults.outage:
        record["failed"] = {str(c): st for c, st in sorted(round_faults.failed.items())}
        record["outage"] = sorted(round_faults.outage)
    return record


#: the client columns a stage adds to (seconds and counts: summed)
_STAGE_SUMS = ("download_s", "compute_s", "upload_s", "server_compute_s")


def add_stages(
    timing: RoundTiming,
    stages: list[StageBatch],
    client_rows: list[dict[str, Any]],
    statuses: dict[int, str],
) -> RoundTiming:
    """Charge a round's further training stages in its records: each client's row gains
    its stages' seconds, bytes, FLOPs, steps, host seconds and energy, its ``finish_s``
    becomes that of its last stage (from the round's start), and a client that missed a
    stage's deadline is ``dropped_deadline`` (its status updated in ``statuses``); returns
    the round's timing with the stages' critical paths added (they run one after the
    other, each waiting for the replies of the one before). The round row's bytes and
    client FLOPs are added by :func:`stage_totals`."""
    rows = {r["client_id"]: r for r in client_rows if r.get("selected")}
    for st in stages:
        timelines = {c.client_id: c for c in st.timing.clients}
        for cid, trace in st.traces.items():
            row, tl = rows[cid], timelines[cid]
            up, down = trace_bytes(trace)
            row["bytes_up"] += up
            row["bytes_down"] += down
            for key in _STAGE_SUMS:
                row[key] += getattr(tl, key)
            row["finish_s"] = st.start_s + tl.finish_s
            r = st.results.get(cid)
            if r is not None:
                row["gflops"] = row.get("gflops", 0.0) + r.flops / 1e9
                row["steps"] = row.get("steps", 0) + r.steps
                row["host_train_s"] = row.get("host_train_s", 0.0) + r.host_seconds
                row["num_samples"] = max(int(row.get("num_samples") or 0), r.num_samples)
                if np.isnan(row.get("train_loss", np.nan)) and not np.isnan(r.train_loss):
                    row["train_loss"] = r.train_loss  # the stage that trained
            for key, joules in st.energy.get(cid, {}).items():
                row[key] = row.get(key, 0.0) + joules
            if not tl.completed and statuses.get(cid) == "completed":
                statuses[cid] = "dropped_deadline"
                row["status"], row["completed"] = "dropped_deadline", False
    sums = {
        attr: getattr(timing, attr) + sum(getattr(st.timing, attr) for st in stages)
        for attr in (*TIMING.values(), "wait_s", "aggregate_s")
    }
    return dataclasses.replace(timing, **sums)


def stage_totals(stages: list[StageBatch]) -> dict[str, float]:
    """The round row's ``bytes_up``, ``bytes_down`` and ``client_gflops`` of its further
    training stages (added to the first batch's)."""
    up = down = 0
    for st in stages:
        for trace in st.traces.values():
            u, d = trace_bytes(trace)
            up, down = up + u, down + d
    flops = sum(r.flops for st in stages for r in st.results.values())
    return {"bytes_up": up, "bytes_down": down, "client_gflops": flops / 1e9}
