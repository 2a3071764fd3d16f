"""Run records in ``runs/<run-id>/``, written as each round ends.

- ``scenario.yaml``: the resolved scenario (every default filled in);
- ``rounds.csv`` / ``clients.csv``: one row per round / per client-round, appended and
  fsync'ed at the end of every round, so a killed run keeps every finished round;
- ``optraces.jsonl``: one line per round with every client's op-trace and the server's
  aggregation FLOPs (what a replay needs);
- at the end: ``rounds.parquet`` / ``clients.parquet`` (when ``outputs.table_format`` is
  parquet) and ``summary.md`` with the tables.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from mecsim.network import downlink_note
from mecsim.runner import RunInfo, RunObserver
from mecsim.scenario import resolved_yaml
from mecsim.summary import markdown, summarise, target_lines

ROUND_COLUMNS = [
    "run_id", "round", "algorithm", "selected", "completed", "dropped",
    "round_time_s", "dl_time_s", "client_time_s", "ul_time_s", "server_time_s",
    "backhaul_time_s", "idle_time_s", "elapsed_s", "bytes_up", "bytes_down",
    # joules, summed over the round's selected clients (mecsim.energy)
    "energy_j", "energy_compute_j", "energy_radio_j", "energy_idle_j",
    "client_gflops", "server_gflops",
    "server_rss_mb", "client_peak_mb", "mean_accuracy", "min_accuracy", "max_accuracy",
    "mean_test_loss", "train_loss", "host_wall_s", "host_train_wall_s", "host_aggregate_s",
]
CHANNEL_COLUMNS = [
    "distance_m", "bandwidth_hz", "tx_power_dbm", "fading_gain", "ul_interference_w",
    "dl_interference_w", "uplink_rate_bps", "downlink_rate_bps", "uplink_snr_db",
    "downlink_snr_db",
    # latency, jitter, loss (mecsim.network.TRANSPORT_KEYS): the latency drawn for the
    # client-round and the goodput the loss rate leaves of the link rate
    "uplink_latency_s", "downlink_latency_s", "uplink_goodput_bps", "downlink_goodput_bps",
    "backhaul_latency_s", "backhaul_goodput_bps",
]
CLIENT_COLUMNS = [
    "run_id", "round", "client_id", "device", "edge_server", "selected", "completed",
    "start_s", "finish_s", "download_s", "compute_s", "upload_s", "server_compute_s",
    "bytes_up", "bytes_down", "gflops", "steps", "num_samples", "train_loss",
    "peak_memory_mb", "host_train_s", "accuracy", "test_loss",
    "energy_j", "energy_compute_j", "energy_radio_j", "energy_idle_j", *CHANNEL_COLUMNS,
]


class _AppendCsv:
    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.file = path.open("w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns, restval="")
        self.writer.writeheader()

    def append(self, rows: list[dict[str, Any]]) -> None:
        self.writer.writerows(rows)
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


class RecordsWriter(RunObserver):
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.summary: dict[str, float] | None = None

    def on_run_start(self, info: RunInfo) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=False)
        sc = info.scenario
        (self.out_dir / "scenario.yaml").write_text(resolved_yaml(sc))
        from agents.algorithms import algorithm_classes

        server_cls, _ = algorithm_classes(sc.algorithm.name)
        self.rounds = _AppendCsv(self.out_dir / "rounds.csv",
                                 ROUND_COLUMNS + list(server_cls.round_metrics))
        self.clients = _AppendCsv(self.out_dir / "clients.csv", CLIENT_COLUMNS)
        self.traces = (self.out_dir / "optraces.jsonl").open("w") \
            if sc.outputs.save_optraces else None
        meta = {"run_id": info.run_id, "num_params": info.num_params,
                "model_bytes": info.model_nbytes, "step_memory_bytes": info.step_memory_bytes,
                "step_flops": info.step_flops, "client_devices": info.client_devices,
                **info.extra}
        (self.out_dir / "run.json").write_text(json.dumps(meta, indent=1))

    def on_round_end(self, info, round_row, client_rows, traces) -> None:
        self.clients.append(client_rows)
        self.rounds.append([round_row])
        if self.traces is not None:
            self.traces.write(json.dumps(traces) + "\n")
            self.traces.flush()

    def on_run_end(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        self.rounds.close()
        self.clients.close()
        if self.traces is not None:
            self.traces.close()
        if info.scenario.outputs.table_format == "parquet":
            for name in ("rounds", "clients"):
                pd.read_csv(self.out_dir / f"{name}.csv").to_parquet(
                    self.out_dir / f"{name}.parquet", index=False)
        self.summary = summarise(rounds)
        targets = target_lines(rounds, info.scenario.evaluation.target_accuracy)
        note = downlink_note(info.scenario)
        (self.out_dir / "summary.md").write_text(
            markdown(info.run_id, info.scenario.algorithm.name, self.summary, targets,
                     [note] if note else []))


def read_rounds(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "rounds.csv")


def read_clients(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "clients.csv")
