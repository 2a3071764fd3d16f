"""Replay a finished run's rounds under a changed network or devices, without training.

"Execute, then time" keeps every client's op-trace (``optraces.jsonl``), so a what-if
question about the network or the devices is answered by step 3 alone: re-draw each
round's channel exactly as the run did (:class:`mecsim.emulation.network.NetworkModel`, same seed,
same selected clients in the same order, same elapsed time for trace channels) from the
resolved scenario with the overrides applied, and re-time the recorded op-traces with the
engine. With no override the replay reproduces the recorded emulated times exactly.

When is that the right answer? Synchronous FL training does not depend on timing, except:

- **deadlines**: a client that misses the deadline is left out of the aggregation, so the
  model, and from then on accuracy (and possibly later op-traces), depend on timing. A
  replay in which the same clients miss the deadline in every round is still exact; from
  the first round whose dropped clients differ, it is not.
- **timing-aware algorithms**: a server class with ``uses_emulated_time = True`` decides
  from emulated time; a replay is exact only up to the first round whose client timelines
  differ from the recorded ones.

A replay says which case it is in (:attr:`ReplayResult.exact`, ``inexact_from_round``,
``notes``); recorded accuracy is reported only for the rounds that are exact. With
``retrain=True`` an inexact replay (or an override of anything else than timing) is
answered by re-running the overridden scenario with training (:func:`mecsim.run.loop.run`),
and the result says ``source == "retrained"``.

``mecsim.replay(...)`` is this module's :func:`replay` (the module is callable).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import types
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console

from mecsim.agents.algorithms import algorithm_classes
from mecsim.channel import TraceChannel
from mecsim.emulation import faults
from mecsim.emulation.energy import round_energy_arrays, transfer_arrays
from mecsim.emulation.engine import (
    RoundColumns,
    RoundTiming,
    TimeVaryingRate,
    TracePlan,
    plan_traces,
    time_round_columns,
)
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import OpTrace, trace_bytes
from mecsim.emulation.timing import emulate_round
from mecsim.run.loop import run as run_loop
from mecsim.run.observers import RunObserver
from mecsim.run.progress import ProgressBar
from mecsim.run.rows import REPLAY_COLUMNS, timing_columns
from mecsim.run.setup import ScenarioInfeasible, moving_rate_refusal
from mecsim.scenario import Scenario, ScenarioError, load_recorded_scenario, scenario_from_dict
from mecsim.scenario.overrides import (
    OverrideError,
    apply_overrides,
    is_geometry_axis,
    is_timing_path,
)
from mecsim.store.reader import (
    CLIENT_CHECKS,
    ROUND_CHECKS,
    RecordError,
    check_client_rows,
    check_rounds_in_order,
    check_scenario,
    read_meta,
    read_table,
    read_traces,
)
from mecsim.store.session import BadRun, run_in_folder

MiB = 1024 * 1024


class RunLoadError(ValueError):
    """A run directory that cannot be replayed; ``str()`` says which file and why."""


class ReplayInfeasible(ValueError):
    """The overridden scenario cannot run (the model does not fit a device's RAM)."""


@dataclass(frozen=True)
class RecordedRound:
    """One recorded round: each selected client's op-trace (in selection order)."""

    round: int
    traces: dict[int, OpTrace]
    aggregate_flops: float
    bytes_up: int
    bytes_down: int
    failed: dict[int, str] = field(default_factory=dict)  # emulated crashes, drop-outs
    outage: frozenset[int] = frozenset()  # clients whose link was down all round

    @cached_property
    def transfer_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(bits, transfers) of each client's uploads and downloads, shape (clients, 2),
        in selection order: what the energy of a re-timed round needs (computed once)."""
        return transfer_arrays(self.traces.values())

    @cached_property
    def trace_plan(self) -> TracePlan | None:
        """The traces as the engine's closed form reads them (planned once: every point
        of a sweep re-times the same traces); None if it does not cover them."""
        return plan_traces(self.traces)


@dataclass(frozen=True)
class RecordedRun:
    """What a replay needs from ``runs/<run-id>/`` (see :func:`load_run`)."""

    run_id: str
    scenario: Scenario
    rounds: tuple[RecordedRound, ...]
    mean_accuracy: tuple[float, ...]  # per round; NaN where it was not evaluated
    dropped: tuple[frozenset[int], ...]  # clients dropped at the deadline, per round
    finish_s: tuple[dict[int, float], ...]  # recorded finish time of each selected client
    round_time_s: tuple[float, ...]  # recorded
    step_memory_bytes: int | None = None
    run_dir: Path | None = None
    # rounds before this one were recorded before profiles had an aggregation rate, when
    # the edge server aggregated at its flops_per_s (retime does the same for them): all
    # rounds when run.json has no aggregate_flops_per_s, up to the first resume by a
    # version that records it when such a run was resumed (:func:`_legacy_aggregation`)
    aggregated_at_flops_per_s_until: int = 0

    @property
    def algorithm(self) -> str:
        return self.scenario.algorithm.name

    def __repr__(self) -> str:
        return (
            f"RecordedRun({self.run_id!r}, algorithm={self.algorithm!r}, "
            f"rounds={len(self.rounds)}, run_dir={str(self.run_dir)!r})"
        )


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return read_table(path, ROUND_CHECKS)
    except RecordError as exc:
        raise RunLoadError(str(exc)) from None


def _true(column: pd.Series) -> pd.Series:
    return column.astype(str).str.strip().str.lower() == "true"


def load_run(run_dir: str | Path) -> RecordedRun:
    """Load a run directory written by ``mecsim run`` (a killed run: its finished rounds).

    Needs ``scenario.yaml``, ``rounds.csv``, ``clients.csv`` and ``optraces.jsonl``
    (written unless the scenario set ``outputs.save_optraces: false``). Every file is
    read strictly (:mod:`mecsim.store.reader`): a folder that was tampered with or
    written by a newer version is a :class:`RunLoadError` naming the file and the line.
    """
    try:
        return _load_run(Path(run_dir))
    except RecordError as exc:
        raise RunLoadError(str(exc)) from None


def _load_run(run_dir: Path) -> RecordedRun:
    if not run_dir.is_dir():
        raise RunLoadError(
            f"{run_dir}: not a directory (expected a run directory "
            "written by `mecsim run`, e.g. runs/<run-id>/)"
        )
    if not (run_dir / "scenario.yaml").exists():
        raise RunLoadError(f"{run_dir}: no scenario.yaml; is this a run directory?")
    try:
        scenario = load_recorded_scenario(run_dir / "scenario.yaml")
    except ScenarioError as exc:
        raise RunLoadError(" ".join(str(exc).split())) from None
    if scenario.aggregation.clocked():
        raise RunLoadError(
            f"{run_dir}: aggregation.mode {scenario.aggregation.mode}: the emulated times "
            "decided which model version each client trained on, so a replay cannot "
            "re-time this run (other times would have trained other models); answer the "
            "what-if by running its scenario again with the change (mecsim run "
            f"{run_dir / 'scenario.yaml'} --set PATH=VALUE), docs/async.md"
        )
    meta = read_meta(run_dir, strict=True)
    clients = scenario.topology.clients
    check_scenario(run_dir, meta, clients)
    traces_path = run_dir / "optraces.jsonl"
    if not traces_path.exists():
        raise RunLoadError(
            f"{traces_path}: missing; the run did not keep its op-traces "
            "(outputs.save_optraces: false), so it cannot be replayed"
        )
    rounds_path, clients_path = run_dir / "rounds.csv", run_dir / "clients.csv"
    rounds_df = read_table(rounds_path, ROUND_CHECKS, ("round", "round_time_s", "mean_accuracy"))
    check_rounds_in_order(rounds_path, rounds_df)
    clients_df = read_table(
        clients_path, CLIENT_CHECKS, ("round", "client_id", "selected", "finish_s")
    )
    if "status" not in clients_df.columns and "completed" not in clients_df.columns:
        raise RunLoadError(f"{clients_path}:1: no 'status' (or older 'completed') column")
    check_client_rows(clients_path, clients_df, clients)
    records = read_traces(traces_path, clients)
    staged = next((r for r in records if r.stages), None)
    if staged is not None:
        raise RunLoadError(
            f"{run_dir}: round {staged.round + 1}'s training has {staged.stages} further "
            f"stages ({traces_path.name}'s 'stages': a Flower app's secure aggregation), "
            "which a replay does not re-time; answer the what-if by running its scenario "
            f"again with the change (mecsim run {run_dir / 'scenario.yaml'} --set "
            "PATH=VALUE), docs/flower.md"
        )
    # a round counts when its row, its clients' rows and its traces were written
    n_rounds = min(len(rounds_df), len(records))
    if n_rounds == 0:
        raise RunLoadError(f"{run_dir}: no finished round with op-traces to replay")
    if n_rounds < len(rounds_df):  # said, not silent: a sweep of it covers fewer rounds
        warnings.warn(
            f"{run_dir}: only rounds 1-{n_rounds} of the {len(rounds_df)} in rounds.csv have "
            f"op-traces in {traces_path.name} (a run killed while writing it, or a cut "
            "file); only those are replayed",
            RuntimeWarning,
            stacklevel=3,
        )

    rounds_df = rounds_df.set_index("round").sort_index()
    sel = clients_df[_true(clients_df["selected"])]
    # every selected client of a replayed round has its row, the same as its traces
    for r in range(n_rounds):
        ids = set(sel.loc[sel["round"] == r, "client_id"].astype(int))
        if ids != set(records[r].traces):
            raise RunLoadError(
                f"{clients_path}: round {r} selects clients {sorted(ids)[:8]}, its "
                f"op-traces ({traces_path.name}:{r + 1}) {sorted(records[r].traces)[:8]}"
            )
    # dropped by the timing (deadline, crash, outage...); an update rejected for NaN/inf
    # arrived in time, so replay counts it as the engine does
    if "status" in sel.columns:
        not_timed_in = ~sel["status"].astype(str).isin(["completed", "rejected_nonfinite"])
    else:
        not_timed_in = ~_true(sel["completed"])
    dropped_by_round = sel[not_timed_in].groupby("round")["client_id"]
    dropped = {int(r): frozenset(int(c) for c in ids) for r, ids in dropped_by_round}
    finish = {
        int(r): dict(zip(g["client_id"].astype(int), g["finish_s"].astype(float), strict=True))
        for r, g in sel.groupby("round")
    }

    rounds = []
    for rec in records[:n_rounds]:
        up = sum(trace_bytes(t)[0] for t in rec.traces.values())
        down = sum(trace_bytes(t)[1] for t in rec.traces.values())
        rounds.append(
            RecordedRound(
                rec.round, rec.traces, rec.aggregate_flops, up, down, rec.failed, rec.outage
            )
        )
    step_mem = meta.get("step_memory_bytes")
    return RecordedRun(
        run_id=str(rounds_df["run_id"].iloc[0])
        if "run_id" in rounds_df.columns and len(rounds_df)
        else run_dir.name,
        scenario=scenario,
        rounds=tuple(rounds),
        mean_accuracy=tuple(float(rounds_df.loc[r, "mean_accuracy"]) for r in range(n_rounds)),
        dropped=tuple(dropped.get(r, frozenset()) for r in range(n_rounds)),
        finish_s=tuple(finish.get(r, {}) for r in range(n_rounds)),
        round_time_s=tuple(float(rounds_df.loc[r, "round_time_s"]) for r in range(n_rounds)),
        step_memory_bytes=int(step_mem) if step_mem is not None else None,
        run_dir=run_dir,
        aggregated_at_flops_per_s_until=_legacy_aggregation(meta, n_rounds),
    )


def _legacy_aggregation(meta: dict[str, Any], n_rounds: int) -> int:
    """Rounds of a run recorded at the edge server's ``flops_per_s`` (see
    :attr:`RecordedRun.aggregated_at_flops_per_s_until`)."""
    if not meta or "aggregate_flops_per_s" in meta:
        return 0
    later = [
        int(r["from_round"])
        for r in meta.get("resumes", [])
        if isinstance(r, dict) and "aggregate_flops_per_s" in r and "from_round" in r
    ]
    return min(later, default=n_rounds)


@dataclass(frozen=True)
class ReplayResult:
    """A replayed (or retrained) run: one row per round, and whether it is exact."""

    run_id: str
    algorithm: str
    overrides: dict[str, Any]
    scenario: Scenario
    rounds: pd.DataFrame  # REPLAY_COLUMNS (mecsim.run.rows)
    source: str  # "replay" or "retrained"
    exact: bool  # every round is what a run with training would give
    inexact_from_round: int | None  # first round that is not (None: all are)
    timing_dependent: bool  # the recorded outcome depended on timing
    dropped_ids: tuple[tuple[int, ...], ...] = ()  # per round (replay only)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __repr__(self) -> str:
        # rounds a person reads are counted from 1 (inexact_from_round is a record index)
        where = (
            "exact"
            if self.exact
            else (
                f"inexact from round {self.inexact_from_round + 1}"
                if self.inexact_from_round is not None
                else "inexact"
            )
        )
        total = self.rounds["round_time_s"].sum() if len(self.rounds) else 0.0
        return (
            f"ReplayResult({self.run_id!r}, {self.source}, {where}, "
            f"overrides={self.overrides}, rounds={len(self.rounds)}, total={total:.6g} s)"
        )


def timing_aware(algorithm: str) -> bool:
    """Does the algorithm's server decide from emulated time (``uses_emulated_time``)?"""

    server_cls, _ = algorithm_classes(algorithm)
    return bool(getattr(server_cls, "uses_emulated_time", False))


def check_feasible(run: RecordedRun, scenario: Scenario) -> None:
    """ReplayInfeasible if the run's training step does not fit a client device's RAM."""
    if run.step_memory_bytes is None:
        return
    profiles = device_profiles(scenario)
    for name in sorted(set(scenario.client_profiles())):
        ram = profiles[name].ram_bytes
        if run.step_memory_bytes > ram:
            raise ReplayInfeasible(
                f"the run's model needs {run.step_memory_bytes / MiB:.1f} MiB per training "
                f"step, but device profile {name!r} has {ram / MiB:.0f} MiB of RAM"
            )


@dataclass(frozen=True)
class _Timed:
    rows: list[dict[str, Any]]
    dropped: list[frozenset[int]]
    finish_s: list[dict[int, float]]
    # clients that move: every client's serving edge server at each round's start
    serving: list[np.ndarray] | None = None


def retime(run: RecordedRun, scenario: Scenario) -> _Timed:
    """Re-time every recorded round under ``scenario`` (the run's, maybe overridden).

    The run loop's step 3 (:func:`mecsim.emulation.timing.emulate_round`, as
    :func:`mecsim.run.round.run_round` times a round): the round's channel from the seed,
    the recorded traces, the aggregation time of the recorded aggregation FLOPs on the
    edge-server profile, and the elapsed time carried from round to round.
    """
    profiles = device_profiles(scenario)
    network = NetworkModel(scenario, profiles)
    server = profiles[scenario.devices.edge_server]
    # rounds recorded before profiles had an aggregation rate aggregate as they did, at
    # flops_per_s, unless the replay sets the server's aggregation rate itself
    recorded = device_profiles(run.scenario)[run.scenario.devices.edge_server]
    legacy_server = (
        dataclasses.replace(server, aggregate_flops_per_s=None)
        if server.aggregate_flops_per_s == recorded.aggregate_flops_per_s
        else server
    )
    rows, dropped, finish = [], [], []
    elapsed_s = 0.0
    slowdown = faults.slowdown_factors(scenario.faults, scenario.seed, scenario.topology.clients)
    # Without emulated faults or rate traces, a round of download/compute/upload traces is
    # timed on columns (the round's links as arrays, its traces planned once per recorded
    # round, no object per client): the same numbers as through ClientSpecs, which time
    # what columns do not cover
    columns = not (faults.active(scenario.faults) or isinstance(network.channel, TraceChannel))
    for rec in run.rounds:
        selected = list(rec.traces)
        aggregator = legacy_server if rec.round < run.aggregated_at_flops_per_s_until else server
        aggregate_s = aggregator.aggregate_time_s(rec.aggregate_flops)
        plan = rec.trace_plan if columns and not rec.outage else None
        if plan is not None:
            links = network.links(rec.round, selected, elapsed_s)
            cols = network.columns(links, selected)
            timed = (
                None
                if cols is None
                else time_round_columns(
                    plan,
                    cols,
                    network.network,
                    aggregate_s,
                    failed=frozenset(rec.failed),
                    servers=links.servers,
                    edge_server=network.edge_server[selected],
                )
            )
            if timed is not None:
                energy = _columns_energy(network, rec, selected, timed)
                rows.append(_row(rec, timed.summary, elapsed_s, energy))
                elapsed_s = rows[-1]["elapsed_s"]
                dropped.append(frozenset(timed.summary.dropped))
                finish.append(dict(zip(timed.ids, timed.finish_s.tolist(), strict=True)))
                continue
        # the run's emulated faults: its stragglers and link outages are the scenario's,
        # its crashes and drop-outs are what the records say
        emulated = emulate_round(
            network,
            scenario.faults,
            slowdown,
            rec.round,
            selected,
            elapsed_s,
            rec.outage,
            rec.failed,
            records=False,
        )
        t = emulated.time(rec.traces, aggregate_s)
        link_arrays = (
            _links(emulated.specs, selected, network.round_links[0])
            if faults.active(scenario.faults)
            else network.round_links
        )
        energy = _round_energy(network, rec, selected, t, link_arrays)
        rows.append(_row(rec, t, elapsed_s, energy))
        elapsed_s = rows[-1]["elapsed_s"]
        dropped.append(frozenset(t.dropped))
        finish.append({c.client_id: c.finish_s for c in t.clients})
    moving = network.moving
    serving = None if moving is None else [rc.serving for rc in moving.history]
    return _Timed(rows, dropped, finish, serving)


def _row(
    rec: RecordedRound, t: RoundTiming, elapsed_s: float, energy: dict[str, float]
) -> dict[str, Any]:
    """A re-timed round's row (:data:`~mecsim.run.rows.REPLAY_COLUMNS`)."""
    selected = len(rec.traces)
    return {
        "round": rec.round,
        "selected": selected,
        "completed": selected - len(t.dropped),
        "dropped": len(t.dropped),
        **timing_columns(t, elapsed_s),
        "bytes_up": rec.bytes_up,
        "bytes_down": rec.bytes_down,
        **energy,
    }


def _links(specs, selected: list[int], air_rates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rates, latencies) arrays as ``NetworkModel.round_links`` has them, from the round's
    client specs after the emulated faults changed them (a rate schedule: NaN; a link
    down: its 0; a working constant link: its air rate, ``air_rates``)."""

    def rate(r, air: float) -> float:
        if isinstance(r, TimeVaryingRate):
            return float("nan")
        return float(r) if r <= 0 else float(air)

    rates = np.array(
        [
            (rate(specs[c].uplink_rate_bps, up), rate(specs[c].downlink_rate_bps, down))
            for c, (up, down) in zip(selected, air_rates.tolist(), strict=True)
        ],
        dtype=float,
    ).reshape(-1, 2)
    lat = np.array(
        [(specs[c].uplink_latency_s, specs[c].downlink_latency_s) for c in selected], dtype=float
    ).reshape(-1, 2)
    return rates, lat


def _round_energy(
    network: NetworkModel, rec: RecordedRound, selected: list[int], t, links
) -> dict[str, float]:
    """The round's client energy (mecsim.emulation.energy), vectorised over its clients."""
    times = np.array(
        [
            (c.download_s, c.compute_s, c.upload_s, c.server_compute_s, c.backhaul_s, c.finish_s)
            for c in t.clients
        ],
        dtype=float,
    )
    return _energy(network, rec, selected, times, links, t.round_time_s)


def _columns_energy(
    network: NetworkModel, rec: RecordedRound, selected: list[int], t: RoundColumns
) -> dict[str, float]:
    """:func:`_round_energy` of a round timed on columns (the closed form's have no
    server or backhaul seconds: 0, as in its ClientTimelines)."""
    spent = t.spent_s
    if spent.shape[1] == 3:
        spent = np.column_stack([spent, np.zeros((len(selected), 2))])
    times = np.column_stack([spent, t.finish_s])
    return _energy(network, rec, selected, times, network.round_links, t.summary.round_time_s)


def _energy(
    network: NetworkModel,
    rec: RecordedRound,
    selected: list[int],
    times: np.ndarray,
    links: tuple[np.ndarray, np.ndarray],
    round_time_s: float,
) -> dict[str, float]:
    """:func:`round_energy_arrays` of the selected clients' seconds ``times`` (download,
    compute, upload, server, backhaul, finish) over ``links`` (air rates, latencies)."""
    bits, n_ops = rec.transfer_arrays
    rates, lat = links  # of the round just drawn, in selection order
    return round_energy_arrays(
        network.power_w[selected],
        times,
        bits,
        n_ops,
        rates,
        lat,
        round_time_s,
        network.scenario.energy.idle_policy,
    )


def _rounds_list(rounds: list[int]) -> str:
    """Record indices, shown counted from 1."""
    shown = ", ".join(str(r + 1) for r in rounds[:8])
    return shown + (f", ... ({len(rounds)} rounds)" if len(rounds) > 8 else "")


def _first_divergence(run: RecordedRun, timed: _Timed, aware: bool) -> tuple[int | None, str]:
    """First round whose outcome would differ from the recorded one, and why."""
    for r in range(len(run.rounds)):
        rec, rep = run.dropped[r], timed.dropped[r]
        if rec != rep:
            return r, (
                f"round {r + 1}: the replay drops clients {sorted(rep)} at the deadline, "
                f"the recorded run dropped {sorted(rec)}"
            )
        if aware and timed.finish_s[r] != run.finish_s[r]:
            return r, (
                f"round {r + 1}: client timelines differ from the recorded ones and the "
                "algorithm decides from emulated time (uses_emulated_time)"
            )
    return None, ""


def hierarchical(algorithm: str) -> bool:
    """Is the algorithm hierarchical (``ServerAlgorithm.Edge`` set: its edge servers keep
    a model and aggregate the clients they serve)?"""
    server_cls, _ = algorithm_classes(algorithm)
    return getattr(server_cls, "Edge", None) is not None


def geometry_axis_refusal(recorded: Scenario, paths: Iterable[str]) -> str | None:
    """Why the geometry axes among ``paths`` (mobility speed, inter-site distance:
    :data:`mecsim.scenario.overrides.GEOMETRY_AXES`) cannot be replayed for this run;
    None when there are none or the algorithm is flat (who serves a client changes its
    links, not what it trains: the replay re-derives positions and association)."""
    axes = [p for p in paths if is_geometry_axis(p)]
    if not axes or not hierarchical(recorded.algorithm.name):
        return None
    return (
        f"{', '.join(map(repr, axes))}: algorithm {recorded.algorithm.name!r} is hierarchical "
        "(each edge server aggregates the models of the clients it serves), and where the "
        "sites are and how fast the clients move can change which edge server a client "
        "trains with, which the recorded op-traces cannot answer; pass retrain=True "
        "(--retrain) to re-run with training"
    )


def membership_free(recorded: Scenario) -> bool:
    """Does a replay of this run re-associate clients anyway? A flat algorithm's run whose
    clients move: the replay recomputes every round's association from its own times
    (docs/mobility.md, "Replays"), so an override that changes who serves a client at
    the start is no different from one that changes it later, and is exact."""
    g = recorded.geometry
    return g is not None and g.moves() and not hierarchical(recorded.algorithm.name)


def association_changes(recorded: Scenario, scenario: Scenario) -> str:
    """Which clients ``scenario`` serves from another edge server than ``recorded`` did
    at the start (a geometry's association: :class:`NetworkModel`'s ``edge_server``), as
    text; "" when none does (or neither has a geometry)."""
    if recorded.geometry is None and scenario.geometry is None:
        return ""
    before = _edge_servers(recorded)
    after = _edge_servers(scenario)
    if len(before) != len(after):
        return f"{len(before)} clients recorded, {len(after)} now"
    diff = np.flatnonzero(before != after)
    if not diff.size:
        return ""
    c = int(diff[0])
    more = f" and {diff.size - 1} more" if diff.size > 1 else ""
    return f"client {c} from edge server {before[c]} to {after[c]}{more}"


def moving_hierarchy(scenario: Scenario) -> bool:
    """A hierarchical algorithm (``ServerAlgorithm.Edge`` set) whose clients move: its
    edge servers group the clients served at each round's start, so where the clients
    are at each start decides what they train (:func:`mecsim.run.setup.moving_hierarchy`)."""
    g = scenario.geometry
    return (
        g is not None
        and g.moves()
        and algorithm_classes(scenario.algorithm.name)[0].Edge is not None
    )


def membership_changes(run: RecordedRun, timed: _Timed) -> str:
    """For a :func:`moving_hierarchy` run: the first round whose association at its
    start differs between the recorded run (its recorded starts: the sums of the
    recorded round times) and ``timed`` (a re-timing under some overrides, whose starts
    follow its own round times), as text; "" when every round's is the same (or the run
    is not such a run)."""
    if timed.serving is None or not moving_hierarchy(run.scenario):
        return ""
    network = NetworkModel(run.scenario, device_profiles(run.scenario))
    assert network.moving is not None
    starts, t = [], 0.0
    for rt in run.round_time_s:
        starts.append(t)
        t += rt
    network.moving.catch_up(starts)
    for r, (rec, rep) in enumerate(zip(network.moving.history, timed.serving, strict=False)):
        diff = np.flatnonzero(rec.serving != rep)
        if diff.size:
            c = int(diff[0])
            more = f" and {diff.size - 1} more" if diff.size > 1 else ""
            start = timed.rows[r - 1]["elapsed_s"] if r > 0 else 0.0
            return (
                f"round {r + 1}: client {c} is served by edge server {int(rep[c])} at the "
                f"replay's start of the round ({start:.6g} s), by {int(rec.serving[c])} in "
                f"the recorded run (at {starts[r]:.6g} s){more}"
            )
    return ""


def _edge_servers(scenario: Scenario) -> np.ndarray:
    return NetworkModel(scenario, device_profiles(scenario)).edge_server


def _overrides_id(overrides: Mapping[str, Any]) -> str:
    text = json.dumps(overrides, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def replay(
    run: RecordedRun | str | Path,
    overrides: Mapping[str, Any] | None = None,
    *,
    retrain: bool = False,
    backend: str | None = None,
    retrain_dir: str | Path | None = None,
    progress: bool = False,
) -> ReplayResult:
    """Replay ``run`` (a :class:`RecordedRun` or a run directory) under ``overrides``.

    ``overrides`` maps dotted scenario paths to values, e.g.
    ``{"channel.uplink.bandwidth_hz": 5e6, "devices.clients.0.profile": "rpi2b"}``.
    Only timing paths (channel, devices, deadline_s, backhaul) can be replayed; others
    need ``retrain=True``. With ``retrain=True`` a replay that is not exact is answered by
    training the overridden scenario (with ``backend``, default the scenario's; records
    under ``retrain_dir`` when given). Raises OverrideError, RunLoadError,
    ReplayInfeasible.
    """
    if not isinstance(run, RecordedRun):
        run = load_run(run)
    overrides = dict(overrides or {})
    source = f"{run.run_dir or run.run_id}/scenario.yaml"
    scenario = apply_overrides(run.scenario, overrides, source)
    untimed = [p for p in overrides if not is_timing_path(p)]
    if untimed and not retrain:
        raise OverrideError(
            f"override {', '.join(map(repr, untimed))} changes what the clients execute, so "
            "replaying the recorded op-traces cannot answer it; pass retrain=True (--retrain) "
            "to re-run with training, or override only channel.*, devices.*, deadline_s, "
            "backhaul.*, the geometry's speeds and inter-site distance"
        )
    refusal = geometry_axis_refusal(run.scenario, overrides)
    if refusal and not retrain:
        raise OverrideError(f"override {refusal}")
    check_membership = overrides and not membership_free(run.scenario)
    moved = association_changes(run.scenario, scenario) if check_membership else ""
    if moved and not retrain:
        raise OverrideError(
            f"override {', '.join(map(repr, overrides))} changes which edge server serves "
            f"clients ({moved}: geometry.association), so the clients would train in "
            "other groups than the recorded run's; pass retrain=True (--retrain) to re-run "
            "with training"
        )
    moving = moving_rate_refusal(scenario)
    if moving is not None:
        raise OverrideError(
            f"override {', '.join(map(repr, overrides))}: geometry.mobility.rate: {moving}"
        )
    check_feasible(run, scenario)

    notes: list[str] = []
    recorded_drops = [r for r, d in enumerate(run.dropped) if d]
    aware = timing_aware(run.algorithm)
    if recorded_drops:
        notes.append(
            f"the recorded run dropped clients at the deadline in rounds "
            f"{_rounds_list(recorded_drops)}: its training depended on timing"
        )
    if aware:
        notes.append(f"algorithm {run.algorithm!r} decides from emulated time")
    timing_dependent = bool(recorded_drops) or aware

    first: int | None
    if untimed or moved or refusal:
        first, why = (
            0,
            (
                f"override of {', '.join(untimed)} changes training"
                if untimed
                else f"the association changes ({moved})"
                if moved
                else "a geometry axis of a hierarchical algorithm"
            ),
        )
        timed = None
    else:
        timed = retime(run, scenario)
        first, why = _first_divergence(run, timed, aware)
        regrouped = membership_changes(run, timed) if overrides else ""
        if regrouped and not retrain:
            raise OverrideError(
                f"override {', '.join(map(repr, overrides))} moves the rounds' starts, so "
                f"where the clients are at them, and {regrouped}: algorithm "
                f"{run.algorithm!r} is hierarchical, its edge servers would aggregate "
                "other groups of clients than the recorded run's; pass retrain=True "
                "(--retrain) to re-run with training"
            )
        if regrouped:
            first, why = 0, f"the association changes ({regrouped})"

    if first is not None and retrain:
        notes.append(f"not exact as a replay ({why}); retrained")
        return _retrain(
            run, scenario, overrides, backend, retrain_dir, progress, timing_dependent, notes
        )

    assert timed is not None
    acc = [a if first is None or r < first else math.nan for r, a in enumerate(run.mean_accuracy)]
    frame = pd.DataFrame(timed.rows, columns=REPLAY_COLUMNS[:-1])
    frame["mean_accuracy"] = acc
    if first is None:
        if recorded_drops:
            notes.append("the replay drops the same clients in every round, so it is exact")
    else:
        notes.append(
            f"not exact from round {first + 1} on ({why}): the aggregated models, "
            "accuracy (not reported from there) and possibly later op-traces would "
            "differ; round times from there on re-time the recorded op-traces. "
            "Use retrain=True (--retrain) to re-run with training"
        )
    return ReplayResult(
        run_id=run.run_id,
        algorithm=run.algorithm,
        overrides=overrides,
        scenario=scenario,
        rounds=frame,
        source="replay",
        exact=first is None,
        inexact_from_round=first,
        timing_dependent=timing_dependent,
        dropped_ids=tuple(tuple(sorted(d)) for d in timed.dropped),
        notes=tuple(notes),
    )


def _retrain(
    run: RecordedRun,
    scenario: Scenario,
    overrides: dict[str, Any],
    backend: str | None,
    retrain_dir: str | Path | None,
    progress: bool,
    timing_dependent: bool,
    notes: list[str],
) -> ReplayResult:
    """Run the overridden scenario with training, for the rounds the run recorded: into
    ``retrain_dir/<run id>-retrain-<hash of the overrides>/`` as ``mecsim run`` does when
    a folder is given (its records reused when that point was retrained before), else
    without records."""
    data = scenario.model_dump(mode="json")
    data["rounds"] = len(run.rounds)
    data["metrics"]["enabled"] = False
    scenario = scenario_from_dict(data, f"{run.run_id} retrain")
    run_id = f"{run.run_id}-retrain-{_overrides_id(overrides)}"
    observers: list[RunObserver] = [ProgressBar(Console(stderr=True))] if progress else []
    try:
        if retrain_dir is None:
            rows = run_loop(scenario, run_id, None, observers, backend=backend)
        else:
            out_dir = Path(retrain_dir) / run_id
            if out_dir.exists():  # the same point retrained before: reuse its records
                notes.append(f"records reused from {out_dir}")
                return _result_from_records(
                    load_run(out_dir), run, overrides, timing_dependent, notes
                )
            notes.append(f"records in {out_dir}")
            rows = run_in_folder(scenario, out_dir, observers=observers, backend=backend).rows
    except (ScenarioInfeasible, BadRun) as exc:
        raise ReplayInfeasible(str(exc)) from None
    frame = pd.DataFrame(rows).reindex(columns=REPLAY_COLUMNS)
    return ReplayResult(
        run_id=run.run_id,
        algorithm=run.algorithm,
        overrides=overrides,
        scenario=scenario,
        rounds=frame.reset_index(drop=True),
        source="retrained",
        exact=True,
        inexact_from_round=None,
        timing_dependent=timing_dependent,
        notes=tuple(notes),
    )


def _result_from_records(
    rec: RecordedRun,
    run: RecordedRun,
    overrides: dict[str, Any],
    timing_dependent: bool,
    notes: list[str],
) -> ReplayResult:
    # records of an older mecsim may lack columns (energy): NaN there
    assert rec.run_dir is not None  # loaded from its folder
    frame = _read_csv(rec.run_dir / "rounds.csv").reindex(columns=REPLAY_COLUMNS)
    return ReplayResult(
        run_id=run.run_id,
        algorithm=run.algorithm,
        overrides=overrides,
        scenario=rec.scenario,
        rounds=frame,
        source="retrained",
        exact=True,
        inexact_from_round=None,
        timing_dependent=timing_dependent,
        notes=tuple(notes),
    )


def recorded_frame(run: RecordedRun) -> pd.DataFrame:
    """The recorded rounds' timing columns (from rounds.csv), for comparisons."""
    if run.run_dir is None:
        raise RunLoadError(f"{run.run_id}: no run directory")
    frame = _read_csv(run.run_dir / "rounds.csv").reindex(columns=REPLAY_COLUMNS)
    return frame.iloc[: len(run.rounds)]


def reproduces(run: RecordedRun) -> bool:
    """Does a replay with no override give exactly the recorded round times?"""
    timed = retime(run, run.scenario)
    got = np.array([r["round_time_s"] for r in timed.rows])
    return bool(np.array_equal(got, np.array(run.round_time_s)))


class _CallableModule(types.ModuleType):
    """``mecsim.replay(...)`` calls :func:`replay` even once this module is imported."""

    def __call__(self, *args: Any, **kwargs: Any) -> ReplayResult:
        return replay(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
