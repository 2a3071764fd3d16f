"""A run folder for notebooks and scripts: :class:`Run` (what :func:`mecsim.load_run`
and :func:`mecsim.simulate` return).

    run = mecsim.load_run("runs/fedavg-mnist-10")
    run.rounds            # rounds.csv as a pandas DataFrame
    run.clients           # clients.csv (one row per client-round)
    run.tables().accuracy # the summary tables (as `mecsim report`), DataFrames
    run.plot("accuracy")  # a matplotlib Figure

Everything is read from the folder on first use, so a Run of a folder another process
is still writing shows what was there when it was first asked.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from mecsim.analysis import maps, plots
from mecsim.analysis.tables import ReportError, RunRecords, Tables, build_tables
from mecsim.analysis.tables import load_run as load_records
from mecsim.scenario import Scenario, ScenarioError, load_recorded_scenario
from mecsim.store.reader import read_meta
from mecsim.store.session import Outcome

#: what :meth:`Run.plot` draws, by name
FIGURES = ("accuracy", "accuracy_vs_time", "time_split", "bytes", "energy", "map")


class Run:
    """The records of one run folder (``runs/<run id>/``)."""

    def __init__(self, path: str | Path, outcome: Outcome | None = None) -> None:
        self.path = Path(path)
        if not (self.path / "rounds.csv").is_file() and not (self.path / "run.json").is_file():
            raise ReportError(f"{self.path}: not a run folder (no rounds.csv or run.json)")
        self._outcome = outcome  # how simulate's run ended, when this Run is its result
        #: warnings the run printed (simulate's runs)
        self.warnings = list(outcome.warnings) if outcome is not None else []

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r}, rounds={self.rounds_done})"

    # -- what the folder says

    @cached_property
    def meta(self) -> dict[str, Any]:
        """``run.json``: status, model size, hosts, plugins, ..."""
        return read_meta(self.path) or {}

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.path.name)

    @property
    def run_dir(self) -> Path:
        """The folder (the name :class:`~mecsim.store.session.Outcome` used)."""
        return self.path

    @property
    def status(self) -> str:
        """running, finished, interrupted, cancelled or failed (``run.json``)."""
        if self._outcome is not None:
            return self._outcome.status
        return str(self.meta.get("status", "unknown"))

    @property
    def rounds_done(self) -> int:
        return int(self.meta.get("rounds_done", len(self.rounds)))

    @cached_property
    def scenario(self) -> Scenario:
        """The resolved scenario (``scenario.yaml``, every default filled in)."""
        if self._outcome is not None:
            return self._outcome.scenario
        try:
            return load_recorded_scenario(self.path / "scenario.yaml")
        except ScenarioError as exc:
            raise ReportError(str(exc)) from None

    @cached_property
    def records(self) -> RunRecords:
        return load_records(self.path)

    @property
    def rounds(self) -> pd.DataFrame:
        """``rounds.csv``: one row per round (columns: docs/reports.md)."""
        return self.records.rounds

    @property
    def clients(self) -> pd.DataFrame:
        """``clients.csv``: one row per client-round (empty if the run wrote none)."""
        return self.records.clients if self.records.clients is not None else pd.DataFrame()

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The round rows as dicts (as :class:`~mecsim.store.session.Outcome` had them)."""
        if self._outcome is not None:
            return self._outcome.rows
        return list(self.rounds.to_dict("records"))

    @property
    def plugins(self) -> list[dict[str, Any]]:
        """What the run used that is not mecsim's own (``run.json``'s ``plugins``)."""
        return list(self.meta.get("plugins", []))

    def tables(self, target: float | None = None) -> Tables:
        """The summary tables of ``mecsim report`` (KAPC Tables 5-6 shaped, MTFL, DC-PFL,
        accuracy) as DataFrames; ``.markdown()`` renders them."""
        return build_tables([self.records], target)

    def plot(self, what: str = "accuracy", target: float | None = None) -> Any:
        """A matplotlib Figure: one of :data:`FIGURES` (accuracy per round, accuracy per
        emulated second, the time split, bytes, energy, the map of a run with a
        geometry)."""
        runs = [self.records]
        if what == "accuracy":
            return plots.accuracy_figure(runs, "round", target)
        if what == "accuracy_vs_time":
            return plots.accuracy_figure(runs, "time", target)
        if what == "time_split":
            return plots.time_split_figure(runs)
        if what == "bytes":
            return plots.bytes_figure(runs)
        if what == "energy":
            fig = plots.energy_figure(runs)
            if fig is None:
                raise ReportError(f"{self.path}: no energy figures recorded")
            return fig
        if what == "map":
            fig = maps.run_map_figure(self.scenario, self.clients, self.run_id)
            if fig is None:
                raise ReportError(f"{self.path}: no map: the run has no geometry section")
            return fig
        raise ValueError(f"unknown figure {what!r}; choose one of {', '.join(FIGURES)}")


def load_run(path: str | Path) -> Run:
    """The run in folder ``path`` (:class:`Run`); ReportError if it is not one."""
    return Run(path)
