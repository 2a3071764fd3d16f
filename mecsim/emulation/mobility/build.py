"""A :class:`~mecsim.scenario.mobility.MobilityConfig` made into positions: the one call
a run needs (:func:`build_trajectory`), and the check a pre-flight needs
(:func:`check_trace`)."""

from __future__ import annotations

from pathlib import Path

import numpy.typing as npt

from mecsim.emulation.mobility.area import Area
from mecsim.emulation.mobility.models import (
    GaussMarkov,
    MobilityModel,
    RandomWalk,
    RandomWaypoint,
    Static,
    mobility_rng,
    trajectory,
)
from mecsim.emulation.mobility.traces import Trace, load_trace
from mecsim.emulation.mobility.trajectory import Trajectory
from mecsim.scenario.mobility import MobilityConfig, TraceConfig


def build_model(
    config: MobilityConfig, initial_m: npt.ArrayLike, area: Area, seed: int
) -> MobilityModel:
    """The synthetic model ``config`` names, its draws from the mobility stream of
    ``seed`` (a trace is not a model: :func:`build_trajectory` reads it)."""
    p = config.parameters()
    step = config.step_s
    if config.model == "static":
        return Static(initial_m, area, step)
    rng = mobility_rng(seed)
    if config.model == "random_waypoint":
        return RandomWaypoint(
            initial_m, area, step, rng, speed_mps=p["speed_mps"], pause_s=p["pause_s"]
        )
    if config.model == "gauss_markov":
        return GaussMarkov(initial_m, area, step, rng, **p)
    if config.model == "random_walk":
        return RandomWalk(
            initial_m, area, step, rng, speed_mps=p["speed_mps"], interval_s=p["interval_s"]
        )
    raise ValueError(f"model {config.model!r} is not a synthetic model")


def _trace_path(trace: TraceConfig, base_dir: str | Path | None) -> Path:
    path = Path(trace.path)
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path


def check_trace(
    config: MobilityConfig,
    n_clients: int,
    area: Area | None,
    base_dir: str | Path | None = None,
) -> Trace | None:
    """Read and check the trace of ``config`` (None for the synthetic models): the file,
    its lines, and its nodes against the clients. Refuses with file and line. Only the
    samples of the nodes the clients follow are kept (the first ``n_clients``, or those
    of ``trace.node_map``): memory stays bounded by what the scenario uses."""
    if config.model != "trace":
        return None
    assert config.trace is not None  # the config's validator requires it
    node_map = config.trace.node_map
    trace = load_trace(
        _trace_path(config.trace, base_dir),
        config.trace.format,
        area=area,
        max_bytes=config.trace.max_bytes,
        keep=n_clients if node_map is None else frozenset(node_map),
    )
    trace.assign(n_clients, config.trace.node_map)
    return trace


def build_trajectory(
    config: MobilityConfig,
    initial_m: npt.ArrayLike,
    area: Area,
    seed: int,
    horizon_s: float,
    *,
    base_dir: str | Path | None = None,
) -> Trajectory:
    """Every client's positions over ``[0, horizon_s]`` on the grid of ``config.step_s``
    (float32 ``(n, T, 2)``). A trace gives the positions itself (``initial_m`` only
    says how many clients there are)."""
    if config.model == "trace":
        assert config.trace is not None
        n_clients = len(initial_m)  # type: ignore[arg-type]
        trace = check_trace(config, n_clients, area, base_dir)
        assert trace is not None
        return trace.trajectory(
            n_clients,
            config.step_s,
            horizon_s,
            node_map=config.trace.node_map,
            start_s=config.trace.start_s,
            after_end=config.trace.after_end,
        )
    return trajectory(build_model(config, initial_m, area, seed), horizon_s)
