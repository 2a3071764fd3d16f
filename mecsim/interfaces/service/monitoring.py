"""The service's one Prometheus target: every run's series plus the service's own.

A :class:`~mecsim.interfaces.metrics.MetricsExporter` per run observes it (the families and labels
of ``mecsim run``, so the shipped dashboards work unchanged); :class:`RunSeries` puts
them on one page and drops a finished run's series ``retention_s`` after it ended, so
the page stays bounded however many runs the service has done. :class:`ServiceCollector`
adds the service's series, read from the store at scrape time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mecsim.interfaces.metrics import MetricsExporter
from mecsim.interfaces.service.jobs import STATUSES, Store

# name -> (type, help): the service's own families
SERVICE_METRICS: dict[str, tuple[str, str]] = {
    "mecsim_service_runs": ("gauge", "Runs known to the service by status"),
    "mecsim_service_queue_length": ("gauge", "Runs waiting for a worker (queued or interrupted)"),
    "mecsim_service_workers": ("gauge", "Worker slots by state (busy: running a run)"),
    "mecsim_service_ready": (
        "gauge",
        "1 when the service's Ray is up and runs are taken from the queue",
    ),
    "mecsim_service_uptime_seconds": ("gauge", "Seconds since the service started"),
    "mecsim_service_retained_runs": (
        "gauge",
        "Finished runs whose series are still served (dropped after the retention)",
    ),
}


class ServiceCollector(Collector):
    """The service's series, computed when scraped."""

    def __init__(
        self,
        store: Store,
        workers: int,
        busy: Callable[[], int],
        ready: Callable[[], bool],
        retained: Callable[[], int],
    ) -> None:
        self.store = store
        self.workers = workers
        self.busy = busy
        self.ready = ready
        self.retained = retained
        self.started = time.monotonic()

    def _gauge(self, name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, SERVICE_METRICS[name][1], labels=labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.store.counts()
        runs = self._gauge("mecsim_service_runs", ["status"])
        for status in STATUSES:
            runs.add_metric([status], counts[status])
        yield runs
        queue = self._gauge("mecsim_service_queue_length")
        queue.add_metric([], counts["queued"] + counts["interrupted"])
        yield queue
        busy = self.busy()
        workers = self._gauge("mecsim_service_workers", ["state"])
        workers.add_metric(["busy"], busy)
        workers.add_metric(["idle"], self.workers - busy)
        yield workers
        ready = self._gauge("mecsim_service_ready")
        ready.add_metric([], 1.0 if self.ready() else 0.0)
        yield ready
        up = self._gauge("mecsim_service_uptime_seconds")
        up.add_metric([], time.monotonic() - self.started)
        yield up
        retained = self._gauge("mecsim_service_retained_runs")
        retained.add_metric([], self.retained())
        yield retained


class RunSeries:
    """Every run's series on one page: an exporter per run, finished runs' text kept.

    Each run gets its own :class:`~mecsim.interfaces.metrics.MetricsExporter` on its own registry
    (:meth:`exporter`). A finished run's series never change again, so when it ends
    (:meth:`finished`) its page is rendered once, kept as text per family, and its
    exporter dropped; a scrape renders only the running runs and splices the kept text
    in (rendering every retained run at every scrape cost ~1.9 ms and 21 kB per run: a
    busy hour's 100 finished runs would make each scrape ~0.2 s of the API's CPU).
    :meth:`expire` (called every second by the service, and at every scrape) forgets a
    finished run ``retention_s`` after it ended, so the page stays bounded.

    The text exposition format wants each family's lines in one group under one
    ``# HELP`` / ``# TYPE`` header: :meth:`render` merges the runs' lines family by
    family, in the exporter's order.
    """

    def __init__(self, retention_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not retention_s >= 0:
            raise ValueError(f"retention must be >= 0 seconds, got {retention_s}")
        self.retention_s = retention_s
        self.clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, MetricsExporter] = {}
        self._kept: dict[str, tuple[float, dict[str, str]]] = {}  # run -> (ended, lines)
        # the families' headers, in order: an exporter that observes nothing
        self._headers = list(
            _split(generate_latest(MetricsExporter(registry=CollectorRegistry()).registry).decode())
        )

    def exporter(self, run_id: str) -> MetricsExporter:
        """A new exporter for ``run_id`` (a resumed run's replaces any kept series)."""
        exporter = MetricsExporter(registry=CollectorRegistry())
        with self._lock:
            self._kept.pop(run_id, None)
            self._live[run_id] = exporter
        return exporter

    def finished(self, run_id: str) -> None:
        """Run ``run_id`` ended: keep its page as text, drop its exporter."""
        with self._lock:
            exporter = self._live.pop(run_id, None)
        if exporter is not None:
            lines = _split(generate_latest(exporter.registry).decode())
            with self._lock:
                self._kept[run_id] = (self.clock(), lines)
        self.expire()

    def expire(self) -> list[str]:
        """Forget the finished runs whose retention is over; their ids."""
        now = self.clock()
        with self._lock:
            due = [r for r, (t, _) in self._kept.items() if now - t >= self.retention_s]
            for run_id in due:
                del self._kept[run_id]
        return due

    def __len__(self) -> int:
        """Finished runs whose series are still served."""
        with self._lock:
            return len(self._kept)

    def render(self) -> str:
        """Every running and retained run's series, one group per family."""
        self.expire()
        with self._lock:
            live = list(self._live.values())
            kept = [lines for _, lines in self._kept.values()]
        pages = [_split(generate_latest(e.registry).decode()) for e in live] + kept
        headers = dict.fromkeys(self._headers)  # and any a page adds (a counter's
        for page in pages:  # "_created" family once it has a child)
            headers.update(dict.fromkeys(page))
        out: list[str] = []
        for header in headers:
            out.append(header)
            out.extend(page.get(header, "") for page in pages)
        return "".join(out)


def _split(page: str) -> dict[str, str]:
    """A text-format page as {family header ("# HELP ..." and "# TYPE ..." lines): its
    sample lines}, in the page's order."""
    families: dict[str, str] = {}
    for block in page.split("# HELP ")[1:]:
        help_line, type_line, samples = ("# HELP " + block).split("\n", 2)
        families[f"{help_line}\n{type_line}\n"] = samples
    return families


def service_registry(
    store: Store,
    workers: int,
    busy: Callable[[], int],
    ready: Callable[[], bool],
    retained: Callable[[], int],
) -> CollectorRegistry:
    """A registry with the service's own series (the runs' are :class:`RunSeries`)."""
    registry = CollectorRegistry()
    registry.register(ServiceCollector(store, workers, busy, ready, retained))
    return registry
