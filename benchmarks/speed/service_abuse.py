"""A hostile mix against ``mecsim serve`` while it trains a run: does the service hold?

A real ``mecsim serve`` (loopback, its default limits) trains the embedded default
scenario for ``--rounds`` rounds. The hostile mix is switched on and off in windows of
``--window`` seconds (off, on, off, on ...), so that the training's rounds under abuse
and alone are measured in one run, alternately, on the same machine state (two runs one
after the other differed by up to 20 % with no abuse at all). While the mix is on:

- **hostile requests** are sent by ``--hostile-threads`` threads, each pausing
  ``--hostile-interval`` seconds between requests: a 1 MB form of 100,000 unknown keys,
  a 10 KB YAML alias bomb (2,000 references to a 2,000-element list), 900 levels of
  nesting in YAML and in JSON, NaN, lone surrogates, integers beyond 2^63, ``epochs:
  1e9``, ``hosts: 500``, ``rounds: 1e20``, sweep grids of 10^9 and 10^6 points, and
  code to import (a Flower app's ``PIL.__main__`` and ``trio.__main__``, ``os:system``
  as the algorithm, a private submodule as the model, ``this`` as the data set: each
  must be 422 with nothing imported or printed); each one's status and time;
- **slow clients**: ``--slow-clients`` connections that send half a request header and
  then nothing (the server must close them: its header deadline is 10 s);
- an **SSE flood**: ``--sse-streams`` clients following the training run's events;
- **cancels**: a valid run submitted and cancelled at once every ``--cancel-interval``
  seconds (each costs the server a full validation and pre-flight).

Throughout, a **prober** asks ``GET /healthz`` and ``GET /runs/{id}`` every
``--probe-interval`` seconds. Reported: probe latencies (p50 / p99) with the mix on and
off, the server's RSS growth, each hostile kind's statuses and slowest answer, slow
clients closed, and the training's median round wall time (``host_wall_s``) in the
windows with the mix on against those with it off (each round counted in the window it
finished in; rounds within a second of a switch left out).

The load generator's threads (this process's, but the prober) run 10 nice steps below
the server unless ``--same-priority``: on a machine of two cores their own CPU would
otherwise be taken from the training as much as the server's is, and a prober below the
training would measure its own waits for a CPU. Targets: p99 < 50 ms with the mix on; RSS
growth < 200 MiB; every hostile request answered 4xx within 2 s; the training within 10 %
of its speed with the mix off. A 5xx or a refused connection is an error (exit 1); a
missed target is printed, not an exit code (figures depend on the machine).

    python benchmarks/speed/service_abuse.py [--rounds 600] [--window 10] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pandas as pd
import psutil

from mecsim.scenario import default_scenario_path

QUICK_USES_RAY = True  # tests/e2e/test_benchmarks.py marks this benchmark's --quick run "ray"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def hostile_requests(finished_run: str) -> dict[str, dict]:
    """name -> httpx request arguments."""
    default = default_scenario_path().read_text()
    alias = "a: &a [" + ",".join(["1"] * 2000) + "]\nb: [" + ",".join(["*a"] * 2000) + "]\n"
    form = "\n".join(f"unknown_key_{i}: 1" for i in range(100_000))[: 1000 * 1024]
    deep_json = '{"set": {"a": ' + "[" * 900 + "]" * 900 + "}}"
    return {
        "form 1 MB, 100k unknown keys": {
            "method": "POST",
            "url": "/ui/runs",
            "files": {"scenario": ("s.yaml", form.encode(), "application/yaml")},
        },
        "YAML alias bomb (10 KB)": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": alias},
        },
        "YAML nested 900 levels": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": "a: " + "[" * 900 + "]" * 900},
        },
        "JSON nested 900 levels": {
            "method": "POST",
            "url": "/runs",
            "content": deep_json,
            "headers": {"content-type": "application/json"},
        },
        "NaN in the body": {
            "method": "POST",
            "url": "/runs",
            "content": '{"set": {"training.lr": NaN}}',
            "headers": {"content-type": "application/json"},
        },
        "lone surrogate": {
            "method": "POST",
            "url": "/runs",
            "content": '{"scenario": "name: \\ud800"}',
            "headers": {"content-type": "application/json"},
        },
        "integer beyond 2^63": {
            "method": "POST",
            "url": "/runs",
            "content": '{"rounds": 100000000000000000000000}',
            "headers": {"content-type": "application/json"},
        },
        "epochs: 1e9": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": default, "set": {"training.epochs": 1_000_000_000}},
        },
        "hosts: 500": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": default, "set": {"execution.hosts": 500}},
        },
        "rounds: 1e20 (set)": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": default, "set": {"rounds": 1e20}},
        },
        # code the server must not import (422 before any import; nothing printed)
        "flower serverapp PIL.__main__": {
            "method": "POST",
            "url": "/runs",
            "json": {
                "scenario": default,
                "set": {
                    "algorithm": {
                        "name": "flower",
                        "params": {"serverapp": "PIL.__main__:x", "clientapp": "trio.__main__:x"},
                    },
                    "checkpoint.every": 0,
                },
            },
        },
        "algorithm os:system": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": default, "set": {"algorithm.name": "os:system"}},
        },
        "model: a private submodule": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": default, "set": {"model.name": "jsonschema._keywords:ref"}},
        },
        "dataset `this` (prints)": {
            "method": "POST",
            "url": "/runs",
            "json": {"scenario": default, "set": {"dataset.name": "this:s"}},
        },
        "sweep of 10^9 points": {
            "method": "POST",
            "url": "/sweeps",
            "json": {"runs": [finished_run], "set": ["deadline_s=1:2:1000000000"]},
        },
        "sweep grid of 10^6 points": {
            "method": "POST",
            "url": "/sweeps",
            "json": {
                "runs": [finished_run],
                "set": ["deadline_s=1:2:1000", "channel.uplink.bandwidth_hz=1e6:2e7:1000"],
            },
        },
    }


class Server:
    def __init__(self, state: Path) -> None:
        # the server's log goes to a file: a pipe nobody reads would fill and stall it
        self.log_path = state.with_name("serve.log")
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mecsim", "serve", "--port", "0", "--state", str(state)],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        line = self.proc.stdout.readline()
        found = re.search(r"(http://\S+?)/ ", line)
        if not found:
            raise SystemExit(f"mecsim serve did not start: {line}{self.log_path.read_text()}")
        self.url = found.group(1)
        self.host, port = self.url.removeprefix("http://").split(":")
        self.port = int(port)
        self.http = httpx.Client(base_url=self.url, timeout=60)
        self.state = state
        self.ps = psutil.Process(self.proc.pid)
        while self.http.get("/readyz").status_code != 200:
            time.sleep(0.2)

    def submit(self, rounds: int, overrides: dict[str, object] | None = None) -> str:
        text = default_scenario_path().read_text()
        body = {"scenario": text, "rounds": rounds, **({"set": overrides} if overrides else {})}
        r = self.http.post("/runs", json=body)
        r.raise_for_status()
        return r.json()["id"]

    def status(self, run_id: str) -> dict:
        return self.http.get(f"/runs/{run_id}").json()

    def wait(self, run_id: str, rounds_done: int | None = None) -> dict:
        while True:
            st = self.status(run_id)
            if st["status"] in ("finished", "failed", "cancelled"):
                return st
            if rounds_done is not None and st["rounds_done"] >= rounds_done:
                return st
            time.sleep(0.25)

    def median_round_s(self, run_id: str) -> float:
        walls = pd.read_csv(self.state / "runs" / run_id / "rounds.csv")["host_wall_s"].tolist()
        return statistics.median(walls[1:] if len(walls) > 1 else walls)

    def stop(self) -> str:
        """SIGTERM; the server's log."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log_path.read_text()


class Abuse:
    """The hostile mix, switched on and off in windows (see :func:`main`)."""

    def __init__(self, server: Server, run_id: str, finished_run: str, args) -> None:
        self.server, self.run_id, self.args = server, run_id, args
        self.requests = hostile_requests(finished_run)
        self.on = threading.Event()  # the hostile mix is on
        self.stop = threading.Event()  # the benchmark is over
        self.latencies: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
        self.answers: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.done_at: list[tuple[float, int]] = []  # (time, rounds done) seen by the probe
        self.phases: list[tuple[float, bool]] = []  # (time, on) at each switch
        self.errors: list[str] = []
        self.rss_peak = 0
        self.slow_closed: list[float] = []
        self.slow_opened = 0
        self.sse_status: list[int] = []

    # ---------------------------------------------------------------- always on
    def probe(self) -> None:
        paths = (("healthz", "/healthz"), ("status", f"/runs/{self.run_id}"))
        with httpx.Client(base_url=self.server.url, timeout=30) as c:
            while not self.stop.is_set():
                for name, path in paths:
                    on, t0 = self.on.is_set(), time.perf_counter()
                    try:
                        r = c.get(path)
                        if r.status_code != 200:
                            self.errors.append(f"probe {path}: {r.status_code}")
                        elif name == "status":
                            self.done_at.append((time.monotonic(), r.json()["rounds_done"]))
                    except httpx.HTTPError as exc:
                        self.errors.append(f"probe {path}: {exc!r}")
                    self.latencies[name].append((time.perf_counter() - t0, t0, on))
                self.rss_peak = max(self.rss_peak, self.server.ps.memory_info().rss)
                self.stop.wait(self.args.probe_interval)

    # ---------------------------------------------------------------- while on
    def _lower(self) -> None:
        """This load-making thread below the server's priority: on a 2-core machine its
        own CPU (building 1 MB forms, following 50 streams) would be taken from the
        training as much as the server's is. (Linux schedules threads on their own; the
        prober keeps the normal priority, or its own waits for a CPU would be measured.)"""
        if not self.args.same_priority:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)

    def hostile(self, offset: int) -> None:
        self._lower()
        names = list(self.requests)
        i = offset
        with httpx.Client(base_url=self.server.url, timeout=60) as c:
            while not self.stop.is_set():
                if not self.on.wait(0.2):
                    continue
                name = names[i % len(names)]
                i += 1
                t0 = time.perf_counter()
                try:
                    code = c.request(**self.requests[name]).status_code
                except httpx.HTTPError as exc:
                    self.errors.append(f"{name}: {exc!r}")
                    code = 0
                self.answers[name].append((code, time.perf_counter() - t0))
                self.stop.wait(self.args.hostile_interval)

    def cancels(self) -> None:
        self._lower()
        text = default_scenario_path().read_text()
        with httpx.Client(base_url=self.server.url, timeout=60) as c:
            while not self.stop.is_set():
                if not self.on.wait(0.2):
                    continue
                t0 = time.perf_counter()
                queued = c.post("/runs", json={"scenario": text})
                code = queued.status_code
                if code == 201:
                    code = c.delete(f"/runs/{queued.json()['id']}").status_code
                self.answers["submit then cancel"].append((code, time.perf_counter() - t0))
                self.stop.wait(self.args.cancel_interval)

    def sse(self, until: threading.Event) -> None:
        self._lower()
        try:
            with httpx.stream(
                "GET", f"{self.server.url}/runs/{self.run_id}/events", timeout=None
            ) as r:
                self.sse_status.append(r.status_code)
                for _ in r.iter_lines():
                    if until.is_set():
                        return
        except httpx.HTTPError as exc:
            self.errors.append(f"sse: {exc!r}")

    def window_on(self) -> threading.Event:
        """Switch the mix on: slow clients connect, event streams open, the hostile and
        cancel threads send. Returns the event that ends this window's streams."""
        until = threading.Event()
        slow = []
        for _ in range(self.args.slow_clients):
            sock = socket.create_connection((self.server.host, self.server.port), timeout=30)
            sock.sendall(b"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            slow.append(sock)
        self.slow_opened += len(slow)
        threading.Thread(target=self._watch_slow, args=(slow,), daemon=True).start()
        for _ in range(self.args.sse_streams):
            threading.Thread(target=self.sse, args=(until,), daemon=True).start()
        self.phases.append((time.monotonic(), True))
        self.on.set()
        return until

    def window_off(self, until: threading.Event) -> None:
        self.on.clear()
        until.set()
        self.phases.append((time.monotonic(), False))

    def _watch_slow(self, sockets: list[socket.socket]) -> None:
        self._lower()
        opened = time.monotonic()
        for sock in sockets:
            sock.settimeout(max(0.1, 30 - (time.monotonic() - opened)))
            try:
                if sock.recv(1024) == b"":
                    self.slow_closed.append(time.monotonic() - opened)
            except OSError:
                pass
            sock.close()


def _phase_of(t: float, phases: list[tuple[float, bool]], settle_s: float) -> bool | None:
    """Whether the mix was on at ``t`` (None: within ``settle_s`` of a switch, or before
    the first window)."""
    current = None
    for at, on in phases:
        if t < at:
            break
        current = (at, on)
    if current is None or t - current[0] < settle_s:
        return None
    return current[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=600, help="rounds of the training run")
    p.add_argument("--window", type=float, default=10.0, help="seconds of each on / off window")
    p.add_argument("--hostile-threads", type=int, default=4)
    p.add_argument(
        "--hostile-interval",
        type=float,
        default=1.0,
        help="seconds each hostile thread pauses between requests (default 1: about 4 "
        "hostile requests a second in all)",
    )
    p.add_argument(
        "--cancel-interval",
        type=float,
        default=2.0,
        help="seconds between valid submissions that are cancelled at once (each costs "
        "the server a full validation and pre-flight; default 2)",
    )
    p.add_argument("--probe-interval", type=float, default=0.05, help="seconds between probes")
    p.add_argument("--slow-clients", type=int, default=300, help="per window")
    p.add_argument("--sse-streams", type=int, default=50, help="per window")
    p.add_argument(
        "--same-priority",
        action="store_true",
        help="run this load generator at the server's CPU priority (by default it runs "
        "10 nice steps below, so that what slows the training is the server's own work)",
    )
    p.add_argument("--keep", metavar="DIR", help="keep the server's state folder and log in DIR")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run for the test suite (6 rounds on a tenth of the data: its figures "
        "mean nothing)",
    )
    args = p.parse_args()
    #: what the training run changes of the default scenario: nothing, but in a smoke run
    #: (a tenth of its data: rounds of a fraction of a second, the same calls)
    smaller: dict[str, object] = {}
    if args.quick:
        args.rounds, args.window, args.hostile_interval = 6, 1.0, 0.05
        args.hostile_threads, args.slow_clients, args.sse_streams = 2, 10, 3
        smaller = {"dataset.train_size": 800, "dataset.test_size": 200}

    with tempfile.TemporaryDirectory(prefix="mecsim-abuse-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        server = Server(base / "state")
        try:
            if args.quick:  # the sweeps name a run that is not there: refused all the same
                finished = "no-such-run-1"
            else:  # what the hostile sweeps name
                finished = server.submit(2)
                server.wait(finished)
            run_id = server.submit(args.rounds, smaller)
            server.wait(run_id, rounds_done=2)  # actors up, rounds training
            abuse = Abuse(server, run_id, finished, args)
            rss_before = abuse.rss_peak = server.ps.memory_info().rss
            threads = [threading.Thread(target=abuse.probe, daemon=True)]
            threads += [
                threading.Thread(target=abuse.hostile, args=(k,), daemon=True)
                for k in range(args.hostile_threads)
            ]
            threads.append(threading.Thread(target=abuse.cancels, daemon=True))
            for t in threads:
                t.start()
            abuse.phases.append((time.monotonic(), False))
            on = False
            until: threading.Event | None = None
            while server.status(run_id)["status"] not in ("finished", "failed", "cancelled"):
                time.sleep(args.window)
                on = not on
                if on:
                    until = abuse.window_on()
                elif until is not None:
                    abuse.window_off(until)
            if until is not None:
                abuse.window_off(until)
            final = server.status(run_id)
            time.sleep(1.0)
            abuse.stop.set()
            for t in threads:
                t.join(timeout=60)
            rss_after = max(abuse.rss_peak, server.ps.memory_info().rss)
            walls = pd.read_csv(server.state / "runs" / run_id / "rounds.csv")[
                "host_wall_s"
            ].tolist()
        finally:
            log = server.stop()

    # each round belongs to the window it finished in (rounds finishing within a second
    # of a switch, and the first two, are left out)
    by_phase: dict[bool, list[float]] = {True: [], False: []}
    seen = sorted(abuse.done_at)
    for r, wall in enumerate(walls[2:], start=2):
        t = next((at for at, done in seen if done >= r + 1), None)
        phase = None if t is None else _phase_of(t, abuse.phases, min(1.0, args.window / 4))
        if phase is not None:
            by_phase[phase].append(wall)
    errors = abuse.errors
    print(
        f"training run: {final['status']}, {final['rounds_done']} rounds; windows of "
        f"{args.window:g} s, the mix off / on / off / on ..."
    )
    for name in ("healthz", "status"):
        on_lat = [x for x, _, was_on in abuse.latencies[name] if was_on]
        off_lat = [x for x, _, was_on in abuse.latencies[name] if not was_on]
        print(
            f"{name:8s} while on: p50 {1e3 * _pct(on_lat, 0.5):.1f} ms, p99 "
            f"{1e3 * _pct(on_lat, 0.99):.1f} ms ({len(on_lat)} probes); while off: p50 "
            f"{1e3 * _pct(off_lat, 0.5):.1f} ms, p99 {1e3 * _pct(off_lat, 0.99):.1f} ms"
        )
    growth_mib = (rss_after - rss_before) / 2**20
    print(
        f"server RSS: {rss_before / 2**20:.0f} MiB -> peak {rss_after / 2**20:.0f} MiB "
        f"(+{growth_mib:.0f} MiB)"
    )
    print(f"{'hostile request':32s} {'n':>4s} {'statuses':>18s} {'slowest s':>10s}")
    all_4xx_fast = bool(abuse.answers)
    for name, got in sorted(abuse.answers.items()):
        codes = sorted({c for c, _ in got})
        slowest = max(t for _, t in got)
        print(f"{name:32s} {len(got):4d} {','.join(map(str, codes)):>18s} {slowest:10.3f}")
        if any(c >= 500 or c == 0 for c, _ in got):
            errors.append(f"{name}: statuses {codes}")
        if name != "submit then cancel" and (
            any(not 400 <= c < 500 for c, _ in got) or slowest > 2.0
        ):
            all_4xx_fast = False
    print(
        f"slow clients: {len(abuse.slow_closed)} of {abuse.slow_opened} closed by the server "
        f"(the last after {max(abuse.slow_closed, default=math.nan):.1f} s)"
    )
    print(f"SSE streams: {len(abuse.sse_status)} opened, statuses {sorted(set(abuse.sse_status))}")
    off_s, on_s = (
        statistics.median(by_phase[phase]) if by_phase[phase] else math.nan
        for phase in (False, True)
    )
    ratio = on_s / off_s
    print(
        f"median round: mix off {off_s:.4f} s ({len(by_phase[False])} rounds), mix on "
        f"{on_s:.4f} s ({len(by_phase[True])} rounds): x{ratio:.3f}"
    )
    p99_on = max(
        _pct([x for x, _, on in abuse.latencies[n] if on], 0.99) for n in ("healthz", "status")
    )
    targets = {
        "p99 < 50 ms": p99_on < 0.050,
        "RSS growth < 200 MiB": growth_mib < 200,
        "hostile requests 4xx within 2 s": all_4xx_fast,
        "slow clients closed": len(abuse.slow_closed) == abuse.slow_opened,
        "training within 10 % of alone": ratio <= 1.10,
    }
    for name, ok in targets.items():
        print(f"target {name}: {'met' if ok else 'MISSED'}")
    if "Traceback" in log:
        errors.append("a traceback in the server's log:\n" + log[-2000:])
    for printed in ("Beautiful is better than ugly", "PIL SETTINGS", "trio REPL"):
        if printed in log:  # a module a hostile request named was imported
            errors.append(f"the server's log has {printed!r}: a named module was imported")
    if final["status"] != "finished":
        errors.append(f"the training run ended {final['status']}")
    for e in errors[:20]:
        print(f"error: {e}", file=sys.stderr)
    print(json.dumps({"errors": len(errors)}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
