"""The service without Ray: its state, its checks of submissions, its HTTP layer.

The HTTP tests run the real application on a real uvicorn on loopback, in a thread of
this process with the workers not started (nothing queued runs), so they need no Ray:
validation as ``mecsim validate``, data-root confinement, token, body and queue bounds,
Host/Origin checks, cancelling a queued run, and schemathesis over the OpenAPI spec.
The same server in a subprocess with Ray, running runs, is tested in test_service.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.scenarios import tiny
from support.service import TOKEN, ThreadServer, tiny_yaml

from mecsim.interfaces.cli import main
from mecsim.interfaces.service.app import ServiceConfig, create_app
from mecsim.interfaces.service.jobs import StateError, Store
from mecsim.interfaces.service.monitoring import RunSeries
from mecsim.interfaces.service.submission import (
    PATH_FIELDS,
    SERVICE_FIELDS,
    Rejected,
    prepare_submission,
)
from mecsim.run.loop import run
from mecsim.scenario import Scenario
from mecsim.store.session import run_in_folder

AUTH = {"Authorization": f"Bearer {TOKEN}"}


# ----------------------------------------------------------------------------- the store


def test_store_is_a_fifo_queue_with_cancel_and_recovery(tmp_path):
    store = Store(tmp_path / "state")
    for i in range(3):
        store.add_run(f"r{i}", "tiny", "fedavg", "x: 1", 2, max_waiting=10)
    first = store.claim_next()
    assert first.id == "r0" and first.status == "queued"  # the status it waited with
    assert store.get_run("r0").status == "running" and store.get_run("r0").attempts == 1
    assert store.request_cancel("r1") == "cancelled"  # waiting: leaves the queue
    assert store.request_cancel("r0") == "stopping"  # running: flagged
    assert store.cancel_requested("r0") and store.get_run("r0").status == "running"
    assert store.request_cancel("r1") == "ended" and store.request_cancel("nope") is None
    assert store.claim_next().id == "r2"  # r1 was skipped
    assert store.claim_next() is None
    store.round_done("r2", 0, {"round": 0, "mean_accuracy": float("nan"), "host_wall_s": 2.0})
    store.round_done("r2", 1, {"round": 1, "mean_accuracy": 0.5, "host_wall_s": 4.0})
    assert store.get_run("r2").rounds_done == 2
    r2 = store.get_run("r2")
    assert (r2.best_accuracy, r2.emulated_s, r2.host_wall_s) == (0.5, None, 6.0)
    assert r2.eta_s == 0.0  # 2 of 2 rounds done
    store.round_done(
        "r2", 1, {"round": 1, "mean_accuracy": 0.25, "host_wall_s": 1.0, "elapsed_s": 9.5}
    )  # a round recorded again replaces it
    r2 = store.get_run("r2")
    assert (r2.best_accuracy, r2.emulated_s, r2.host_wall_s) == (0.25, 9.5, 3.0)
    store.clear_rounds("r2", first=1)  # back to its first round (a resume's checkpoint)
    r2 = store.get_run("r2")
    assert (r2.rounds_done, r2.best_accuracy, r2.host_wall_s) == (1, None, 2.0)
    store.round_done(
        "r2", 1, {"round": 1, "mean_accuracy": 0.25, "host_wall_s": 1.0, "elapsed_s": 9.5}
    )
    assert store.rounds("r2", after=0) == [
        {"round": 1, "mean_accuracy": 0.25, "host_wall_s": 1.0, "elapsed_s": 9.5}
    ]
    store.close()
    # a server that died: its running runs are interrupted, and wait first in the queue,
    # but one whose cancel was requested (r0) is cancelled, never resumed
    store = Store(tmp_path / "state")
    assert sorted(store.recover()) == ["r2"]
    assert store.get_run("r0").status == "cancelled"
    store.add_run("r3", "tiny", "fedavg", "x: 1", 2, max_waiting=10)
    assert [store.claim_next().id for _ in range(2)] == ["r2", "r3"]
    assert store.claim_next() is None
    hist = store.get_run("r2").history
    assert [h["status"] for h in hist] == ["queued", "running", "interrupted", "running"]
    assert [h["status"] for h in store.get_run("r0").history] == [
        "queued",
        "running",
        "cancelled",
    ]
    assert store.counts()["running"] == 2
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("records", ["whole", "short", "unreadable"])
def test_a_run_that_finished_as_the_server_died_is_kept_not_run_again(
    tmp_path, monkeypatch, records
):
    """The server died after the run's records said "finished" but before the store
    heard: on restart the run is finished with its recorded rounds (the store given the
    ones it missed, the figures drawn), not started again from round 0 in a new folder.
    A folder that says finished without every round in its rounds.csv starts again from
    round 0 instead, kept beside the new one, and nothing is half-written to the store."""
    from mecsim.interfaces.service.jobs import _json_safe
    from mecsim.interfaces.service.worker import Worker
    from mecsim.store.runfolder import read_meta

    store = Store(tmp_path / "state")
    text = tiny_yaml(rounds=3, metrics={"enabled": False})
    store.add_run("r0", "tiny", "fedavg", text, 3, max_waiting=10)
    claimed = store.claim_next()
    out = store.run_dir("r0")
    rows = run_in_folder(Scenario.model_validate(yaml.safe_load(text)), out).rows
    store.round_done("r0", 0, rows[0])  # the store heard of the first round only
    assert read_meta(out)["status"] == "finished" and not (out / "plots").exists()
    csv_text = (out / "rounds.csv").read_text()
    if records == "short":  # the header and two of the three rounds
        (out / "rounds.csv").write_text("".join(csv_text.splitlines(True)[:3]))
    elif records == "unreadable":
        (out / "rounds.csv").write_text(csv_text.replace("round,", "rnd,", 1))
    written = {p: p.stat().st_mtime_ns for p in out.glob("*.csv")}
    store.close()

    store = Store(tmp_path / "state")  # the server starts again
    assert store.recover() == [claimed.id]
    again = store.claim_next()
    assert again.status == "interrupted"
    worker = Worker(store)
    started = []
    monkeypatch.setattr(
        worker, "_start", lambda r: (started.append((r.id, store.get_run("r0").rounds_done)), [])[1]
    )
    worker._execute(again)
    view = store.get_run("r0")
    if records != "whole":
        # started again from round 0 (here a stub), the old folder kept, the store's
        # rounds forgotten first
        assert started == [("r0", 0)]
        assert not out.exists() and (out.parent / "r0.attempt-1").is_dir()  # attempt 1's
        assert view.status == "failed"  # the stub ran no round
        store.close()
        return
    assert started == []
    assert view.status == "finished" and view.rounds_done == 3 and view.attempts == 2
    assert [h["status"] for h in view.history] == [
        "queued",
        "running",
        "interrupted",
        "running",
        "finished",
    ]
    # every value as the run produced it (through JSON, as the store keeps rows)
    assert store.rounds("r0") == [
        json.loads(json.dumps({k: _json_safe(v) for k, v in r.items()})) for r in rows
    ]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.csv")} == written  # not rewritten
    assert not list(out.parent.glob("r0.attempt-*"))
    assert sorted(p.suffix for p in (out / "plots").iterdir()) and all(
        p.stat().st_size > 0 for p in (out / "plots").iterdir()
    )
    store.close()


def _samples(page: str) -> dict[tuple, float]:
    """A text-format page's samples, {(name, sorted labels): value}, without the
    ``_created`` timestamps (when a series was made, not what it says)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.slow
def test_an_adopted_run_s_prometheus_series_are_rebuilt_from_its_records(tmp_path, monkeypatch):
    """A run that finished as the server died: the restarted server's /metrics shows it
    with every series the exporter that watched it had at its end (counters, gauges,
    histograms of the clients' rates and phases, the last checkpoint), rebuilt from the
    records, and keeps them for the retention like any finished run's."""
    from prometheus_client import CollectorRegistry, generate_latest

    from mecsim.interfaces.metrics import MetricsExporter
    from mecsim.interfaces.service.worker import Worker

    store = Store(tmp_path / "state")
    text = tiny_yaml(rounds=3, faults={"crash_prob": 0.3, "dropout_prob": 0.2})
    store.add_run("r0", "tiny", "fedavg", text, 3, max_waiting=10)
    store.claim_next()
    out = store.run_dir("r0")
    live = MetricsExporter(registry=CollectorRegistry())
    run_in_folder(Scenario.model_validate(yaml.safe_load(text)), out, observers=[live])
    expected = _samples(generate_latest(live.registry).decode())
    store.close()

    store = Store(tmp_path / "state")  # the server starts again
    store.recover()
    series = RunSeries(retention_s=600)
    worker = Worker(store, exporter=series.exporter, on_finished=series.finished)
    monkeypatch.setattr(worker, "_start", lambda r: pytest.fail("the run was started again"))
    worker._execute(store.claim_next())
    assert store.get_run("r0").status == "finished"
    got = _samples(series.render())
    assert len(series) == 1  # kept as a finished run's, for the retention
    assert got[("mecsim_rounds_total", (("algorithm", "fedavg"), ("run", "r0")))] == 3
    assert any(
        name == "mecsim_channel_rate_bytes_per_second_count" and value > 0
        for (name, _), value in got.items()
    )
    key = ("mecsim_checkpoint_write_seconds", (("algorithm", "fedavg"), ("run", "r0")))
    assert got.pop(key) == pytest.approx(expected.pop(key), abs=1e-6)  # run.json: to the µs
    assert got == expected
    store.close()


def test_an_interrupted_run_whose_folder_another_process_holds_fails_untouched(
    tmp_path, monkeypatch
):
    """A folder still locked by another live process after LOCK_WAIT_S (a user's
    `mecsim run --resume` on it, say) is not renamed or run again: the run fails, saying
    so, and the folder and its records stay as they were."""
    from mecsim.interfaces.service import worker as worker_module
    from mecsim.store.runfolder import RunLock, read_meta, write_meta

    monkeypatch.setattr(worker_module, "LOCK_WAIT_S", 0.3)
    store = Store(tmp_path / "state")
    text = tiny_yaml(rounds=2, metrics={"enabled": False})
    store.add_run("r0", "tiny", "fedavg", text, 2, max_waiting=10)
    store.claim_next()
    out = store.run_dir("r0")
    run_in_folder(Scenario.model_validate(yaml.safe_load(text)), out)
    write_meta(out, {**read_meta(out), "status": "interrupted"})  # as if cut short

    def files():  # but the lock file, which the other process's lock writes
        return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"}

    before = files()
    store.close()
    store = Store(tmp_path / "state")
    store.recover()
    again = store.claim_next()
    worker = worker_module.Worker(store)
    started = []
    monkeypatch.setattr(worker, "_start", lambda r: started.append(r.id) or [])
    lock = RunLock(out).acquire()  # the other process
    try:
        worker._execute(again)
    finally:
        lock.release()
    view = store.get_run("r0")
    assert view.status == "failed" and "in use by another mecsim process" in view.error
    assert started == [] and not list(out.parent.glob("r0.attempt-*"))
    assert files() == before
    store.close()


def test_queue_bound_and_one_server_per_state_folder(tmp_path):
    store = Store(tmp_path / "s")
    store.add_run("a", "n", "fedavg", "x: 1", 1, max_waiting=2)
    store.add_run("b", "n", "fedavg", "x: 1", 1, max_waiting=2)
    from mecsim.interfaces.service.jobs import QueueFull

    with pytest.raises(QueueFull, match="2 runs are waiting"):
        store.add_run("c", "n", "fedavg", "x: 1", 1, max_waiting=2)
    assert store.get_run("c") is None
    with pytest.raises(StateError, match="in use by another mecsim serve"):
        Store(tmp_path / "s")
    store.close()
    Store(tmp_path / "s").close()  # the lock goes with the server


@pytest.mark.parametrize("kind", ["garbage", "foreign-db", "foreign-folder", "newer"])
def test_corrupt_or_foreign_state_is_a_one_line_error(tmp_path, capsys, kind):
    state = tmp_path / "state"
    state.mkdir()
    db = state / "mecsim.sqlite"
    if kind == "garbage":
        db.write_bytes(b"not a database at all " * 100)
        expected = "not a usable mecsim state database"
    elif kind == "foreign-db":
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
        expected = "another application"
    elif kind == "foreign-folder":
        (state / "thesis.tex").write_text("x")
        expected = "not a mecsim state folder"
    else:
        Store(state).close()
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA user_version = 99")
        conn.commit()
        conn.close()
        expected = "newer mecsim"
    before = sorted(p.name for p in state.iterdir())
    assert main(["serve", "--state", str(state), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and "Traceback" not in err[0], err
    assert sorted(p.name for p in state.iterdir()) == before  # nothing changed


def test_the_listening_socket_is_tcp_so_responses_are_not_delayed():
    """asyncio sets TCP_NODELAY on accepted connections only when the listening socket's
    protocol is IPPROTO_TCP; without it a keep-alive client waits ~40 ms for each
    response's body (Nagle against the client's delayed ACK)."""
    import socket

    from mecsim.interfaces.cli.service import _listen

    sock = _listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.type == socket.SOCK_STREAM
    finally:
        sock.close()


def test_serve_refuses_a_non_loopback_host_without_a_token(tmp_path, capsys):
    assert main(["serve", "--host", "0.0.0.0", "--state", str(tmp_path / "s")]) == 2
    assert "--token-file" in capsys.readouterr().err
    short = tmp_path / "short"
    short.write_text("abc\n")
    assert main(["serve", "--token-file", str(short), "--state", str(tmp_path / "s")]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before anything is made


# ----------------------------------------------------------------------------- submissions


def _submit(tmp_path: Path, text: str | dict | None, data_root: Path | None = None, **kw: Any):
    return prepare_submission(
        text,
        rounds=kw.get("rounds"),
        overrides=kw.get("set", {}),
        data_root=data_root,
        tmp_dir=tmp_path / "tmp",
        runs_dir=tmp_path / "runs",
    )


def test_submissions_are_validated_exactly_as_mecsim_validate(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(tiny_yaml(training={"lr": -1, "epochs": 0}, rounds="many"))
    assert main(["validate", str(bad)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3
    with pytest.raises(Rejected) as exc:
        _submit(tmp_path, bad.read_text())
    got = [f"{bad}: {p.field}: {p.msg}" for p in exc.value.problems]
    assert got == lines  # the same problems, field by field
    assert {p.field for p in exc.value.problems} == {"rounds", "training.lr", "training.epochs"}
    with pytest.raises(Rejected) as exc:
        _submit(tmp_path, "rounds: [unclosed")
    (problem,) = exc.value.problems
    assert "invalid YAML" in problem.msg and "line 1" in problem.field
    assert not list((tmp_path / "tmp").iterdir())  # the spooled files are gone


def test_overrides_and_service_fields(tmp_path):
    run_id, sc = _submit(
        tmp_path,
        tiny_yaml(execution={"backend": "local", "ray_address": "10.0.0.1:6379"}),
        rounds=3,
        set={"channel.uplink.bandwidth_hz": 5e6, "seed": 9},
    )
    assert re.fullmatch(r"tiny-\d{8}-\d{6}-[0-9a-f]{6}", run_id)
    assert sc.rounds == 3 and sc.seed == 9 and sc.channel.uplink.bandwidth_hz == 5e6
    # runs use the service's Ray and write under its state folder, whatever was asked
    assert sc.execution.backend == "ray" and sc.execution.ray_address is None
    assert sc.outputs.dir == str(tmp_path / "runs") and sc.outputs.run_id == run_id
    with pytest.raises(Rejected) as exc:
        _submit(
            tmp_path,
            tiny_yaml(),
            set={
                "outputs.dir": "/etc",
                "execution.backend": "local",
                "nope.x": 1,
                "training.lr": 0,
            },
        )
    fields = [p.field for p in exc.value.problems]
    assert fields == ["outputs.dir", "execution.backend", "nope.x"]
    with pytest.raises(Rejected) as exc:
        _submit(tmp_path, tiny_yaml(), rounds=2, set={"training.lr": 0})
    assert [p.field for p in exc.value.problems] == ["training.lr"]
    _, default = _submit(tmp_path, None)  # no scenario: the embedded default
    assert default.name == "default" and default.rounds == 30


def test_files_named_by_a_scenario_must_lie_under_the_data_root(tmp_path):
    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    (root / "traces").mkdir()
    (root / "escape").symlink_to(tmp_path)  # a link out of the data root
    trace = {"model": "trace", "path": "traces/t.csv"}
    outside = [
        (None, {"dataset": {"name": "mnist", "root": "mnist"}}, "dataset.root", "without"),
        (root, {"dataset": {"name": "mnist", "root": "/etc"}}, "dataset.root", "outside"),
        (root, {"dataset": {"name": "mnist", "root": "../"}}, "dataset.root", "outside"),
        (root, {"dataset": {"name": "mnist", "root": "escape/x"}}, "dataset.root", "outside"),
        (root, {"dataset": {"name": "mnist", "root": "~"}}, "dataset.root", "outside"),
        (root, {"channel": {**trace, "path": "/etc/passwd"}}, "channel.path", "outside"),
    ]
    for data_root, section, field, why in outside:
        with pytest.raises(Rejected) as exc:
            _submit(tmp_path, tiny_yaml(**section), data_root)
        (problem,) = exc.value.problems
        assert problem.field == field and why in problem.msg, (section, problem)
    rows = "".join(f"0,{c},{5 + c},20\n" for c in range(4))
    (root / "traces" / "t.csv").write_text("time_s,client_id,uplink_mbps,downlink_mbps\n" + rows)
    _, sc = _submit(tmp_path, tiny_yaml(channel=trace), root)
    assert sc.channel.path == str(root / "traces" / "t.csv")  # stored absolute
    # a dataset root under the data root is taken, made absolute, and then checked by the
    # pre-flight of a run like any other: this one holds no MNIST files
    with pytest.raises(Rejected) as exc:
        _submit(tmp_path, tiny_yaml(dataset={"name": "mnist", "root": "mnist"}), root)
    (problem,) = exc.value.problems
    assert problem.field == "dataset.root" and str(root / "mnist") in problem.msg, problem


def test_every_file_field_of_the_scenario_is_confined_or_set_by_the_service():
    """A new scenario field naming a file must join PATH_FIELDS (or SERVICE_FIELDS)."""
    from pydantic import BaseModel

    def walk(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            dotted = f"{prefix}{name}"
            if re.search(r"(^|_)(root|path|dir|file|filename|folder)$", name):
                out.append(dotted)
            for t in getattr(f.annotation, "__args__", ()) or (f.annotation,):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    out += walk(t, dotted + ".")
        return out

    found = set(walk(Scenario, ""))
    assert {"dataset.root", "channel.path", "outputs.dir"} <= found  # the walk sees them
    assert found <= set(PATH_FIELDS) | set(SERVICE_FIELDS), found


# ----------------------------------------------------------------------------- metrics


def test_one_page_serves_every_run_and_retention_drops_finished_ones():
    now = [0.0]
    series = RunSeries(60.0, clock=lambda: now[0])
    first = series.exporter("run-a")
    run(tiny(rounds=1), "run-a", None, [first])
    from prometheus_client import generate_latest

    own_page = generate_latest(first.registry).decode()
    series.finished("run-a")  # kept as text from here on
    live = series.exporter("run-b")
    run(tiny(rounds=2, algorithm={"name": "local"}), "run-b", None, [live])

    def families() -> dict[str, list]:
        page = series.render()
        found: dict[str, list] = {}
        for f in text_string_to_metric_families(page):
            assert f.name not in found, f"family {f.name} in two groups"
            found[f.name] = f.samples
        return found

    def rounds_by_run() -> dict[str, float]:
        return {
            s.labels["run"]: s.value
            for s in families()["mecsim_rounds"]
            if s.name == "mecsim_rounds_total"
        }

    assert rounds_by_run() == {"run-a": 1.0, "run-b": 2.0}
    # the kept run's samples are exactly those its exporter had, histograms included
    kept = sorted(
        (s.name, sorted(s.labels.items()), s.value)
        for ss in families().values()
        for s in ss
        if s.labels.get("run") == "run-a"
    )
    own = sorted(
        (s.name, sorted(s.labels.items()), s.value)
        for f in text_string_to_metric_families(own_page)
        for s in f.samples
    )
    assert kept == own and any(name.endswith("_bucket") for name, _, _ in kept)
    promtool = shutil.which("promtool")  # Debian's prometheus package ships it
    if promtool:  # Prometheus's own linter accepts the spliced page
        check = subprocess.run(
            [promtool, "check", "metrics"],
            input=series.render(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    live.rounds.labels(run="run-b", algorithm="local").inc()  # live runs render afresh
    assert rounds_by_run() == {"run-a": 1.0, "run-b": 3.0}
    now[0] = 59.0
    assert series.expire() == [] and len(series) == 1
    now[0] = 60.0
    assert series.expire() == ["run-a"]
    assert rounds_by_run() == {"run-b": 3.0}
    assert 'run="run-a"' not in series.render()  # every family forgot it
    series.finished("run-b")
    assert len(series) == 1 and rounds_by_run() == {"run-b": 3.0}
    assert not live.serves and live._server is None
    with pytest.raises(ValueError):
        RunSeries(-1.0)


# ----------------------------------------------------------------------------- HTTP layer


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The app with a token, a 64 KiB body bound, 3 waiting runs at most, no workers."""
    base = tmp_path_factory.mktemp("api")
    root = base / "data"
    root.mkdir()
    config = ServiceConfig(
        state_dir=base / "state",
        token=TOKEN,
        data_root=root,
        max_body_bytes=64 * 1024,
        max_queued=3,
        start_workers=False,
    )
    with ThreadServer(create_app(config)) as server:
        server.store = server.server.config.app.state.store
        yield server


@pytest.fixture
def client(api):
    with httpx.Client(base_url=api.url, headers=AUTH, timeout=30) as c:
        yield c
    for queued in api.store.list_runs(["queued"])[0]:  # leave the queue empty for the next
        api.store.request_cancel(queued.id)


def test_token_is_required_everywhere_but_health_and_metrics(api):
    with httpx.Client(base_url=api.url, timeout=30) as anon:
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/metrics").status_code == 200
        for method, path in [
            ("GET", "/"),
            ("GET", "/runs"),
            ("GET", "/readyz"),
            ("GET", "/openapi.json"),
            ("GET", "/docs"),
            ("POST", "/runs"),
            ("GET", "/runs/x-1"),
            ("DELETE", "/runs/x-1"),
            ("GET", "/sweeps/x"),
        ]:
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token-of-same-length!"},
                {"Authorization": TOKEN},
                {"Authorization": f"Basic {TOKEN}"},
            ):
                r = anon.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert r.headers["www-authenticate"] == "Bearer"
        assert anon.get("/runs", headers=AUTH).status_code == 200


def test_bad_scenario_is_422_per_field_and_nothing_is_queued(api, client):
    before = client.get("/runs").json()["total"]
    r = client.post(
        "/runs", json={"scenario": tiny_yaml(training={"lr": 0}, topology={"clients": 0})}
    )
    assert r.status_code == 422
    assert {p["field"] for p in r.json()["detail"]} == {"training.lr", "topology.clients"}
    r = client.post(
        "/runs", json={"scenario": yaml.safe_load(tiny_yaml()), "set": {"dataset.root": "/etc"}}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "dataset.root"
    assert client.post("/runs", json={"scenario": 5}).status_code == 422
    assert (
        client.post(
            "/runs", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 422
    )
    assert client.get("/runs").json()["total"] == before
    assert list((api.store.dir / "runs").iterdir()) == []


def test_submit_cancel_queued_and_the_queue_bound(api, client):
    ids = []
    for _ in range(3):
        r = client.post("/runs", json={"scenario": tiny_yaml(), "rounds": 2})
        assert r.status_code == 201, r.text
        body = r.json()
        assert r.headers["location"] == body["url"] == f"{api.url}/runs/{body['id']}"
        ids.append(body["id"])
    r = client.post("/runs", json={"scenario": tiny_yaml()})
    assert r.status_code == 429 and "bound is 3" in r.json()["detail"]
    run = client.get(f"/runs/{ids[0]}").json()
    assert (run["status"], run["rounds_done"], run["rounds_planned"]) == ("queued", 0, 2)
    assert client.get(f"/runs/{ids[0]}/rounds").status_code == 409  # no records yet
    scenario = yaml.safe_load(client.get(f"/runs/{ids[0]}/scenario").text)
    assert scenario["outputs"]["run_id"] == ids[0] and scenario["rounds"] == 2
    r = client.delete(f"/runs/{ids[0]}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.delete(f"/runs/{ids[0]}").status_code == 409
    assert client.post("/runs", json={"scenario": tiny_yaml()}).status_code == 201
    listed = client.get("/runs", params={"status": "cancelled"}).json()
    assert [r["id"] for r in listed["runs"]] == [ids[0]]
    page = client.get("/runs", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 4 and len(page["runs"]) == 2
    assert client.get("/runs/nope-1").status_code == 404
    assert client.get("/runs/..%2F..%2Fetc").status_code == 404
    assert client.get(f"/runs/{ids[1]}/files/..%2F..%2Fmecsim.sqlite").status_code == 404


def test_a_run_before_its_first_round_has_no_records_yet(api, client):
    """The records file exists (header not yet flushed) but no round has finished."""
    api.store.add_run("early-1", "tiny", "fedavg", tiny_yaml(), 2, max_waiting=100)
    while (claimed := api.store.claim_next()).id != "early-1":
        api.store.set_status(claimed.id, "failed", error="not this one")
    run_dir = api.store.run_dir("early-1")
    run_dir.mkdir(parents=True)
    (run_dir / "rounds.csv").write_text("")
    (run_dir / "clients.csv").write_text("run_id,round\n")
    for path in ("rounds", "clients", "summary"):
        r = client.get(f"/runs/early-1/{path}")
        assert r.status_code == 409 and "no finished round" in r.json()["detail"], path
    page = client.get("/ui/runs/early-1")
    assert page.status_code == 200 and "running" in page.text
    api.store.set_status("early-1", "failed", error="made by a test")
    assert client.get("/runs/early-1/rounds").status_code == 409  # an empty file


def test_body_bound_host_and_origin_checks(api, client):
    big = "#" + "x" * (70 * 1024) + "\nrounds: 2\n"
    r = client.post("/runs", json={"scenario": big})
    assert r.status_code == 413
    chunks = (
        b'{"scenario": "' + b"y" * 8192 + b'"}' if i == 0 else b" " * 8192 for i in range(10)
    )  # chunked: no Content-Length, 80 KiB sent
    r = client.post("/runs", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413
    # DNS rebinding: a foreign name resolving to 127.0.0.1 is refused
    assert client.get("/runs", headers={"Host": "evil.example:80"}).status_code == 400
    assert client.get("/runs", headers={"Host": "localhost"}).status_code == 200
    # a form on another site posting to the service
    for origin in ("http://evil.example", "null", f"{api.url}.evil.example"):
        r = client.post("/runs", json={"scenario": tiny_yaml()}, headers={"Origin": origin})
        assert r.status_code == 403, origin
        assert client.delete("/runs/x-1", headers={"Origin": origin}).status_code == 403
    own = api.url.replace("http://", "https://")  # the same site behind a TLS proxy
    assert client.delete("/runs/x-1", headers={"Origin": own}).status_code == 404
    assert client.get("/runs").json()["total"] == len(api.store.list_runs()[0])


def test_metrics_of_an_idle_service(api):
    page = httpx.get(f"{api.url}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
    }
    assert samples[("mecsim_service_ready", ())] == 0  # no workers in this fixture
    assert samples[("mecsim_service_workers", (("state", "idle"),))] == 1
    counts = api.store.counts()
    for status, n in counts.items():
        assert samples[("mecsim_service_runs", (("status", status),))] == n
    assert samples[("mecsim_service_queue_length", ())] == counts["queued"]
    r = httpx.get(f"{api.url}/readyz", headers=AUTH, timeout=10)
    assert r.status_code == 503 and "without workers" in r.json()["detail"]


def test_sweep_requests_are_checked(api, client):
    r = client.post(
        "/sweeps", json={"runs": ["nope-1"], "set": ["training.lr=0.1"], "metric": "bogus"}
    )
    assert r.status_code == 422
    fields = [p["field"] for p in r.json()["detail"]]
    assert fields == ["runs.0", "set.0", "metric"]


@pytest.mark.slow  # ~7 s of generated requests
def test_schemathesis_finds_no_server_error(api):
    """Generated requests for every operation of /openapi.json: never a 5xx (but /readyz's
    documented 503: this server has no workers), and every response conforms to the spec
    (status code, content type, body schema)."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json", headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14
    failures: list[str] = []
    calls = [0]
    for op in operations:

        @settings(
            max_examples=12,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def check(case):
            if case.method == "POST" and case.path == "/runs" and isinstance(case.body, dict):
                case.body["rounds"] = 1  # a queued run never runs here; keep it small
            response = case.call(headers=AUTH, timeout=30)
            calls[0] += 1
            not_ready = case.path == "/readyz" and response.status_code == 503  # documented
            if response.status_code >= 500 and not not_ready:
                failures.append(
                    f"{case.method} {case.formatted_path}: "
                    f"{response.status_code} {response.text[:200]}"
                )
            for check_fn in (
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ):
                try:
                    case.validate_response(response, checks=[check_fn])
                except Exception as exc:  # noqa: BLE001 - schemathesis' failure groups
                    failures.append(f"{case.method} {case.formatted_path}: {exc}"[:400])
            for queued in api.store.list_runs(["queued"])[0]:
                api.store.request_cancel(queued.id)  # keep the queue bound from biting

        check()
    assert calls[0] >= 5 * len(operations)
    assert not failures, "\n".join(sorted(set(failures))[:20])


def test_openapi_lists_the_api(client):
    spec = client.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/rounds",
        "/runs/{run_id}/clients",
        "/runs/{run_id}/summary",
        "/runs/{run_id}/plots/{name}.png",
        "/runs/{run_id}/scenario",
        "/runs/{run_id}/events",
        "/sweeps",
        "/sweeps/{sweep_id}",
        "/sweeps/{sweep_id}/plot.png",
        "/metrics",
        "/healthz",
        "/readyz",
    } <= paths
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "/" not in paths  # the web page is not part of the API


def test_client_reports_problems_by_field(api):
    from mecsim.interfaces.service.client import Client, ScenarioRejected, ServiceError

    with Client(api.url, token=TOKEN) as c:
        with pytest.raises(ScenarioRejected) as exc:
            c.submit(tiny_yaml(rounds=0))
        assert exc.value.problems == [
            {"field": "rounds", "msg": "Input should be greater than or equal to 1"}
        ]
        with pytest.raises(ServiceError) as err:
            c.get("nope-1")
        assert err.value.status == 404
    with Client(api.url, token="wrong") as c, pytest.raises(ServiceError) as err:
        c.runs()
    assert err.value.status == 401
    os.environ.pop("MECSIM_TOKEN", None)
    with Client("http://127.0.0.1:9") as c, pytest.raises(ServiceError) as err:
        c.runs()
    assert err.value.status == 0 and "cannot reach" in str(err.value)
    assert json.loads(json.dumps(err.value.args))  # plain data


# ----------------------------------------------------------------------------- figures


@pytest.mark.slow
def test_figures_drawn_in_a_child_process_equal_the_run_s_own(tmp_path):
    """The service draws a run's figures in a child (matplotlib would hold the API's GIL):
    from the records folder it draws the same pixels PlotWriter draws from the rows."""
    import matplotlib.image as mpimg
    import numpy as np

    from mecsim.analysis.plots import PlotWriter
    from mecsim.interfaces.service.plotjob import ChildPlotWriter
    from mecsim.store.records import RecordsWriter

    own, child = tmp_path / "own", tmp_path / "child"
    run(
        tiny(rounds=3, evaluation={"every": 2}),
        "figs",
        None,
        [
            RecordsWriter(own),
            PlotWriter(own / "plots"),
            RecordsWriter(child),
            ChildPlotWriter(child / "plots"),
        ],
    )
    names = sorted(p.name for p in (own / "plots").glob("*.png"))
    assert "client_accuracy.png" in names and "accuracy_vs_round.png" in names
    assert sorted(p.name for p in (child / "plots").glob("*.png")) == names
    for name in names:
        a, b = mpimg.imread(own / "plots" / name), mpimg.imread(child / "plots" / name)
        assert a.shape == b.shape and np.array_equal(a, b), name


@pytest.mark.slow
def test_a_plot_child_dies_with_the_process_that_started_it(tmp_path):
    """A service killed outright takes its plot child with it (the restarted service
    draws the same run's figures again): here a parent process starts the child as
    draw_in_child does, its drawing replaced by a long sleep, and is SIGKILLed."""
    import signal
    import sys
    import time

    import psutil

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    child_code = (
        "import sys, time; import mecsim.interfaces.service.plotjob as p; "
        "p.plot_run_folder = lambda *a: time.sleep(120) or []; sys.exit(p.main())"
    )
    parent_code = (
        "import os, subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', {child_code!r}, "
        f"{str(tmp_path)!r}, '3', str(os.getpid())]); "
        "print(c.pid, flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        time.sleep(3)  # the child has imported mecsim and asked to die with its parent
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the plot child outlived its parent"
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait(10)
        if child is not None and child.is_running():
            child.kill()


def test_a_mobility_trace_outside_the_data_root_is_refused(tmp_path):
    """A trace file is read by the run: like every file field, it must lie under the
    service's --data-root (else a submission could make the server parse any file)."""
    geometry = {
        "area": {"width_m": 200, "height_m": 200},
        "sites": {"layout": "explicit", "positions_m": [[100, 100]]},
        "mobility": {"model": "trace", "trace": {"format": "ns2", "path": "/etc/passwd"}},
    }
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(Rejected) as exc:
        _submit(tmp_path, tiny_yaml(geometry=geometry), root)
    fields = {p.field for p in exc.value.problems}
    assert "geometry.mobility.trace.path" in fields, exc.value.problems
