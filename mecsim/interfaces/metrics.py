"""Prometheus ``/metrics`` for a running run (loopback by default), updated each round.

Names follow Prometheus conventions: ``mecsim_`` prefix, base units in the name
(``_seconds``, ``_bytes``, ``_ratio``), counters end in ``_total``; labels ``run`` and
``algorithm`` on every series, ``phase`` / ``direction`` / ``side`` / ``stat`` /
``status`` where a family has parts. Emulated quantities (what the modelled testbed
would take) and host quantities (what this machine took) are separate families.

Per-client quantities (channel rates and SNRs, per-client phase times) are exported as
*histograms* over the client-rounds, never as one series per client, so a run with
thousands of clients costs the same few series as one with ten.

:data:`METRICS` lists every family with its type and help text; the dashboards in
``dashboards/`` may name only these (a test checks it), and ``docs/monitoring.md``
describes them.

The exporter is a :class:`~mecsim.run.observers.RunObserver`. ``linger_s`` keeps ``/metrics``
up for that many seconds after the last round, so that a Prometheus scraping every
``scrape_interval`` also sees the final round of a short run (``mecsim run
--metrics-linger``).

``mecsim run`` gives each run its own exporter, registry and HTTP server. ``mecsim serve``
gives each run an exporter on a registry of its own (``registry=``) that serves nothing
itself: the service's ``/metrics`` puts every run's page together
(:class:`mecsim.interfaces.service.monitoring.RunSeries`).
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from mecsim.emulation.network import channel_record_keys
from mecsim.run.observers import RunInfo, RunObserver

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

MiB = 1024 * 1024

#: Critical-path phases of a round: (``phase`` label, round-row column). ``backhaul`` is
#: 0 until the round rows carry ``backhaul_time_s`` (hierarchical scenarios).
PHASES = (
    ("download", "dl_time_s"),
    ("client", "client_time_s"),
    ("upload", "ul_time_s"),
    ("backhaul", "backhaul_time_s"),
    ("server", "server_time_s"),
    ("idle", "idle_time_s"),
)
#: Client counts of a round by ``status`` label: the round-row column of each. ``dropped``
#: is every selected client not aggregated; the others split it by cause.
CLIENT_STATUSES = (
    "selected",
    "completed",
    "dropped",
    "dropped_deadline",
    "crashed",
    "dropped_out",
    "outage",
    "rejected",
)

#: Buckets of the per-client channel-rate histogram: 10^3 .. 10^10 bytes/s in half
#: decades (8 kbit/s .. 80 Gbit/s).
RATE_BUCKETS = tuple(10 ** (k / 2) for k in range(6, 21))
#: Buckets of the per-client SNR histogram (dB).
SNR_BUCKETS = tuple(float(x) for x in range(-30, 65, 5))
#: Buckets of the per-client phase-time histogram: 1 ms .. 10^4 s in half decades.
CLIENT_SECONDS_BUCKETS = tuple(10 ** (k / 2) for k in range(-6, 9))

#: Runs with more clients than this have no per-client series (``mecsim_client_edge_server_index``):
#: one series per client is what the per-client histograms avoid; the per-cell counts
#: (``mecsim_cell_clients``) and the run's map (``plots/map.png``) cover larger runs.
MAX_CLIENT_SERIES = 100

# name (as exposed; counters with their _total) -> (type, help)
METRICS: dict[str, tuple[str, str]] = {
    "mecsim_run_info": (
        "gauge",
        "The run, described by its labels: scenario, model, dataset, clients, backend "
        "(value always 1)",
    ),
    "mecsim_rounds_planned": ("gauge", "Rounds the scenario asks for (count)"),
    "mecsim_rounds_total": ("counter", "Rounds completed (count)"),
    "mecsim_round_duration_seconds": ("gauge", "Emulated duration of the last round (seconds)"),
    "mecsim_round_phase_seconds": (
        "gauge",
        "Emulated critical-path time of the last round by phase (seconds)",
    ),
    "mecsim_emulated_seconds_total": (
        "counter",
        "Emulated time elapsed since the run started (seconds)",
    ),
    "mecsim_emulated_phase_seconds_total": (
        "counter",
        "Emulated critical-path time by phase, summed over rounds (seconds)",
    ),
    "mecsim_transferred_bytes_total": (
        "counter",
        "Data sent over the air (up: clients to server, down: server to clients) (bytes)",
    ),
    "mecsim_flops_total": (
        "counter",
        "Floating-point operations (client: local training of "
        "all selected clients; server: aggregation) (FLOPs)",
    ),
    "mecsim_server_resident_memory_bytes": (
        "gauge",
        "Resident memory of the edge-server process after the last aggregation "
        "(bytes; the records' server_rss_mb is it in MiB)",
    ),
    "mecsim_client_step_memory_bytes": (
        "gauge",
        "Peak modelled memory of a client training step in the last round "
        "(bytes; the records' client_peak_mb is it in MiB)",
    ),
    "mecsim_user_accuracy_ratio": (
        "gauge",
        "User accuracy over the clients evaluated in the last evaluated round, by stat (ratio 0-1)",
    ),
    "mecsim_train_loss": (
        "gauge",
        "Mean training loss of the last round's clients (cross-entropy, nats)",
    ),
    "mecsim_test_loss": (
        "gauge",
        "Mean test loss of the last evaluated round (cross-entropy, nats)",
    ),
    "mecsim_round_clients": ("gauge", "Clients in the last round by status (count)"),
    "mecsim_clients_total": ("counter", "Client-rounds by status, summed over rounds (count)"),
    "mecsim_handovers_total": (
        "counter",
        "Clients that changed edge server at a round's start, summed over rounds "
        "(runs with a geometry only; docs/mobility.md, Handover) (count)",
    ),
    "mecsim_cell_clients": (
        "gauge",
        "Selected clients of the last round by the edge server (cell) serving them at "
        "its start (runs with a geometry only) (count)",
    ),
    "mecsim_client_edge_server_index": (
        "gauge",
        "The edge server (cell) serving each client at the start of the last round it "
        "was selected in, by client (runs with a geometry and at most "
        f"{MAX_CLIENT_SERIES} clients only) (index)",
    ),
    "mecsim_actor_failures_total": (
        "counter",
        "Ray actors (client hosts, edge server) that "
        "died and were re-created from the last "
        "checkpoint (count)",
    ),
    "mecsim_checkpoint_bytes": ("gauge", "Size of the last checkpoint written (bytes)"),
    "mecsim_checkpoint_write_seconds": (
        "gauge",
        "Host time the last checkpoint took to write (seconds)",
    ),
    "mecsim_host_round_wall_seconds": ("gauge", "Host wall-clock time of the last round (seconds)"),
    "mecsim_host_wall_seconds_total": ("counter", "Host wall-clock time spent in rounds (seconds)"),
    "mecsim_channel_rate_bytes_per_second": (
        "histogram",
        "Per-client link rate drawn for each client-round, by direction (bytes per second)",
    ),
    "mecsim_channel_snr_decibels": (
        "histogram",
        "Per-client effective SNR of each client-round, by direction, "
        "Shannon channels only (decibels)",
    ),
    "mecsim_channel_quantity": (
        "gauge",
        "Mean over the last round's selected clients of each per-client quantity a channel "
        "plugin records (its record_keys), by quantity (the plugin's unit)",
    ),
    "mecsim_client_phase_seconds": (
        "histogram",
        "Emulated time of each selected client-round by phase: download, compute, upload (seconds)",
    ),
    "mecsim_client_energy_joules_total": (
        "counter",
        "Energy of the selected clients' devices "
        "summed over rounds, by part (compute, "
        "radio, idle, sleep), from the device profiles (joules)",
    ),
    "mecsim_round_energy_joules": (
        "gauge",
        "Energy of the last round's selected clients, all parts (joules)",
    ),
    "mecsim_update_staleness_versions": (
        "gauge",
        "Staleness of the updates aggregated into the last model version, by stat (mean, "
        "max): versions the server made between a client's download and its update's "
        "arrival (asynchronous runs only; docs/async.md) (versions)",
    ),
    "mecsim_update_staleness_seconds": (
        "gauge",
        "Mean emulated seconds between the making of the version an update trained on and "
        "its arrival, over the last version's updates (asynchronous runs only) (seconds)",
    ),
    "mecsim_updates_in_flight": (
        "gauge",
        "Clients between a download's start and their update's arrival when the last "
        "model version was made (asynchronous runs only) (count)",
    ),
}
#: Families only an asynchronous run's versions set (docs/async.md): a run in rounds
#: serves none of them.
ASYNC_ONLY = (
    "mecsim_update_staleness_versions",
    "mecsim_update_staleness_seconds",
    "mecsim_updates_in_flight",
)
#: Parts of a client-round's energy: (``part`` label, round-row column).
ENERGY_PARTS = (
    ("compute", "energy_compute_j"),
    ("radio", "energy_radio_j"),
    ("idle", "energy_idle_j"),
    ("sleep", "energy_sleep_j"),
)


def _family(name: str) -> str:
    """The name prometheus_client wants (without the counter's ``_total``)."""
    return name.removesuffix("_total") if METRICS[name][0] == "counter" else name


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _number(value: Any) -> float:
    """A round-row value as a number for a counter (missing or NaN: 0)."""
    return float(value) if _finite(value) else 0.0


class MetricsExporter(RunObserver):
    """Serves ``/metrics`` on ``host:port`` (``port=0``: any free port) during a run.

    With ``registry``, the families are registered there instead and nothing is served
    here (a service serves that registry for all its runs; one exporter per registry).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9464,
        linger_s: float = 0.0,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not 0 <= linger_s < math.inf:
            raise ValueError(f"linger_s must be a finite number of seconds >= 0, got {linger_s}")
        self.host = host
        self.port = port
        self.linger_s = float(linger_s)
        self.serves = registry is None
        self.registry = r = CollectorRegistry() if registry is None else registry
        lab = ["run", "algorithm"]
        self._families: list[Any] = []

        def make(name: str, extra: tuple[str, ...] = (), **kw: Any):
            kind, doc = METRICS[name]
            cls = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[kind]
            family = cls(_family(name), doc, [*lab, *extra], registry=r, **kw)
            self._families.append(family)
            return family

        self.info = make("mecsim_run_info", ("scenario", "model", "dataset", "clients", "backend"))
        self.rounds_planned = make("mecsim_rounds_planned")
        self.rounds = make("mecsim_rounds_total")
        self.round_time = make("mecsim_round_duration_seconds")
        self.phase_time = make("mecsim_round_phase_seconds", ("phase",))
        self.emulated = make("mecsim_emulated_seconds_total")
        self.phase_total = make("mecsim_emulated_phase_seconds_total", ("phase",))
        self.bytes = make("mecsim_transferred_bytes_total", ("direction",))
        self.flops = make("mecsim_flops_total", ("side",))
        self.server_rss = make("mecsim_server_resident_memory_bytes")
        self.client_peak = make("mecsim_client_step_memory_bytes")
        self.accuracy = make("mecsim_user_accuracy_ratio", ("stat",))
        self.train_loss = make("mecsim_train_loss")
        self.test_loss = make("mecsim_test_loss")
        self.clients = make("mecsim_round_clients", ("status",))
        self.clients_total = make("mecsim_clients_total", ("status",))
        self.actor_failures = make("mecsim_actor_failures_total")
        self.handovers = make("mecsim_handovers_total")
        self.cell_clients = make("mecsim_cell_clients", ("edge_server",))
        self.client_cell = make("mecsim_client_edge_server_index", ("client",))
        self.checkpoint_bytes = make("mecsim_checkpoint_bytes")
        self.checkpoint_seconds = make("mecsim_checkpoint_write_seconds")
        self.host_wall = make("mecsim_host_round_wall_seconds")
        self.host_total = make("mecsim_host_wall_seconds_total")
        self.rate = make(
            "mecsim_channel_rate_bytes_per_second", ("direction",), buckets=RATE_BUCKETS
        )
        self.snr = make("mecsim_channel_snr_decibels", ("direction",), buckets=SNR_BUCKETS)
        self.channel_quantity = make("mecsim_channel_quantity", ("quantity",))
        self.client_phase = make(
            "mecsim_client_phase_seconds", ("phase",), buckets=CLIENT_SECONDS_BUCKETS
        )
        self.energy = make("mecsim_client_energy_joules_total", ("part",))
        self.round_energy = make("mecsim_round_energy_joules")
        self.staleness = make("mecsim_update_staleness_versions", ("stat",))
        self.staleness_s = make("mecsim_update_staleness_seconds")
        self.in_flight = make("mecsim_updates_in_flight")
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ server

    def start(self) -> None:
        """Start serving (idempotent); afterwards :attr:`port` is the bound port.

        Does nothing for an exporter on a registry served by someone else."""
        if self.serves and self._server is None:
            self._server, self._thread = start_http_server(
                self.port, addr=self.host, registry=self.registry
            )
            self.port = self._server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------------ hooks

    def on_run_start(self, info: RunInfo) -> None:
        self.start()
        sc = info.scenario
        lab = {"run": info.run_id, "algorithm": sc.algorithm.name}
        self.info.labels(
            **lab,
            scenario=sc.name,
            model=sc.model.name,
            dataset=sc.dataset.name,
            clients=str(sc.topology.clients),
            backend=str(info.extra.get("backend", "")),
        ).set(1)
        self.rounds_planned.labels(**lab).set(sc.rounds)
        # families whose value is a sum start at 0, so rate()/increase() see the first round
        self.rounds.labels(**lab)
        self.emulated.labels(**lab)
        self.host_total.labels(**lab)
        for phase, _ in PHASES:
            self.phase_total.labels(**lab, phase=phase)
        for direction in ("up", "down"):
            self.bytes.labels(**lab, direction=direction)
        for side in ("client", "server"):
            self.flops.labels(**lab, side=side)
        for status in CLIENT_STATUSES:
            self.clients_total.labels(**lab, status=status)
        self.actor_failures.labels(**lab)
        if sc.geometry is not None:  # only runs with a geometry have edge servers to change
            self.handovers.labels(**lab)
        self.checkpoint_bytes.labels(**lab)  # 0 until the first checkpoint
        self.checkpoint_seconds.labels(**lab)
        for part, _ in ENERGY_PARTS:
            self.energy.labels(**lab, part=part)

    def on_run_resume(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        """Counters continue from the finished rounds' sums (read back from the records),
        so a resumed run's series go on where the killed run's stopped."""
        self.on_run_start(info)
        for row in rounds:
            self._count(info, row)
            self.actor_failures.labels(run=info.run_id, algorithm=row["algorithm"]).inc(
                _number(row.get("faults"))
            )

    def on_run_replay(
        self,
        info: RunInfo,
        rounds: list[dict[str, Any]],
        client_rows: dict[int, list[dict[str, Any]]],
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        """A finished run's series rebuilt from its records, as the exporter that watched
        it had them at its end: for a service that adopts a run which finished while the
        service died (``client_rows``: each round's rows of ``clients.csv``;
        ``checkpoint``: run.json's last checkpoint, for its two gauges)."""
        self.on_run_start(info)
        for row in rounds:
            self.on_round_end(info, row, client_rows.get(int(row["round"]), []), None)
            self.actor_failures.labels(run=info.run_id, algorithm=row["algorithm"]).inc(
                _number(row.get("faults"))
            )
        if checkpoint:
            self.on_checkpoint(
                info,
                int(checkpoint.get("rounds_done", 0)),
                int(checkpoint.get("bytes", 0)),
                float(checkpoint.get("seconds", 0.0)),
            )

    def _count(self, info, row: dict[str, Any]) -> None:
        """The counters' increments of one round."""
        lab = {"run": info.run_id, "algorithm": row["algorithm"]}
        self.rounds.labels(**lab).inc()
        self.emulated.labels(**lab).inc(row["round_time_s"])
        for phase, key in PHASES:
            self.phase_total.labels(**lab, phase=phase).inc(_number(row.get(key)))
        self.bytes.labels(**lab, direction="up").inc(row["bytes_up"])
        self.bytes.labels(**lab, direction="down").inc(row["bytes_down"])
        self.flops.labels(**lab, side="client").inc(row["client_gflops"] * 1e9)
        self.flops.labels(**lab, side="server").inc(row["server_gflops"] * 1e9)
        for status in CLIENT_STATUSES:
            self.clients_total.labels(**lab, status=status).inc(_number(row.get(status)))
        self.host_total.labels(**lab).inc(row["host_wall_s"])
        if info.scenario.geometry is not None:  # a static geometry's rows have no column: 0
            self.handovers.labels(**lab).inc(_number(row.get("handovers")))
        if _finite(row.get("energy_j")):  # NaN: a device profile without power figures
            for part, key in ENERGY_PARTS:
                self.energy.labels(**lab, part=part).inc(_number(row.get(key)))

    def on_fault(self, info, rnd: int, message: str) -> None:
        self.actor_failures.labels(run=info.run_id, algorithm=info.scenario.algorithm.name).inc()

    def on_checkpoint(self, info, rounds_done: int, nbytes: int, seconds: float) -> None:
        lab = {"run": info.run_id, "algorithm": info.scenario.algorithm.name}
        self.checkpoint_bytes.labels(**lab).set(nbytes)
        self.checkpoint_seconds.labels(**lab).set(seconds)

    def on_round_end(self, info, row: dict[str, Any], client_rows, traces) -> None:
        lab = {"run": info.run_id, "algorithm": row["algorithm"]}
        self._count(info, row)
        self.round_time.labels(**lab).set(row["round_time_s"])
        for phase, key in PHASES:
            self.phase_time.labels(**lab, phase=phase).set(_number(row.get(key)))
        self.server_rss.labels(**lab).set(row["server_rss_mb"] * MiB)
        self.client_peak.labels(**lab).set(row["client_peak_mb"] * MiB)
        for stat in ("mean", "min", "max"):
            value = row[f"{stat}_accuracy"]
            if _finite(value):  # this round was evaluated
                self.accuracy.labels(**lab, stat=stat).set(value)
        if _finite(row.get("mean_test_loss")):
            self.test_loss.labels(**lab).set(row["mean_test_loss"])
        if _finite(row.get("train_loss")):
            self.train_loss.labels(**lab).set(row["train_loss"])
        for status in CLIENT_STATUSES:
            self.clients.labels(**lab, status=status).set(_number(row.get(status)))
        if _finite(row.get("energy_j")):  # NaN: a device profile without power figures
            self.round_energy.labels(**lab).set(row["energy_j"])
        self.host_wall.labels(**lab).set(row["host_wall_s"])
        if "in_flight" in row:  # an asynchronous run's version (docs/async.md)
            self._asynchronous(lab, row)
        for key in channel_record_keys(info.scenario.channel):  # a channel plugin's
            values = [
                float(c[key]) for c in client_rows if c.get("selected") and _finite(c.get(key))
            ]
            if values:
                self.channel_quantity.labels(**lab, quantity=key).set(sum(values) / len(values))
        if info.scenario.geometry is not None:
            self._cells(info, lab, client_rows)
        for c in client_rows:
            if not c.get("selected"):
                continue
            for direction, key in (("up", "uplink"), ("down", "downlink")):
                rate = c.get(f"{key}_rate_bps")
                if _finite(rate):
                    self.rate.labels(**lab, direction=direction).observe(float(rate) / 8)
                snr = c.get(f"{key}_snr_db")
                if _finite(snr):
                    self.snr.labels(**lab, direction=direction).observe(float(snr))
            for phase, key in (
                ("download", "download_s"),
                ("compute", "compute_s"),
                ("upload", "upload_s"),
            ):
                if _finite(c.get(key)):
                    self.client_phase.labels(**lab, phase=phase).observe(float(c[key]))

    def _asynchronous(self, lab: dict[str, str], row: dict[str, Any]) -> None:
        """A version's staleness (of the updates it aggregated; a version that aggregated
        none keeps the last values) and the updates in flight when it was made."""
        self.in_flight.labels(**lab).set(_number(row.get("in_flight")))
        if _finite(row.get("mean_staleness")):
            self.staleness.labels(**lab, stat="mean").set(float(row["mean_staleness"]))
            self.staleness.labels(**lab, stat="max").set(_number(row.get("max_staleness")))
        if _finite(row.get("mean_staleness_s")):
            self.staleness_s.labels(**lab).set(float(row["mean_staleness_s"]))

    def _cells(self, info, lab: dict[str, str], client_rows) -> None:
        """Who served the last round's selected clients: the count per edge server
        (every edge server, 0 where none was selected) and, for small runs, each
        client's edge server (a client keeps its series at the last round it was in)."""
        sc = info.scenario
        counts = dict.fromkeys(range(sc.topology.edge_servers), 0)
        per_client = sc.topology.clients <= MAX_CLIENT_SERIES
        for c in client_rows:
            if not c.get("selected") or not _finite(c.get("edge_server")):
                continue
            edge = int(c["edge_server"])
            counts[edge] = counts.get(edge, 0) + 1
            if per_client:
                self.client_cell.labels(**lab, client=str(int(c["client_id"]))).set(edge)
        for edge, count in counts.items():
            self.cell_clients.labels(**lab, edge_server=str(edge)).set(count)

    def on_run_stopped(self, info, rounds, status, message) -> None:
        self.close()

    def on_run_end(self, info, rounds) -> None:
        if self.linger_s > 0 and self._server is not None:
            print(
                f"mecsim: run finished; serving {self.url} for {self.linger_s:g} s more "
                "(--metrics-linger)",
                file=sys.stderr,
            )
            time.sleep(self.linger_s)
        self.close()
