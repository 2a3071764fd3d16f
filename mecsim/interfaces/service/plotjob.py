"""A finished run's figures, drawn in a child process of the service.

``mecsim run`` draws its figures in the run's own process when it ends
(:class:`mecsim.analysis.plots.PlotWriter`). In ``mecsim serve`` that process is also the API's:
matplotlib holds the GIL for about a second per run, and status polls and scrapes
answered meanwhile waited 60-160 ms (measured with ``benchmarks/speed/service.py``: 50
pollers, p50 62 ms, p99 156 ms). :class:`ChildPlotWriter` draws the same figures from
the run's records folder in a child process instead, so the API stays responsive:

    python -m mecsim.interfaces.service.plotjob RUN_DIR PLANNED_ROUNDS [PARENT_PID]

On Linux the child dies with the process that started it (a service killed outright
leaves no child drawing into a run folder the restarted service draws into again).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mecsim.analysis.maps import write_map
from mecsim.analysis.plots import PlotWriter, label_runs, write_plots
from mecsim.analysis.tables import from_rows
from mecsim.run.interrupts import die_with_parent  # the plot job dies with the server

#: A child that takes longer than this is killed and the run goes on without figures.
PLOT_TIMEOUT_S = 600.0


def plot_run_folder(run_dir: str | Path, planned_rounds: int | None) -> list[Path]:
    """Draw the figures of the run in ``run_dir`` (its ``rounds.csv`` and ``clients.csv``;
    the map of a run with a geometry) into ``run_dir/plots``, as :class:`PlotWriter` does
    at a run's end."""
    import pandas as pd

    run_dir = Path(run_dir)
    # rounds.csv read directly: mecsim.store.records would import torch (its checkpoint writer)
    rounds = pd.read_csv(run_dir / "rounds.csv").to_dict("records")
    writer = PlotWriter(run_dir / "plots")
    writer.on_run_resume(None, rounds)  # the last evaluated round's client rows
    r = from_rows(
        run_dir.name, rounds, writer._last_eval, path=writer.out_dir, planned_rounds=planned_rounds
    )
    label_runs([r])
    written = write_plots([r], writer.out_dir)
    # a run with a geometry: its map (the scenario from scenario.yaml); others: none
    if (run_map := write_map(run_dir)) is not None:
        written.append(run_map)
    return written


class ChildPlotWriter(PlotWriter):
    """:class:`PlotWriter` whose drawing runs in a child process (see the module)."""

    def on_round_end(self, info, round_row, client_rows, traces) -> None:
        pass  # the child reads the client rows back from clients.csv

    def on_run_resume(self, info, rounds: list[dict[str, Any]]) -> None:
        pass

    def on_run_end(self, info, rounds: list[dict[str, Any]]) -> None:
        if rounds:
            self.written = draw_in_child(self.out_dir.parent, info.scenario.rounds)


def draw_in_child(run_dir: Path, planned_rounds: int) -> list[Path]:
    """:func:`plot_run_folder` in a child process; the figures written (none, with the
    reason on stderr, when the child fails or takes over ``PLOT_TIMEOUT_S``)."""
    out_dir = Path(run_dir) / "plots"
    cmd = [
        sys.executable,
        "-m",
        "mecsim.interfaces.service.plotjob",
        str(run_dir),
        str(planned_rounds),
        str(os.getpid()),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PLOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(
            f"mecsim: plots not written to {out_dir}: drawing took over {PLOT_TIMEOUT_S:g} s",
            file=sys.stderr,
        )
        return []
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        print(f"mecsim: plots not written to {out_dir}: {last}", file=sys.stderr)
        return []
    return [Path(p) for p in done.stdout.split("\n") if p]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run_dir, planned = args[0], int(args[1])
    if len(args) > 2:
        die_with_parent(int(args[2]))
    for path in plot_run_folder(run_dir, planned):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
