"""A service one request cannot take down: the size limits of a run, bodies read within
bounds, hostile input answered 4xx (never 5xx, never a traceback), symlinks, framing,
slow clients, duplicate Host headers, a busy port, and cancelled runs at recovery."""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import sys
import time

import httpx
import pytest
from support.paths import DATA
from support.scenarios import tiny
from support.service import TOKEN, ThreadServer, tiny_yaml

from mecsim.interfaces.cli import main
from mecsim.interfaces.service import bounded
from mecsim.interfaces.service.app import ServiceConfig, create_app
from mecsim.interfaces.service.connections import TimedH11Protocol, TimedHttpToolsProtocol
from mecsim.interfaces.service.jobs import Store
from mecsim.run import limits
from mecsim.scenario.overrides import OverrideError, parse_values

AUTH = {"Authorization": f"Bearer {TOKEN}"}


# ----------------------------------------------------------------------------- limits


def test_a_run_s_cost_worked_out_by_hand():
    # 8,000 embedded train samples over 10 clients: 800 each; 800 / 32 = 25 batches;
    # half of the 10 clients per round, 2 epochs, 30 rounds: 30 x 5 x 2 x 25 = 7,500 steps
    sc = tiny(
        rounds=30,
        dataset={"train_size": None, "partition": {"method": "iid"}},
        topology={"clients": 10, "participation": 0.5},
        training={"epochs": 2, "batch_size": 32},
    )
    cost = limits.estimate(sc, cores=2)
    assert (cost.samples_per_client, cost.steps_per_client_round, cost.steps) == (800, 50, 7_500)
    edge = limits.Limits(30, 10, 7_500, 1.0, 10, max_client_samples=8_000)
    assert limits.check(sc, edge, cores=2) == []  # at each limit: accepted
    over = limits.Limits(29, 9, 7_499, 0.5, 10, max_client_samples=7_999)
    problems = dict(limits.check(sc, over, cores=2))
    assert set(problems) == {
        "rounds",
        "topology.clients",
        "training.epochs",
        "execution.hosts",
        "dataset.partition.samples_per_client",
    }
    assert (
        "8,000 samples (10 clients x 800, train and test)"
        in problems["dataset.partition.samples_per_client"]
    )
    assert (
        "7,500 steps" in problems["training.epochs"]
        and "--max-steps" in problems["training.epochs"]
    )
    assert "2 host processes on 2 cores" in problems["execution.hosts"]
    # samples_per_client given: 3,000 / 7 -> 429 batches
    sc = tiny(
        rounds=1,
        dataset={"partition": {"method": "iid", "samples_per_client": 3000}},
        training={"epochs": 1, "batch_size": 7},
    )
    assert limits.estimate(sc).steps_per_client_round == math.ceil(3000 / 7) == 429
    # beyond SQLite's integers even with the limits lifted
    sc = tiny(rounds=10**20)
    assert [f for f, _ in limits.check(sc, limits.LOCAL.lifted())] == ["rounds", "training.epochs"]


def test_mecsim_run_refuses_a_typo_sized_run_and_lifts_its_limits_on_request(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "huge.yaml"
    # metrics on any free port: validate checks the port, and another test process may
    # hold the default one (9464) meanwhile
    path.write_text(
        tiny_yaml(
            training={"epochs": 1_000_000_000, "batch_size": 16},
            metrics={"enabled": True, "port": 0},
        )
    )
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "training.epochs" in err and "--max-steps" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing written
    assert main(["validate", str(path)]) == 0  # the schema itself is satisfied


def test_the_pre_flight_of_per_client_draws_is_linear_in_the_data_set():
    """5,000 clients each drawing 8,000 of the 8,000 train samples would be 40 million
    indices (320 MB) if drawn: the pre-flight checks them without drawing."""
    import tracemalloc

    from mecsim.run.preflight import find_problems

    sc = tiny(
        dataset={
            "train_size": 8000,
            "test_size": 2000,
            "partition": {"method": "iid", "samples_per_client": 8000},
        },
        topology={"clients": 5000, "participation": 0.001},
    )
    tracemalloc.start()
    try:
        found = find_problems(sc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not found.problems, found.problems
    assert peak < 100 * 2**20, peak
    bad = tiny(dataset={"partition": {"method": "iid", "samples_per_client": 401}})
    (problem,) = find_problems(bad).problems
    assert problem.field == "dataset.partition.samples_per_client" and "400" in problem.message


def test_a_sweep_axis_is_counted_before_it_is_made():
    with pytest.raises(OverrideError, match="more than the 1,000"):
        parse_values("1:2:1000000000000", max_values=1000)
    with pytest.raises(OverrideError, match="more than the 3"):
        parse_values("1,2,3,4", max_values=3)
    with pytest.raises(OverrideError, match="nested deeper"):
        parse_values("[" * 70 + "]" * 70)
    assert parse_values("1:3:3") == [1.0, 2.0, 3.0]


def test_mecsim_sweep_counts_its_grid_before_making_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "no-run", "--set", "deadline_s=1:2:1000", "--set", "deadline_s=1"])
    assert code == 2  # the same path twice: refused before anything
    args = ["sweep", "no-run", "--set", "deadline_s=1:2:1000"]
    assert main([*args, "--set", "backhaul.rate_bps=1:2:1001"]) == 2
    assert "1,001,000 points, above the limit of 1,000,000" in capsys.readouterr().out


# ----------------------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    "raw, field, words",
    [
        (b'{"set": {"training.lr": NaN}}', "(body)", "NaN"),
        (b'{"set": {"training.lr": 1e400}}', "(body)", "too large"),
        (b'{"rounds": 100000000000000000000000}', "(body)", "2^63"),
        (b'{"scenario": "name: \\ud800"}', "scenario", "surrogate"),
        (b'{"scenario": "a\\u0000b"}', "scenario", "NUL"),
        (b'{"set": {"a": ' + b"[" * 900 + b"]" * 900 + b"}}", "set.a.0", "deeper"),
        (b'{"set": {"x": "' + b"y" * 70_000 + b'"}}', "set.x", "70,000 characters"),
        (b"\xff\xfe", "(body)", "UTF-8"),
        (b"[1, 2]", "(body)", "JSON object"),
        (b'{"rounds": 0}', "rounds", "greater than or equal"),
    ],
)
def test_bodies_are_parsed_within_bounds(raw, field, words):
    from mecsim.interfaces.service.schemas import RunRequest

    with pytest.raises(bounded.BadBody) as info:
        bounded.parse_model(raw, RunRequest)
    (where, message), *_ = info.value.problems
    assert where.startswith(field) and words in message


def test_many_keys_are_refused_while_parsing():
    body = "{" + ",".join(f'"k{i}": 1' for i in range(1001)) + "}"
    with pytest.raises(bounded.BadBody, match="1,001 keys"):
        bounded.parse_json(body.encode())


# ----------------------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The app with a token, its default limits, 3 waiting runs at most, no workers."""
    base = tmp_path_factory.mktemp("limits")
    config = ServiceConfig(state_dir=base / "state", token=TOKEN, max_queued=3, start_workers=False)
    log = logging.getLogger("uvicorn.error")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(logging.DEBUG)
    for name in ("uvicorn.error", "mecsim.interfaces.service", ""):
        logging.getLogger(name).addHandler(handler)
    with ThreadServer(create_app(config)) as server:
        server.store = server.server.config.app.state.store
        server.log_records = records
        yield server
    for name in ("uvicorn.error", "mecsim.interfaces.service", ""):
        logging.getLogger(name).removeHandler(handler)
    del log


@pytest.fixture
def client(api):
    with httpx.Client(base_url=api.url, headers=AUTH, timeout=30) as c:
        yield c
    for queued in api.store.list_runs(["queued"])[0]:
        api.store.request_cancel(queued.id)


def _fields(r: httpx.Response) -> list[str]:
    return [p["field"] for p in r.json()["detail"]]


def test_runs_above_the_service_s_limits_are_422_naming_field_and_flag(api, client):
    big = "exceeded maximum size"  # pydantic's own bound on integers, met first
    cases = [
        (
            tiny_yaml(training={"epochs": 1_000_000_000, "batch_size": 16}),
            {},
            "training.epochs",
            "--max-steps",
        ),
        (tiny_yaml(rounds=10**20), {}, "rounds", "--max-rounds"),
        (tiny_yaml(rounds=20_000), {}, "rounds", "--max-rounds"),
        (tiny_yaml(), {"rounds": 1e20}, "rounds", big),
        (
            tiny_yaml(execution={"backend": "local", "hosts": 500}),
            {},
            "execution.hosts",
            "--max-hosts-per-core",
        ),
        (tiny_yaml(topology={"clients": 200_000}), {}, "topology.clients", "--max-clients"),
    ]
    for text, sets, field, words in cases:
        r = client.post("/runs", json={"scenario": text, "set": sets})
        assert r.status_code == 422, (field, r.text)
        assert field in _fields(r), r.text
        assert words in r.text, r.text
    assert api.store.list_runs()[1] == 0  # nothing queued


def test_hostile_bodies_are_4xx_and_the_token_comes_first(api, client):
    deep = b'{"set": {"a": ' + b"[" * 900 + b"]" * 900 + b"}}"
    hostile = [
        b'{"scenario": null, "set": {"training.lr": NaN}}',
        b'{"rounds": 100000000000000000000000}',
        b'{"scenario": "name: \\ud800"}',
        deep,
        b'{"scenario": "' + b"a: &a [1,2,3,4,5,6,7,8,9,0]\\n" + b'b: [*a,*a,*a]"}',
        b"not json",
        b"",
    ]
    for raw in hostile:
        r = client.post("/runs", content=raw, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (raw[:60], r.status_code, r.text[:200])
        # without the token: 401 before the body is even read
        r = httpx.post(f"{api.url}/runs", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 401
    r = client.post("/sweeps", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.post("/sweeps", json={"runs": ["a-1"], "set": ["deadline_s=1:2:10000000000"]})
    assert r.status_code == 422 and "max-sweep-points" in r.text or "more than" in r.text


def test_ids_paths_and_last_event_id_never_5xx(api, client):
    run_id = client.post("/runs", json={"scenario": tiny_yaml(rounds=1)}).json()["id"]
    assert client.delete(f"/runs/{run_id}").status_code == 200  # queued -> cancelled
    for path in (
        "/runs/%00",
        "/runs/a%0A",
        f"/runs/{run_id}/files/a%00b",
        f"/runs/{run_id}/plots/%00.png",
        "/sweeps/%00",
        "/ui/runs/%00",
    ):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
    for given in ("99999999999999999999999999", "-5", "abc", "1" * 5000):
        r = client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": given})
        assert r.status_code == 200 and "event: end" in r.text
    tracebacks = [r for r in api.log_records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, tracebacks[0].getMessage()


def test_pages_cannot_be_framed_or_sniffed(api, client):
    for path in ("/", "/ui/submit", "/runs", "/healthz"):
        r = client.get(path)
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


def test_plots_and_files_never_leave_the_run_folder(api, client, tmp_path):
    run_id = client.post("/runs", json={"scenario": tiny_yaml(rounds=1)}).json()["id"]
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG secret")
    plots = api.store.run_dir(run_id) / "plots"
    plots.mkdir(parents=True)
    (plots / "leak.png").symlink_to(secret)
    (plots / "own.png").write_bytes(b"\x89PNG own")
    assert client.get(f"/runs/{run_id}/plots/leak.png").status_code == 404
    assert client.get(f"/runs/{run_id}/plots/own.png").content == b"\x89PNG own"
    assert client.get(f"/runs/{run_id}").json()["plots"] == ["own"]
    names = [f["name"] for f in client.get(f"/runs/{run_id}/files").json()]
    assert names == ["plots/own.png"]


def _raw_request(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        return s.recv(65536)


def test_duplicate_host_headers_are_400(api):
    answer = _raw_request(
        api.url,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]


@pytest.mark.parametrize("protocol", [TimedHttpToolsProtocol, TimedH11Protocol])
def test_slow_clients_are_disconnected(monkeypatch, tmp_path, protocol):
    monkeypatch.setattr(protocol, "header_timeout_s", 0.5)
    monkeypatch.setattr(protocol, "body_timeout_s", 0.5)
    config = ServiceConfig(state_dir=tmp_path / "state", start_workers=False)
    with ThreadServer(create_app(config), http=protocol) as server:
        host, port = server.url.removeprefix("http://").split(":")
        silent = socket.create_connection((host, int(port)), timeout=10)
        trickle = socket.create_connection((host, int(port)), timeout=10)
        half_body = socket.create_connection((host, int(port)), timeout=10)
        half_body.sendall(
            b"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        start = time.monotonic()
        for i in range(4):  # a byte every 0.2 s does not push the deadline back
            trickle.sendall(b"GET /healthz HTTP/1.1\r\n"[i : i + 1])
            time.sleep(0.2)
        for s in (silent, trickle, half_body):
            assert s.recv(1024) == b""  # closed by the server
            s.close()
        assert time.monotonic() - start < 8
        # an ordinary client is served as before, keep-alive included
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
            time.sleep(1.0)
            assert c.get("/healthz").status_code == 200


def test_a_busy_port_is_refused_before_anything_is_written(tmp_path, capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        state = tmp_path / "state"
        assert main(["serve", "--port", str(port), "--state", str(state)]) == 2
        assert "cannot listen" in capsys.readouterr().err
        assert not state.exists()
    finally:
        taken.close()


def test_a_run_whose_cancel_was_requested_is_cancelled_at_recovery(tmp_path):
    store = Store(tmp_path / "state")
    try:
        for name in ("a", "b", "c"):
            store.add_run(f"{name}-1", name, "fedavg", "rounds: 2\n", 2, 10)
        for _ in range(3):
            store.claim_next()  # all three running
        store.request_cancel("a-1")  # running: flagged
        store.request_cancel("c-1")
        store.recover()
        with store._tx() as c:  # c: as a server stopping would leave it
            c.execute("UPDATE runs SET status = 'interrupted' WHERE id = 'c-1'")
        store.recover()
        status = {r.id: r.status for r in store.list_runs()[0]}
        assert status == {"a-1": "cancelled", "b-1": "interrupted", "c-1": "cancelled"}
        history = store.get_run("a-1").history
        assert (
            history[-1]["status"] == "cancelled" and "cancel was requested" in history[-1]["note"]
        )
    finally:
        store.close()


def test_sweeps_are_bounded_and_cancellable(tmp_path):
    store = Store(tmp_path / "state")
    try:
        store.add_sweep("sweep-a", {"runs": [], "set": []}, max_waiting=2)
        store.add_sweep("sweep-b", {"runs": [], "set": []}, max_waiting=2)
        from mecsim.interfaces.service.jobs import QueueFull

        with pytest.raises(QueueFull):
            store.add_sweep("sweep-c", {"runs": [], "set": []}, max_waiting=2)
        assert store.cancel_sweep("sweep-a") == "cancelled"
        store.set_sweep_status("sweep-b", "running")
        assert store.cancel_sweep("sweep-b") == "stopping" and store.sweep_cancelled("sweep-b")
        store.recover()  # a server that died while the cancelled sweep ran
        assert store.get_sweep("sweep-b").status == "cancelled"
        assert store.cancel_sweep("sweep-b") == "ended" and store.cancel_sweep("nope") is None
        # a cancel between the sweep thread's pick and its start: not run
        store.add_sweep("sweep-d", {"runs": [], "set": []}, max_waiting=5)
        store.set_sweep_status("sweep-d", "running")
        store.cancel_sweep("sweep-d")
        assert not store.start_sweep("sweep-d") and store.get_sweep("sweep-d").status == "cancelled"
        store.add_sweep("sweep-e", {"runs": [], "set": []}, max_waiting=5)
        assert store.start_sweep("sweep-e") and store.get_sweep("sweep-e").status == "running"
    finally:
        store.close()


def test_the_json_body_schema_stays_in_the_openapi_document(client):
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/runs"]["post"]["requestBody"]["content"]["application/json"]
    assert set(body["schema"]["properties"]) == {"scenario", "rounds", "set"}
    body = spec["paths"]["/sweeps"]["post"]["requestBody"]["content"]["application/json"]
    assert "runs" in body["schema"]["properties"]
    assert "delete" in spec["paths"]["/sweeps/{sweep_id}"]
    json.dumps(spec)


# ----------------------------------------------------------------------------- cancel


class _Ending:
    def __init__(self) -> None:
        self.status: str | None = None
        self.rounds: list = []

    def __getattr__(self, name):  # every other hook: nothing to do
        return lambda *args, **kwargs: None

    def on_round_end(self, info, row, client_rows, traces) -> None:
        self.rounds.append(row)

    def on_run_stopped(self, info, rounds, status, message) -> None:
        self.status = status


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("backend", ["ray", "local"])
def test_a_cancel_stops_a_round_in_progress(backend):
    """Rounds of many seconds (100 local epochs): a stop requested 1.5 s into the first
    round ends the run within about a second of it on Ray (the executor polls its stop
    check while it waits for the hosts), between host calls in-process; the round in
    progress is discarded and the run is ``cancelled``."""
    from mecsim.run.loop import run

    sc = tiny(
        rounds=2,
        dataset={"train_size": 2000},
        training={"epochs": 100},
        execution={"backend": backend, "hosts": 2},
    )
    first: list[float] = []  # when the run first asked (its first round under way)
    asked: list[float] = []

    def should_stop():
        now = time.monotonic()
        first[:] = first or [now]
        if now - first[0] > 1.5:
            asked.append(now)
            return "cancelled"
        return False

    ending = _Ending()
    rows = run(sc, "cancel-mid-round", None, [ending], should_stop=should_stop)
    ended = time.monotonic()
    assert rows == [] and ending.rounds == [] and ending.status == "cancelled"
    assert asked, "the stop check was never asked during the round"
    if backend == "ray":  # Ray's wait polls every 0.5 s; a round takes far longer
        assert ended - asked[0] < 3.0, ended - asked[0]


# ----------------------------------------------------------------------------- corpus

HOSTILE_SEGMENTS = [
    "%00",
    "a%00b",
    "%ED%A0%80",  # a lone surrogate, UTF-8 encoded
    "99999999999999999999999999",
    "-1",
    "NaN",
    "..%2F..%2Fetc%2Fpasswd",
    "x" * 2000,
    "%FF%FE",
]
HOSTILE_BODIES = [
    b'{"scenario": null, "set": {"training.lr": NaN}}',
    b'{"rounds": 100000000000000000000000, "runs": ["a"]}',
    b'{"scenario": "name: \\ud800", "runs": ["\\ud800"]}',
    b'{"set": ' + b"[" * 900 + b"]" * 900 + b"}",
    b'{"runs": ["a\\u0000"], "set": ["deadline_s=1:2:99999999999999999999"]}',
    b"\x00\xff",
    b"",
]
HOSTILE_QUERIES = [
    "limit=100000000000000000000000",
    "offset=-1",
    "status=%00",
    "format=%ED%A0%80",
    "limit=NaN",
]


def test_a_corpus_of_hostile_input_on_every_route_is_never_5xx(api, client):
    """Every route of the app (API, web page, service endpoints) with each hostile path
    segment, body, query and Last-Event-ID: never a 5xx, and no traceback in the log."""
    from starlette.routing import Route

    def walk(items):  # routers included in the app hold their own routes
        for r in items:
            if isinstance(r, Route):
                yield r
            elif hasattr(r, "original_router"):
                yield from walk(r.original_router.routes)
            elif hasattr(r, "routes"):
                yield from walk(r.routes)

    routes = list(walk(api.server.config.app.routes))
    assert len(routes) >= 20
    sent = 0
    problems = []
    for route in routes:
        for method in sorted(route.methods - {"HEAD"}):
            params = re.findall(r"{(\w+)(?::path)?}", route.path)
            segments = HOSTILE_SEGMENTS if params else [None]
            for segment in segments:
                path = route.path
                for name in params:
                    path = re.sub(r"{" + name + r"(?::path)?}", segment, path)
                bodies = HOSTILE_BODIES if method in ("POST", "PUT", "PATCH") else [None]
                for body in bodies:
                    for query in [None, *HOSTILE_QUERIES[:2]]:
                        url = path + (f"?{query}" if query else "")
                        r = client.request(
                            method,
                            url,
                            content=body,
                            headers={
                                "content-type": "application/json",
                                "Last-Event-ID": "9" * 40,
                            },
                        )
                        sent += 1
                        if route.path == "/readyz" and r.status_code == 503:
                            continue  # documented: this server has no workers
                        if r.status_code >= 500:
                            problems.append(f"{method} {url[:80]}: {r.status_code} {r.text[:100]}")
    for query in HOSTILE_QUERIES:
        r = client.get(f"/runs?{query}")
        sent += 1
        if r.status_code >= 500:
            problems.append(f"GET /runs?{query}: {r.status_code}")
    assert sent > 500, sent
    assert not problems, "\n".join(problems[:20])
    tracebacks = [r for r in api.log_records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, tracebacks[0].getMessage()


# ----------------------------------------------------------------------------- events


def test_many_followers_of_a_run_share_one_feed(tmp_path, monkeypatch):
    """Ten streams follow a running run (two resuming after round 1, one arriving late):
    each gets every round after its own once, in order, then the end; one feed read the
    store for all of them; and a follower far behind the feed's window reads what it
    missed from the store."""
    import asyncio

    from mecsim.interfaces.service import events

    monkeypatch.setattr(events, "EVENTS_POLL_S", 0.02)
    monkeypatch.setattr(events, "FEED_KEEP", 3)
    store = Store(tmp_path / "state")
    store.add_run("r-1", "r", "fedavg", "rounds: 8\n", 8, 10)
    run = store.claim_next()
    feeds = events.Feeds(store)
    reads = []
    real_read = events.RoundFeed._read
    monkeypatch.setattr(events.RoundFeed, "_read", lambda self: reads.append(1) or real_read(self))

    async def never() -> bool:
        return False

    async def follow(after: int, delay: float) -> list[str]:
        await asyncio.sleep(delay)
        return [e async for e in feeds.stream(run, after, never)]

    async def main():
        followers = [asyncio.create_task(follow(-1, 0)) for _ in range(7)]
        # two resume after round 1, joining once rounds 0-2 are recorded
        followers += [asyncio.create_task(follow(1, 0.35)) for _ in range(2)]
        followers.append(asyncio.create_task(follow(-1, 0.5)))  # late, behind the window
        gone = asyncio.create_task(follow(-1, 0))  # its client goes away while it waits
        for rnd in range(8):
            await asyncio.sleep(0.1)
            store.round_done("r-1", rnd, {"round": rnd, "mean_accuracy": 0.5})
            if rnd == 2:
                gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        store.set_status("r-1", "finished")
        got = await asyncio.wait_for(asyncio.gather(*followers), 30)
        assert len(feeds) == 0  # the feed went with its last follower
        return got

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    for i, stream in enumerate(got):
        first = 2 if i in (7, 8) else 0
        sent = [e for e in "".join(stream).split("\n\n") if e]  # backlog comes as one chunk
        ids = [int(e.split("\n")[0].removeprefix("id: ")) for e in sent[:-1]]
        assert ids == list(range(first, 8)), (i, ids)
        assert all(e.split("\n")[1] == "event: round" for e in sent[:-1])
        assert sent[-1].startswith("event: end") and '"status": "finished"' in sent[-1]
        assert '"mean_accuracy": 0.5' in sent[0]
    assert len(reads) < 8 * 10  # polls of one feed, not one per stream and tick


# ----------------------------------------------------------------------------- review fixes


def test_a_follower_with_an_id_beyond_the_run_still_gets_the_end(tmp_path):
    """An old Last-Event-ID beyond the rounds recorded (a run gone back to an older
    checkpoint) creates the feed: it and a later follower both get every round after
    the newest recorded one, then the end."""
    import asyncio

    from mecsim.interfaces.service import events

    store = Store(tmp_path / "state")
    store.add_run("r-1", "r", "fedavg", "rounds: 4\n", 4, 10)
    run = store.claim_next()
    store.round_done("r-1", 0, {"round": 0})
    feeds = events.Feeds(store)

    async def never() -> bool:
        return False

    async def follow(after: int, delay: float) -> str:
        await asyncio.sleep(delay)
        return "".join([e async for e in feeds.stream(run, after, never)])

    async def main():
        tasks = [asyncio.create_task(follow(999_999_999, 0)), asyncio.create_task(follow(-1, 0.2))]
        for rnd in (1, 2):
            await asyncio.sleep(0.6)
            store.round_done("r-1", rnd, {"round": rnd})
        store.set_status("r-1", "failed", error="boom")
        return await asyncio.wait_for(asyncio.gather(*tasks), 20)

    try:
        beyond, fresh = asyncio.run(main())
    finally:
        store.close()
    assert "id: 0\n" not in beyond and "id: 1\n" in beyond and "id: 2\n" in beyond
    assert all(f"id: {r}\n" in fresh for r in (0, 1, 2))
    for text in (beyond, fresh):
        assert text.rstrip().splitlines()[-1].startswith("data: ") and '"failed"' in text


def test_more_hostile_headers_and_names_are_4xx(api, client):
    run_id = client.post("/runs", json={"scenario": tiny_yaml(rounds=1)}).json()["id"]
    api.store.run_dir(run_id).mkdir(parents=True, exist_ok=True)
    assert client.get(f"/runs/{run_id}/files/{'a' * 300}").status_code == 404
    r = client.post("/runs", json={"scenario": tiny_yaml()}, headers={"Origin": "http://["})
    assert r.status_code == 403
    assert client.delete(f"/runs/{run_id}").status_code == 200
    r = client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": b"\xb2"})
    assert r.status_code == 200 and "event: end" in r.text
    # the form's overrides take one value each: a range is refused before it is made
    r = client.post(
        "/ui/runs",
        files={"scenario": ("s.yaml", tiny_yaml().encode(), "application/yaml")},
        data={"overrides": "training.lr=0:1:1000000\n" * 50},
    )
    assert r.status_code == 422 and "more than the 1 one axis may have" in r.text


def test_a_nul_in_a_scenario_path_is_a_problem_not_a_crash(tmp_path):
    from mecsim.interfaces.service.submission import Rejected, prepare_submission

    text = tiny_yaml(dataset={"name": "mnist", "root": "a\x00b"})
    with pytest.raises(Rejected) as info:
        prepare_submission(
            text,
            rounds=None,
            overrides={},
            data_root=tmp_path,
            tmp_dir=tmp_path / "tmp",
            runs_dir=tmp_path / "runs",
        )
    assert [p.field for p in info.value.problems] == ["dataset.root"]


def test_steps_that_algorithms_take_besides_the_epochs_are_counted():
    sc = tiny(
        rounds=2,
        algorithm={"name": "phsfl", "params": {"batches_per_epoch": 1000, "finetune_steps": 7}},
        topology={"clients": 4, "edge_servers": 2},
        training={"epochs": 3},
    )
    assert limits.estimate(sc).steps_per_client_round == 3 * 1000 + 7
    sc = tiny(
        dataset={
            "partition": {"method": "iid", "samples_per_client": 5, "test_samples_per_client": 7}
        }
    )
    (problem,) = limits.check(sc, limits.Limits(None, None, None, None, None, 47))
    assert "4 clients x 12, train and test" in problem[1]


# ----------------------------------------------------------------------------- imports

#: the tests' Flower app (tests/data/flower_seeded_app), listed by the operator below
SEEDED_APP = DATA / "flower_seeded_app"
SEEDED = {"serverapp": "seededapp.server_app:app", "clientapp": "seededapp.client_app:app"}


def _flower(**params: str) -> dict:
    return {"algorithm": {"name": "flower", "params": params}, "checkpoint": {"every": 0}}


#: Submissions naming code the server must not import: (id, scenario sections, set,
#: the field the 422 names, modules that must not be imported by the request). Each
#: module was chosen for what importing it does: PIL's __main__ prints a report, trio's
#: starts a REPL on the server's stdin, certifi's and jsonschema's raise SystemExit,
#: `this` prints, `antigravity` opens a web browser.
IMPORT_CASES = [
    (
        "flower serverapp PIL.__main__ (prints)",
        _flower(serverapp="PIL.__main__:x", clientapp="PIL.__main__:x"),
        {},
        "algorithm.params.serverapp",
        ["PIL.__main__"],
    ),
    (
        "flower serverapp trio.__main__ (a REPL on stdin)",
        _flower(serverapp="trio.__main__:x", clientapp=SEEDED["clientapp"]),
        {},
        "algorithm.params.serverapp",
        ["trio.__main__", "trio"],
    ),
    (
        "flower clientapp certifi.__main__ (SystemExit)",
        _flower(serverapp=SEEDED["serverapp"], clientapp="certifi.__main__:x"),
        {},
        "algorithm.params.clientapp",
        ["certifi.__main__", "seededapp", "seededapp.server_app"],
    ),
    (
        "flower serverapp jsonschema.__main__ by --set",
        _flower(**SEEDED),
        {"algorithm.params.serverapp": "jsonschema.__main__:x"},
        "algorithm.params.serverapp",
        ["jsonschema.__main__", "jsonschema"],
    ),
    (
        "flower clientapp os:system",
        _flower(serverapp=SEEDED["serverapp"], clientapp="os:system"),
        {},
        "algorithm.params.clientapp",
        [],
    ),
    (
        "flower serverapp: a private submodule of an installed package",
        _flower(serverapp="flwr.cli.new.new:new", clientapp=SEEDED["clientapp"]),
        {},
        "algorithm.params.serverapp",
        ["flwr.cli.new.new"],
    ),
    (
        "flower app: a folder the operator did not list",
        _flower(app=str(SEEDED_APP.parent)),
        {},
        "algorithm.params.app",
        [],
    ),
    ("algorithm os:system", {"algorithm": {"name": "os:system"}}, {}, "algorithm.name", []),
    ("model subprocess:run", {"model": {"name": "subprocess:run"}}, {}, "model.name", []),
    ("dataset this (prints)", {"dataset": {"name": "this:s"}}, {}, "dataset.name", ["this"]),
    (
        "model by --set: a private submodule",
        {},
        {"model.name": "jsonschema._keywords:ref"},
        "model.name",
        ["jsonschema._keywords"],
    ),
    (
        "channel antigravity (a browser)",
        {"channel": {"model": "plugin", "name": "antigravity:x"}},
        {},
        "channel",
        ["antigravity"],
    ),
]


@pytest.fixture(scope="module")
def no_imports_api(tmp_path_factory):
    """The app as `mecsim serve --flower-app tests/data/flower_seeded_app` starts it:
    no token, no --allow-imports, no workers."""
    base = tmp_path_factory.mktemp("imports")
    config = ServiceConfig(
        state_dir=base / "state", start_workers=False, flower_apps=(str(SEEDED_APP),)
    )
    with ThreadServer(create_app(config)) as server:
        yield server


@pytest.mark.parametrize(
    "sections, sets, field, modules",
    [case[1:] for case in IMPORT_CASES],
    ids=[case[0] for case in IMPORT_CASES],
)
def test_a_submission_naming_code_is_422_before_anything_is_imported(
    no_imports_api, capfd, sections, sets, field, modules
):
    if "flower" in json.dumps(sections):
        pytest.importorskip("flwr", reason="Flower is not installed")
    before = set(sys.modules)
    text = tiny_yaml(**sections)
    with httpx.Client(base_url=no_imports_api.url, timeout=60) as c:
        r = c.post("/runs", json={"scenario": text, "set": sets})
        assert r.status_code == 422, r.text
        problems = r.json()["detail"]
        assert any(p["field"].startswith(field) for p in problems), problems
        assert "nothing was imported" in r.text or "runs only installed" in r.text, r.text
        assert "Traceback" not in r.text
        assert c.get("/healthz").status_code == 200  # the server still answers
        assert c.get("/runs").json()["total"] == 0  # nothing queued
    for module in modules:
        assert module in before or module not in sys.modules, f"{module} was imported"
    out, err = capfd.readouterr()
    assert "Beautiful is better than ugly" not in out + err  # `this`
    assert "PIL SETTINGS" not in out + err and "Pillow" not in out + err  # PIL.__main__
    assert "trio REPL" not in out + err and ">>>" not in out + err


def test_a_sweep_naming_code_in_its_grid_is_422_before_anything_is_imported(
    no_imports_api, monkeypatch
):
    """A sweep's axes may set channel.* of finished runs: of a run on a plugin channel,
    channel.name could name an import string. Its grid is checked as a submission is:
    refused, naming the axis, before anything is imported."""
    import types

    import mecsim.registry as registry
    from mecsim.interfaces.service import sweep_runner as sweeps

    class Link:  # a plugin channel of a test (registered, not installed)
        pass

    registry.CHANNELS.register("test-link", Link)
    try:
        recorded = tiny(channel={"model": "plugin", "name": "test-link"})
        monkeypatch.setattr(
            sweeps, "load_run", lambda folder: types.SimpleNamespace(scenario=recorded)
        )
        store = no_imports_api.server.config.app.state.store
        store.add_run("plugin-link-1", "tiny", "fedavg", "", 2, 10)
        store.set_status("plugin-link-1", "finished")
        before = set(sys.modules)
        for value in ("antigravity:x", "this:s", "os:system"):
            r = httpx.post(
                f"{no_imports_api.url}/sweeps",
                json={"runs": ["plugin-link-1"], "set": [f"channel.name={value}"]},
                timeout=60,
            )
            assert r.status_code == 422, r.text
            assert "import string" in r.text and "--allow-imports" in r.text, r.text
            assert "Traceback" not in r.text
        # the same grid with a registered name passes the check (202: queued)
        ok = httpx.post(
            f"{no_imports_api.url}/sweeps",
            json={"runs": ["plugin-link-1"], "set": ["channel.name=test-link"]},
            timeout=60,
        )
        assert ok.status_code == 202, ok.text
    finally:
        registry.CHANNELS.unregister("test-link")
    for module in ("antigravity", "this"):
        assert module in before or module not in sys.modules


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.own_ray
def test_a_real_server_imports_no_module_a_submission_names(tmp_path):
    """`mecsim serve` in its own process, its log read afterwards: the installed
    packages' __main__ modules named as a Flower app are refused with
    422 naming the field; nothing they would print reaches its log, trio's REPL does not
    start, certifi's and jsonschema's SystemExit end no thread (no 500), and it answers on."""
    pytest.importorskip("flwr", reason="Flower is not installed")
    from support.service import ServeProcess

    server = ServeProcess(tmp_path / "state").start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for module in ("PIL", "trio", "certifi", "jsonschema"):
                ref = f"{module}.__main__:x"
                text = tiny_yaml(**_flower(serverapp=ref, clientapp=ref))
                r = c.post("/runs", json={"scenario": text})
                assert r.status_code == 422, r.text
                assert _fields(r) == ["algorithm.params.serverapp"], r.text
                assert c.get("/healthz").status_code == 200
            assert c.get("/runs").json()["total"] == 0
        assert server.proc.poll() is None
    finally:
        server.stop()
    log = server.log_text()
    for printed in ("PIL SETTINGS", "Pillow", "trio REPL", ">>>", "Traceback", "SystemExit"):
        assert printed not in log, log


@pytest.mark.parametrize("how", ["sys.exit(0)", "a BaseException of its own"])
def test_a_plugin_that_exits_while_a_submission_is_checked_is_a_422(no_imports_api, how):
    """The pre-flight builds the algorithm's server: a plugin whose constructor calls
    sys.exit(0) used to raise SystemExit in the validation thread (a 500; raised in the
    event loop it could stop the server). It is a 422, and the server answers on."""
    import mecsim.registry as registry
    from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer

    class Boom(BaseException):
        pass

    class Exits(FedAvgServer):
        Client = FedAvgClient

        def __init__(self, *args, **kwargs):
            if how == "sys.exit(0)":
                sys.exit(0)
            raise Boom("its own")

    registry.ALGORITHMS.register("exits-on-check", (Exits, FedAvgClient))
    try:
        text = tiny_yaml(algorithm={"name": "exits-on-check"})
        with httpx.Client(base_url=no_imports_api.url, timeout=60) as c:
            r = c.post("/runs", json={"scenario": text})
            assert r.status_code == 422, r.text
            assert "SystemExit(0)" in r.text or "Boom('its own')" in r.text, r.text
            assert c.get("/healthz").status_code == 200
    finally:
        registry.ALGORITHMS.unregister("exits-on-check")


def test_a_run_whose_code_exits_in_a_worker_thread_fails_and_the_worker_goes_on(
    tmp_path, monkeypatch
):
    """sys.exit(0) (or a BaseException of a plugin's own) raised on the server's side
    of a run ended the worker's thread, leaving the run `running` for ever: the run
    fails, naming it, and the worker takes the next run."""
    from mecsim.interfaces.service.worker import Worker

    store = Store(tmp_path / "state")
    worker = Worker(store)
    for i, exc in enumerate((SystemExit(0), KeyboardInterrupt())):
        store.add_run(f"r{i}", "tiny", "fedavg", tiny_yaml(), 2, 10)
        run = store.claim_next()

        def start(r, exc=exc):
            raise exc

        monkeypatch.setattr(worker, "_start", start)
        worker._execute(run)
        view = store.get_run(run.id)
        assert view.status == "failed", view
        assert f"raised {exc!r} (user code)" in view.error
    store.close()


def test_get_plugins_lists_the_flower_components_a_submission_may_name(no_imports_api):
    page = httpx.get(f"{no_imports_api.url}/plugins", timeout=30).json()
    assert page["allow_imports"] is False
    listed = {row["component"]: row["declared_by"] for row in page["flower_apps"]}
    assert listed["seededapp.server_app:app"] == f"--flower-app {SEEDED_APP}"
    assert "seededapp.client_app:app" in listed
