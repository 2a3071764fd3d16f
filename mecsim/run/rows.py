"""The rows a round leaves in the records: the one list of round columns, the one of
client columns, and the part of a round row its timing decides.

The run loop (:mod:`mecsim.run.round`) fills every column; a replay
(:mod:`mecsim.analysis.replay`) re-computes :data:`REPLAY_COLUMNS` (the same names, a
subset) with the same :func:`timing_columns`. A new timing column is one entry of
:data:`TIMING`; a new round column one name in :data:`ROUND_COLUMNS` (and the value the
round computes for it). The columns that measure the machine running the emulation rather
than the emulated testbed are told by :func:`is_host_column`.
"""

from __future__ import annotations

from mecsim.channel.wireless import RECORD_KEYS
from mecsim.emulation.energy import ENERGY_KEYS
from mecsim.emulation.engine import RoundTiming
from mecsim.emulation.network import TRANSPORT_KEYS

#: Round columns of the critical-path breakdown (emulated seconds), each an attribute of
#: :class:`~mecsim.emulation.engine.RoundTiming`.
TIMING = {
    "round_time_s": "round_time_s",
    "dl_time_s": "download_s",
    "client_time_s": "client_s",
    "ul_time_s": "upload_s",
    "server_time_s": "server_s",
    "backhaul_time_s": "backhaul_s",
    "idle_time_s": "idle_s",
}

ROUND_COLUMNS = [
    "run_id",
    "round",
    "algorithm",
    "selected",
    "completed",
    "dropped",
    "dropped_deadline",
    "crashed",
    "dropped_out",
    "outage",
    "rejected",
    "faults",
    *TIMING,
    "elapsed_s",
    "bytes_up",
    "bytes_down",
    # joules, summed over the round's selected clients (mecsim.emulation.energy)
    *ENERGY_KEYS,
    "client_gflops",
    "server_gflops",
    "server_rss_mb",
    "client_peak_mb",
    "mean_accuracy",
    "min_accuracy",
    "max_accuracy",
    "mean_test_loss",
    "train_loss",
    "host_wall_s",
    "host_train_wall_s",
    "host_aggregate_s",
]
#: What a replay re-computes of a round (the timing, and what it is counted from), and
#: the recorded accuracy beside it.
REPLAY_COLUMNS = [
    c
    for c in ROUND_COLUMNS
    if c
    in (
        "round",
        "selected",
        "completed",
        "dropped",
        *TIMING,
        "elapsed_s",
        "bytes_up",
        "bytes_down",
        *ENERGY_KEYS,
        "mean_accuracy",
    )
]
#: clients.csv's channel columns: the channel's draws (mecsim.channel.wireless), then the
#: latency drawn for the client-round and the goodput the loss rate leaves of the link rate
#: (mecsim.emulation.network.TRANSPORT_KEYS)
CHANNEL_COLUMNS = [*RECORD_KEYS, *TRANSPORT_KEYS]
CLIENT_COLUMNS = [
    "run_id",
    "round",
    "client_id",
    "device",
    "edge_server",
    "selected",
    "status",
    "completed",
    "start_s",
    "finish_s",
    "download_s",
    "compute_s",
    "upload_s",
    "server_compute_s",
    "bytes_up",
    "bytes_down",
    "gflops",
    "steps",
    "num_samples",
    "train_loss",
    "peak_memory_mb",
    "host_train_s",
    "accuracy",
    "test_loss",
    *ENERGY_KEYS,
    *CHANNEL_COLUMNS,
]


#: The host-measured columns without ``host`` among their words: the server process's
#: resident memory (the others are ``host_wall_s``, ``host_train_s``, ...).
HOST_MEASURED = ("server_rss_mb",)


def is_host_column(name: str) -> bool:
    """Whether column ``name`` measures the machine running the emulation (wall seconds,
    resident memory) rather than the emulated testbed: :data:`HOST_MEASURED` and any
    column with ``host`` among its ``_``-separated words (``host_wall_s``, an algorithm's
    ``kapc_plan_host_s``). Such a column differs from run to run of the same scenario, so
    comparisons of records leave it out."""
    return name in HOST_MEASURED or "host" in name.split("_")


def timing_columns(timing: RoundTiming, elapsed_before_s: float) -> dict[str, float]:
    """The round row's :data:`TIMING` columns and ``elapsed_s``, the emulated time since
    the run started once this round has ended."""
    row = {column: getattr(timing, attr) for column, attr in TIMING.items()}
    row["elapsed_s"] = elapsed_before_s + timing.round_time_s
    return row
