"""mecsim's public API: what a plugin, a notebook or a script may rely on.

Everything here keeps its name and meaning within a major :data:`VERSION`; modules not
re-exported here may change between releases. docs/extending.md is the reference.

Algorithms (a plugin's ``mecsim.algorithms`` entry is a ``(server class, client class)``
pair, or a server class with a ``Client`` attribute)::

    from mecsim.api import ClientAlgorithm, ServerAlgorithm, ...

    class MyServer(ServerAlgorithm):           # aggregate_fit is the one abstract method
        ...
    class MyClient(ClientAlgorithm):           # fit is the one abstract method
        ...

Runs from Python::

    run = mecsim.api.simulate("scenarios/fedavg-mnist-10.yaml", out="runs", rounds=5)
    run.rounds                 # a pandas DataFrame of rounds.csv
    run = mecsim.api.load_run("runs/fedavg-mnist-10-...")

:func:`simulate` is the same code path as ``mecsim run``
(:func:`mecsim.store.session.run_in_folder`: the pre-flight, the run folder, records,
checkpoints), with a progress bar on stderr that ``progress=False`` turns off and the
figures ``plots=False`` leaves out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from mecsim import registry as _registry
from mecsim.agents import models as _models
from mecsim.agents.algorithms import base as _base
from mecsim.agents.algorithms.asynchronous import (
    AsyncServer,
    AsyncServerParams,
    Update,
    fedbuff_weight,
    staleness_weight,
)
from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EdgeAlgorithm,
    EdgeReport,
    ServerAlgorithm,
    TrainConfig,
    all_finite,
    finite_upload,
    local_sgd,
    standard_trace,
    trained_result,
)
from mecsim.agents.algorithms.base import NoParams as Params
from mecsim.agents.algorithms.fedavg import WeightedSum, weighted_average
from mecsim.agents.compressors import Compressor, CompressorParams
from mecsim.agents.models import ModelLayout, get_flat, model_layout, set_flat
from mecsim.agents.training import (
    StepCost,
    StepCosts,
    TrainStats,
    counted_step,
    evaluate,
    measured_step,
    model_optimizer,
    optimizer_step_flops,
    train_epochs,
    work_signature,
)
from mecsim.analysis.loaded_run import Run, load_run
from mecsim.analysis.plots import PlotWriter
from mecsim.channel.wireless import ChannelModel, ClientRadio, RoundChannel
from mecsim.data.datasets import DatasetSpec
from mecsim.emulation import ops as _ops
from mecsim.emulation.devices import DeviceProfile
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.registry import (
    PluginError,
    PluginInfo,
    UnknownName,
    load_plugin_file,
    register,
)
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

#: The public API's version: a plugin written against 1.x runs on every mecsim whose
#: ``VERSION`` starts with 1 and is at least 1.x (1.1 added the asynchronous servers:
#: :class:`AsyncServer`, :data:`ASYNC_SERVERS`).
VERSION = "1.1"

#: The registry of algorithms: ``(server class, client class)`` pairs by name (the
#: ``mecsim.algorithms`` entry points, plugin files' :func:`register` calls, import strings).
ALGORITHMS = _registry.ALGORITHMS
#: The registry of models: factories ``(in_shape, num_classes) -> torch.nn.Module`` by name
#: (the ``mecsim.models`` entry points).
MODELS = _registry.MODELS
#: The registry of data sets: :class:`DatasetSpec` (or callables returning one) by name (the
#: ``mecsim.datasets`` entry points).
DATASETS = _registry.DATASETS
#: The registry of channel models: :class:`ChannelModel` classes by name (the
#: ``mecsim.channels`` entry points).
CHANNELS = _registry.CHANNELS
#: The registry of device profiles: ``{profile name: fields}`` mappings (the
#: ``mecsim.devices`` entry points).
DEVICES = _registry.DEVICES
#: The registry of compressors: :class:`Compressor` classes by name (the
#: ``mecsim.compressors`` entry points; docs/compressors.md).
COMPRESSORS = _registry.COMPRESSORS
#: The registry of asynchronous servers: :class:`AsyncServer` classes by name (the
#: ``mecsim.async_servers`` entry points; ``aggregation.server`` of a scenario, docs/async.md).
ASYNC_SERVERS = _registry.ASYNC_SERVERS
#: Bytes of one model parameter on the air (float32).
BYTES_PER_ELEMENT = _models.BYTES_PER_ELEMENT
#: What :meth:`ClientAlgorithm.evaluate` returns: ``(accuracy, loss)``, or ``(accuracy,
#: loss, extra figures by name)``.
EvalResult = _base.EvalResult
#: A client's op-trace for one round: its :class:`Download`, :class:`Compute` and
#: :class:`Upload` operations (and the others of :mod:`mecsim.emulation.ops`), in order.
OpTrace = _ops.OpTrace

__all__ = [
    "ALGORITHMS",
    "ASYNC_SERVERS",
    "BYTES_PER_ELEMENT",
    "CHANNELS",
    "COMPRESSORS",
    "DATASETS",
    "DEVICES",
    "MODELS",
    "VERSION",
    "AggregateStats",
    "AsyncServer",
    "AsyncServerParams",
    "ChannelModel",
    "ClientRadio",
    "RoundChannel",
    "ClientAlgorithm",
    "ClientContext",
    "ClientResult",
    "ClientTask",
    "Compute",
    "Compressor",
    "CompressorParams",
    "DatasetSpec",
    "DeviceProfile",
    "Download",
    "EdgeAlgorithm",
    "EdgeReport",
    "EvalResult",
    "ModelLayout",
    "OpTrace",
    "Outcome",
    "Params",
    "PluginError",
    "PluginInfo",
    "Run",
    "ScenarioError",
    "ServerAlgorithm",
    "StepCost",
    "StepCosts",
    "TrainConfig",
    "TrainStats",
    "UnknownName",
    "Update",
    "Upload",
    "WeightedSum",
    "all_finite",
    "counted_step",
    "evaluate",
    "fedbuff_weight",
    "finite_upload",
    "get_flat",
    "load_plugin_file",
    "load_run",
    "local_sgd",
    "measured_step",
    "model_layout",
    "model_optimizer",
    "optimizer_step_flops",
    "register",
    "set_flat",
    "simulate",
    "staleness_weight",
    "standard_trace",
    "train_epochs",
    "trained_result",
    "weighted_average",
    "work_signature",
]


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
) -> Run:
    """Run ``scenario`` (a :class:`~mecsim.scenario.Scenario`, a YAML file, a mapping, or
    None: the embedded default) into ``out/<run id>/`` (``out`` defaults to the scenario's
    ``outputs.dir``; the run id to ``<name>-<timestamp>-<random>``) and return the
    :class:`Run`: its folder (``run_dir``), status, round rows, DataFrames, tables and
    figures.

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
        outcome = run_in_folder(
            sc, run_dir, observers=observers, source=source, backend=backend, hosts=hosts
        )
    finally:
        if bar is not None:
            bar.close()
    return Run(outcome.run_dir, outcome)
