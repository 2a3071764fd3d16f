"""The rows an asynchronous run leaves in its records (docs/async.md, "Records").

- ``rounds.csv``: one row per server model version. Every column of a synchronous run's
  :data:`~mecsim.run.rows.ROUND_COLUMNS` is there, read for a version: ``round`` is the
  version index (0: the first version the server made), ``selected`` the updates the
  server took since the previous version (accepted or not), ``completed`` those it
  aggregated, ``round_time_s`` the emulated seconds since the previous version,
  ``dl_time_s`` / ``client_time_s`` / ``ul_time_s`` the means over the aggregated updates,
  ``server_time_s`` the aggregation, bytes, GFLOPs and energy the sums over the updates
  taken; then :data:`ASYNC_COLUMNS`.
- ``updates.csv`` (in place of ``clients.csv``): one row per update that reached the
  server, in arrival order: :data:`UPDATE_COLUMNS`.
"""

from __future__ import annotations

from mecsim.emulation.energy import ENERGY_KEYS
from mecsim.run.rows import ROUND_COLUMNS

#: Columns a version row has beyond a round row's.
ASYNC_COLUMNS = [
    "mean_staleness",  # versions, over the updates aggregated into this version
    "max_staleness",
    "mean_staleness_s",  # emulated s between its base version's making and its arrival
    "in_flight",  # clients between a download's start and their update's arrival
    "dropped_stale",  # updates over aggregation.max_staleness
]
ASYNC_ROUND_COLUMNS = ROUND_COLUMNS + ASYNC_COLUMNS

UPDATE_COLUMNS = [
    "run_id",
    "update",  # index in arrival order, from 0
    "client_id",
    "device",
    "edge_server",
    "cycle",  # the client's own count of cycles, from 0
    "trained_on",  # the model version it downloaded and trained from
    "server_version",  # the server's version when the update reached it
    "staleness",  # server_version - trained_on
    "staleness_s",  # emulated s since version trained_on was made
    "weight",  # FedAsync's α_t, or FedBuff's 1/sqrt(1 + staleness)
    "status",  # accepted | dropped_stale | rejected_nonfinite
    "version",  # the version it went into (accepted), or the next one the server made
    "start_s",  # its download started (emulated s since the run's start)
    "arrive_s",  # its upload was done
    "download_s",
    "compute_s",
    "upload_s",
    "bytes_up",
    "bytes_down",
    "gflops",
    "steps",
    "num_samples",
    "train_loss",
    "peak_memory_mb",
    "host_train_s",
    *ENERGY_KEYS,
]
