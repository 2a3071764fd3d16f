"""A round's further training stages (SecAgg+'s) charged in its own columns
(:func:`mecsim.run.rows.add_stages`, :func:`mecsim.run.rows.stage_totals`), on hand-built
timings whose sums are worked out by hand."""

from __future__ import annotations

import math

import pytest

from mecsim.agents.algorithms import ClientResult
from mecsim.emulation.engine import ClientTimeline, RoundTiming
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.run.rows import StageBatch, add_stages, stage_totals


def timing(round_s: float, clients: list[ClientTimeline]) -> RoundTiming:
    return RoundTiming(
        clients=tuple(clients),
        critical_client=clients[0].client_id,
        wait_s=round_s,
        aggregate_s=0.0,
        round_time_s=round_s,
        download_s=round_s / 4,
        client_s=round_s / 4,
        upload_s=round_s / 2,
        server_s=0.0,
        idle_s=0.0,
        dropped=tuple(c.client_id for c in clients if not c.completed),
    )


def tl(cid: int, finish: float, completed: bool = True) -> ClientTimeline:
    return ClientTimeline(cid, 0.0, finish, 0.1, 0.2, 0.3, 0.0, completed)


def result(cid: int, flops: float, loss: float) -> ClientResult:
    trace = (Download(100), Compute(flops, 2), Upload(300))
    return ClientResult(cid, None, 300, 50, loss, trace, flops, 2, 0, host_seconds=0.5)


def stage(start: float, round_s: float, done: dict[int, bool], flops: float) -> StageBatch:
    traces = {cid: (Download(100), Compute(flops, 2), Upload(300)) for cid in done}
    return StageBatch(
        start_s=start,
        timing=timing(round_s, [tl(c, round_s if ok else math.inf, ok) for c, ok in done.items()]),
        traces=traces,
        results={c: result(c, flops, 1.5) for c in done},
        energy={c: {"energy_j": 2.0} for c in done},
    )


def test_stages_add_their_seconds_bytes_flops_and_energy_to_the_round_and_its_clients() -> None:
    first = timing(1.0, [tl(0, 1.0), tl(1, 0.8)])
    rows = [
        {
            "client_id": c,
            "selected": True,
            "status": "completed",
            "completed": True,
            "bytes_up": 10,
            "bytes_down": 20,
            "download_s": 0.1,
            "compute_s": 0.2,
            "upload_s": 0.3,
            "server_compute_s": 0.0,
            "finish_s": 1.0,
            "gflops": 0.0,
            "steps": 0,
            "host_train_s": 0.1,
            "num_samples": 0,
            "train_loss": math.nan,
            "energy_j": 1.0,
        }
        for c in (0, 1)
    ]
    statuses = {0: "completed", 1: "completed"}
    stages = [
        stage(1.0, 2.0, {0: True, 1: True}, 1e9),  # trains: 1 GFLOP a client
        stage(3.0, 0.5, {0: True, 1: False}, 0.0),  # client 1 misses its deadline
    ]
    total = add_stages(first, stages, rows, statuses)
    assert total.round_time_s == pytest.approx(1.0 + 2.0 + 0.5)
    assert total.upload_s == pytest.approx(0.5 + 1.0 + 0.25)
    assert total.download_s == pytest.approx(0.25 + 0.5 + 0.125)
    zero, one = rows
    assert (zero["bytes_up"], zero["bytes_down"]) == (10 + 300 + 300, 20 + 100 + 100)
    assert zero["compute_s"] == pytest.approx(0.2 * 3)
    assert zero["finish_s"] == pytest.approx(3.0 + 0.5)  # its last stage's end
    assert zero["gflops"] == pytest.approx(1.0) and zero["steps"] == 4
    assert zero["host_train_s"] == pytest.approx(0.1 + 0.5 + 0.5)
    assert zero["energy_j"] == pytest.approx(1.0 + 2.0 + 2.0)
    assert zero["train_loss"] == 1.5 and zero["num_samples"] == 50  # the stage that trained
    assert zero["status"] == "completed"
    assert one["status"] == "dropped_deadline" and one["completed"] is False
    assert statuses == {0: "completed", 1: "dropped_deadline"}
    assert math.isinf(one["finish_s"])
    assert stage_totals(stages) == {
        "bytes_up": 4 * 300,
        "bytes_down": 4 * 100,
        "client_gflops": pytest.approx(2.0),
    }


def test_no_stage_leaves_the_round_as_it_was() -> None:
    first = timing(1.0, [tl(0, 1.0)])
    rows = [{"client_id": 0, "selected": True, "bytes_up": 1}]
    assert add_stages(first, [], rows, {0: "completed"}) == first
    assert rows == [{"client_id": 0, "selected": True, "bytes_up": 1}]
    assert stage_totals([]) == {"bytes_up": 0, "bytes_down": 0, "client_gflops": 0.0}
