"""Metrics exporter, Grafana dashboards, and a real Prometheus scraping a real run.

- what the exporter serves after a 2-round run, checked against the run's own rows;
- ``promtool check metrics`` on a real scrape (skipped only without promtool);
- the dashboard JSON: valid, built by the Grafana Foundation SDK (when installed), and
  every query names only metrics the exporter serves;
- end to end: a real ``prometheus`` on loopback scrapes a live run; every PromQL
  expression of the dashboards returns data through its HTTP API (skipped only without
  the ``prometheus`` binary).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import DASHBOARD_FILES, dashboards, exprs, panels, substitute, variable_queries
from support.paths import ROOT
from support.scenarios import tiny, tiny_async_dict

from mecsim.interfaces.metrics import ASYNC_ONLY, METRICS, RATE_BUCKETS, MetricsExporter
from mecsim.run.loop import run
from mecsim.run.observers import RunObserver
from mecsim.scenario import scenario_from_dict

DASHBOARDS = ROOT / "dashboards"
NO_PROMETHEUS = "no `prometheus` binary on PATH (Debian: apt-get install prometheus)"
NO_PROMTOOL = "no `promtool` binary on PATH (Debian: apt-get install prometheus)"


class _Collect(RunObserver):
    """Keeps the client rows and scrapes /metrics at the end of every round."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self.exporter = exporter
        self.clients: list[dict] = []
        self.pages: list[str] = []

    def on_round_end(self, info, row, client_rows, traces) -> None:
        self.clients += client_rows
        with urllib.request.urlopen(self.exporter.url, timeout=5) as resp:
            self.pages.append(resp.read().decode())


def walking(rounds: int):
    """The tiny scenario on two cells with clients that walk, so that the cells' and
    handovers' families (and their dashboard panels) have data too."""
    return tiny(
        rounds=rounds,
        topology={"clients": 4, "edge_servers": 2},
        geometry={
            "area": {"width_m": 1000, "height_m": 200},
            "sites": {"layout": "explicit", "positions_m": [[200, 100], [800, 100]]},
            "mobility": {"model": "random_walk"},
        },
    )


@pytest.fixture(scope="module")
def scraped():
    """A real 2-round run with the exporter; (last page, round rows, client rows)."""
    exporter = MetricsExporter("127.0.0.1", 0)
    collect = _Collect(exporter)
    rows = run(walking(rounds=2), "exp", None, [exporter, collect])
    return collect.pages[-1], rows, collect.clients


@pytest.fixture(scope="module")
def scraped_async():
    """A real asynchronous run (FedBuff, K = 2) with the exporter; (last page, version
    rows)."""
    exporter = MetricsExporter("127.0.0.1", 0)
    collect = _Collect(exporter)
    sc = scenario_from_dict(tiny_async_dict(mode="buffered", buffer_size=2), "async-tiny")
    rows = run(sc, "exp-async", None, [exporter, collect])
    return collect.pages[-1], rows


def _samples(page: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("run", "algorithm")}
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def _exposed_names(page: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(page) for s in f.samples}


# ----------------------------------------------------------------------------- exporter


def test_exporter_serves_every_family_with_the_runs_numbers(scraped):
    page, rows, clients = scraped
    s = _samples(page)
    names = _exposed_names(page)
    for name, (kind, _) in METRICS.items():
        if name == "mecsim_channel_quantity":  # channel plugins' own quantities only:
            continue  # tests/integration/test_plugins.py checks it with one
        if name in ASYNC_ONLY:  # test_async_gauges_follow_the_versions
            assert name not in names, f"{name} served for a run in rounds"
            continue
        expected = f"{name}_count" if kind == "histogram" else name
        assert expected in names, f"{name} not served"
    # the last round's selected clients per serving cell, and each client's cell at the
    # last round it was selected in (the run's client rows; 4 clients: per-client series)
    last = [c for c in clients if c["round"] == rows[-1]["round"] and c["selected"]]
    for edge in (0, 1):
        assert s[("mecsim_cell_clients", (("edge_server", str(edge)),))] == sum(
            c["edge_server"] == edge for c in last
        )
    cell_of = {c["client_id"]: c["edge_server"] for c in clients if c["selected"]}
    assert (
        cell_of
        and {
            int(dict(k[1])["client"]): v
            for k, v in s.items()
            if k[0] == "mecsim_client_edge_server_index"
        }
        == cell_of
    )
    info = [k for k in s if k[0] == "mecsim_run_info"]
    assert len(info) == 1 and dict(info[0][1]) == {
        "scenario": "tiny",
        "model": "mlp_2nn",
        "dataset": "mnist-embedded",
        "clients": "4",
        "backend": "local",
    }
    assert s[("mecsim_rounds_planned", ())] == 2
    assert s[("mecsim_rounds_total", ())] == 2
    assert s[("mecsim_emulated_seconds_total", ())] == pytest.approx(rows[-1]["elapsed_s"])
    # the phase totals are the per-round split summed (backhaul: 0 until rows carry it)
    for phase, col in (
        ("download", "dl_time_s"),
        ("client", "client_time_s"),
        ("upload", "ul_time_s"),
        ("server", "server_time_s"),
        ("idle", "idle_time_s"),
        ("backhaul", "backhaul_time_s"),
    ):
        assert s[("mecsim_emulated_phase_seconds_total", (("phase", phase),))] == pytest.approx(
            sum(r.get(col, 0.0) for r in rows)
        )
        assert s[("mecsim_round_phase_seconds", (("phase", phase),))] == rows[-1].get(col, 0.0)
    assert s[("mecsim_transferred_bytes_total", (("direction", "down"),))] == sum(
        r["bytes_down"] for r in rows
    )
    assert s[("mecsim_flops_total", (("side", "client"),))] == pytest.approx(
        1e9 * sum(r["client_gflops"] for r in rows)
    )
    assert s[("mecsim_server_resident_memory_bytes", ())] == pytest.approx(
        rows[-1]["server_rss_mb"] * 2**20
    )
    assert s[("mecsim_client_step_memory_bytes", ())] == pytest.approx(
        rows[-1]["client_peak_mb"] * 2**20
    )
    for stat in ("mean", "min", "max"):
        assert s[("mecsim_user_accuracy_ratio", (("stat", stat),))] == pytest.approx(
            rows[-1][f"{stat}_accuracy"]
        )
    assert s[("mecsim_train_loss", ())] == pytest.approx(rows[-1]["train_loss"])
    assert s[("mecsim_test_loss", ())] == pytest.approx(rows[-1]["mean_test_loss"])
    for status in ("selected", "completed", "dropped"):
        assert s[("mecsim_round_clients", (("status", status),))] == rows[-1][status]
        assert s[("mecsim_clients_total", (("status", status),))] == sum(r[status] for r in rows)
    assert s[("mecsim_host_wall_seconds_total", ())] == pytest.approx(
        sum(r["host_wall_s"] for r in rows)
    )
    for part in ("compute", "radio", "idle"):  # joules of the selected clients, summed
        assert s[("mecsim_client_energy_joules_total", (("part", part),))] == pytest.approx(
            sum(r[f"energy_{part}_j"] for r in rows)
        )
    assert s[("mecsim_round_energy_joules", ())] == pytest.approx(rows[-1]["energy_j"])
    assert rows[-1]["energy_j"] > 0


def test_async_gauges_follow_the_versions(scraped_async):
    """The staleness and in-flight gauges hold the last version's row: FedBuff with K = 2
    aggregates two updates a version, each of staleness 0 or more."""
    page, rows = scraped_async
    s = _samples(page)
    last = rows[-1]
    assert last["completed"] == 2 and len(rows) == 6
    assert s[("mecsim_update_staleness_versions", (("stat", "mean"),))] == last["mean_staleness"]
    assert s[("mecsim_update_staleness_versions", (("stat", "max"),))] == last["max_staleness"]
    assert s[("mecsim_update_staleness_seconds", ())] == last["mean_staleness_s"]
    assert s[("mecsim_updates_in_flight", ())] == last["in_flight"]
    # 4 clients, two of whose updates the last version took: the other two in flight, or
    # fewer (a client whose update was taken starts its next cycle when it can)
    assert 0 <= last["in_flight"] <= 4 and last["max_staleness"] >= last["mean_staleness"] >= 0
    assert s[("mecsim_rounds_total", ())] == 6  # versions counted as rounds


def test_channel_histograms_count_every_selected_client_round(scraped):
    page, rows, clients = scraped
    s = _samples(page)
    selected = [c for c in clients if c["selected"]]
    assert len(selected) == 8  # 4 clients x 2 rounds
    for direction, key in (("up", "uplink_rate_bps"), ("down", "downlink_rate_bps")):
        rates = np.array([c[key] / 8 for c in selected])  # bytes/s
        lab = (("direction", direction),)
        assert s[("mecsim_channel_rate_bytes_per_second_count", lab)] == 8
        assert s[("mecsim_channel_rate_bytes_per_second_sum", lab)] == pytest.approx(rates.sum())
        for le in RATE_BUCKETS:
            key_le = (("direction", direction), ("le", str(float(le))))
            got = s.get(("mecsim_channel_rate_bytes_per_second_bucket", key_le))
            if got is None:  # the client library prints le with repr(); find it by value
                got = next(
                    v
                    for (n, ls), v in s.items()
                    if n == "mecsim_channel_rate_bytes_per_second_bucket"
                    and dict(ls)["direction"] == direction
                    and dict(ls)["le"] != "+Inf"
                    and float(dict(ls)["le"]) == le
                )
            assert got == (rates <= le).sum()
        assert s[("mecsim_channel_snr_decibels_count", lab)] == 8
    assert s[("mecsim_client_phase_seconds_sum", (("phase", "upload"),))] == pytest.approx(
        sum(c["upload_s"] for c in selected)
    )
    # no per-client series but the serving cell's, of runs of at most MAX_CLIENT_SERIES
    # clients (tests/integration/test_handover.py checks that larger runs have none)
    assert all(
        name == "mecsim_client_edge_server_index"
        or ("client" not in dict(labels) and "client_id" not in dict(labels))
        for name, labels in s
    )


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_promtool_check_metrics_passes_on_a_real_scrape(scraped):
    page, _, _ = scraped
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=page, text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == ""  # not even a lint warning


def test_linger_keeps_metrics_up_after_the_last_round():
    exporter = MetricsExporter("127.0.0.1", 0, linger_s=0.3)
    t0 = time.perf_counter()
    run(tiny(rounds=1), "linger", None, [exporter])
    assert time.perf_counter() - t0 >= 0.3
    with pytest.raises(OSError):  # closed after lingering
        urllib.request.urlopen(exporter.url, timeout=2)
    with pytest.raises(ValueError, match="linger_s"):
        MetricsExporter(linger_s=-1)


# ----------------------------------------------------------------------------- dashboards


SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")


def test_three_dashboards_with_run_and_algorithm_variables():
    dashes = dashboards()
    assert set(dashes) == {"mecsim-overview.json", "mecsim-algorithms.json", "mecsim-network.json"}
    assert len({d["uid"] for d in dashes.values()}) == 3
    for name, d in dashes.items():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert set(variables) == {"datasource", "run", "algorithm"}, name
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for var in ("run", "algorithm"):
            assert variables[var]["multi"] and variables[var]["includeAll"]
            assert variables[var]["query"].startswith("label_values(mecsim_run_info")
        ids = [p["id"] for p in panels(d)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        graphs = [p for p in panels(d) if p["type"] != "row"]
        assert len(graphs) >= 8, name
        for p in graphs:
            where = f"{name}: panel {p['title']!r}"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), where
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), where
            assert p.get("description"), where
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, where


def test_every_dashboard_query_names_only_exported_metrics_and_filters_by_run(
    scraped, scraped_async
):
    page, _, _ = scraped
    exported = _exposed_names(page) | _exposed_names(scraped_async[0])
    for name, d in dashboards().items():
        for query in variable_queries(d):
            m = re.fullmatch(r"label_values\((mecsim_\w+)(\{[^}]*\})?,\s*(run|algorithm)\)", query)
            assert m and m.group(1) in exported, f"{name}: variable query {query!r}"
        for expr in exprs(d):
            selectors = SELECTOR.findall(expr)
            assert selectors, f"{name}: no metric selector in {expr!r}"
            for metric, matchers in selectors:
                assert metric in exported, f"{name}: {metric} is not exported ({expr!r})"
                if metric != "mecsim_run_info":
                    assert 'run=~"$run"' in matchers and 'algorithm=~"$algorithm"' in matchers, (
                        f"{name}: {metric} not filtered by the run/algorithm variables"
                    )
            for token in re.findall(r"\bmecsim_\w+", expr):
                assert token in exported, f"{name}: {token} is not exported ({expr!r})"


def test_provisioning_points_grafana_at_the_dashboards_and_a_prometheus():
    ds = yaml.safe_load((DASHBOARDS / "provisioning/datasources/mecsim.yaml").read_text())
    (source,) = ds["datasources"]
    assert ds["apiVersion"] == 1 and source["type"] == "prometheus"
    assert source["url"].startswith("http://") and source["isDefault"]
    prov = yaml.safe_load((DASHBOARDS / "provisioning/dashboards/mecsim.yaml").read_text())
    (provider,) = prov["providers"]
    assert prov["apiVersion"] == 1 and provider["type"] == "file"
    assert provider["options"]["path"] == "${MECSIM_DASHBOARDS}"
    scrape = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    # the data source's timeInterval is the scrape interval ($__rate_interval needs it)
    assert source["jsonData"]["timeInterval"] == scrape["global"]["scrape_interval"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_example_prometheus_config_is_valid():
    proc = subprocess.run(
        ["promtool", "check", "config", str(DASHBOARDS / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _load_builder():
    pin = re.search(r'SDK_PIN = "([^"]+)"', (DASHBOARDS / "build.py").read_text()).group(1)
    pytest.importorskip(
        "grafana_foundation_sdk",
        reason=f"grafana-foundation-sdk not installed (pip install "
        f"'grafana-foundation-sdk=={pin}') - it builds the dashboards",
    )
    installed = importlib.metadata.version("grafana-foundation-sdk")
    if installed != pin:
        pytest.skip(
            f"grafana-foundation-sdk {installed} installed; the dashboards are built with {pin}"
        )
    spec = importlib.util.spec_from_file_location(
        "mecsim_dashboards_build", DASHBOARDS / "build.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_json_is_what_the_foundation_sdk_builds():
    build = _load_builder()
    assert set(build.DASHBOARDS) == {p.name for p in DASHBOARD_FILES}
    for name, make in build.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text() == build.render(make), (
            f"{name} differs from the build: run python dashboards/build.py"
        )


def test_dashboard_json_round_trips_through_the_sdk_model():
    _load_builder()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for name, d in dashboards().items():
        back = json.loads(json.dumps(Dashboard.from_json(d), cls=JSONEncoder))
        assert back == d, f"{name}: the SDK's dashboard model does not reproduce it"


# ----------------------------------------------------------------------------- e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class _WaitForScrape(RunObserver):
    """Blocks at the end of each round until Prometheus has scraped that round."""

    def __init__(self, api: str, run_id: str) -> None:
        self.api = api
        self.run_id = run_id

    def rounds_seen(self) -> float:
        q = urllib.parse.quote(f'mecsim_rounds_total{{run="{self.run_id}"}}')
        result = _get(f"{self.api}/query?query={q}")["data"]["result"]
        return float(result[0]["value"][1]) if result else -1.0

    def on_run_start(self, info) -> None:  # a sample of the run's zeros before round 1
        _wait(lambda: self.rounds_seen() == 0, 30, "Prometheus to scrape the run's start")

    def on_round_end(self, info, row, client_rows, traces) -> None:
        _wait(
            lambda: self.rounds_seen() >= row["round"] + 1,
            30,
            f"Prometheus to scrape round {row['round']}",
        )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason=NO_PROMETHEUS)
def test_real_prometheus_scrapes_a_run_and_every_dashboard_query_returns_data(tmp_path):
    exporter = MetricsExporter("127.0.0.1", 0)
    exporter.start()
    # an asynchronous run's exporter too: the gauges only such runs have, and their panels
    async_exporter = MetricsExporter("127.0.0.1", 0)
    async_exporter.start()
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": job,
                        "static_configs": [{"targets": [f"127.0.0.1:{e.port}"]}],
                    }
                    for job, e in (("mecsim", exporter), ("mecsim-async", async_exporter))
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        _wait(
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2).status == 200
                or prom.poll() is not None
            ),
            60,
            "Prometheus to be ready",
        )
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
        start = time.time() - 2
        waiter = _WaitForScrape(api, "e2e")
        up = urllib.parse.quote('up{job="mecsim"}')
        _wait(
            lambda: (
                [r["value"][1] for r in _get(f"{api}/query?query={up}")["data"]["result"]] == ["1"]
            ),
            30,
            "the first scrape of the exporter",
        )
        rows = run(walking(rounds=3), "e2e", None, [exporter, waiter])
        waiter = _WaitForScrape(api, "e2e-async")
        run(
            scenario_from_dict(tiny_async_dict(mode="buffered", buffer_size=2), "a"),
            "e2e-async",
            None,
            [async_exporter, waiter],
        )
        end = time.time() + 1
        targets = _get(f"{api}/targets")["data"]["activeTargets"]
        assert sorted(t["labels"]["job"] for t in targets) == ["mecsim", "mecsim-async"]

        def query_range(expr: str) -> list[dict]:
            params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
            body = _get(f"{api}/query_range?{params}", timeout=30)
            assert body["status"] == "success", (expr, body)
            return body["data"]["result"]

        # Prometheus holds what the run recorded
        (series,) = query_range('mecsim_rounds_total{run="e2e"}')
        assert float(series["values"][-1][1]) == 3
        (series,) = query_range('mecsim_transferred_bytes_total{run="e2e",direction="up"}')
        assert float(series["values"][-1][1]) == sum(r["bytes_up"] for r in rows)

        failures, checked = [], 0
        for name, dash in dashboards().items():
            for expr in exprs(dash):
                run_id = "e2e-async" if any(m in expr for m in ASYNC_ONLY) else "e2e"
                promql = substitute(expr, run_id, "fedavg", int(end - start) + 60)
                result = query_range(promql)
                values = [float(v) for s in result for _, v in s["values"]]
                checked += 1
                if not any(math.isfinite(v) for v in values):
                    failures.append(f"{name}: {promql} -> {len(result)} series, no finite value")
            for query in variable_queries(dash):
                m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
                assert m, query
                selector = substitute(m.group(1), "e2e", "fedavg", 0)
                params = urllib.parse.urlencode({"match[]": selector, "start": start, "end": end})
                values = _get(f"{api}/label/{m.group(2)}/values?{params}")["data"]
                checked += 1
                if {"run": "e2e", "algorithm": "fedavg"}[m.group(2)] not in values:
                    failures.append(f"{name}: variable query {query} -> {values}")
        assert checked >= 40
        assert not failures, "\n".join(failures)
    finally:
        exporter.close()
        async_exporter.close()
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
