"""Asynchronous runs worked out by hand: three clients with fixed cycle times.

The executor is a thin fake (the process boundary): client ``c`` "trains" by adding
``c + 1`` to every element of the model it downloaded, in ``steps[c]`` steps of 0.1 s,
and uploads 1,000 bytes. Everything else is real: the scenario, the NetworkModel's fixed
80 kb/s links (1,000 bytes: 0.1 s each way), SimPy, the servers' maths.

Cycle times (download 0.1 + compute + upload 0.1): client 0 1.0 s, client 1 2.4 s,
client 2 3.7 s. The server aggregates in ~1e-11 s (6 FLOPs at 1e12 FLOP/s), so arrivals
come at 1.0, 2.0, 2.4, 3.0, 3.7, 4.0, 4.8, ... (client 0, 0, 1, 0, 2, 0, 1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mecsim.agents.algorithms import ClientResult
from mecsim.agents.algorithms.asynchronous import fedbuff_weight, staleness_weight
from mecsim.emulation.devices import DeviceProfile
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.run.async_run import AsyncRun
from mecsim.run.observers import RunInfo
from mecsim.run.setup import RunSetup
from mecsim.scenario import scenario_from_dict

STEPS = {0: 8, 1: 22, 2: 35}  # x 0.1 s per step
NBYTES = 1000


class _Executor:
    """Trains by adding c + 1; counts the fit calls and what each trained."""

    def __init__(self, scale: float = 1.0) -> None:
        self.fits: list[list[tuple[int, float]]] = []
        self.scale = scale

    def fit(self, rnd, tasks, lost=frozenset(), fold=None):
        self.fits.append([(t.client_id, float(t.weights[0])) for t in tasks])
        return [
            ClientResult(
                t.client_id,
                (t.weights + self.scale * (t.client_id + 1)).astype(np.float32),
                NBYTES,
                10,
                0.5,
                (Download(NBYTES), Compute(0.0, STEPS[t.client_id]), Upload(NBYTES)),
                0.0,
                STEPS[t.client_id],
                0,
            )
            for t in tasks
        ]

    def take_uploads(self):
        return {}

    def evaluate_tasks(self, rnd, tasks):
        return [(t.client_id, float(t.weights[0]), 0.0, 1) for t in tasks]


def _scenario(aggregation: dict, rounds: int):
    return scenario_from_dict(
        {
            "rounds": rounds,
            "topology": {"clients": 3},
            "devices": {
                "clients": [{"profile": "step"}],
                "profiles": {
                    "step": {
                        "flops_per_s": 1e12,
                        "step_overhead_s": 0.1,
                        "ram_bytes": 10**9,
                        "flops_source": "test",
                        "step_overhead_source": "test",
                    }
                },
            },
            "channel": {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 80_000, "transport": "ideal"},
                "downlink": {"rate_bps": 80_000, "transport": "ideal"},
            },
            "aggregation": aggregation,
        }
    )


class _NaNFromClient1(_Executor):
    """As :class:`_Executor`, but client 1 uploads NaN."""

    def fit(self, rnd, tasks, lost=frozenset(), fold=None):
        results = super().fit(rnd, tasks, lost, fold)
        for r in results:
            if r.client_id == 1:
                r.weights = np.full_like(r.weights, np.nan)
        return results


def _run(aggregation: dict, rounds: int, scale: float = 1.0, ex: _Executor | None = None):
    sc = _scenario(aggregation, rounds)
    profiles = device_profiles(sc)
    info = RunInfo("t", sc, None, 2, NBYTES, 0, 0.0, sc.client_profiles())
    ex = _Executor(scale) if ex is None else ex
    server = DeviceProfile("srv", 1e12, 0.0, 10**9)
    rs = RunSetup(
        info, ex, NetworkModel(sc, profiles), server, np.ones(3), init_weights=np.zeros(2)
    )
    rows: list = []
    updates: list = []

    def emit(name, row, taken, traces):
        rows.append(row)
        updates.extend(taken)

    run = AsyncRun(rs, emit)
    assert run.run() == "finished"
    return run, rows, updates, ex


def test_fedasync_staleness_and_mixing_by_hand():
    run, rows, updates, ex = _run({"mode": "async", "alpha": 0.6}, rounds=5)
    assert [u["client_id"] for u in updates] == [0, 0, 1, 0, 2]
    assert [u["trained_on"] for u in updates] == [0, 1, 0, 2, 0]
    assert [u["staleness"] for u in updates] == [0, 0, 2, 1, 4]
    assert [u["arrive_s"] for u in updates] == pytest.approx([1.0, 2.0, 2.4, 3.0, 3.7])
    assert [u["download_s"] for u in updates] == pytest.approx([0.1] * 5)
    assert [u["compute_s"] for u in updates] == pytest.approx([0.8, 0.8, 2.2, 0.8, 3.5])
    # staleness in seconds: since the version it trained on was made (v0 at 0, v1 at 1.0,
    # v2 at 2.0): 1.0, 1.0, 2.4, 1.0, 3.7
    assert [u["staleness_s"] for u in updates] == pytest.approx([1.0, 1.0, 2.4, 1.0, 3.7])
    # x_t = (1 - α_t) x + α_t x_new, α_t = 0.6 (s + 1)^-0.5; client c uploads base + c + 1
    a = [0.6, 0.6, 0.6 / math.sqrt(3), 0.6 / math.sqrt(2), 0.6 / math.sqrt(5)]
    assert [u["weight"] for u in updates] == pytest.approx(a)
    x1 = 0.6 * 1.0  # 0.6
    x2 = 0.4 * x1 + 0.6 * (x1 + 1)  # 1.2
    x3 = (1 - a[2]) * x2 + a[2] * 2.0  # client 1 trained on x0 = 0
    x4 = (1 - a[3]) * x3 + a[3] * (x2 + 1)  # client 0 trained on x2
    x5 = (1 - a[4]) * x4 + a[4] * 3.0  # client 2 trained on x0
    assert x2 == pytest.approx(1.2)
    assert x5 == pytest.approx(2.110153, abs=1e-6)  # by hand: 1.477128, 1.783817
    assert float(run.server.weights[0]) == pytest.approx(x5, rel=1e-6)
    assert [r["mean_accuracy"] for r in rows] == pytest.approx([x1, x2, x3, x4, x5], rel=1e-6)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["elapsed_s"] for r in rows] == pytest.approx([1.0, 2.0, 2.4, 3.0, 3.7])
    # the first fit trains all three (every download began at 0); then one at a time
    assert [sorted(c for c, _ in f) for f in ex.fits][:2] == [[0, 1, 2], [0]]


def test_fedbuff_buffer_and_weighting_by_hand():
    run, rows, updates, _ = _run({"mode": "buffered", "buffer_size": 2, "server_lr": 1.0}, rounds=3)
    assert [u["client_id"] for u in updates] == [0, 0, 1, 0, 2, 0]
    assert [u["trained_on"] for u in updates] == [0, 0, 0, 1, 0, 2]
    assert [u["staleness"] for u in updates] == [0, 0, 1, 0, 2, 0]
    assert [u["version"] for u in updates] == [1, 1, 2, 2, 3, 3]
    w = [fedbuff_weight(s) for s in (0, 0, 1, 0, 2, 0)]
    assert w[2] == pytest.approx(1 / math.sqrt(2)) and w[4] == pytest.approx(1 / math.sqrt(3))
    assert [u["weight"] for u in updates] == pytest.approx(w)
    # x_{t+1} = x_t + η (1/K) Σ Δ_i / sqrt(1 + s_i); Δ = c + 1
    x1 = 0.0 + (1 + 1) / 2  # 1.0
    x2 = x1 + (2 / math.sqrt(2) + 1) / 2
    x3 = x2 + (3 / math.sqrt(3) + 1) / 2
    assert x3 == pytest.approx(3.573132, abs=1e-6)
    assert float(run.server.weights[0]) == pytest.approx(x3, rel=1e-6)
    assert [r["completed"] for r in rows] == [2, 2, 2]
    assert [r["mean_staleness"] for r in rows] == pytest.approx([0.0, 0.5, 1.0])
    assert [r["elapsed_s"] for r in rows] == pytest.approx([2.0, 3.0, 4.0])


def test_max_staleness_drops_and_records_why():
    _, rows, updates, _ = _run({"mode": "async", "max_staleness": 1}, rounds=5)
    dropped = [u for u in updates if u["status"] == "dropped_stale"]
    # a dropped update makes no version: client 1 (staleness 2 at 2.4 s), client 2
    # (staleness 3 at 3.7 s: versions 1-3 made by client 0 meanwhile) and client 1's
    # second update (trained on v2 from 2.4 s, staleness 2 at 4.8 s) are dropped
    assert [(u["client_id"], u["staleness"]) for u in dropped] == [(1, 2), (2, 3), (1, 2)]
    assert [u["arrive_s"] for u in dropped] == pytest.approx([2.4, 3.7, 4.8])
    assert sum(r["dropped_stale"] for r in rows) == 3


def test_staleness_functions_are_the_papers():
    assert staleness_weight("constant", 7) == 1.0
    assert staleness_weight("polynomial", 3, a=0.5) == pytest.approx(0.5)  # 4^-0.5
    assert staleness_weight("hinge", 4, a=10, b=4) == 1.0
    assert staleness_weight("hinge", 6, a=10, b=4) == pytest.approx(1 / 21)
    with pytest.raises(ValueError):
        staleness_weight("exponential", 1)


def test_server_version_is_the_one_the_update_met():
    _, _, updates, _ = _run({"mode": "async"}, rounds=5)
    assert [u["server_version"] for u in updates] == [0, 1, 2, 3, 4]
    assert [u["server_version"] - u["trained_on"] for u in updates] == [
        u["staleness"] for u in updates
    ]


def test_semi_sync_averages_each_periods_arrivals_by_hand():
    run, rows, updates, _ = _run({"mode": "semi_sync", "period_s": 1.7}, rounds=3)
    # periods end at 1.7, 3.4 and 5.1 s; arrivals as above (client 0 every second)
    assert [u["client_id"] for u in updates] == [0, 0, 1, 0, 2, 0, 1, 0]
    assert [u["arrive_s"] for u in updates] == pytest.approx(
        [1.0, 2.0, 2.4, 3.0, 3.7, 4.0, 4.8, 5.0]
    )
    assert [u["trained_on"] for u in updates] == [0, 0, 0, 1, 0, 1, 1, 2]
    assert [u["staleness"] for u in updates] == [0, 1, 1, 0, 2, 1, 1, 0]
    assert [u["version"] for u in updates] == [1, 2, 2, 2, 3, 3, 3, 3]
    # x1 = 1 (client 0 from x0); x2 = mean(0+1, 0+2, x1+1) = 5/3;
    # x3 = mean(0+3, x1+1, x1+2, x2+1) = 8/3 (equal samples: a plain mean)
    assert [r["mean_accuracy"] for r in rows] == pytest.approx([1.0, 5 / 3, 8 / 3], rel=1e-6)
    assert [r["elapsed_s"] for r in rows] == pytest.approx([1.7, 3.4, 5.1])
    assert [r["completed"] for r in rows] == [1, 3, 4]


def test_a_diverging_server_step_stops_the_run_saying_so():
    """Finite updates (deltas of 1e37), a step that overflows float32 (η_g = 100):
    the run stops instead of serving a non-finite model."""
    from mecsim.run.setup import RunFailed

    with pytest.raises(RunFailed, match="version 1 of the model holds NaN or inf"):
        _run({"mode": "buffered", "buffer_size": 1, "server_lr": 100.0}, rounds=3, scale=1e37)


def test_a_non_finite_upload_is_rejected_and_folds_into_nothing():
    """Client 1 uploads NaN: its update (the third arrival, at 2.4 s) is recorded as
    rejected_nonfinite with weight 0 and makes no version; FedAsync (α = 0.6, s = 1 / (1
    + staleness)^0.5 by default) makes its 4 versions from the other four updates:
    x1 = 0.6 (client 0 on x0 = 0: 0.4 * 0 + 0.6 * 1), x2 = 0.4 * 0.6 + 0.6 * 1.6 = 1.2,
    x3 from client 0 on x2 (staleness 0): 0.4 * 1.2 + 0.6 * 2.2 = 1.8, x4 from client 2
    on x0 (staleness 3): weight 0.6 / 2 = 0.3, 0.7 * 1.8 + 0.3 * 3 = 2.16."""
    run, rows, updates, _ = _run({"mode": "async", "alpha": 0.6}, rounds=4, ex=_NaNFromClient1())
    assert [u["client_id"] for u in updates] == [0, 0, 1, 0, 2]
    assert [u["status"] for u in updates] == ["accepted"] * 2 + ["rejected_nonfinite"] + [
        "accepted"
    ] * 2
    assert updates[2]["weight"] == 0.0 and updates[2]["version"] == 3
    assert [r["rejected"] for r in rows] == [0, 0, 1, 0]
    assert [r["mean_accuracy"] for r in rows] == pytest.approx([0.6, 1.2, 1.8, 2.16], rel=1e-6)
