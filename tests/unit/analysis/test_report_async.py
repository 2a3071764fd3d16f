"""`mecsim report` and the run summary on asynchronous runs (docs/async.md): the time to
accuracy of sync and async runs side by side, worked out by hand; no per-round split
of server versions (their updates overlap in time)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mecsim.analysis.tables import build_tables, from_rows, label_runs
from mecsim.store.summary import markdown, summarise, table_rows, table_titles

MiB = 2**20
NAN = float("nan")


def _rows(table: list[tuple[float, int, float, float, float]], **extra: Any) -> list[dict]:
    """Round (or version) rows: (elapsed s, updates completed, energy J, MiB each way,
    mean accuracy); every other column of a round row 1 s / 0."""
    out = []
    for k, (elapsed, completed, energy, mib, acc) in enumerate(table):
        out.append(
            {
                "round": k,
                "algorithm": "fedavg",
                "selected": completed,
                "completed": completed,
                "round_time_s": 1.0,
                "dl_time_s": 0.25,
                "client_time_s": 0.5,
                "ul_time_s": 0.25,
                "server_time_s": 0.0,
                "idle_time_s": 0.0,
                "elapsed_s": elapsed,
                "bytes_up": mib * MiB,
                "bytes_down": mib * MiB,
                "energy_j": energy,
                "client_gflops": 1.0,
                "server_gflops": 0.0,
                "server_rss_mb": 100.0,
                "client_peak_mb": 2.0,
                "mean_accuracy": acc,
                "host_wall_s": 0.1,
                **extra,
            }
        )
    return out


SYNC = [  # 4 rounds of 4 clients, 40 J and 1 MiB each way a round
    (10.0, 4, 40.0, 1.0, 0.50),
    (20.0, 4, 40.0, 1.0, NAN),
    (30.0, 4, 40.0, 1.0, 0.82),
    (40.0, 4, 40.0, 1.0, 0.85),
]
ASYNC = [  # 4 server versions; version 2 took two updates (a buffer of its time)
    (1.0, 1, 5.0, 0.25, NAN),
    (2.0, 1, 5.0, 0.25, 0.60),
    (3.5, 2, 10.0, 0.50, 0.81),
    (4.0, 1, 5.0, 0.25, 0.79),
]


def _runs():
    sync = from_rows("s", _rows(SYNC))
    versions = from_rows("a", _rows(ASYNC, mean_staleness=1.5))
    versions.mode = "async"
    runs = [sync, versions]
    label_runs(runs)
    return runs


def test_time_to_accuracy_of_a_sync_and_an_async_run_by_hand() -> None:
    t = build_tables(_runs(), target=0.8).time_to_accuracy
    sync, versions = t.iloc[0], t.iloc[1]
    # sync reaches 0.82 at round 3 (index 2): 3 rounds of 4 updates, 30 s, 3 x 40 J,
    # 3 x (1 + 1) MiB
    assert (sync["mode"], sync["updates_to_target"], sync["time_to_target_s"]) == ("sync", 12, 30)
    assert (sync["energy_to_target_j"], sync["mib_to_target"]) == (120, 6)
    # async reaches 0.81 at version 2: 1 + 1 + 2 updates, 3.5 s, 5 + 5 + 10 J,
    # 2 x (0.25 + 0.25 + 0.5) MiB
    assert versions["mode"] == "async"
    assert (versions["updates_to_target"], versions["time_to_target_s"]) == (4, 3.5)
    assert (versions["energy_to_target_j"], versions["mib_to_target"]) == (20, 2)
    assert (sync["updates"], versions["updates"]) == (16, 5)
    # final accuracies: the mean of the last 5 evaluated rounds / versions
    assert sync["final_acc"] == pytest.approx((0.50 + 0.82 + 0.85) / 3)
    assert versions["final_acc"] == pytest.approx((0.60 + 0.81 + 0.79) / 3)


def test_without_a_target_the_common_one_and_never_reached_is_x() -> None:
    runs = _runs()
    # finals (window 1): 0.85 and 0.79 -> the common target 0.79; sync reaches it at
    # round 3, async at version 2 (0.81; 0.60 before it is below)
    t = build_tables(runs, window=1).time_to_accuracy
    assert list(t["target"]) == [pytest.approx(0.79)] * 2
    assert list(t["time_to_target_s"]) == [30.0, 3.5]
    text = build_tables(runs, target=0.84).markdown()
    section = text.split("## Time to accuracy")[1]
    row = next(line for line in section.splitlines() if line.startswith("| fedavg (a)"))
    # async never reaches 84 %: X in the four to-target columns
    assert row.split(" | ")[2:6] == ["X", "X", "X", "X"]
    assert "| fedavg (s) | sync | 16 | 40.0 | 160 | 8.0 |" in section


def test_the_per_round_tables_leave_the_async_run_out_and_say_so() -> None:
    text = build_tables(_runs(), target=0.8).markdown()
    per_round = text.split("## User accuracy")[0]
    assert "| fedavg (s) |" in per_round
    assert "| fedavg (a) |" not in per_round  # no per-round split of server versions
    # under each of the four per-round tables
    assert per_round.count("Not shown: fedavg (a) (asynchronous") == 4
    assert "Rounds (versions)" in text
    # only asynchronous runs: the per-round tables are empty, their note is there
    only = _runs()[1:]
    text = build_tables(only, target=0.8).markdown()
    assert "| fedavg (a) |" not in text.split("## User accuracy")[0]
    assert "| fedavg | async | 4 | 3.5 | 20 | 2.0 |" in text


def test_the_summary_of_versions_has_no_shares_of_the_time_between_them() -> None:
    s = summarise(_rows(ASYNC, mean_staleness=1.5))
    header, cells, _, _ = table_rows(s)
    assert not any("%" in h for h in header)
    assert header[0] == "Between versions (s)" and header[-1] == "Staleness (versions)"
    assert cells == ["1.00", "0.25", "0.25", "0.50", "0.00", "1.5"]
    assert table_titles(s)[0].startswith("Average time per server version")
    text = markdown("a", "fedavg", s)
    assert text.splitlines()[2].startswith("4 versions, 4.0 emulated seconds in all")
    assert "(version 3)" in text  # best accuracy 0.81 at version index 2


def test_a_sync_summary_is_as_before() -> None:
    s = summarise(_rows(SYNC))
    assert "versions" not in s
    header, cells, _, _ = table_rows(s)
    assert header == ["Time (s)", "U-Comm (s/%)", "D-Comm (s/%)", "Client (s/%)", "Server (s/%)"]
    assert cells[1] == "0.25 (25.00)"
    assert table_titles(s) == (
        "Average time per round (emulated, critical path)",
        "Communication and computation per round",
    )
    assert not math.isnan(s["best_mean_accuracy"])
