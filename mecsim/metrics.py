"""Prometheus ``/metrics`` for a running run (loopback by default), updated each round.

Names follow Prometheus conventions: ``mecsim_`` prefix, base units in the name
(``_seconds``, ``_bytes``, ``_ratio``), counters end in ``_total``; labels ``run`` and
``algorithm`` on every series, ``phase`` / ``direction`` / ``stat`` where a family has
parts. Emulated quantities (what the modelled testbed would take) and host quantities
(what this machine took) are separate families.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from mecsim.runner import RunInfo, RunObserver

MiB = 1024 * 1024


class MetricsExporter(RunObserver):
    def __init__(self, host: str = "127.0.0.1", port: int = 9464) -> None:
        self.host = host
        self.port = port
        self.registry = CollectorRegistry()
        labels = ["run", "algorithm"]
        r = self.registry
        self.rounds = Counter("mecsim_rounds", "Rounds completed", labels, registry=r)
        self.round_time = Gauge("mecsim_round_duration_seconds",
                                "Emulated duration of the last round", labels, registry=r)
        self.phase_time = Gauge("mecsim_round_phase_seconds",
                                "Emulated critical-path time of the last round by phase",
                                [*labels, "phase"], registry=r)
        self.emulated = Counter("mecsim_emulated_seconds",
                                "Emulated time elapsed since the run started", labels, registry=r)
        self.bytes = Counter("mecsim_transferred_bytes", "Bytes sent over the air",
                             [*labels, "direction"], registry=r)
        self.flops = Counter("mecsim_flops", "Floating-point operations",
                             [*labels, "side"], registry=r)
        self.server_rss = Gauge("mecsim_server_resident_memory_bytes",
                                "Resident memory of the edge-server process", labels, registry=r)
        self.client_peak = Gauge("mecsim_client_step_memory_bytes",
                                 "Modelled memory of a client training step", labels, registry=r)
        self.accuracy = Gauge("mecsim_user_accuracy_ratio",
                              "User accuracy over evaluated clients (0-1)",
                              [*labels, "stat"], registry=r)
        self.train_loss = Gauge("mecsim_train_loss", "Mean training loss of the last round",
                                labels, registry=r)
        self.clients = Gauge("mecsim_round_clients", "Clients in the last round by status",
                             [*labels, "status"], registry=r)
        self.host_wall = Gauge("mecsim_host_round_wall_seconds",
                               "Host wall-clock seconds of the last round", labels, registry=r)
        self._server = None
        self._thread = None

    def on_run_start(self, info: RunInfo) -> None:
        self._server, self._thread = start_http_server(self.port, addr=self.host,
                                                       registry=self.registry)
        self.port = self._server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def on_round_end(self, info, row: dict[str, Any], client_rows, traces) -> None:
        lab = {"run": info.run_id, "algorithm": row["algorithm"]}
        self.rounds.labels(**lab).inc()
        self.round_time.labels(**lab).set(row["round_time_s"])
        for phase, key in (("download", "dl_time_s"), ("client", "client_time_s"),
                           ("upload", "ul_time_s"), ("server", "server_time_s"),
                           ("idle", "idle_time_s")):
            self.phase_time.labels(**lab, phase=phase).set(row[key])
        self.emulated.labels(**lab).inc(row["round_time_s"])
        self.bytes.labels(**lab, direction="up").inc(row["bytes_up"])
        self.bytes.labels(**lab, direction="down").inc(row["bytes_down"])
        self.flops.labels(**lab, side="client").inc(row["client_gflops"] * 1e9)
        self.flops.labels(**lab, side="server").inc(row["server_gflops"] * 1e9)
        self.server_rss.labels(**lab).set(row["server_rss_mb"] * MiB)
        self.client_peak.labels(**lab).set(row["client_peak_mb"] * MiB)
        for stat in ("mean", "min", "max"):
            value = row[f"{stat}_accuracy"]
            if value == value:  # not NaN: this round was evaluated
                self.accuracy.labels(**lab, stat=stat).set(value)
        self.train_loss.labels(**lab).set(row["train_loss"])
        for status in ("selected", "completed", "dropped"):
            self.clients.labels(**lab, status=status).set(row[status])
        self.host_wall.labels(**lab).set(row["host_wall_s"])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def on_run_end(self, info, rounds) -> None:
        self.close()
