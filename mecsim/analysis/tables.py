"""The papers' comparison tables, computed from the records of finished runs.

Each table is a :class:`pandas.DataFrame` with one row per run (numbers, for CSV) and is
rendered as markdown by :func:`markdown_tables` in the papers' own layout.

- **KAPC Table 5 shape** (:func:`kapc_time_table`): average emulated time per round and
  its split into U-Comm / D-Comm / Client / Server seconds with the share of the round
  in %; ``Backhaul`` and ``Idle`` columns appear when any run has them.
- **KAPC Table 6 shape** (:func:`kapc_cost_table`): MiB uploaded and downloaded per round
  (all selected clients; the papers' "MB" are MiB), client and server GFLOPs per round,
  peak server memory (MiB of RSS) and peak modelled client training-step memory (MiB).
- **MTFL Table 4 shape** (:func:`mtfl_time_table`): average round time and the % of it
  spent in Down / Client / Up / Server.
- **DC-PFL Tables I-II shape** (:func:`dcpfl_table`): final accuracy, communication rounds,
  communication time and total time *at convergence* (defined below), with the total
  time's ratio to the first run given (the paper's "(x 1.65)").
- **Accuracy table** (:func:`accuracy_table`): best mean user accuracy and its round,
  final mean accuracy, and with a target, the rounds and emulated time to reach it.

Definitions (the same in ``docs/reports.md``):

- Rounds are counted from 1 in the tables (round index 0 in the records is "round 1").
- *Final accuracy* (accuracy table): the mean user accuracy of the last evaluated round.
- DC-PFL table: final accuracy, convergence round, comm. rounds, comm. time and total
  time as :mod:`mecsim.analysis.convergence` defines them (one definition for ``mecsim report``
  and ``benchmarks/papers/dcpfl_table.py``): the final accuracy is the mean over the last
  ``window`` (default 5) evaluated rounds; the convergence round is the earliest
  evaluated round from which the trailing ``window``-round mean stays at or above the
  final accuracy minus ``tolerance`` (default 0.01); comm. rounds are the rounds up to it
  in which weights were sent (the algorithm's ``comm_round`` column, else any byte);
  comm. time sums the critical path's download + upload + backhaul seconds up to it;
  total time is the emulated seconds elapsed at its end.
- *Rounds to target*: the number of rounds until the mean user accuracy first reaches
  ``target`` (an evaluated round with accuracy >= target); "X" when it never does (the
  MTFL paper's notation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from mecsim.analysis import convergence
from mecsim.scenario import ScenarioError, load_recorded_scenario
from mecsim.store.reader import (
    CLIENT_CHECKS,
    ROUND_CHECKS,
    RecordError,
    check_client_rows,
    check_rounds_in_order,
    read_table,
)
from mecsim.store.summary import run_notes

MiB = 1024 * 1024

#: (label in tables, round-row column); optional phases appear only when present.
PHASES = (
    ("U-Comm", "ul_time_s"),
    ("D-Comm", "dl_time_s"),
    ("Client", "client_time_s"),
    ("Server", "server_time_s"),
    ("Backhaul", "backhaul_time_s"),
    ("Idle", "idle_time_s"),
)
OPTIONAL_PHASES = ("backhaul_time_s", "idle_time_s")
REQUIRED_COLUMNS = (
    "round",
    "algorithm",
    "round_time_s",
    "dl_time_s",
    "client_time_s",
    "ul_time_s",
    "server_time_s",
    "elapsed_s",
    "bytes_up",
    "bytes_down",
    "client_gflops",
    "server_gflops",
    "server_rss_mb",
    "client_peak_mb",
    "mean_accuracy",
)


class ReportError(Exception):
    """Records that cannot be reported on; the message names the path."""


@dataclass
class RunRecords:
    """The records of one run, as read from ``runs/<run-id>/``."""

    path: Path
    run_id: str
    algorithm: str
    rounds: pd.DataFrame
    clients: pd.DataFrame | None = None
    planned_rounds: int | None = None
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: ``aggregation.mode``: ``sync``, or ``async`` / ``buffered`` / ``semi_sync`` (rows
    #: are server versions, not rounds: docs/async.md)
    mode: str = "sync"

    @property
    def is_async(self) -> bool:
        return self.mode != "sync"

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.algorithm


def from_rows(
    run_id: str,
    rounds: Sequence[dict[str, Any]],
    clients: Sequence[dict[str, Any]] | None = None,
    *,
    path: Path | str = ".",
    planned_rounds: int | None = None,
) -> RunRecords:
    """A :class:`RunRecords` from in-memory rows (what a run's observers see)."""
    if not rounds:
        raise ReportError(f"{path}: no rounds recorded")
    df = pd.DataFrame(list(rounds))
    cl = pd.DataFrame(list(clients)) if clients else None
    return RunRecords(Path(path), run_id, str(df["algorithm"].iloc[0]), df, cl, planned_rounds)


def load_run(path: str | Path) -> RunRecords:
    """Read ``rounds.csv`` (required), ``clients.csv`` and ``scenario.yaml`` (optional)."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: no such run directory")
    rounds_file = path / "rounds.csv"
    if not rounds_file.is_file():
        raise ReportError(f"{path}: not a run directory (no rounds.csv)")
    scenario_file = path / "scenario.yaml"
    planned, clients = None, None
    # an asynchronous run records updates.csv in place of clients.csv (docs/async.md)
    mode = "async" if (path / "updates.csv").is_file() else "sync"
    if scenario_file.is_file():
        try:
            data: Any = yaml.safe_load(scenario_file.read_text()) or {}
            mode = str((data.get("aggregation") or {}).get("mode", mode))
            planned = int(data.get("rounds"))
            clients = int(data.get("topology", {}).get("clients"))
        except (yaml.YAMLError, TypeError, ValueError, AttributeError, RecursionError):
            pass
    try:  # read strictly: a tampered file is refused naming its line (mecsim.store.reader)
        rounds = read_table(rounds_file, ROUND_CHECKS, REQUIRED_COLUMNS)
        if rounds.empty:
            raise ReportError(f"{rounds_file}: no rounds recorded")
        check_rounds_in_order(rounds_file, rounds)
        client_rows = None
        clients_file = path / "clients.csv"
        if clients_file.is_file():
            client_rows = read_table(clients_file, CLIENT_CHECKS, ("round", "client_id"))
            check_client_rows(clients_file, client_rows, clients)
    except RecordError as exc:
        raise ReportError(str(exc)) from None
    notes: list[str] = []
    if scenario_file.is_file():
        notes = _scenario_notes(scenario_file, rounds)
    run_id = str(rounds["run_id"].iloc[0]) if "run_id" in rounds.columns else path.name
    algorithms = sorted(set(rounds["algorithm"].astype(str)))
    return RunRecords(
        path,
        run_id,
        "+".join(algorithms),
        rounds,
        client_rows,
        planned,
        extra={"notes": notes},
        mode=mode,
    )


def _scenario_notes(scenario_file: Path, rounds: pd.DataFrame) -> list[str]:
    """What a run's tables must state under them (the downlink assumption, the algorithm's
    warnings: :func:`mecsim.store.summary.run_notes`), from its scenario and round records;
    none when the file is not a valid scenario of this mecsim (records of another one)."""

    try:
        scenario = load_recorded_scenario(scenario_file)
    except (ScenarioError, ValueError, RecursionError):
        return []
    return run_notes(scenario, rounds.to_dict("records"))


def label_runs(runs: Sequence[RunRecords]) -> None:
    """Label each run by its algorithm, adding the run id when several runs are shown."""
    for r in runs:
        r.label = r.algorithm if len(runs) == 1 else f"{r.algorithm} ({r.run_id})"


# ----------------------------------------------------------------------------- measures


def _phases(runs: Sequence[RunRecords]) -> list[tuple[str, str]]:
    """The phases to show: the four always, backhaul/idle when any run has them > 0."""
    out = []
    for name, col in PHASES:
        if col in OPTIONAL_PHASES and not any(
            col in r.rounds.columns and (r.rounds[col].fillna(0) > 0).any() for r in runs
        ):
            continue
        out.append((name, col))
    return out


def _col(df: pd.DataFrame, col: str) -> pd.Series:
    """A time column as floats; absent or empty cells (older records) count as 0 s."""
    if col not in df.columns:
        return pd.Series(0.0, index=df.index)
    return df[col].astype(float).fillna(0.0)


def _pct(part: float, total: float) -> float:
    return 100.0 * part / total if total > 0 else 0.0


def evaluated(r: RunRecords) -> pd.DataFrame:
    """The rounds with a mean user accuracy (evaluated rounds), in round order."""
    return r.rounds[r.rounds["mean_accuracy"].notna()]


def convergence_round(
    r: RunRecords, tolerance: float = convergence.TOLERANCE, window: int = convergence.WINDOW_ROUNDS
) -> int | None:
    """Index (records' ``round``) of the convergence round; None if nothing was evaluated.

    :func:`mecsim.analysis.convergence.convergence_round`: the earliest evaluated round from which
    the trailing ``window``-round mean of the mean user accuracy stays at or above the
    final accuracy (mean of the last ``window`` evaluated rounds) minus ``tolerance``.
    """
    if evaluated(r).empty:
        return None
    acc = r.rounds["mean_accuracy"].astype(float).to_numpy()
    return int(r.rounds["round"].iloc[convergence.convergence_round(acc, window, tolerance)])


def rounds_to_target(r: RunRecords, target: float) -> tuple[int | None, float | None]:
    """(rounds counted from 1, emulated seconds) until the mean accuracy first >= target."""
    ev = evaluated(r)
    hit = ev[ev["mean_accuracy"].astype(float) >= target]
    if hit.empty:
        return None, None
    first = hit.iloc[0]
    return int(first["round"]) + 1, float(first["elapsed_s"])


# ----------------------------------------------------------------------------- tables


def kapc_time_table(runs: Sequence[RunRecords]) -> pd.DataFrame:
    """KAPC Table 5 shape: average time per round (s) and each phase's share (%)."""
    phases = _phases(runs)
    rows = []
    for r in runs:
        t = float(r.rounds["round_time_s"].mean())
        row: dict[str, Any] = {
            "method": r.algorithm,
            "run": r.run_id,
            "rounds": len(r.rounds),
            "time_s": t,
        }
        for name, col in phases:
            s = float(_col(r.rounds, col).mean())
            key = name.lower().replace("-", "_")
            row[f"{key}_s"], row[f"{key}_pct"] = s, _pct(s, t)
        rows.append(row)
    return pd.DataFrame(rows)


def kapc_cost_table(runs: Sequence[RunRecords]) -> pd.DataFrame:
    """KAPC Table 6 shape: MiB up/down, GFLOPs client/server per round; memory; accuracy."""
    rows = []
    for r in runs:
        df = r.rounds
        ev = evaluated(r)
        rows.append(
            {
                "method": r.algorithm,
                "run": r.run_id,
                "u_comm_mib": float(df["bytes_up"].mean()) / MiB,
                "d_comm_mib": float(df["bytes_down"].mean()) / MiB,
                "c_comp_gflops": float(df["client_gflops"].mean()),
                "s_comp_gflops": float(df["server_gflops"].mean()),
                # joules of all selected clients per round (NaN in records without energy)
                "client_energy_j": float(df["energy_j"].mean(skipna=False))
                if "energy_j" in df.columns
                else math.nan,
                **_energy_shares(df),
                # MiB (the records' server_rss_mb is MiB too); server_mem_mb: the same
                # figure under its old name, for readers of earlier kapc_table6_cost.csv
                "server_mem_mib": float(df["server_rss_mb"].max()),
                "server_mem_mb": float(df["server_rss_mb"].max()),
                "client_step_mem_mib": float(df["client_peak_mb"].max()),
                "best_mean_acc": float(ev["mean_accuracy"].max()) if not ev.empty else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _energy_shares(df: pd.DataFrame) -> dict[str, float]:
    """% of the client energy in each part (compute, radio, idle, sleep): the shares of
    the summed joules of all rounds; NaN where the records lack the part."""
    total = float(df["energy_j"].sum(min_count=len(df))) if "energy_j" in df.columns else 0.0
    return {
        f"energy_{part}_pct": 100.0 * float(df[f"energy_{part}_j"].sum(min_count=len(df))) / total
        if f"energy_{part}_j" in df.columns and total > 0
        else math.nan
        for part in ("compute", "radio", "idle", "sleep")
    }


def mtfl_time_table(runs: Sequence[RunRecords]) -> pd.DataFrame:
    """MTFL Table 4 shape: average round time (s) and the % in Down / Client / Up / Server."""
    order = [
        ("Down", "dl_time_s"),
        ("Client", "client_time_s"),
        ("Up", "ul_time_s"),
        ("Server", "server_time_s"),
        ("Backhaul", "backhaul_time_s"),
        ("Idle", "idle_time_s"),
    ]
    shown = {col for _, col in _phases(runs)}
    rows = []
    for r in runs:
        t = float(r.rounds["round_time_s"].mean())
        row: dict[str, Any] = {"method": r.algorithm, "run": r.run_id, "round_time_s": t}
        for name, col in order:
            if col in shown:
                row[f"{name.lower()}_pct"] = _pct(float(_col(r.rounds, col).mean()), t)
        rows.append(row)
    return pd.DataFrame(rows)


def dcpfl_table(
    runs: Sequence[RunRecords],
    tolerance: float = convergence.TOLERANCE,
    window: int = convergence.WINDOW_ROUNDS,
    target: float | None = None,
) -> pd.DataFrame:
    """DC-PFL Tables I-II shape, at the convergence round (:mod:`mecsim.analysis.convergence`), and
    to a common target accuracy (``target``, or :func:`mecsim.analysis.convergence.common_target`
    of the runs' final accuracies): rounds, emulated seconds and MiB until each run first
    reaches it (the fair comparison: "converged" compares a run only with its own end)."""
    rows = []
    for r in runs:
        base = {"method": r.algorithm, "run": r.run_id}
        if evaluated(r).empty:
            rows.append(
                {
                    **base,
                    "final_acc": math.nan,
                    "best_acc": math.nan,
                    "convergence_round": math.nan,
                    "comm_rounds": 0,
                    "comm_time_s": 0.0,
                    "total_time_s": float(r.rounds["elapsed_s"].iloc[-1]),
                }
            )
            continue
        conv = convergence.to_convergence(r.rounds.to_dict("records"), window, tolerance)
        rows.append(
            {
                **base,
                "final_acc": conv["final_accuracy"],
                "best_acc": conv["best_accuracy"],
                "convergence_round": int(conv["convergence_round"]) + 1,
                "comm_rounds": int(conv["comm_rounds"]),
                "comm_time_s": conv["comm_time_s"],
                "total_time_s": conv["total_time_s"],
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:  # every run asynchronous: nothing per round to show
        return out
    base = out["total_time_s"].iloc[0]
    out["total_time_ratio"] = out["total_time_s"] / base if base > 0 else math.nan
    finals = out["final_acc"].astype(float).tolist()
    if target is None and any(math.isfinite(a) for a in finals):
        target = convergence.common_target(finals)
    out["target"] = math.nan if target is None else target
    for key in ("target_round", "target_time_s", "target_mib"):
        out[key] = math.nan
    if target is not None:
        for k, r in enumerate(runs):
            hit = convergence.to_target(r.rounds.to_dict("records"), target)
            out.loc[k, "target_round"] = hit["target_round"] + 1
            out.loc[k, "target_time_s"] = hit["total_time_s"]
            out.loc[k, "target_mib"] = hit["bytes_total"] / MiB
    return out


def _final_accuracies(runs: Sequence[RunRecords], window: int) -> list[float]:
    """Each run's final accuracy (:func:`mecsim.analysis.convergence.final_accuracy`);
    NaN for a run nothing of which was evaluated."""
    return [
        convergence.final_accuracy(r.rounds["mean_accuracy"].astype(float).tolist(), window)
        if not evaluated(r).empty
        else math.nan
        for r in runs
    ]


def _common_target(finals: Sequence[float]) -> float | None:
    """:func:`mecsim.analysis.convergence.common_target`, None when no run has a final
    accuracy."""
    return convergence.common_target(finals) if any(math.isfinite(a) for a in finals) else None


def time_to_accuracy_table(
    runs: Sequence[RunRecords],
    target: float | None = None,
    window: int = convergence.WINDOW_ROUNDS,
) -> pd.DataFrame:
    """Time to accuracy, for synchronous and asynchronous runs alike: until the first
    evaluated round (or server version) whose mean user accuracy is at or above
    ``target`` (or :func:`mecsim.analysis.convergence.common_target` of the runs' final
    accuracies), the updates aggregated (the rows' ``completed``), the emulated seconds
    (``elapsed_s``), the clients' energy (J, the rows' ``energy_j``: every selected client
    of a round, every update that reached the server in an asynchronous run) and the MiB
    sent and received; NaN where a run never reaches it."""
    finals = _final_accuracies(runs, window)
    if target is None:
        target = _common_target(finals)
    rows = []
    for r, final in zip(runs, finals, strict=True):
        df = r.rounds
        row: dict[str, Any] = {
            "method": r.algorithm,
            "run": r.run_id,
            "mode": r.mode,
            "target": math.nan if target is None else target,
            "updates_to_target": math.nan,
            "time_to_target_s": math.nan,
            "energy_to_target_j": math.nan,
            "mib_to_target": math.nan,
            "final_acc": final,
            "updates": int(df["completed"].sum()) if "completed" in df.columns else math.nan,
            "elapsed_s": float(df["elapsed_s"].iloc[-1]),
        }
        if target is not None:
            acc = df["mean_accuracy"].astype(float).to_numpy()
            hit = [k for k, a in enumerate(acc) if math.isfinite(a) and a >= target]
            if hit:
                upto = df.iloc[: hit[0] + 1]
                row.update(
                    updates_to_target=int(upto["completed"].sum())
                    if "completed" in upto.columns
                    else math.nan,
                    time_to_target_s=float(upto["elapsed_s"].iloc[-1]),
                    energy_to_target_j=float(upto["energy_j"].sum(min_count=len(upto)))
                    if "energy_j" in upto.columns
                    else math.nan,
                    mib_to_target=float(upto["bytes_up"].sum() + upto["bytes_down"].sum()) / MiB,
                )
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_table(runs: Sequence[RunRecords], target: float | None = None) -> pd.DataFrame:
    """Best mean user accuracy (and its round), final accuracy, rounds/time to target."""
    rows = []
    for r in runs:
        ev = evaluated(r)
        row: dict[str, Any] = {
            "method": r.algorithm,
            "run": r.run_id,
            "rounds": len(r.rounds),
            "evaluated_rounds": len(ev),
        }
        if ev.empty:
            row.update(best_mean_acc=math.nan, best_round=math.nan, final_acc=math.nan)
        else:
            best = ev.loc[ev["mean_accuracy"].astype(float).idxmax()]
            row.update(
                best_mean_acc=float(best["mean_accuracy"]),
                best_round=int(best["round"]) + 1,
                final_acc=float(ev["mean_accuracy"].iloc[-1]),
            )
        if target is not None:
            n, t = rounds_to_target(r, target)
            row.update(
                target=target,
                rounds_to_target=n if n is not None else math.nan,
                time_to_target_s=t if t is not None else math.nan,
            )
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- rendering


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def _num(x: Any, fmt: str, missing: str = "-") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return missing
    return missing if math.isnan(v) else format(v, fmt)


def _method(row: pd.Series, runs_shown: int) -> str:
    return row["method"] if runs_shown == 1 else f"{row['method']} ({row['run']})"


@dataclass
class Tables:
    """All tables of a report; :meth:`markdown` renders them, :meth:`write_csv` saves them."""

    kapc_time: pd.DataFrame
    kapc_cost: pd.DataFrame
    mtfl_time: pd.DataFrame
    dcpfl: pd.DataFrame
    accuracy: pd.DataFrame
    target: float | None = None
    tolerance: float = convergence.TOLERANCE
    window: int = convergence.WINDOW_ROUNDS
    notes: list[str] = field(default_factory=list)  # assumptions to print under the tables
    time_to_accuracy: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: labels of the asynchronous runs the per-round tables leave out (their rows are
    #: server versions: a version's times overlap other versions' updates)
    versioned: list[str] = field(default_factory=list)

    CSV_NAMES = {
        "kapc_time": "kapc_table5_time.csv",
        "kapc_cost": "kapc_table6_cost.csv",
        "mtfl_time": "mtfl_table4_time.csv",
        "dcpfl": "dcpfl_tables_1_2.csv",
        "accuracy": "accuracy.csv",
        "time_to_accuracy": "time_to_accuracy.csv",
    }

    def write_csv(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for attr, name in self.CSV_NAMES.items():
            p = out_dir / name
            getattr(self, attr).to_csv(p, index=False)
            paths.append(p)
        return paths

    def _left_out(self, table: pd.DataFrame) -> str:
        """The sentence under a per-round table that leaves asynchronous runs out."""
        if not self.versioned:
            return ""
        runs = ", ".join(self.versioned)
        return (
            ("" if table.empty else "\n\n")
            + f"Not shown: {runs} (asynchronous: its rows are server versions, whose "
            "updates overlap in time; see Time to accuracy, and updates.csv for each "
            "update's times)."
        )

    def _per_round(self, title: str, table: pd.DataFrame, body: str) -> str:
        return f"## {title}\n\n" + (body if not table.empty else "") + self._left_out(table)

    def markdown(self) -> str:
        n = len(self.accuracy)
        parts = []

        # KAPC Table 5
        t5 = self.kapc_time
        names = [c[:-2] for c in t5.columns if c.endswith("_s") and c != "time_s"]
        label = {k.lower().replace("-", "_"): k for k, _ in PHASES}
        header = ["method", "Time (s)"] + [f"{label[k]} (s/%)" for k in names]
        rows = [
            [_method(r, n), _num(r["time_s"], ".2f")]
            + [f"{_num(r[k + '_s'], '.2f')} ({_num(r[k + '_pct'], '.2f')})" for k in names]
            for _, r in t5.iterrows()
        ]
        parts.append(
            self._per_round(
                "Average time per round (KAPC Table 5 shape; emulated, critical path)",
                t5,
                _md(header, rows),
            )
        )

        # KAPC Table 6
        t6 = self.kapc_cost
        header = [
            "method",
            "U-Comm (MiB)",
            "D-Comm (MiB)",
            "C-Comp (GFLOPs)",
            "S-Comp (GFLOPs)",
            "Client energy (J)",
            "Energy compute/radio/idle/sleep (%)",
            "Server mem (MiB)",
            "Client step mem (MiB)",
            "Best mean acc (%)",
        ]
        rows = [
            [
                _method(r, n),
                _num(r["u_comm_mib"], ".2f"),
                _num(r["d_comm_mib"], ".2f"),
                _num(r["c_comp_gflops"], ".2f"),
                _num(r["s_comp_gflops"], ".3f"),
                _num(r["client_energy_j"], ".1f"),
                "/".join(
                    _num(r[f"energy_{p}_pct"], ".0f") for p in ("compute", "radio", "idle", "sleep")
                ),
                _num(r["server_mem_mib"], ".1f"),
                _num(r["client_step_mem_mib"], ".2f"),
                _num(100 * r["best_mean_acc"], ".2f"),
            ]
            for _, r in t6.iterrows()
        ]
        parts.append(
            self._per_round(
                "Communication and computation per round (KAPC Table 6 shape)",
                t6,
                _md(header, rows) + "\n\nClient energy: joules of all selected clients per "
                "round (compute, radio, idle and sleep, and each part's share of it; "
                "docs/devices.md).",
            )
        )

        # MTFL Table 4
        t4 = self.mtfl_time
        pct = [c for c in t4.columns if c.endswith("_pct")]
        header = ["Learning scheme", "Round time (s)"] + [f"{c[:-4].capitalize()} (%)" for c in pct]
        rows = [
            [_method(r, n), _num(r["round_time_s"], ".2f")] + [_num(r[c], ".1f") for c in pct]
            for _, r in t4.iterrows()
        ]
        parts.append(
            self._per_round("Round time and its split (MTFL Table 4 shape)", t4, _md(header, rows))
        )

        # DC-PFL Tables I-II
        d = self.dcpfl
        pp = 100 * self.tolerance
        goal = d["target"].iloc[0] if "target" in d and len(d) else math.nan
        header = [
            "Method",
            "Final Acc. (fraction)",
            "Best Acc. (fraction)",
            "Comm. rounds",
            "Comm. time (s)",
            "Total time (s)",
            "Converged at round",
        ]
        if math.isfinite(goal):
            header += [
                f"Round to {100 * goal:g} %",
                f"Time to {100 * goal:g} % (s)",
                f"Sent to {100 * goal:g} % (MiB)",
            ]
        rows = []
        for _, r in d.iterrows():
            comm = r["comm_rounds"] > 0
            cells = [
                _method(r, n),
                _num(r["final_acc"], ".3f"),
                _num(r["best_acc"], ".3f"),
                str(int(r["comm_rounds"])) if comm else "-",
                _num(r["comm_time_s"], ".1f") if comm else "-",
                f"{_num(r['total_time_s'], '.1f')} (×{_num(r['total_time_ratio'], '.2f')})",
                _num(r["convergence_round"], ".0f"),
            ]
            if math.isfinite(goal):
                cells += [
                    _num(r["target_round"], ".0f", "X"),
                    _num(r["target_time_s"], ".1f", "X"),
                    _num(r["target_mib"], ".1f", "X"),
                ]
            rows.append(cells)
        parts.append(
            "## Accuracy and time to convergence (DC-PFL Tables I-II shape)\n\n"
            + (_md(header, rows) + "\n\n" if not d.empty else "")
            + f"Final Acc.: the mean over the last {self.window} evaluated round"
            f"{'' if self.window == 1 else 's'}. Converged: the earliest evaluated round from "
            f"which the trailing {self.window}-round mean accuracy stays no more than {pp:g} "
            f"percentage point{'' if pp == 1 else 's'} below the final accuracy. "
            "Comm. rounds and times count rounds up to it; (×) is the total time relative to "
            "the first run. Best Acc.: the best trailing mean (above Final when the accuracy "
            "fell back). To the target: the first round with mean user accuracy at or above "
            "it, its emulated time and the MiB sent and received until then, the same target "
            "for every run (given with --target, else the highest whole point every run's "
            "final accuracy reaches): the fair comparison, since 'converged' compares each "
            "run only with its own end." + self._left_out(d)
        )

        # Accuracy
        a = self.accuracy
        rounds_label = "Rounds (versions)" if self.versioned else "Rounds"
        header = ["method", rounds_label, "Best mean acc (%)", "Best round", "Final acc (%)"]
        if self.target is not None:
            header += [f"Rounds to {100 * self.target:g} %", "Time to target (s)"]
        rows = []
        for _, r in a.iterrows():
            cells = [
                _method(r, n),
                str(int(r["rounds"])),
                _num(100 * r["best_mean_acc"], ".2f"),
                _num(r["best_round"], ".0f"),
                _num(100 * r["final_acc"], ".2f"),
            ]
            if self.target is not None:
                cells += [
                    _num(r["rounds_to_target"], ".0f", "X"),
                    _num(r["time_to_target_s"], ".1f", "X"),
                ]
            rows.append(cells)
        parts.append("## User accuracy\n\n" + _md(header, rows))
        parts.append(self._time_to_accuracy_markdown(n))
        if self.notes:
            parts.append(
                "## Assumptions and warnings\n\n" + "\n".join(f"- {note}" for note in self.notes)
            )
        return "\n\n".join(parts) + "\n"

    def _time_to_accuracy_markdown(self, n: int) -> str:
        t = self.time_to_accuracy
        goal = float(t["target"].iloc[0]) if len(t) else math.nan
        title = "## Time to accuracy (synchronous and asynchronous runs alike)\n\n"
        if not math.isfinite(goal):
            return title + "No run was evaluated: no target to reach."
        g = f"{100 * goal:g} %"
        header = [
            "method",
            "mode",
            f"Updates to {g}",
            f"Time to {g} (s)",
            f"Energy to {g} (J)",
            f"Sent to {g} (MiB)",
            "Final acc (%)",
            "Updates",
            "Emulated time (s)",
        ]

        def reached(r: pd.Series, key: str, fmt: str) -> str:
            # X: never reached; -: reached, but the records lack the column (older ones)
            return _num(r[key], fmt, "-" if math.isfinite(r["time_to_target_s"]) else "X")

        rows = [
            [
                _method(r, n),
                str(r["mode"]),
                reached(r, "updates_to_target", ".0f"),
                _num(r["time_to_target_s"], ".1f", "X"),
                reached(r, "energy_to_target_j", ",.0f"),
                reached(r, "mib_to_target", ".1f"),
                _num(100 * r["final_acc"], ".2f"),
                _num(r["updates"], ".0f"),
                _num(r["elapsed_s"], ".1f"),
            ]
            for _, r in t.iterrows()
        ]
        return (
            title
            + _md(header, rows)
            + f"\n\nUntil the first evaluated round (or server version) with mean user "
            f"accuracy at or above {g} (given with --target, else the highest whole point "
            "every run's final accuracy reaches): the updates aggregated, the emulated "
            "seconds, the clients' joules (every selected client of a round; every update "
            "that reached the server, of an asynchronous run: trainings under way then are "
            "not counted) and the MiB sent and received; X: never reached (-: not in the "
            "records). Final acc: the "
            f"mean over the last {self.window} evaluated rounds or versions."
        )


def build_tables(
    runs: Sequence[RunRecords],
    target: float | None = None,
    tolerance: float = convergence.TOLERANCE,
    window: int = convergence.WINDOW_ROUNDS,
) -> Tables:
    if not runs:
        raise ReportError("no runs given")
    notes = [
        note if len(runs) == 1 else f"{r.label}: {note}"
        for r in runs
        for note in r.extra.get("notes", [])
    ]
    # the papers' per-round tables are of synchronous rounds; an asynchronous run's rows
    # are server versions (docs/async.md), shown in the accuracy tables only
    rounds = [r for r in runs if not r.is_async]
    common = target if target is not None else _common_target(_final_accuracies(runs, window))
    return Tables(
        kapc_time_table(rounds),
        kapc_cost_table(rounds),
        mtfl_time_table(rounds),
        dcpfl_table(rounds, tolerance, window, common),
        accuracy_table(runs, target),
        target,
        tolerance,
        window,
        notes,
        time_to_accuracy_table(runs, common, window),
        [r.label for r in runs if r.is_async],
    )
