"""The timing engine: play one round's op-traces through a model of the network.

"Execute, then time": the clients of a round have already run for real and returned
op-traces (:mod:`mecsim.emulation.ops`). :func:`time_round` replays them in emulated time
through dedicated links, shared media (processor sharing; water-filling of the medium's
time when a flow is capped below its link rate), device CPUs and edge-server
CPUs, and returns per-client timelines and the round's critical-path breakdown. It is a
pure function: no torch, no Ray, no wall clock.

- :mod:`.specs`: what the engine is given and what it returns;
- :mod:`.simpy_model`: the reference model, SimPy processes;
- :mod:`.sharing`: a shared medium with capped flows (max-min fair shares of its time);
- :mod:`.closed_form`: a numpy closed form when nothing is shared;
- :mod:`.media`: each shared resource solved for all its flows at once, when clients
  visit resources in one order;
- :mod:`.events`: event by event without SimPy, for everything else;
- :mod:`.dispatch`: :func:`time_round`, which takes the first of those that covers the
  round (docs/engine.md has the details and the speeds), and :func:`time_round_columns`,
  the closed form on columns (a round's traces planned once, its clients as arrays) for
  replays.

Units: seconds (``_s``), bits per second (``_bps``), FLOPs and FLOP/s (``flops_per_s``).
"""

from mecsim.emulation.engine.closed_form import ClientColumns, TracePlan, plan_traces
from mecsim.emulation.engine.dispatch import (
    METHODS,
    SolvedRound,
    engine_path,
    solve_round,
    time_round,
    time_round_columns,
)
from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    Rate,
    RateSchedule,
    RoundColumns,
    RoundTiming,
    ServerSpec,
    TimeVaryingRate,
)

__all__ = [
    "METHODS",
    "ClientColumns",
    "ClientSpec",
    "ClientTimeline",
    "NetworkSpec",
    "Rate",
    "RateSchedule",
    "TimeVaryingRate",
    "RoundColumns",
    "RoundTiming",
    "ServerSpec",
    "SolvedRound",
    "TracePlan",
    "engine_path",
    "plan_traces",
    "solve_round",
    "time_round",
    "time_round_columns",
]
