"""mecsim from Python: :func:`simulate` runs a scenario as ``mecsim run`` does.

    import mecsim
    outcome = mecsim.simulate("scenarios/fedavg-mnist-10.yaml", out="runs", rounds=5,
                              training__lr=0.1)
    outcome.run_dir, outcome.status, outcome.rows

It is the same code path as the command (:func:`mecsim.store.session.run_in_folder`:
the pre-flight, the run folder, records, checkpoints), with a progress bar on stderr
that ``progress=False`` turns off and the figures ``plots=False`` leaves out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from mecsim.analysis.plots import PlotWriter
from mecsim.run.observers import RunObserver
from mecsim.run.progress import ProgressBar
from mecsim.scenario import (
    Scenario,
    ScenarioError,
    default_scenario_path,
    load_scenario,
    scenario_from_dict,
)
from mecsim.scenario.overrides import OverrideError, apply_overrides
from mecsim.store.session import Outcome, new_run_id, run_in_folder

__all__ = ["Outcome", "simulate"]


def simulate(
    scenario: Scenario | str | Path | dict[str, Any] | None = None,
    out: str | Path | None = None,
    *,
    run_id: str | None = None,
    backend: str | None = None,
    hosts: int | None = None,
    progress: bool = True,
    plots: bool = True,
    **overrides: Any,
) -> Outcome:
    """Run ``scenario`` (a :class:`~mecsim.scenario.Scenario`, a YAML file, a mapping, or
    None: the embedded default) into ``out/<run id>/`` (``out`` defaults to the scenario's
    ``outputs.dir``; the run id to ``<name>-<timestamp>-<random>``) and return how it
    ended: the run folder, its status and its round rows.

    ``overrides`` set scenario fields, a double underscore between the parts of a dotted
    path: ``rounds=5``, ``seed=1``, ``training__lr=0.1``, ``channel__uplink__bandwidth_hz=5e6``.
    ``backend`` (``ray`` or ``local``) and ``hosts`` override the execution section.

    Raises :class:`~mecsim.scenario.ScenarioError` (a field's problem, one line each) or
    :class:`~mecsim.store.session.BadRun` before anything runs;
    :class:`~mecsim.run.setup.RunFailed` or ``KeyboardInterrupt`` with the finished rounds
    kept (resumable with ``mecsim run --resume``).
    """
    if scenario is None:
        source = str(default_scenario_path())
        sc = load_scenario(source)
    elif isinstance(scenario, Scenario):
        source, sc = "scenario", scenario
    elif isinstance(scenario, dict):
        source, sc = "scenario", scenario_from_dict(scenario, "scenario")
    else:
        source, sc = str(scenario), load_scenario(scenario)
    paths = {name.replace("__", "."): value for name, value in overrides.items()}
    if out is not None:
        paths["outputs.dir"] = str(out)
    if run_id is not None:
        paths["outputs.run_id"] = run_id
    try:
        sc = apply_overrides(sc, paths, source)
    except OverrideError as exc:  # an unknown path or a value the schema refuses
        raise ScenarioError(str(exc)) from None
    observers: list[RunObserver] = []
    run_dir = Path(sc.outputs.dir) / new_run_id(sc)
    if plots:
        observers.append(PlotWriter(run_dir / "plots"))
    bar = ProgressBar(Console(stderr=True)) if progress else None
    if bar is not None:
        observers.append(bar)
    try:
        return run_in_folder(
            sc, run_dir, observers=observers, source=source, backend=backend, hosts=hosts
        )
    finally:
        if bar is not None:
            bar.close()
