"""The service's one Prometheus target: every run's series plus the service's own.

One :class:`~mecsim.metrics.MetricsExporter` on the service's registry observes every
run (the families and labels of ``mecsim run``, so the shipped dashboards work
unchanged). :class:`ServiceCollector` adds the service's series, read from the store
at scrape time. :class:`Retention` drops a finished run's series ``retention_s`` after
it ended, so the number of series stays bounded however many runs the service has done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mecsim.metrics import MetricsExporter
from mecsim.service.store import STATUSES, Store

# name -> (type, help): the service's own families
SERVICE_METRICS: dict[str, tuple[str, str]] = {
    "mecsim_service_runs": ("gauge", "Runs known to the service by status"),
    "mecsim_service_queue_length": ("gauge", "Runs waiting for a worker (queued or "
                                             "interrupted)"),
    "mecsim_service_workers": ("gauge", "Worker slots by state (busy: running a run)"),
    "mecsim_service_ready": ("gauge", "1 when the service's Ray is up and runs are taken "
                                      "from the queue"),
    "mecsim_service_uptime_seconds": ("gauge", "Seconds since the service started"),
    "mecsim_service_retained_runs": ("gauge", "Finished runs whose series are still "
                                              "served (dropped after the retention)"),
}


class ServiceCollector(Collector):
    """The service's series, computed when scraped."""

    def __init__(self, store: Store, workers: int, busy: Callable[[], int],
                 ready: Callable[[], bool], retained: Callable[[], int]) -> None:
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


class Retention:
    """Forgets a finished run's series ``retention_s`` after it ended.

    :meth:`finished` is called when a run ends; :meth:`expire` (called every few seconds
    by the service, and at every scrape) drops the runs whose time is up.
    """

    def __init__(self, exporter: MetricsExporter, retention_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not retention_s >= 0:
            raise ValueError(f"retention must be >= 0 seconds, got {retention_s}")
        self.exporter = exporter
        self.retention_s = retention_s
        self.clock = clock
        self._ended: dict[str, float] = {}
        self._lock = threading.Lock()

    def finished(self, run_id: str) -> None:
        with self._lock:
            self._ended[run_id] = self.clock()
        self.expire()

    def expire(self) -> list[str]:
        now = self.clock()
        with self._lock:
            due = [r for r, t in self._ended.items() if now - t >= self.retention_s]
            for run_id in due:
                del self._ended[run_id]
        for run_id in due:
            self.exporter.forget_run(run_id)
        return due

    def __len__(self) -> int:
        with self._lock:
            return len(self._ended)


def service_registry() -> tuple[CollectorRegistry, MetricsExporter]:
    """A registry with the run families (one shared exporter observing every run)."""
    registry = CollectorRegistry()
    return registry, MetricsExporter(registry=registry)
