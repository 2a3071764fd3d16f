"""The engine's closed-form path equals the SimPy model bit for bit, and is used only
when it applies (no shared medium or CPU, constant rates, Download/Compute/Upload ops)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from mecsim.emulation.engine import (
    ClientSpec,
    NetworkSpec,
    RateSchedule,
    ServerSpec,
    dispatch,
    simpy_model,
    time_round,
)
from mecsim.emulation.engine.closed_form import _closed_form_timelines
from mecsim.emulation.ops import Compute, Download, ServerCompute, Upload

SERVERS = [ServerSpec(flops_per_s=1e9)]


def _random_round(rng: np.random.Generator):
    n = int(rng.integers(1, 25))
    ids = rng.permutation(1000)[:n].tolist()  # any order, not sorted
    traces, specs = {}, {}
    for cid in ids:
        ops = []
        for _ in range(int(rng.integers(0, 7))):
            kind = rng.integers(3)
            zero = rng.random() < 0.15
            if kind == 0:
                ops.append(Download(0 if zero else int(rng.integers(1, 5_000_000))))
            elif kind == 1:
                flops = 0.0 if zero else float(rng.uniform(1e6, 5e10))
                ops.append(Compute(flops, int(rng.integers(0, 60))))
            else:
                ops.append(Upload(0 if zero else int(rng.integers(1, 5_000_000))))
        traces[cid] = tuple(ops)
        rate = lambda: 0.0 if rng.random() < 0.05 else float(rng.uniform(1e5, 1e8))  # noqa: E731
        fps = 0.0 if rng.random() < 0.03 else float(rng.uniform(1e8, 3e10))
        lat = lambda: 0.0 if rng.random() < 0.5 else float(rng.uniform(0.0, 0.3))  # noqa: E731
        specs[cid] = ClientSpec(
            cid,
            rate(),
            rate(),
            float(rng.choice([0.0, rng.uniform(0, 0.2)])),
            fps,
            uplink_latency_s=lat(),
            downlink_latency_s=lat(),
        )
    deadline = None if rng.random() < 0.4 else float(rng.uniform(0.1, 30.0))
    return traces, specs, NetworkSpec(deadline_s=deadline), float(rng.uniform(0, 1))


def test_closed_form_equals_simpy_on_random_rounds():
    rng = np.random.default_rng(12345)
    stuck = dropped = 0
    for _ in range(300):
        traces, specs, net, agg = _random_round(rng)
        assert _closed_form_timelines(traces, specs, net) is not None  # the fast path applies
        fast = time_round(traces, specs, SERVERS, net, aggregate_s=agg)
        slow = time_round(traces, specs, SERVERS, net, aggregate_s=agg, method="simpy")
        assert fast == slow  # every float of every timeline, exactly
        stuck += sum(math.isinf(c.finish_s) for c in fast.clients)
        dropped += len(fast.dropped)
    assert stuck > 0 and dropped > 0  # the random cases did reach those branches


def test_closed_form_sums_in_simpy_order():
    # 0.1 + 0.2 != 0.3 in floating point: per-kind time is a difference of clock readings
    trace = (Download(1), Compute(0.2, 0), Upload(1), Compute(0.7, 0))
    spec = ClientSpec(1, 80.0, 80.0, 0.0, 1.0)  # 8 bits at 80 bps = 0.1 s
    fast = time_round({1: trace}, {1: spec}, SERVERS, NetworkSpec())
    slow = time_round({1: trace}, {1: spec}, SERVERS, NetworkSpec(), method="simpy")
    assert fast == slow
    assert fast.clients[0].finish_s == ((0.1 + 0.2) + 0.1) + 0.7


@dataclass(frozen=True)
class Backhaul:  # an op type the closed form does not know (added later by someone else)
    nbytes: int


class SlowUpload(Upload):
    pass


def test_closed_form_declines_what_it_does_not_cover():
    trace = (Download(1000), Compute(1e9, 3), Upload(1000))
    specs = {1: ClientSpec(1, 1e6, 1e6, 0.01, 1e9), 2: ClientSpec(2, 2e6, 1e6, 0.01, 1e9)}
    both = {1: trace, 2: trace}
    assert _closed_form_timelines(both, specs, NetworkSpec()) is not None
    assert _closed_form_timelines(both, specs, NetworkSpec(uplink_shared=True)) is None
    assert _closed_form_timelines(both, specs, NetworkSpec(downlink_shared=True)) is None
    with_server = {1: trace + (ServerCompute(1e9),), 2: trace}
    assert _closed_form_timelines(with_server, specs, NetworkSpec()) is None
    sched = {1: ClientSpec(1, RateSchedule((0.0,), (1e6,)), 1e6, 0.01, 1e9), 2: specs[2]}
    assert _closed_form_timelines(both, sched, NetworkSpec()) is None
    for foreign in (Backhaul(10), SlowUpload(10)):
        assert (
            _closed_form_timelines({1: trace + (foreign,), 2: trace}, specs, NetworkSpec()) is None
        )


def test_time_round_uses_simpy_only_for_what_the_fast_paths_do_not_cover(monkeypatch):
    calls = []
    real = simpy_model._simulate

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(dispatch, "_simulate", spy)
    trace = (Download(1000), Compute(1e9, 3), Upload(1000))
    specs = {1: ClientSpec(1, 1e6, 1e6, 0.01, 1e9)}
    time_round({1: trace}, specs, SERVERS, NetworkSpec())  # closed form
    shared = time_round({1: trace}, specs, SERVERS, NetworkSpec(uplink_shared=True))
    time_round({1: trace + (ServerCompute(1e9),)}, specs, SERVERS, NetworkSpec())
    assert calls == [] and shared.clients[0].finish_s > 0  # media / events paths
    with pytest.raises(KeyError):  # an op type no path knows: left to the SimPy model,
        time_round({1: trace + (SlowUpload(10),)}, specs, SERVERS, NetworkSpec())
    assert len(calls) == 1  # which rejects it too
    time_round({1: trace}, specs, SERVERS, NetworkSpec(), method="simpy")
    assert len(calls) == 2


def test_closed_form_checks_client_ids_and_method():
    with pytest.raises(ValueError, match="client_id"):
        time_round({1: (Upload(10),)}, {1: ClientSpec(2, 1e6, 1e6, 0, 1e9)}, SERVERS, NetworkSpec())
    with pytest.raises(ValueError, match="method"):
        time_round({}, {}, SERVERS, NetworkSpec(), method="fast")


def _tied_round(rng: np.random.Generator):
    """A round of small binary fractions: many clients finish at the very same instant
    with other busy times, so the critical client's tie-break is exercised."""
    n = int(rng.integers(1, 12))
    ids = rng.permutation(50)[:n].tolist()
    traces, specs = {}, {}
    for cid in ids:
        ops = []
        for _ in range(int(rng.integers(0, 5))):
            kind = rng.integers(3)
            if kind == 0:
                ops.append(Download(int(rng.integers(0, 3))))
            elif kind == 1:
                ops.append(Compute(float(rng.integers(0, 3)), int(rng.integers(0, 3))))
            else:
                ops.append(Upload(int(rng.integers(0, 3))))
        traces[cid] = tuple(ops)
        specs[cid] = ClientSpec(
            cid,
            float(rng.choice([0.0, 8.0, 16.0], p=[0.05, 0.5, 0.45])),
            float(rng.choice([8.0, 16.0])),
            float(rng.choice([0.0, 0.5])),
            float(rng.choice([1.0, 2.0])),
            uplink_latency_s=float(rng.choice([0.0, 0.25])),
            downlink_latency_s=float(rng.choice([0.0, 0.25])),
        )
    deadline = None if rng.random() < 0.4 else float(rng.choice([0.5, 1.0, 1.5, 2.0]))
    return traces, specs, NetworkSpec(deadline_s=deadline), float(rng.choice([0.0, 0.25]))


@pytest.mark.parametrize("make", [_random_round, _tied_round])
def test_columns_give_time_rounds_numbers(make):
    """time_round_columns (what replays use) and time_round's closed form, which both
    summarise columns, give exactly what the SimPy model's path summarises from its
    timelines, with crashes and drop-outs (``failed``) and a wait-for count too."""
    from mecsim.emulation.engine import ClientColumns, plan_traces, time_round_columns

    rng = np.random.default_rng(777)
    cut = failing = 0
    for _ in range(400):
        traces, specs, net, agg = make(rng)
        ids = list(traces)
        failed = [c for c in ids if rng.random() < 0.2]
        wait_for = None if rng.random() < 0.5 else int(rng.integers(0, len(ids) + 2))
        slow = time_round(
            traces, specs, SERVERS, net, agg, method="simpy", failed=failed, wait_for=wait_for
        )
        fast = time_round(traces, specs, SERVERS, net, agg, failed=failed, wait_for=wait_for)
        plan = plan_traces(traces)
        assert plan is not None
        columns = time_round_columns(
            plan,
            ClientColumns.of([specs[c] for c in ids]),
            net,
            agg,
            failed=failed,
            wait_for=wait_for,
        )
        assert columns is not None
        assert fast == slow
        assert columns.timing() == slow
        cut += wait_for is not None and 0 < wait_for < len(ids)
        failing += bool(failed)
    assert cut > 50 and failing > 100


def test_columns_decline_shared_media():
    from mecsim.emulation.engine import ClientColumns, plan_traces, time_round_columns

    trace = (Download(1000), Compute(1e9, 3), Upload(1000))
    spec = ClientSpec(1, 1e6, 1e6, 0.01, 1e9)
    plan = plan_traces({1: trace})
    assert plan is not None and plan_traces({1: trace + (ServerCompute(1.0),)}) is None
    cols = ClientColumns.of([spec])
    assert time_round_columns(plan, cols, NetworkSpec(uplink_shared=True)) is None
    assert time_round_columns(plan, cols, NetworkSpec()).timing() == time_round(
        {1: trace}, {1: spec}, SERVERS, NetworkSpec()
    )


@pytest.mark.parametrize("n_kinds", [3, 5])
def test_summarising_columns_equals_summarising_timelines(n_kinds):
    """The column summary picks the same critical client as max() over timelines when
    several finish at the same instant with different busy seconds (the tie-break), and
    applies deadlines, failures and wait-for counts the same way."""
    from mecsim.emulation.engine.dispatch import _complete, _summarise_columns
    from mecsim.emulation.engine.specs import _timelines

    rng = np.random.default_rng(31)
    tie_breaks = 0
    for _ in range(500):
        n = int(rng.integers(0, 10))
        ids = tuple(rng.permutation(100)[:n].tolist())
        finish = rng.choice([1.0, 2.0, 3.0, math.inf], size=n, p=[0.3, 0.3, 0.3, 0.1])
        spent = rng.uniform(0.0, 1.0, size=(n, n_kinds))
        deadline = None if rng.random() < 0.4 else float(rng.choice([1.5, 2.0, 2.5]))
        failed = [c for c in ids if rng.random() < 0.15]
        wait_for = None if rng.random() < 0.5 else int(rng.integers(0, n + 2))
        agg = float(rng.uniform(0.0, 0.5))
        timelines = _timelines(list(ids), finish, spent, deadline)
        expected = _complete(timelines, deadline, agg, failed, wait_for)
        got = _summarise_columns(ids, finish, spent, deadline, agg, failed, wait_for)
        assert got.timing() == expected
        done = [t for t in expected.clients if t.completed]
        tie_breaks += len({t.finish_s for t in done}) < len(done)
    assert tie_breaks > 100
