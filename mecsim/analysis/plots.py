"""PNG figures of one or more runs (matplotlib; the papers' convergence and cost figures).

:func:`write_plots` draws, for any number of runs (overlaid, one colour per run):

- ``accuracy_vs_round.png``: mean user accuracy per evaluated round, with the min-max
  band over clients (the papers' convergence curves);
- ``accuracy_vs_time.png``: the same against emulated seconds elapsed, on a log time
  axis when the runs' total times differ by more than 10x;
- ``time_split.png``: stacked emulated time per round by phase (download, client,
  upload, backhaul, server, idle), one panel per run, all panels on one y scale;
- ``bytes_per_round.png``: MiB (2**20 bytes) sent up (solid) and down (dashed) per round;
- ``energy_per_round.png``: joules of the selected clients per round, stacked by part
  (compute, radio, idle, sleep), one panel per run on one y scale (skipped when no run has
  energy figures);
- ``client_accuracy.png``: the distribution of per-client accuracy in each run's last
  evaluated round (box plot with every client as a dot).

Rounds are counted from 1 (the records' round index + 1) and round axes have integer
ticks. With many series the legend goes outside the axes, to the right of the data.

:class:`PlotWriter` is a run observer that writes them to ``<run dir>/plots/`` when the
run ends, and, for a run with a ``geometry:`` section, ``map.png``: the cells, the
clients' trajectories, their association per round and the handovers
(:mod:`mecsim.analysis.maps`, drawn from the run's ``clients.csv``). Figures are drawn
on the Agg canvas without pyplot, so no GUI and no global state are involved.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mecsim.analysis.maps import MAP_NAME, write_map
from mecsim.analysis.tables import RunRecords, evaluated, from_rows, label_runs
from mecsim.run.observers import RunInfo, RunObserver

MiB = 1024 * 1024
PLOT_NAMES = (
    "accuracy_vs_round.png",
    "accuracy_vs_time.png",
    "time_split.png",
    "bytes_per_round.png",
    "energy_per_round.png",
    "client_accuracy.png",
)
_PHASES = (
    ("download", "dl_time_s"),
    ("client", "client_time_s"),
    ("upload", "ul_time_s"),
    ("backhaul", "backhaul_time_s"),
    ("server", "server_time_s"),
    ("idle", "idle_time_s"),
)
_ENERGY_PARTS = (
    ("compute", "energy_compute_j"),
    ("radio", "energy_radio_j"),
    ("idle", "energy_idle_j"),
    ("sleep", "energy_sleep_j"),
)
#: More legend entries than this go outside the axes (right of the data).
LEGEND_INSIDE_MAX = 6
#: A time axis is logarithmic when the runs' total emulated times differ by more than this.
LOG_TIME_RATIO = 10.0


def round_numbers(df) -> np.ndarray:
    """Rounds as a person reads them: counted from 1 (the records' ``round`` index + 1)."""
    return df["round"].to_numpy() + 1


def log_time_axis(runs: Sequence[RunRecords]) -> bool:
    """Do the runs' total emulated times differ by more than :data:`LOG_TIME_RATIO`?"""
    totals = [float(r.rounds["elapsed_s"].max()) for r in runs if not evaluated(r).empty]
    totals = [t for t in totals if t > 0 and np.isfinite(t)]
    return len(totals) > 1 and max(totals) / min(totals) > LOG_TIME_RATIO


def _legend(ax, fig: Figure) -> None:
    """Inside the axes for a few entries; outside, right of the data, for many."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if len(handles) > LEGEND_INSIDE_MAX:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    else:
        ax.legend(handles, labels, fontsize="small")


def _figure(width: float = 7.0, height: float = 4.2) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Write the PNG to a temporary name and rename it: a killed run leaves no half file.
    The name is this process's own, so two processes drawing the same figure (a restarted
    service while a killed one's plot child still draws) each rename a whole file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def _colors(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "viridis"]
    return [cmap(i if n <= 10 else i / max(1, n - 1)) for i in range(n)]


def accuracy_figure(runs: Sequence[RunRecords], x: str, target: float | None = None) -> Figure:
    """Mean user accuracy against rounds (``x='round'``) or emulated time (``'time'``)."""
    fig = _figure(9.0 if len(runs) > LEGEND_INSIDE_MAX else 7.0)
    ax = fig.add_subplot()
    for r, color in zip(runs, _colors(len(runs)), strict=True):
        ev = evaluated(r)
        if ev.empty:
            continue
        xs = round_numbers(ev) if x == "round" else ev["elapsed_s"].to_numpy()
        ax.plot(
            xs,
            100 * ev["mean_accuracy"].to_numpy(),
            marker="o",
            markersize=3,
            color=color,
            label=r.label,
        )
        if "min_accuracy" in ev and "max_accuracy" in ev:
            ax.fill_between(
                xs,
                100 * ev["min_accuracy"].to_numpy(),
                100 * ev["max_accuracy"].to_numpy(),
                color=color,
                alpha=0.15,
                linewidth=0,
            )
    if target is not None:
        ax.axhline(100 * target, color="grey", linestyle=":", label=f"target {100 * target:g} %")
    if x == "round":
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(left=0.5)  # rounds start at 1: no tick at 0
    elif log_time_axis(runs):
        ax.set_xscale("log")
        ax.set_xlabel("emulated time elapsed, log scale: the runs differ by > 10x (s)")
    else:
        ax.set_xlabel("emulated time elapsed (s)")
        ax.set_xlim(left=0)
    ax.set_ylabel("user accuracy (%)")
    ax.set_title("Mean user accuracy (band: min-max over clients)")
    ax.grid(alpha=0.3)
    _legend(ax, fig)
    return fig


def time_split_figure(runs: Sequence[RunRecords]) -> Figure:
    """Stacked seconds per round by phase, one panel per run, one y scale."""
    phases = [
        (name, col)
        for name, col in _PHASES
        if any(col in r.rounds and (r.rounds[col].fillna(0) > 0).any() for r in runs)
    ]
    fig = _figure(7.0, max(3.0, 2.6 * len(runs)))
    # one y scale for every panel, so the runs' round times compare at a glance
    axes = fig.subplots(len(runs), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    colors = dict(zip([n for n, _ in _PHASES], _colors(len(_PHASES)), strict=True))
    for ax, r in zip(axes, runs, strict=True):
        rounds = round_numbers(r.rounds)
        bottom = np.zeros(len(rounds))
        for name, col in phases:
            values = (
                r.rounds[col].fillna(0).to_numpy(dtype=float)
                if col in r.rounds
                else np.zeros(len(rounds))
            )
            ax.bar(rounds, values, bottom=bottom, color=colors[name], label=name, width=0.8)
            bottom += values
        ax.set_ylabel("emulated time (s)")
        mean_s = float(np.nansum(bottom) / max(len(rounds), 1))
        ax.set_title(f"{r.label}: {mean_s:.4g} s a round on average", fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="outside lower center", fontsize="small", ncols=max(1, len(phases))
    )
    axes[-1].set_xlabel("round")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlim(left=0.5)  # rounds start at 1: no tick at 0
    fig.suptitle("Time per round by phase (critical path)")
    return fig


def energy_figure(runs: Sequence[RunRecords]) -> Figure | None:
    """Stacked joules per round by part, one panel per run, one y scale; None when no run
    recorded energy (older records, or device profiles without power figures)."""

    def has_energy(r: RunRecords) -> bool:
        return "energy_j" in r.rounds and bool(r.rounds["energy_j"].notna().any())

    if not any(has_energy(r) for r in runs):
        return None
    fig = _figure(7.0, max(3.0, 2.6 * len(runs)))
    axes = fig.subplots(len(runs), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    colors = dict(
        zip(
            [n for n, _ in _ENERGY_PARTS],
            ("tab:red", "tab:purple", "tab:gray", "tab:cyan"),
            strict=True,
        )
    )
    for ax, r in zip(axes, runs, strict=True):
        rounds = round_numbers(r.rounds)
        bottom = np.zeros(len(rounds))
        for name, col in _ENERGY_PARTS:
            values = (
                r.rounds[col].to_numpy(dtype=float)
                if col in r.rounds
                else np.full(len(rounds), np.nan)
            )
            ax.bar(
                rounds,
                np.nan_to_num(values),
                bottom=bottom,
                color=colors[name],
                label=name,
                width=0.8,
            )
            bottom += np.nan_to_num(values)
        if not has_energy(r):
            ax.text(
                0.5,
                0.5,
                "no energy figures (device profiles without power)",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize="small",
            )
        ax.set_ylabel("client energy per round (J)")
        mean_j = float(np.sum(bottom) / max(len(rounds), 1))
        ax.set_title(
            f"{r.label}: {mean_j:.4g} J a round on average" if has_energy(r) else r.label,
            fontsize="medium",
        )
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="outside lower center", fontsize="small", ncols=len(_ENERGY_PARTS)
    )
    axes[-1].set_xlabel("round")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlim(left=0.5)  # rounds start at 1: no tick at 0
    fig.suptitle("Client energy per round (all selected clients)")
    return fig


def bytes_figure(runs: Sequence[RunRecords]) -> Figure:
    fig = _figure(9.0 if 2 * len(runs) > LEGEND_INSIDE_MAX else 7.0)
    ax = fig.add_subplot()
    for r, color in zip(runs, _colors(len(runs)), strict=True):
        rounds = round_numbers(r.rounds)
        ax.plot(
            rounds,
            r.rounds["bytes_up"].to_numpy(dtype=float) / MiB,
            color=color,
            marker="^",
            markersize=4,
            label=f"{r.label} up",
        )
        ax.plot(
            rounds,
            r.rounds["bytes_down"].to_numpy(dtype=float) / MiB,
            color=color,
            marker="v",
            markersize=4,
            linestyle="--",
            label=f"{r.label} down",
        )
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(left=0.5)  # rounds start at 1: no tick at 0
    ax.set_ylabel("sent per round, all selected clients (MiB)")
    ax.set_title("Bytes per round")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, fig)
    return fig


def last_client_accuracies(r: RunRecords) -> tuple[int | None, np.ndarray]:
    """(round index, per-client accuracies) of the run's last evaluated round."""
    c = r.clients
    if c is None or "accuracy" not in c or c["accuracy"].notna().sum() == 0:
        return None, np.array([])
    c = c[c["accuracy"].notna()]
    last = int(c["round"].max())
    return last, c.loc[c["round"] == last, "accuracy"].to_numpy(dtype=float)


def _client_accuracy(runs: Sequence[RunRecords], path: Path) -> Path | None:
    data = [
        (r, rnd, acc)
        for r in runs
        for rnd, acc in [last_client_accuracies(r)]
        if rnd is not None and acc.size
    ]
    if not data:
        return None
    fig = _figure(max(5.0, 1.6 * len(data) + 2), 4.2)
    ax = fig.add_subplot()
    ax.boxplot([100 * acc for _, _, acc in data], widths=0.5, showfliers=False)
    rng = np.random.default_rng(0)  # jitter only; fixed so the figure is reproducible
    for i, (_, _, acc) in enumerate(data, start=1):
        ax.scatter(
            i + rng.uniform(-0.15, 0.15, acc.size),
            100 * acc,
            s=10,
            alpha=0.6,
            color="tab:blue",
            zorder=3,
        )
    ax.set_xticks(
        range(1, len(data) + 1),
        [f"{r.label}\nround {rnd + 1}, {acc.size} clients" for r, rnd, acc in data],
        fontsize="small",
    )
    ax.set_ylabel("user accuracy (%)")
    ax.set_title("Per-client accuracy, last evaluated round")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def write_plots(
    runs: Sequence[RunRecords], out_dir: str | Path, target: float | None = None
) -> list[Path]:
    """Write the figures for ``runs`` into ``out_dir``; returns the files written.

    ``energy_per_round.png`` is skipped when no run has energy figures,
    ``client_accuracy.png`` when no run has per-client accuracies and ``time_split.png``
    when every run is asynchronous (it shows synchronous runs only).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        _save(accuracy_figure(runs, "round", target), out / "accuracy_vs_round.png"),
        _save(accuracy_figure(runs, "time", target), out / "accuracy_vs_time.png"),
        _save(bytes_figure(runs), out / "bytes_per_round.png"),
    ]
    # stacked phases of synchronous rounds: an asynchronous run's versions overlap
    rounds = [r for r in runs if not r.is_async]
    if rounds:
        written.insert(2, _save(time_split_figure(rounds), out / "time_split.png"))
    energy = energy_figure(runs)
    if energy is not None:
        written.append(_save(energy, out / "energy_per_round.png"))
    dist = _client_accuracy(runs, out / "client_accuracy.png")
    if dist is not None:
        written.append(dist)
    return written


class PlotWriter(RunObserver):
    """Writes the figures of a run to ``out_dir`` (``<run dir>/plots``) when it ends.

    Keeps the client rows of the latest evaluated round only (the distribution plot's
    data), so memory does not grow with rounds x clients.
    """

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self._last_eval: list[dict[str, Any]] = []
        self.written: list[Path] = []

    def on_round_end(self, info, round_row, client_rows, traces) -> None:
        rows = [c for c in client_rows if c.get("accuracy") is not None]
        if rows:
            self._last_eval = rows

    def on_run_resume(self, info: RunInfo | None, rounds: list[dict[str, Any]]) -> None:
        """The last evaluated round's client rows, from the records of the rounds done."""
        import pandas as pd

        path = self.out_dir.parent / "clients.csv"
        if not path.exists():
            return
        df = pd.read_csv(path)
        if "accuracy" in df.columns:
            evaluated = df[df["accuracy"].notna()]
            if len(evaluated):
                last = evaluated[evaluated["round"] == evaluated["round"].max()]
                self._last_eval = last.to_dict("records")

    def on_run_stopped(
        self, info: RunInfo, rounds: list[dict[str, Any]], status: str, message: str
    ) -> None:
        self.on_run_end(info, rounds)

    def on_run_end(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        if not rounds:
            return
        try:
            r = from_rows(
                info.run_id,
                rounds,
                self._last_eval,
                path=self.out_dir,
                planned_rounds=info.scenario.rounds,
            )
            label_runs([r])
            self.written = write_plots([r], self.out_dir)
        except Exception as exc:  # noqa: BLE001 - the records are written; say why, go on
            print(
                f"mecsim: plots not written to {self.out_dir}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
        if info.scenario.geometry is None:
            return
        try:  # the rows of every round are in clients.csv (written as each round ended)
            path = write_map(
                self.out_dir.parent, self.out_dir / MAP_NAME, info.scenario, info.run_id
            )
            if path is not None:
                self.written.append(path)
        except Exception as exc:  # noqa: BLE001 - as above
            print(
                f"mecsim: {MAP_NAME} not written to {self.out_dir}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
