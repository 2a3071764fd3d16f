"""Who is online when (mecsim.emulation.availability): FedScale-layout traces, with their
mistakes named by file and line, and exponential on/off periods, against hand numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mecsim.emulation.availability import Availability, AvailabilityError, read_trace
from mecsim.scenario.availability import AvailabilityConfig


def _trace(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(text)
    return path


def test_a_trace_repeats_every_finish_time(tmp_path: Path) -> None:
    # client 0: online [10, 40) and [60, 100), every 120 s; client 1: [0, 50), once
    path = _trace(
        tmp_path,
        json.dumps(
            {
                "0": {"active": [10, 60], "inactive": [40, 100], "finish_time": 120},
                "1": {"active": [0], "inactive": [50], "duration": 7, "model": "x"},
            }
        ),
    )
    a = Availability(read_trace(path, clients=3))
    assert [a.online(0, t) for t in (0, 10, 39.9, 40, 59, 60, 99, 100, 130, 185)] == [
        False, True, True, False, False, True, True, False, True, True,
    ]  # fmt: skip
    assert a.next_on(0, 0) == 10 and a.next_on(0, 45) == 60 and a.next_on(0, 20) == 20
    assert a.next_on(0, 105) == 130  # the next period's first interval: 120 + 10
    assert a.next_off(0, 15) == 40 and a.next_off(0, 70) == 100 and a.next_off(0, 45) == 45
    assert a.next_off(0, 250) == 280  # 240 + 40
    # no finish_time: once, then offline for good
    assert a.online(1, 0) and not a.online(1, 50) and a.next_on(1, 60) == math.inf
    assert a.next_off(1, 0) == 50
    # a client the trace does not name is online throughout
    assert a.online(2, 1e6) and a.next_off(2, 5) == math.inf and a.next_on(2, 5) == 5


def test_an_interval_across_the_period_end_is_one(tmp_path: Path) -> None:
    # online [0, 30) and [90, 120) every 120 s: online from 90 to 150 without a break
    path = _trace(tmp_path, '{"0": {"active": [0, 90], "inactive": [30, 120], "finish_time": 120}}')
    a = Availability(read_trace(path, clients=1))
    assert a.next_off(0, 100) == 150 and a.online(0, 120) and a.next_off(0, 125) == 150
    path = _trace(tmp_path, '{"0": {"active": [0], "inactive": [120], "finish_time": 120}}')
    assert Availability(read_trace(path, clients=1)).next_off(0, 5) == math.inf


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            '{\n "0": {"active": [0], "inactive": [5]},\n "4": {"active": [0], "inactive": [5]}\n}',
            3,
            "client 4, but the scenario has 4 clients (0 to 3)",
        ),
        ('{\n "x": {"active": [0], "inactive": [5]}\n}', 2, "client 'x' is not an index"),
        (
            '{\n "1": {"active": [0, 9],\n       "inactive": [5]}\n}',
            3,
            "2 active times and 1 inactive ones",
        ),
        ('{\n "1": {"active": [0],\n "inactive": [0]}\n}', 3, "interval 0 ends at 0.0 s"),
        (
            '{\n "1": {"active": [0, 3],\n "inactive": [5, 8]}\n}',
            2,
            "interval 1 starts at 3.0 s, before interval 0 ends at 5.0 s",
        ),
        (
            '{\n "1": {"active": [0], "inactive": [50],\n  "finish_time": 40}\n}',
            3,
            "finish_time 40.0 s is not after its last interval's end (50.0 s)",
        ),
        ('{\n "1": {"active": [-1], "inactive": [5]}\n}', 2, "is not a time >= 0"),
        ('{\n "1": {"active": [0], "inactive": [5], "speed": 3}\n}', 2, "unknown key 'speed'"),
        ('{\n "1": {"active": [], "inactive": []}\n}', 2, "never online"),
        (
            '{\n "1": {"active": [0], "inactive": [5]},\n "1": {"active": [0], "inactive": [5]}\n}',
            3,
            "client 1 a second time",
        ),
        ('{\n "1": {"active": [0], "inactive": [5]\n}', 3, "not JSON"),  # (ends on line 3)
        ("[1, 2]", 1, "not a JSON object of clients"),
    ],
)
def test_a_bad_trace_is_refused_naming_file_and_line(tmp_path, text, line, words) -> None:
    path = _trace(tmp_path, text)
    with pytest.raises(AvailabilityError) as err:
        read_trace(path, clients=4)
    assert f"{path}:{line}: " in str(err.value) and words in str(err.value), str(err.value)


def test_a_pickle_is_refused_not_read(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "client_behave_trace.pkl"
    path.write_bytes(pickle.dumps({1: {"active": [0], "inactive": [5]}}))
    with pytest.raises(AvailabilityError, match="a pickle"):
        read_trace(path, clients=4)


def test_exponential_periods_are_seeded_and_have_their_means() -> None:
    cfg = AvailabilityConfig(model="exponential", mean_online_s=30.0, mean_offline_s=10.0)
    a = Availability.of(cfg, clients=200, seed=7)
    b = Availability.of(cfg, clients=200, seed=7)
    assert a is not None and b is not None
    # asked in another order, the same answers (each client draws from its own stream)
    times = np.linspace(0, 500, 101)
    forward = [[a.online(c, t) for t in times] for c in range(200)]
    backward = [[b.online(c, t) for t in reversed(times)][::-1] for c in range(200)]
    assert forward == backward
    # at time 0 online with the stationary probability 30 / (30 + 10) = 0.75 (200 draws:
    # 0.75 +- 3 standard errors of 0.031), and the share online stays there
    assert abs(np.mean([a.online(c, 0.0) for c in range(200)]) - 0.75) < 0.093
    assert abs(np.mean(forward) - 0.75) < 0.05
    # an online period lasts 30 s on average: the mean over 200 clients' first full one
    lengths = []
    for c in range(200):
        on = a.next_on(c, a.next_off(c, 0.0))
        lengths.append(a.next_off(c, on) - on)
    assert abs(np.mean(lengths) - 30.0) < 3 * 30.0 / math.sqrt(200)
    assert Availability.of(AvailabilityConfig(), clients=3, seed=0) is None
