"""Helpers shared by test modules: the one place they live, so that no test module
imports another (tests/project/test_architecture.py checks that). Helpers that plugin authors need
too (comparing records, stopping a run the way a kill would) are public in
:mod:`mecsim.testing`; the service tests' own helpers are in ``service_support.py``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from mecsim.emulation.engine import (
    ClientSpec,
    NetworkSpec,
    RateSchedule,
    RoundTiming,
    ServerSpec,
)
from mecsim.emulation.ops import Backhaul, Compute, Download, ServerCompute, Upload
from mecsim.run.observers import RunObserver
from mecsim.scenario import scenario_from_dict
from mecsim.store.reader import read_csv_exact
from mecsim.store.runfolder import prepare_resume
from mecsim.store.session import run_in_folder
from mecsim.testing import BUILTIN_OVERRIDES, SimulatedKill, StopAfter
from support.paths import ROOT

DASHBOARDS = ROOT / "dashboards"


# ---------------------------------------------------------------------------------------- resuming


def interrupted_then_resumed(sc, tmp_path: Path, stop_at: int, hosts=(2, 2)) -> Path:
    """Run ``sc`` into ``tmp_path/resumed/r``, stopped at the end of round ``stop_at``
    (:class:`~mecsim.testing.StopAfter`) on ``hosts[0]`` hosts, then resumed on
    ``hosts[1]`` from the checkpoint before that round; returns the finished run folder."""
    out = tmp_path / "resumed" / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, out, observers=[StopAfter(stop_at)], hosts=hosts[0])
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    target = prepare_resume(out)
    try:
        # cut back to the checkpoint before the stopped round
        assert target.rounds_done == stop_at
        assert len(pd.read_csv(out / "rounds.csv")) == stop_at
        run_in_folder(None, resume=target, hosts=hosts[1])
    finally:
        target.lock.release()
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    return out


# ------------------------------------------------------------------------------- Ray actors killed


#: the actor classes a kill plan names -> the key of ``RayExecutor.actor_pids()``
_ACTOR_KINDS = {
    "ClientHostActor": "hosts",
    "CentralServerActor": "server",
    "EdgeServerActor": "edges",
}


class _KillActors(RunObserver):
    """Kills -9 the first actor of each ``(rounds, kind)`` of ``plan`` at the end of the
    round that makes ``rounds`` rounds recorded (the actor's process, found through the
    run's own executor: no other run's actor is touched)."""

    def __init__(self, plan: list[tuple[int, str]], executors: list, first_round=None) -> None:
        self.plan, self.executors, self.killed = list(plan), executors, []
        self.first_round = first_round

    def on_round_end(self, info, row, client_rows, traces) -> None:
        if row["round"] == 0 and self.first_round is not None:
            self.first_round(self.executors[-1])
        while self.plan and row["round"] + 1 >= self.plan[0][0]:
            kind = _ACTOR_KINDS[self.plan.pop(0)[1]]
            pid = self.executors[-1].actor_pids()[kind][0]
            proc = psutil.Process(pid)
            os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)  # gone before the run asks the actor for anything
            self.killed.append(pid)


def run_killing_actors(sc, tmp_path: Path, plan: list[tuple[int, str]], first_round=None) -> Path:
    """Run ``sc`` under this process's shared Ray (tests/conftest.py) into
    ``tmp_path/runs/r``, killing -9 the process of one actor of class ``kind`` once
    ``rounds`` rounds are recorded, for each ``(rounds, kind)`` of ``plan``; asserts every
    kill happened and the run finished with one fault each; returns its run folder.
    ``first_round(executor)``, if given, is called with the run's live RayExecutor at the
    end of round 0, before any kill (to look at its actors without starting others)."""
    from mecsim.run.backends import ray_executor

    executors: list = []
    real_start = ray_executor.RayExecutor._start

    def start(self, *args, **kwargs):
        executors.append(self)
        return real_start(self, *args, **kwargs)

    data = sc.model_dump(mode="json")
    data["execution"]["backend"] = "ray"
    out = tmp_path / "runs" / "r"
    killer = _KillActors(plan, executors, first_round)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray_executor.RayExecutor, "_start", start)
        run_in_folder(scenario_from_dict(data, "killed"), out, observers=[killer])
    assert len(killer.killed) == len(plan) and not killer.plan, killer.killed
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "finished" and len(meta["faults"]) == len(plan)
    rounds = read_csv_exact(out / "rounds.csv")
    assert rounds["faults"].sum() == len(plan)
    return out


# -------------------------------------------------------------------------------- DC-PFL scenarios

#: DC-PFL's dynamic clustering within a few rounds: the conformance kit's settings for it
#: (clients with a primary class, a 2-round warm-up), on a fixed-rate channel.
DCPFL_E2E = {
    **{k: v for k, v in copy.deepcopy(BUILTIN_OVERRIDES["dcpfl"]).items() if k != "algorithm"},
    "channel": {"model": "fixed_rate", "uplink": {"rate_bps": 2e6}, "downlink": {"rate_bps": 2e6}},
}
DCPFL_FAST = copy.deepcopy(BUILTIN_OVERRIDES["dcpfl"]["algorithm"]["params"])


# --------------------------------------------------------------------- random rounds of the engine


def _schedule(rng: np.random.Generator, quantized: bool) -> RateSchedule:
    k = int(rng.integers(1, 5))
    if quantized:
        times = [float(t) for t in range(k)]
        rates = [float(rng.choice([0.0, 1e6, 2e6])) for _ in range(k)]
    else:
        times = [0.0, *np.sort(rng.uniform(0.01, 20.0, k - 1)).tolist()]
        rates = [0.0 if rng.random() < 0.2 else float(rng.uniform(1e5, 5e7)) for _ in range(k)]
    if rates[-1] == 0.0 and rng.random() < 0.8:  # mostly not dead for ever
        rates[-1] = 1e6
    return RateSchedule(tuple(times), tuple(rates))


def random_round(rng: np.random.Generator, quantized: bool = False):
    """A random round: 1-30 clients (sometimes 100) on 1-3 edge servers, shared or dedicated
    links (constant, zero, or rate traces), random or FedAvg-like op-traces with server
    compute and backhaul transfers, zero-work ops, a deadline or none. ``quantized``
    draws sizes, rates and speeds from a few round numbers, so that many events fall on
    the very same instant."""
    n = int(rng.integers(1, 100 if rng.random() < 0.05 else 30))
    n_es = int(rng.integers(1, 4))
    ids = rng.permutation(1000)[:n].tolist()
    up_shared, down_shared = bool(rng.random() < 0.6), bool(rng.random() < 0.6)
    structured, server_first = rng.random() < 0.6, rng.random() < 0.5
    same_for_all = rng.random() < 0.15

    def pick(lo: float, hi: float, grid: list[float]) -> float:
        return float(rng.choice(grid)) if quantized else float(rng.uniform(lo, hi))

    def nbytes() -> int:
        if rng.random() < 0.1:
            return 0
        return int(rng.integers(0, 4)) * 125_000 if quantized else int(rng.integers(1, 3e6))

    def flops() -> float:
        return 0.0 if rng.random() < 0.1 else pick(1e6, 5e10, [1e9, 2e9, 3e9])

    servers = [
        ServerSpec(
            0.0 if rng.random() < 0.03 else pick(1e9, 1e11, [1e9, 2e9, 4e9]),
            float(rng.choice([0.0, 0.01, 0.25])),
            pick(1e8, 1e10, [1e6, 8e6]),
            pick(0.0, 0.01, [0.0, 0.5]),
        )
        for _ in range(n_es)
    ]
    backhaul = {
        es: [
            Backhaul(int(rng.integers(0, 10_000_000)), d)
            for d in ("down", "up")[: int(rng.integers(0, 3))]
        ]
        for es in range(n_es)
    }
    traces, specs, common = {}, {}, None
    for cid in ids:
        es = int(rng.integers(n_es))
        if same_for_all and common is not None:
            ops = list(common)
        elif structured:  # download, compute, [server], upload, [server]: one order
            ops = [Download(nbytes())] if rng.random() < 0.9 else []
            ops += [
                Compute(flops(), int(rng.integers(0, 20))) for _ in range(int(rng.integers(0, 3)))
            ]
            if server_first and rng.random() < 0.5:
                ops.append(ServerCompute(flops(), 1))
            if rng.random() < 0.9:
                ops.append(Upload(nbytes()))
            if not server_first and rng.random() < 0.5:
                ops.append(ServerCompute(flops(), 1))
        else:  # any order, resources visited again and again
            ops = []
            for _ in range(int(rng.integers(0, 10))):
                kind = int(rng.integers(4))
                ops.append(
                    Download(nbytes())
                    if kind == 0
                    else Upload(nbytes())
                    if kind == 2
                    else Compute(flops(), int(rng.integers(0, 20)))
                    if kind == 1
                    else ServerCompute(flops(), int(rng.integers(0, 3)))
                )
        common = common or list(ops)
        mine = backhaul[es][: int(rng.integers(0, len(backhaul[es]) + 1))]
        for op in mine:  # down first, up last
            ops.insert(0 if op.direction == "down" else len(ops), op)
        traces[cid] = tuple(ops)

        def rate(shared: bool) -> float | RateSchedule:
            if same_for_all:
                return 2e6
            if not shared and rng.random() < 0.3:
                return _schedule(rng, quantized)
            return 0.0 if rng.random() < 0.04 else pick(1e5, 5e7, [1e6, 2e6, 4e6])

        specs[cid] = ClientSpec(
            cid,
            rate(up_shared),
            rate(down_shared),
            float(rng.choice([0.0, 0.25, 0.5] if quantized else [0.0, rng.uniform(0, 0.1)])),
            0.0 if rng.random() < 0.02 else pick(1e8, 3e10, [1e9, 2e9, 4e9]),
            es,
        )
    deadline = None if rng.random() < 0.4 else float(rng.uniform(0.1, 60.0))
    return (
        traces,
        specs,
        servers,
        NetworkSpec(up_shared, down_shared, deadline),
        float(rng.uniform(0, 1)),
    )


def _close(x: float, y: float) -> bool:
    return x == y or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def assert_timing_close(got: RoundTiming, ref: RoundTiming) -> None:
    assert len(got.clients) == len(ref.clients)
    for a, b in zip(got.clients, ref.clients, strict=True):
        assert (a.client_id, a.completed) == (b.client_id, b.completed)
        for f in (
            "finish_s",
            "download_s",
            "compute_s",
            "upload_s",
            "server_compute_s",
            "backhaul_s",
        ):
            assert _close(getattr(a, f), getattr(b, f)), (f, a, b)
    assert got.dropped == ref.dropped
    assert _close(got.round_time_s, ref.round_time_s) and _close(got.wait_s, ref.wait_s)
    if got.critical_client != ref.critical_client:  # a tie for the last to finish
        by_id = {c.client_id: c for c in ref.clients}
        a, b = by_id[got.critical_client], by_id[ref.critical_client]
        assert _close(a.finish_s, b.finish_s)
    else:
        for f in ("download_s", "client_s", "upload_s", "server_s", "idle_s", "backhaul_s"):
            assert _close(getattr(got, f), getattr(ref, f)), f


# -------------------------------------------------------------------------------------- dashboards

DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in DASHBOARD_FILES}


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out += p.get("panels", [])  # collapsed rows hold their panels
    return out


def exprs(dash: dict) -> list[str]:
    return [t["expr"] for p in panels(dash) for t in p.get("targets", [])]


def variable_queries(dash: dict) -> list[str]:
    return [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]


def substitute(expr: str, run_id: str, algorithm: str, range_s: int) -> str:
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$__range", f"{range_s}s")
        .replace("$run", run_id)
        .replace("$algorithm", algorithm)
    )
