"""One round numbering for people (from 1) and the figures' readability rules: log time
axis when runs differ > 10x, legends outside for many series, shared y scales, integer
round ticks, and sweep.png with human labels, units, a zero-based y and every point."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.ticker import MaxNLocator
from support.paths import ROOT

from mecsim.analysis.plots import (
    LEGEND_INSIDE_MAX,
    accuracy_figure,
    energy_figure,
    log_time_axis,
    round_numbers,
    time_split_figure,
)
from mecsim.analysis.replay import ReplayResult
from mecsim.analysis.tables import RunRecords, build_tables, label_runs
from mecsim.analysis.whatif_sweep import HEAD_COLUMNS, METRIC_COLUMNS, sweep_figure
from mecsim.store.summary import markdown, summarise, target_lines


def _run(name: str, round_s: float, n: int = 6, energy: bool = True) -> RunRecords:
    acc = np.linspace(0.5, 0.9, n)
    acc[-2] = 0.95  # the best round is the 5th (record index 4)
    df = pd.DataFrame(
        {
            "run_id": name,
            "round": np.arange(n),
            "algorithm": name,
            "round_time_s": round_s,
            "dl_time_s": 0.2 * round_s,
            "client_time_s": 0.5 * round_s,
            "ul_time_s": 0.3 * round_s,
            "server_time_s": 0.0,
            "idle_time_s": 0.0,
            "elapsed_s": round_s * np.arange(1, n + 1),
            "bytes_up": 1e6,
            "bytes_down": 1e6,
            "client_gflops": 1.0,
            "server_gflops": 0.1,
            "server_rss_mb": 10.0,
            "client_peak_mb": 1.0,
            "mean_accuracy": acc,
            "min_accuracy": acc - 0.1,
            "max_accuracy": acc + 0.05,
            "host_wall_s": 0.1,
        }
    )
    if energy:
        df = df.assign(
            energy_j=10.0 * round_s,
            energy_compute_j=5.0 * round_s,
            energy_radio_j=1.0 * round_s,
            energy_idle_j=4.0 * round_s,
        )
    return RunRecords(Path(name), name, name, df)


# ----------------------------------------------------------------------------- rounds


def test_rounds_counted_from_one_in_everything_a_person_reads():
    r = _run("a", 2.0)
    rows = r.rounds.to_dict("records")
    # record index 4 holds the best accuracy: a person reads "round 5"
    assert "(round 5)" in markdown("a", "fedavg", summarise(rows))
    assert summarise(rows)["best_round"] == 5
    t = build_tables([r], target=0.6)
    assert t.accuracy["best_round"].iloc[0] == 5
    # 0.5, 0.58, 0.66: the target 0.6 is first reached at record index 2 -> 3 rounds
    assert t.accuracy["rounds_to_target"].iloc[0] == 3
    assert target_lines(rows, [0.6]) == ["Rounds to 60 % mean user accuracy: 3 (6.0 s emulated)."]
    assert list(round_numbers(r.rounds)) == [1, 2, 3, 4, 5, 6]
    # a replay's notes and repr speak of rounds from 1 too (inexact_from_round is the
    # records' index, like the `round` column)
    res = ReplayResult("a", "fedavg", {}, None, r.rounds, "replay", False, 2, True)
    assert "inexact from round 3" in repr(res)


def test_dcpfl_benchmark_prints_rounds_from_one(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "papers"))  # as when the script runs
    spec = importlib.util.spec_from_file_location(
        "dcpfl_table", ROOT / "benchmarks" / "papers" / "dcpfl_table.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = pd.DataFrame(
        [
            {
                "method": "DC-PFL",
                "key": "dcpfl",
                "seed": 0,
                "final_accuracy": 0.9,
                "best_accuracy": 0.92,
                "convergence_round": 18.0,
                "comm_rounds": 19.0,
                "comm_time_s": 110.0,
                "compute_time_s": 2.0,
                "total_time_s": 112.0,
                "target_target_round": 9.0,
                "target_total_time_s": 50.0,
                "target_bytes_total": 3 * 2**20,
            }
        ]
    )
    md = mod.markdown(t, 0.85, [], 1)
    assert "| DC-PFL | 0.900 | 0.920 | 19.0 | 19.0 | 110 | 112 | 10.0 | 50 | 3 |" in md
    df = pd.DataFrame(
        {
            "round": [13, 14, 15],
            "trial": [0, 0, 1],
            "split_accepted": [0, 0, 1],
            "groups": [1, 1, 22],
            "gamma_tilde": [1.0, 1.0, 0.8],
            "bytes_down": [1, 1, 2],
            "round_time_s": [1.0, 1.0, 2.0],
            "curvature_radius": [float("nan"), float("nan"), float("nan")],
        }
    )
    first = mod.dcpfl_structure(df, 1, 1).splitlines()[0]
    assert first.startswith("round 16: split kept")
    df["curvature_radius"] = [0.5, 2.0, float("nan")]  # r rose from its first value
    assert "without a minimum of r" in mod.dcpfl_structure(df, 1, 1).splitlines()[0]


# ----------------------------------------------------------------------------- run figures


def test_log_time_axis_only_beyond_10x():
    assert log_time_axis([_run("a", 1.0), _run("b", 11.0)])
    assert not log_time_axis([_run("a", 1.0), _run("b", 9.0)])
    fig = accuracy_figure([_run("a", 1.0), _run("b", 50.0)], "time")
    assert fig.axes[0].get_xscale() == "log"
    assert "log scale" in fig.axes[0].get_xlabel()
    assert (
        accuracy_figure([_run("a", 1.0), _run("b", 5.0)], "time").axes[0].get_xscale() == "linear"
    )


def test_legend_outside_for_many_runs_inside_for_few():
    few = [_run(f"r{k}", 1.0 + k) for k in range(2)]
    many = [_run(f"r{k}", 1.0 + k) for k in range(LEGEND_INSIDE_MAX + 1)]
    label_runs(few)
    label_runs(many)
    fig = accuracy_figure(few, "round")
    assert fig.axes[0].get_legend() is not None and not fig.legends
    fig = accuracy_figure(many, "round")
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
    # outside: the legend lies right of the axes once drawn
    fig.canvas.draw()
    assert fig.legends[0].get_window_extent().x0 >= fig.axes[0].get_window_extent().x1


def test_time_split_and_energy_panels_share_y_and_have_integer_round_ticks():
    runs = [_run("fast", 1.0), _run("slow", 30.0)]
    label_runs(runs)
    for fig in (time_split_figure(runs), energy_figure(runs)):
        axes = fig.axes
        fig.canvas.draw()
        assert axes[0].get_ylim() == axes[1].get_ylim()
        assert axes[0].get_ylim()[1] >= 30.0  # the slow run's scale applies to both
        loc = axes[-1].xaxis.get_major_locator()
        assert isinstance(loc, MaxNLocator) and loc._integer
        ticks = [t for t in axes[-1].get_xticks() if 1 <= t <= 6]
        assert ticks and all(float(t).is_integer() for t in ticks)
    assert accuracy_figure(runs, "round").axes[0].xaxis.get_major_locator()._integer
    assert energy_figure([_run("old", 1.0, energy=False)]) is None


# ----------------------------------------------------------------------------- sweep.png


def _sweep_frame(x: str, xs: list, ys: list) -> pd.DataFrame:
    rows = []
    for xv, yv in zip(xs, ys, strict=True):
        row = dict.fromkeys(METRIC_COLUMNS, math.nan)
        row.update(
            run_id="r",
            algorithm="fedavg",
            exact=True,
            source="replay",
            time_to_target_s=yv,
            round_time_mean_s=yv,
        )
        row[x] = xv
        rows.append(row)
    return pd.DataFrame(rows, columns=HEAD_COLUMNS + [x] + METRIC_COLUMNS)


def test_sweep_figure_labels_units_zero_based_and_every_point():
    frame = _sweep_frame(
        "channel.uplink.bandwidth_hz", [1e6, 5e6, 20e6, 50e6], [40.0, 20.0, float("nan"), 5.0]
    )
    ax = sweep_figure(frame, "channel.uplink.bandwidth_hz", "time_to_target_s").axes[0]
    assert ax.get_xlabel() == "uplink bandwidth (MHz)"
    assert ax.get_ylabel() == "emulated time to the target accuracy (s)"
    assert ax.get_xscale() == "log" and ax.get_ylim()[0] == 0
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [1.0, 5.0, 20.0, 50.0]  # MHz
    # the point without a value is drawn on the x axis, not dropped
    missing = [ln for ln in ax.get_lines() if ln.get_marker() == "v" and len(ln.get_xdata())]
    assert len(missing) == 1 and list(missing[0].get_xdata()) == [20.0]
    assert list(missing[0].get_ydata()) == [0.0]
    assert any("no value" in t.get_text() for t in ax.get_legend().get_texts())


def test_sweep_figure_null_grid_value_is_a_category():
    frame = _sweep_frame("deadline_s", [None, 10.0, 30.0], [25.0, 11.0, 24.0])
    ax = sweep_figure(frame, "deadline_s", "round_time_mean_s").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["null", "10", "30"]
    assert list(ax.get_lines()[0].get_xdata()) == [0.0, 1.0, 2.0]  # all three drawn
    assert ax.get_xlabel() == "round deadline (s)" and ax.get_ylim()[0] == 0
    assert ax.get_ylabel() == "mean round time (s)"


@pytest.mark.parametrize(
    "path,text",
    [
        ("channel.uplink.loss_rate", "uplink packet-loss rate (%)"),
        ("channel.downlink.latency_s", "downlink latency (ms)"),
        ("backhaul.latency_s", "backhaul latency (ms)"),
        ("channel.snr_offset_db", "SNR offset (dB)"),
        ("devices.clients.0.profile", "device profile of client group 0"),
        ("energy_mean_j", "client energy a round (all selected clients) (J)"),
        ("something_new_s", "something new (s)"),
    ],
)
def test_human_labels(path, text):
    from mecsim.analysis.labels import axis

    assert axis(path).text == text
