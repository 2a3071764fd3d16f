"""The progress bar over a run's rounds (an observer of the run loop)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from mecsim.run.observers import RunInfo, RunObserver


class ProgressBar(RunObserver):
    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task: TaskID | None = None

    def on_run_start(self, info: RunInfo) -> None:
        self.progress.start()
        self.task = self.progress.add_task(
            f"{escape(info.scenario.algorithm.name)} rounds",  # the column renders markup
            total=info.scenario.rounds,
            status="",
            completed=info.resumed_from,
        )

    def _warn(self, text: str) -> None:
        # on stderr, literally (no rich markup); the live bar shows it above itself
        print(f"warning: {text}", file=sys.stderr)

    def on_round_end(self, info, row: dict[str, Any], client_rows, traces) -> None:
        rejected = int(row.get("rejected", 0) or 0)
        if rejected:
            ids = [c["client_id"] for c in client_rows if c.get("status") == "rejected_nonfinite"]
            text = (
                f"round {int(row['round']) + 1}: {rejected} update(s) with NaN or inf "
                f"rejected (clients {', '.join(map(str, ids))})"
            )
            if int(row.get("completed", 0) or 0) == 0:
                text += "; no update was aggregated, the model is unchanged"
            self._warn(text)
        acc = row["mean_accuracy"]
        acc_txt = f"acc {100 * acc:5.2f}%" if acc == acc else "acc   -   "
        if self.task is None:  # a round before the run started: nothing to advance
            return
        self.progress.update(
            self.task,
            advance=1,
            status=f"{acc_txt}  round {row['round_time_s']:.2f} s emulated, "
            f"{row['host_wall_s']:.2f} s host",
        )

    def on_fault(self, info, rnd: int, message: str) -> None:
        self._warn(
            f"round {rnd + 1}: an actor died ({message}); re-creating the actors "
            "from the last checkpoint"
        )

    def on_run_end(self, info, rounds) -> None:
        self.progress.stop()

    def on_run_stopped(self, info, rounds, status, message) -> None:
        self.progress.stop()

    def close(self) -> None:
        self.progress.stop()
