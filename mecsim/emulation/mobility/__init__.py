"""Clients that move: positions as a function of emulated time (docs/mobility-models.md).

- :mod:`.area`: the rectangle clients move in and its border rule (reflection);
- :mod:`.trajectory`: positions on a time grid, float32 ``(n, T, 2)``, and
  ``position_at(t)`` (linear between grid points, held after the end);
- :mod:`.models`: static, random waypoint, Gauss–Markov, random walk (vectorised over
  clients, seeded from the mobility stream of the scenario seed);
- :mod:`.traces`: SUMO FCD, ns-2, the ONE and BonnMotion traces, refused with file and
  line when bad;
- :mod:`.build`: a :class:`~mecsim.scenario.mobility.MobilityConfig` into positions.
"""

from mecsim.emulation.mobility.area import Area
from mecsim.emulation.mobility.build import build_model, build_trajectory, check_trace
from mecsim.emulation.mobility.models import (
    MOBILITY_STREAM,
    GaussMarkov,
    MobilityModel,
    RandomWalk,
    RandomWaypoint,
    Static,
    mobility_rng,
    trajectory,
)
from mecsim.emulation.mobility.traces import (
    DEFAULT_MAX_BYTES,
    FORMATS,
    NodeTrack,
    Trace,
    TraceError,
    TraceWarning,
    load_trace,
)
from mecsim.emulation.mobility.trajectory import Trajectory, grid_points

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMATS",
    "MOBILITY_STREAM",
    "Area",
    "GaussMarkov",
    "MobilityModel",
    "NodeTrack",
    "RandomWalk",
    "RandomWaypoint",
    "Static",
    "Trace",
    "TraceError",
    "TraceWarning",
    "Trajectory",
    "build_model",
    "build_trajectory",
    "check_trace",
    "grid_points",
    "load_trace",
    "mobility_rng",
    "trajectory",
]
