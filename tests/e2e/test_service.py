"""``mecsim serve`` end to end: a real server in a subprocess on loopback, with its Ray.

One server with a token (module fixture) takes: a run whose records equal a ``mecsim
run`` of the same scenario; the CLI verbs and the Python client; a sweep; cancelling a
queued and a running run; 50 concurrent pollers and scrapers while a run trains; a real
Prometheus scraping it across two consecutive runs with no gap in ``up`` (the
dashboards' queries answered); the web page in a real headless Chromium; the token.
Last, it is killed with SIGKILL while a run is in its third round and started again
(without a token, with two workers) on the same state folder.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.parse
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import dashboards, exprs, substitute, variable_queries
from support.service import TOKEN, ServeProcess, same_records, tiny_yaml, wait_for

from mecsim.interfaces.cli import main
from mecsim.interfaces.metrics import ASYNC_ONLY
from mecsim.interfaces.service.client import Client

pytestmark = [pytest.mark.ray, pytest.mark.own_ray, pytest.mark.slow, pytest.mark.timeout(300)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NO_PROMETHEUS = "no `prometheus` binary on PATH (Debian: apt-get install prometheus)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The service with a token (the last test kills it and starts it again without)."""
    base = tmp_path_factory.mktemp("service")
    token_file = base / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    srv = ServeProcess(
        base / "state", "--metrics-retention", "600", "--token-file", str(token_file)
    ).start()
    try:
        srv.wait_ready(AUTH)
        yield srv
    finally:
        code = srv.stop()
        assert code in (0, -15), srv.log_text()[-3000:]  # a graceful stop


@pytest.fixture(scope="module")
def client(server):
    with Client(server.url, token=TOKEN) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as h:
        yield h


@pytest.fixture(scope="module")
def finished(server, client, tmp_path_factory):
    """A 3-round run through the service, finished; (run id, its scenario file)."""
    path = tmp_path_factory.mktemp("scenario") / "tiny.yaml"
    path.write_text(tiny_yaml(rounds=3))
    run_id = client.submit(path)
    run = client.wait(run_id, timeout_s=180)
    assert run["status"] == "finished", (run, server.log_text()[-3000:])
    return run_id, path


def _reference_run(scenario: Path, out: Path, **extra: str) -> Path:
    """``mecsim run`` of the same file (in-process backend: the records are the same)."""
    args = [
        "run",
        str(scenario),
        "--backend",
        "local",
        "--no-metrics",
        "--no-plots",
        "--quiet",
        "--out",
        str(out),
        "--run-id",
        "reference",
    ]
    for k, v in extra.items():
        args += [f"--{k}", v]
    assert main(args) == 0
    return out / "reference"


# ----------------------------------------------------------------------------- a run


def test_a_run_through_the_service_equals_mecsim_run(server, client, http, finished, tmp_path):
    run_id, scenario = finished
    run = client.get(run_id)
    assert (run["status"], run["rounds_done"], run["rounds_planned"]) == ("finished", 3, 3)
    assert run["attempts"] == 1 and run["eta_s"] is None and run["error"] is None
    assert [h["status"] for h in run["history"]] == ["queued", "running", "finished"]
    fetched = client.fetch(run_id, tmp_path / "fetched")
    reference = _reference_run(scenario, tmp_path / "ref")
    same_records(fetched, reference)
    rounds = pd.read_csv(fetched / "rounds.csv")
    assert run["last_round"]["round"] == 2
    assert run["last_round"]["mean_accuracy"] == pytest.approx(rounds["mean_accuracy"].iloc[-1])
    assert run["best_accuracy"] == pytest.approx(rounds["mean_accuracy"].max())
    assert run["emulated_s"] == pytest.approx(rounds["elapsed_s"].iloc[-1])
    # the same table in every format
    as_json = pd.DataFrame(http.get(f"/runs/{run_id}/rounds").json())
    as_csv = pd.read_csv(
        io.StringIO(http.get(f"/runs/{run_id}/rounds", headers={"Accept": "text/csv"}).text)
    )
    pd.testing.assert_frame_equal(client.rounds(run_id), rounds)
    pd.testing.assert_frame_equal(as_csv, rounds)
    assert as_json["mean_accuracy"].tolist() == pytest.approx(rounds["mean_accuracy"].tolist())
    assert len(client.clients(run_id)) == len(pd.read_csv(fetched / "clients.csv"))
    assert client.summary(run_id) == (fetched / "summary.md").read_text()
    resolved = yaml.safe_load(client.scenario(run_id))
    assert resolved["execution"]["backend"] == "ray" and resolved["rounds"] == 3
    assert (reference / "run.json").exists() and json.loads((fetched / "run.json").read_text())[
        "backend"
    ] == "ray"  # it ran on the service's Ray
    for name in run["plots"]:
        png = http.get(f"/runs/{run_id}/plots/{name}.png", timeout=30)
        assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    assert "accuracy_vs_round" in run["plots"]
    # the events of a finished run: every round, then the end
    events = list(client.events(run_id))
    assert [e for e, _ in events] == ["round"] * 3 + ["end"]
    assert events[-1][1]["status"] == "finished"


def test_cli_verbs(server, http, finished, tmp_path, monkeypatch, capsys):
    run_id, scenario = finished
    monkeypatch.setenv("MECSIM_SERVER", server.url)
    monkeypatch.setenv("MECSIM_TOKEN", TOKEN)
    assert main(["submit", str(scenario), "--rounds", "2", "--set", "seed=11", "--follow"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("submitted tiny-") and out[1].startswith("round 1/2  acc ")
    assert out[2].startswith("round 2/2") and out[-1].endswith("finished after 2 of 2 rounds")
    new_id = out[0].split()[1].rstrip(":")
    # the run's web page, which a browser opens (the API's URL serves it JSON)
    page = out[0].split()[-1]
    assert page == f"{server.url.rstrip('/')}/ui/runs/{new_id}"
    assert "<html" in http.get(page).text.lower()
    sent = http.get(
        f"/runs/{new_id}", headers={"Accept": "text/html,*/*;q=0.8"}, follow_redirects=False
    )
    assert sent.status_code == 303 and sent.headers["location"] == f"/ui/runs/{new_id}"
    assert http.get(f"/runs/{new_id}").json()["id"] == new_id
    assert main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["id"] == new_id and run_id in [r["id"] for r in listed]
    assert main(["status", new_id, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["status"] == "finished" and status["rounds_done"] == 2
    assert yaml.safe_load(http.get(f"/runs/{new_id}/scenario").text)["seed"] == 11
    assert main(["status", new_id]) == 0
    assert "rounds 2 / 2" in capsys.readouterr().out
    assert main(["fetch", run_id, "-o", str(tmp_path / "got")]) == 0
    fetched = {
        p.relative_to(tmp_path / "got").as_posix()
        for p in (tmp_path / "got").rglob("*")
        if p.is_file()
    }
    assert f"fetched {len(fetched)} files" in capsys.readouterr().out
    assert {
        "rounds.csv",
        "clients.csv",
        "rounds.parquet",
        "summary.md",
        "run.json",
        "scenario.yaml",
        "optraces.jsonl",
        "plots/accuracy_vs_round.png",
    } <= fetched
    assert not any(f.startswith(("checkpoints/", ".")) for f in fetched)  # records only
    assert main(["report", str(tmp_path / "got"), "--out", str(tmp_path / "rep")]) == 0
    assert "| fedavg | 3 |" in (tmp_path / "rep" / "tables.md").read_text()
    assert main(["fetch", run_id, "-o", str(tmp_path / "got")]) == 2  # not over files
    assert main(["cancel", run_id]) == 2  # finished runs cannot be cancelled
    assert "is finished" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(tiny_yaml(training={"lr": -1}))
    assert main(["submit", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"{bad}: training.lr: Input should be greater than 0"
    )
    assert main(["status", "no-such-run"]) == 2
    monkeypatch.delenv("MECSIM_TOKEN")
    assert main(["runs"]) == 2
    assert "set MECSIM_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("MECSIM_SERVER", "http://127.0.0.1:9")
    assert main(["runs"]) == 1
    assert "cannot reach the mecsim service" in capsys.readouterr().err


def test_sweep_over_a_finished_run(server, client, http, finished, tmp_path):
    run_id, _ = finished
    import mecsim

    frame = client.sweep([run_id], ["channel.uplink.bandwidth_hz=5e6,20e6"])
    local = mecsim.sweep(
        client.fetch(run_id, tmp_path / "run"), {"channel.uplink.bandwidth_hz": [5e6, 20e6]}
    )
    assert len(frame) == 2 and frame["exact"].all()
    assert frame["round_time_mean_s"].tolist() == pytest.approx(
        local["round_time_mean_s"].tolist(), rel=1e-12
    )
    assert frame["round_time_mean_s"].iloc[0] > frame["round_time_mean_s"].iloc[1]
    png = http.get(f"/sweeps/{frame.attrs['sweep_id']}/plot.png", timeout=30)
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    r = http.post("/sweeps", json={"runs": [run_id], "set": ["training.lr=0.1,0.2"]})
    assert r.status_code == 422 and "no retraining" in r.json()["detail"][0]["msg"]


# ----------------------------------------------------------------------------- cancel


def test_cancel_a_queued_and_a_running_run(server, client, http):
    long_id = client.submit(tiny_yaml(rounds=60))
    queued_id = client.submit(tiny_yaml(rounds=2))
    wait_for(lambda: client.get(long_id)["rounds_done"] >= 1, 120, "the long run's round")
    assert client.get(queued_id)["status"] == "queued"
    cancelled = client.cancel(queued_id)
    assert cancelled["status"] == "cancelled"
    r = http.delete(f"/runs/{long_id}")
    assert r.status_code == 202 and r.json()["cancel_requested"]
    run = client.wait(long_id, timeout_s=120)
    assert run["status"] == "cancelled" and 1 <= run["rounds_done"] < 60
    rounds = client.rounds(long_id)
    assert rounds["round"].tolist() == list(range(run["rounds_done"]))  # its rounds are kept
    assert "Best mean user accuracy" in client.summary(long_id)
    assert f"stopped after {run['rounds_done']} of 60 rounds" in run["history"][-1]["note"]
    queued = client.get(queued_id)  # never started, nothing written
    assert queued["started_at"] is None and queued["attempts"] == 0
    assert [h["status"] for h in queued["history"]] == ["queued", "cancelled"]
    assert http.get(f"/runs/{queued_id}/files").json() == []


# ----------------------------------------------------------------------------- load


def test_50_concurrent_pollers_and_scrapers_while_a_run_trains(server, client):
    # 16 rounds and polls 0.25 s apart (staggered): a run on a quiet machine takes about
    # a second, and some poll must see it between its first and last round
    run_id = client.submit(tiny_yaml(rounds=16))
    failures: list[str] = []
    seen: list[list[int]] = [[] for _ in range(50)]
    running_pages: list[str] = []

    async def poller(i: int, h: httpx.AsyncClient) -> None:
        await asyncio.sleep(i * 0.005)
        for k in range(600):  # bounded: at most 600 requests per poller
            path = f"/runs/{run_id}" if (i + k) % 2 == 0 else "/metrics"
            try:
                r = await h.get(path)
            except httpx.HTTPError as exc:
                failures.append(f"{path}: {type(exc).__name__}: {exc}")
                return
            if r.status_code != 200:
                failures.append(f"{path}: HTTP {r.status_code}")
                return
            if path == "/metrics":
                if f'run="{run_id}"' in r.text:
                    running_pages.append(r.text)
            else:
                body = r.json()
                seen[i].append(body["rounds_done"])
                if body["status"] in ("finished", "failed", "cancelled"):
                    return
            await asyncio.sleep(0.25)

    async def main_loop() -> None:
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
        async with httpx.AsyncClient(
            base_url=server.url, timeout=30, limits=limits, headers=AUTH
        ) as h:
            await asyncio.wait_for(asyncio.gather(*(poller(i, h) for i in range(50))), timeout=180)

    asyncio.run(main_loop())
    assert not failures, failures[:5]
    assert all(s == sorted(s) for s in seen)  # progress never goes back
    assert any(0 < n < 16 for s in seen for n in s)  # some poll saw the run mid-way
    assert client.wait(run_id, timeout_s=60)["status"] == "finished"
    assert running_pages, "no scrape saw the run's series"
    samples = {
        s.name
        for f in text_string_to_metric_families(running_pages[-1])
        for s in f.samples
        if s.labels.get("run") == run_id
    }
    assert {"mecsim_rounds_total", "mecsim_round_duration_seconds"} <= samples


# ----------------------------------------------------------------------------- Prometheus


def _prom_get(api: str, path: str, **params) -> dict:
    r = httpx.get(f"{api}/{path}", params=params, timeout=30)
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason=NO_PROMETHEUS)
def test_prometheus_scrapes_the_service_across_two_runs_without_a_gap(server, client, tmp_path):
    host_port = urllib.parse.urlparse(server.url).netloc
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "mecsim-service", "static_configs": [{"targets": [host_port]}]}
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
        # until its storage is up Prometheus answers 503 "Service Unavailable" (not JSON)
        wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=5).status_code == 200,
            60,
            "Prometheus to be ready",
        )
        wait_for(
            lambda: _prom_get(api, "query", query='up{job="mecsim-service"}')["result"],
            60,
            "Prometheus's first scrape of the service",
        )
        t0 = time.time()
        ids = []
        # two consecutive runs, one after the other, whose clients walk over two cells
        # (so that the cells' and handovers' panels have data too)
        walking = {
            "topology": {"clients": 4, "edge_servers": 2},
            "geometry": {
                "area": {"width_m": 1000, "height_m": 200},
                "sites": {"layout": "explicit", "positions_m": [[200, 100], [800, 100]]},
                "mobility": {"model": "random_walk"},
            },
        }
        for seed in (21, 22):
            ids.append(client.submit(tiny_yaml(rounds=2, seed=seed, **walking)))
            assert client.wait(ids[-1], timeout_s=120)["status"] == "finished"

        def scraped(run_id: str) -> bool:  # no series yet until a scrape has seen the run
            result = _prom_get(api, "query", query=f'mecsim_rounds_total{{run="{run_id}"}}')[
                "result"
            ]
            return bool(result) and float(result[0]["value"][1]) == 2

        wait_for(lambda: all(scraped(i) for i in ids), 30, "the last rounds to be scraped")
        time.sleep(2)
        t1 = time.time()
        span = int(t1 - t0)
        (up,) = _prom_get(
            api, "query_range", query='up{job="mecsim-service"}', start=t0, end=t1, step=1
        )["result"]
        assert {v for _, v in up["values"]} == {"1"} and len(up["values"]) >= span - 1
        (scrapes,) = _prom_get(
            api, "query", query=f'count_over_time(up{{job="mecsim-service"}}[{span}s])', time=t1
        )["result"]
        assert float(scrapes["value"][1]) >= 0.8 * span  # a scrape every second: no gap
        (low,) = _prom_get(
            api, "query", query=f'min_over_time(up{{job="mecsim-service"}}[{span}s])', time=t1
        )["result"]
        assert low["value"][1] == "1"
        runs = _prom_get(api, "label/run/values", **{"match[]": "mecsim_run_info"})
        assert set(ids) <= set(runs)  # the dashboards' Run variable lists both
        failures, checked = [], 0
        for run_id in ids:
            for name, dash in dashboards().items():
                for expr in exprs(dash):
                    if any(m in expr for m in ASYNC_ONLY):
                        continue  # the asynchronous runs' gauges: test_monitoring's async run
                    promql = substitute(expr, run_id, "fedavg", span + 60)
                    result = _prom_get(api, "query_range", query=promql, start=t0, end=t1, step=1)[
                        "result"
                    ]
                    checked += 1
                    if not any(math.isfinite(float(v)) for s in result for _, v in s["values"]):
                        failures.append(f"{name}: {promql}")
                for query in variable_queries(dash):
                    assert query.startswith("label_values(mecsim_run_info")
        assert checked >= 80 and not failures, "\n".join(failures)
        page = httpx.get(f"{server.url}/metrics", timeout=30).text  # no token needed
        names = {f.name for f in text_string_to_metric_families(page)}
        assert {
            "mecsim_service_runs",
            "mecsim_service_queue_length",
            "mecsim_service_uptime_seconds",
        } <= names
        if shutil.which("promtool"):
            check = subprocess.run(
                ["promtool", "check", "metrics"],
                input=page,
                text=True,
                capture_output=True,
                timeout=60,
            )
            assert check.returncode == 0 and not check.stdout.strip(), check.stdout
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- web page


def _chromium_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -e '.[dev]')"
    if not shutil.which("chromium"):
        return "no `chromium` binary on PATH (Debian: apt-get install chromium)"
    if not shutil.which("chromedriver"):
        return "no `chromedriver` on PATH (Debian: apt-get install chromium-driver)"
    return None


@pytest.mark.skipif(_chromium_missing() is not None, reason=str(_chromium_missing()))
def test_web_page_in_headless_chromium(server, http, finished, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    run_id, scenario = finished
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})  # the browser sends the service's token
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": AUTH})
    wait = WebDriverWait(driver, 60)
    logs: list[dict] = []
    try:
        driver.get(f"{server.url}/")
        assert driver.title == "mecsim runs"
        row = driver.find_element(By.XPATH, f"//table[@id='runs']//tr[td/a[text()='{run_id}']]")
        cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        assert cells[1] == "finished" and cells[3] == "fedavg" and cells[4] == "3 / 3"
        assert float(cells[5]) > 0 and float(cells[6]) > 0  # best accuracy, emulated time
        row.find_element(By.LINK_TEXT, run_id).click()
        wait.until(ec.url_to_be(f"{server.url}/ui/runs/{run_id}"))
        assert len(driver.find_elements(By.CSS_SELECTOR, "table.summary")) == 2
        plots = driver.find_elements(By.CSS_SELECTOR, "img.plot")
        assert len(plots) >= 4
        for img in plots:  # every figure loaded and decoded
            assert (
                driver.execute_script(
                    "return arguments[0].complete && arguments[0].naturalWidth", img
                )
                > 100
            )
        logs += driver.get_log("browser")
        # the form: submit a scenario file, land on the new run's page, cancel it there
        driver.get(f"{server.url}/ui/submit")
        driver.find_element(By.NAME, "scenario").send_keys(str(scenario))
        driver.find_element(By.NAME, "rounds").send_keys("40")
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        wait.until(ec.url_contains("/ui/runs/tiny-"))
        new_id = driver.current_url.rsplit("/", 1)[1]
        cancel = wait.until(
            ec.element_to_be_clickable((By.XPATH, "//form[contains(@action, '/cancel')]//button"))
        )
        logs += driver.get_log("browser")
        cancel.click()
        wait_for(
            lambda: http.get(f"/runs/{new_id}").json()["status"] == "cancelled",
            120,
            "the run cancelled from the page",
        )
        driver.get(f"{server.url}/ui/runs/{new_id}")
        assert driver.find_element(By.CSS_SELECTOR, "#run td.status").text == "cancelled"
        # a bad file: the problems are listed on the form's page
        bad = tmp_path / "bad.yaml"
        bad.write_text(tiny_yaml(training={"lr": -1}))
        driver.get(f"{server.url}/ui/submit")
        driver.find_element(By.NAME, "scenario").send_keys(str(bad))
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        problems = wait.until(ec.presence_of_element_located((By.ID, "problems")))
        assert problems.text == "training.lr: Input should be greater than 0"
        # the form answered 422: Chromium logs that as a failed resource, nothing else
        logs += [
            e
            for e in driver.get_log("browser")
            if not ("/ui/runs - Failed to load resource" in e["message"] and "422" in e["message"])
        ]
        errors = [e["message"] for e in logs if e["level"] == "SEVERE"]
        assert not errors, "\n".join(errors)
    finally:
        driver.quit()


# ----------------------------------------------------------------------------- token


def test_the_token_on_a_real_server(server):
    anon = {"timeout": 10}
    assert httpx.get(f"{server.url}/healthz", **anon).status_code == 200
    assert httpx.get(f"{server.url}/metrics", **anon).status_code == 200
    for headers in ({}, {"Authorization": "Bearer " + "x" * len(TOKEN)}):
        for path in ("/runs", "/", "/readyz", "/openapi.json"):
            r = httpx.get(f"{server.url}{path}", headers=headers, **anon)
            assert r.status_code == 401, (path, headers)
    assert httpx.get(f"{server.url}/runs", headers=AUTH, **anon).status_code == 200


# ----------------------------------------------------------------------------- durability


#: the killed run's rounds: killed after its second, it must not finish in the moment
#: between the poll and the kill (at 4 rounds a loaded machine once ran its last two
#: there); 12 leaves ten, and the run resumed on the service and its reference run
#: in-process train 8 rounds fewer each than the 20 it had
KILLED_ROUNDS = 12


def test_kill9_then_restart_keeps_history_and_finishes_every_run(server, client, tmp_path):
    """Last in this file: kills the module's server while a run is in its third round
    (others queued) and starts it again on the same state folder, without a token and
    with two workers (concurrent runs give the records of `mecsim run` too)."""
    # the runs of the tests before it, when this worker ran them (pytest-xdist may hand
    # this test to a worker that did not: then there are none)
    before = {r["id"]: r for r in client.runs(limit=1000)}
    assert all(r["status"] in ("finished", "cancelled") for r in before.values())
    # KILLED_ROUNDS: killed after its second, it cannot have finished (what the service
    # does when a run finishes before the kill is tested in test_service_api: the run is
    # kept as finished)
    killed = client.submit(tiny_yaml(rounds=KILLED_ROUNDS, seed=5))
    queued = [client.submit(tiny_yaml(rounds=1, seed=s)) for s in (6, 7)]
    wait_for(lambda: client.get(killed)["rounds_done"] >= 2, 120, "round 3 to start")
    server.kill9()
    killed_dir = server.state / "runs" / killed
    before_kill = pd.read_csv(killed_dir / "rounds.csv")
    with sqlite3.connect(server.state / "mecsim.sqlite") as db:
        status = dict(db.execute("SELECT id, status FROM runs").fetchall())
    assert {k: status[k] for k in (killed, *queued)} == {
        killed: "running",
        queued[0]: "queued",
        queued[1]: "queued",
    }

    # no token this time, and two workers: runs prepared and run side by side
    server.args = ("--metrics-retention", "600", "--workers", "2")
    server.start()
    with Client(server.url) as c:
        # the history is kept: every earlier run and its records are still there
        after = {r["id"]: r for r in c.runs(limit=1000)}
        assert {k: after[k]["status"] for k in before} == {
            k: v["status"] for k, v in before.items()
        }
        for some in [k for k, v in before.items() if v["status"] == "finished"][:1]:
            assert len(c.rounds(some)) == before[some]["rounds_done"]
        for run_id in (killed, *queued):
            assert c.wait(run_id, timeout_s=180)["status"] == "finished"
        views = {r: c.get(r) for r in (killed, *queued)}
        hist = [h["status"] for h in views[killed]["history"]]
        assert hist == ["queued", "running", "interrupted", "running", "finished"]
        assert views[killed]["history"][2]["note"] == "the server stopped while it ran"
        assert views[killed]["attempts"] == 2
        # FIFO: the interrupted run went first, then the queued ones in order
        started = [
            [h["at"] for h in views[r]["history"] if h["status"] == "running"][-1]
            for r in (killed, *queued)
        ]
        assert started == sorted(started)
        # with two workers the first queued run ran while the interrupted one did
        ended = lambda r: [h["at"] for h in views[r]["history"]][-1]  # noqa: E731
        assert started[1] < ended(killed)
        got = {r: c.fetch(r, tmp_path / r) for r in (killed, queued[0])}
    for run_id, rounds, seed in ((killed, KILLED_ROUNDS, 5), (queued[0], 1, 6)):
        scenario = tmp_path / f"{run_id}.yaml"
        scenario.write_text(tiny_yaml(rounds=rounds, seed=seed))
        same_records(got[run_id], _reference_run(scenario, tmp_path / f"ref-{run_id}"))
    # the interrupted run resumed from its newest checkpoint: the rounds before it were
    # not run again (their host wall times are the first process's), and no second
    # folder was needed
    resumes = json.loads((killed_dir / "run.json").read_text())["resumes"]
    assert resumes, f"the run started again instead of resuming; server log:\n{server.log_text()}"
    resumed_from = resumes[0]["from_round"]
    assert resumed_from >= 1
    after_resume = pd.read_csv(killed_dir / "rounds.csv")
    assert (
        after_resume["host_wall_s"][:resumed_from].tolist()
        == before_kill["host_wall_s"][:resumed_from].tolist()
    )
    assert not list((server.state / "runs").glob(f"{killed}.attempt-*"))


def test_a_server_told_to_stop_says_what_it_waits_for(server):
    """Last in this file: SIGTERM while a run trains. The server says which runs it waits
    for and for how long, the run stops (its round in progress discarded) and is left
    interrupted (it resumes at the next start), and the exit is the graceful one
    (uvicorn re-raises the signal)."""
    with Client(server.url, token=TOKEN) as c:  # (after the kill -9 test it has none)
        run_id = c.submit(tiny_yaml(rounds=KILLED_ROUNDS, seed=8))
        wait_for(lambda: c.get(run_id)["rounds_done"] >= 1, 120, "a round to finish")
    assert server.stop() in (0, -15)
    log = server.log_text()
    assert f"waiting for 1 running run(s) to stop ({run_id}; a round in progress" in log
    assert "at most 60 s" in log and "every run stopped in" in log
    with sqlite3.connect(server.state / "mecsim.sqlite") as db:
        (status,) = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert status == "interrupted"
