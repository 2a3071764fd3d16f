"""Replay and what-if sweeps over small runs recorded here with real training."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from support.procs import wait_gone
from support.scenarios import tiny

import mecsim
from mecsim.agents.algorithms.fedavg import FedAvgServer
from mecsim.analysis.replay import (
    RecordedRun,
    ReplayInfeasible,
    RunLoadError,
    load_run,
    replay,
)
from mecsim.analysis.whatif_sweep import HEAD_COLUMNS, METRIC_COLUMNS, grid_points, summarise, sweep
from mecsim.interfaces.cli import main
from mecsim.run.rows import REPLAY_COLUMNS
from mecsim.scenario.overrides import OverrideError, apply_overrides, parse_set, parse_values
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder

BW = "channel.uplink.bandwidth_hz"
TIMING = [c for c in REPLAY_COLUMNS if c != "mean_accuracy"]


def _recorded(rounds_df: pd.DataFrame) -> pd.DataFrame:
    return rounds_df[REPLAY_COLUMNS].reset_index(drop=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 3-round, 4-client FedAvg run, and the same scenario with a deadline that drops
    the slowest client of round 0."""
    base_dir = tmp_path_factory.mktemp("runs")
    scenario = tiny(rounds=3)
    run_in_folder(scenario, base_dir / "base")
    clients = pd.read_csv(base_dir / "base" / "clients.csv")
    finish = np.sort(clients[clients["round"] == 0]["finish_s"].to_numpy())
    deadline_s = float((finish[-2] + finish[-1]) / 2)
    late = apply_overrides(scenario, {"deadline_s": deadline_s})
    run_in_folder(late, base_dir / "late")
    return {
        "base": load_run(base_dir / "base"),
        "late": load_run(base_dir / "late"),
        "deadline_s": deadline_s,
        "dir": base_dir,
    }


def _csv(run: RecordedRun) -> pd.DataFrame:
    return read_csv_exact(run.run_dir / "rounds.csv")


def test_replay_without_override_reproduces_the_records_exactly(runs):
    for name in ("base", "late"):
        rec = runs[name]
        result = replay(rec)
        assert result.source == "replay" and result.exact and result.inexact_from_round is None
        got, want = result.rounds, _recorded(_csv(rec))
        assert list(got.columns) == REPLAY_COLUMNS
        for col in REPLAY_COLUMNS:  # bit for bit, not approximately
            assert np.array_equal(got[col].to_numpy(), want[col].to_numpy(), equal_nan=True), col
    # the deadline run: its outcome depended on timing, and the replay says why it is exact
    late = replay(runs["late"])
    assert late.timing_dependent and late.rounds["dropped"].iloc[0] == 1
    assert any("dropped clients at the deadline" in n for n in late.notes)
    assert any("drops the same clients" in n for n in late.notes)
    assert not replay(runs["base"]).timing_dependent


# rates change during round 0 and before round 1 starts: the replay must carry the
# elapsed emulated time from round to round as the run did
TRACE_CSV = """time_s,client_id,uplink_mbps,downlink_mbps
0,*,2,8
2.5,*,0.5,4
6,*,6,20
"""


@pytest.mark.parametrize("channel", ["shared_fixed_rate", "trace"])
def test_exact_replay_through_the_simpy_model(channel, tmp_path):
    """Shared media (processor sharing) and rate traces that depend on the elapsed time
    take the SimPy path; a replay reproduces them exactly too."""
    if channel == "trace":
        (tmp_path / "rates.csv").write_text(TRACE_CSV)
        cfg = {"model": "trace", "path": str(tmp_path / "rates.csv")}
    else:
        cfg = {
            "model": "fixed_rate",
            "uplink": {"rate_bps": 4e6, "shared": True},
            "downlink": {"rate_bps": 2e7, "shared": True},
        }
    out = tmp_path / "run"
    run_in_folder(tiny(rounds=2, channel=cfg), out)
    recorded = load_run(out)
    got, want = replay(recorded).rounds, _recorded(_csv(recorded))
    assert (got["round_time_s"] > 0).all()
    for col in REPLAY_COLUMNS:
        assert np.array_equal(got[col].to_numpy(), want[col].to_numpy(), equal_nan=True), col


def test_round_time_is_monotone_in_uplink_bandwidth(runs):
    bandwidths = [0.5e6, 1e6, 2e6, 5e6, 10e6, 20e6, 50e6, 200e6]
    times = np.array(
        [replay(runs["base"], {BW: b}).rounds["round_time_s"].to_numpy() for b in bandwidths]
    )
    uploads = np.array(
        [replay(runs["base"], {BW: b}).rounds["ul_time_s"].to_numpy() for b in bandwidths]
    )
    assert np.all(np.diff(times, axis=0) <= 0)  # every round, every step up in bandwidth
    assert np.all(times[0] > times[-1]) and np.all(uploads[0] > uploads[-1])
    # the recorded per-client range [10, 30] MHz lies between 5 and 50 MHz for everyone
    recorded = _csv(runs["base"])["round_time_s"].to_numpy()
    assert np.all(times[3] >= recorded) and np.all(recorded >= times[6])


def test_override_that_changes_deadline_drops_is_detected(runs):
    d = runs["deadline_s"]
    # the run without a deadline, replayed with one: round 0 now drops a client
    r = replay(runs["base"], {"deadline_s": d})
    assert not r.exact and r.inexact_from_round == 0 and r.dropped_ids[0] != ()
    assert r.rounds["mean_accuracy"].isna().all()  # unknown once training would differ
    assert any("not exact from round 1 on" in n and "retrain" in n for n in r.notes)
    # the deadline run, replayed without it
    r = replay(runs["late"], {"deadline_s": None})
    assert not r.exact and r.inexact_from_round == 0 and r.dropped_ids[0] == ()
    # a deadline so late nobody was dropped anyway: exact
    r = replay(runs["base"], {"deadline_s": 1e9})
    assert r.exact and not r.timing_dependent


def test_retrain_reruns_with_training_and_says_so(runs):
    r = replay(runs["base"], {"deadline_s": runs["deadline_s"]}, retrain=True, backend="local")
    assert r.source == "retrained" and r.exact
    assert any("retrained" in n for n in r.notes)
    # base + this deadline is exactly the recorded "late" scenario: same rounds, same accuracy
    want = _recorded(_csv(runs["late"]))
    pd.testing.assert_frame_equal(r.rounds, want, check_exact=True, check_dtype=False)
    # an exact replay is not retrained
    assert replay(runs["base"], {BW: 5e6}, retrain=True).source == "replay"


def test_timing_aware_algorithm_is_exact_only_while_timelines_match(runs, monkeypatch):
    monkeypatch.setattr(FedAvgServer, "uses_emulated_time", True, raising=False)
    assert replay(runs["base"]).exact
    r = replay(runs["base"], {BW: 5e6})
    assert not r.exact and r.inexact_from_round == 0 and r.timing_dependent


def test_overrides_are_checked(runs):
    with pytest.raises(OverrideError) as exc:
        replay(runs["base"], {"channel.uplink.bandwith_hz": 5e6})
    msg = str(exc.value)
    assert "'channel.uplink.bandwith_hz'" in msg and "bandwidth_hz, tx_power_dbm, shared" in msg
    with pytest.raises(OverrideError, match="devices.clients is a list"):
        replay(runs["base"], {"devices.clients.7.profile": "rpi2b"})
    with pytest.raises(OverrideError, match="retrain"):
        replay(runs["base"], {"training.lr": 0.1})
    with pytest.raises(OverrideError, match="unknown device profile 'pi9'"):
        replay(runs["base"], {"devices.clients.0.profile": "pi9"})
    small = {
        "flops_per_s": 1e9,
        "step_overhead_s": 0.01,
        "ram_bytes": 1_000_000,
        "flops_source": "test",
        "step_overhead_source": "test",
    }
    with pytest.raises(ReplayInfeasible, match="'small' has 1 MiB of RAM"):
        replay(
            runs["base"],
            {"devices.profiles": {"small": small}, "devices.clients.0.profile": "small"},
        )


def test_device_override_changes_compute_time(runs):
    slow = replay(runs["base"], {"devices.clients.0.profile": "rpi2b"}).rounds
    fast = replay(runs["base"], {"devices.clients.0.profile": "rpi5"}).rounds
    assert np.all(slow["client_time_s"] > fast["client_time_s"])


def test_load_run_errors_and_a_killed_run(runs, tmp_path):
    with pytest.raises(RunLoadError, match="not a directory"):
        load_run(tmp_path / "nothing")
    src = runs["base"].run_dir
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("scenario.yaml", "rounds.csv", "clients.csv", "run.json"):
        (killed / name).write_bytes((src / name).read_bytes())
    with pytest.raises(RunLoadError, match="save_optraces"):
        load_run(killed)
    lines = (src / "optraces.jsonl").read_text().splitlines()
    (killed / "optraces.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])
    rows = len(_csv(runs["base"]))
    with pytest.warns(RuntimeWarning, match=f"only rounds 1-2 of the {rows} in rounds.csv"):
        loaded = load_run(killed)
    r = replay(loaded)
    assert len(r.rounds) == 2 and r.exact
    assert r.rounds["round_time_s"].tolist() == _csv(runs["base"])["round_time_s"][:2].tolist()


def test_sweep_dataframe(runs):
    grid = {BW: [1e6, 20e6], "deadline_s": [None, runs["deadline_s"]]}
    acc = _csv(runs["base"])["mean_accuracy"]
    target = float(acc.iloc[1])
    df = mecsim.sweep([runs["base"], runs["late"]], grid, target_accuracy=target)
    assert list(df.columns) == HEAD_COLUMNS + [BW, "deadline_s"] + METRIC_COLUMNS
    assert len(df) == 2 * 4 and df["run_id"].tolist() == ["base"] * 4 + ["late"] * 4
    assert df[BW].tolist() == [1e6, 1e6, 20e6, 20e6] * 2
    assert (df["source"] == "replay").all() and df["feasible"].all()
    # row 0 is one replay, summarised
    one = replay(runs["base"], {BW: 1e6, "deadline_s": None})
    row = df.iloc[0]
    for key, value in summarise(one, target).items():
        assert row[key] == value or (pd.isna(row[key]) and pd.isna(value)), key
    t = one.rounds["round_time_s"].to_numpy()
    assert row["round_time_mean_s"] == np.mean(t) and row["round_time_max_s"] == t.max()
    assert row["round_time_p95_s"] == np.percentile(t, 95)
    assert row["total_time_s"] == one.rounds["elapsed_s"].iloc[-1]
    assert row["ul_time_mean_s"] == one.rounds["ul_time_s"].mean()
    assert row["bytes_up"] == _csv(runs["base"])["bytes_up"].sum()
    # time to target: the first recorded round reaching it, at the replayed elapsed time
    first = int(np.flatnonzero(acc.to_numpy() >= target)[0])
    assert row["rounds_to_target"] == first + 1
    assert row["time_to_target_s"] == one.rounds["elapsed_s"].iloc[first]
    assert row["final_accuracy"] == acc.iloc[-1]
    # every row's exactness is that of its own replay
    for (_, r), point in zip(df.iterrows(), grid_points(grid) * 2, strict=True):
        assert r["exact"] == replay(runs[r["run_id"]], point).exact
    # at 1 MHz round 0 is slower than recorded, so the deadline drops a client the base
    # run kept: inexact from round 0, no accuracy, no time to target
    assert not df.iloc[1]["exact"] and df.iloc[1]["inexact_from_round"] == 0
    assert math.isnan(df.iloc[1]["time_to_target_s"]) and math.isnan(df.iloc[1]["final_accuracy"])
    # without a deadline the deadline run's round 0 keeps the client it dropped
    assert not df.iloc[4]["exact"] and df.iloc[4]["inexact_from_round"] == 0


def test_sweep_of_a_scenario_records_it_once(tmp_path):
    df = sweep(tiny(rounds=2), {BW: [1e6, 20e6]}, record_dir=tmp_path)
    (recorded,) = tmp_path.iterdir()
    assert recorded.name.startswith("tiny-") and (recorded / "optraces.jsonl").exists()
    assert df["exact"].all() and df["run_id"].nunique() == 1
    assert df["total_time_s"].tolist() == [
        replay(recorded, {BW: b}).rounds["elapsed_s"].iloc[-1] for b in (1e6, 20e6)
    ]
    stamp = (recorded / "rounds.csv").stat().st_mtime_ns
    again = sweep(tiny(rounds=2), {BW: [1e6, 20e6]}, record_dir=tmp_path)
    pd.testing.assert_frame_equal(df, again)
    assert (recorded / "rounds.csv").stat().st_mtime_ns == stamp  # reused, not retrained
    sweep(tiny(rounds=2, seed=4), {BW: [1e6]}, record_dir=tmp_path)  # another scenario
    assert len(list(tmp_path.iterdir())) == 2


def test_sweep_in_a_process_pool_gives_the_same_frame(runs):
    grid = {BW: [1e6, 5e6, 20e6], "devices.clients.0.profile": ["rpi2b", "rpi4"]}
    serial = sweep(runs["base"], grid, workers=1)
    pooled = sweep(runs["base"], grid, workers=2)
    pd.testing.assert_frame_equal(serial, pooled, check_exact=True)
    assert len(serial) == 6 and serial["exact"].all()


def test_sweep_marks_infeasible_points(runs):
    small = {
        "flops_per_s": 1e9,
        "step_overhead_s": 0.01,
        "ram_bytes": 1_000_000,
        "flops_source": "test",
        "step_overhead_source": "test",
    }
    df = sweep(runs["base"], {"devices.profiles": [{}, {"rpi4": small}]})
    assert df["feasible"].tolist() == [True, False]
    assert "infeasible" in df.iloc[1]["notes"] and math.isnan(df.iloc[1]["total_time_s"])


def test_grid_and_value_parsing():
    assert grid_points({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    assert parse_values("5e6,10e6,20") == [5e6, 10e6, 20]
    assert parse_values("1e6:5e6:5") == [1e6, 2e6, 3e6, 4e6, 5e6]
    assert parse_values("[10e6,30e6],5e6") == [[10e6, 30e6], 5e6]
    assert parse_values("null,30.5,true") == [None, 30.5, True]
    assert parse_values("{unit: noise, uplink_mean: 2e0}") == [
        {"unit": "noise", "uplink_mean": 2.0}
    ]
    assert parse_set("devices.clients.0.profile=rpi2b,rpi4") == (
        "devices.clients.0.profile",
        ["rpi2b", "rpi4"],
    )
    for bad in ("channel.uplink.bandwidth_hz", "=1", "a=[1,2", "a=1,,2"):
        with pytest.raises(OverrideError):
            parse_set(bad)
    with pytest.raises(OverrideError, match="no values"):
        grid_points({"a": []})


def test_cli_writes_csv_and_plot(runs, tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(
        [
            "sweep",
            str(runs["base"].run_dir),
            str(runs["late"].run_dir),
            "--set",
            f"{BW}=1e6,5e6,20e6",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 6 and list(df.columns) == HEAD_COLUMNS + [BW] + METRIC_COLUMNS
    png = (out / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "wrote" in capsys.readouterr().out


def test_cli_errors_are_one_line_and_exit_2(runs, tmp_path, capsys):
    code = main(
        [
            "sweep",
            str(runs["base"].run_dir),
            "--set",
            "channel.uplinkk.rate=1",
            "--out",
            str(tmp_path / "x"),
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 2 and "Traceback" not in out
    assert "'uplinkk' is not a field of channel" in out and "uplink, downlink" in out
    assert not (tmp_path / "x").exists()
    assert main(["sweep", str(tmp_path), "--set", f"{BW}=1e6", "--quiet"]) == 2
    assert "no scenario.yaml" in capsys.readouterr().out
    assert (
        main(
            [
                "sweep",
                str(runs["base"].run_dir),
                "--set",
                f"{BW}=1e6",
                "--metric",
                "time_to_target_s",
                "--quiet",
            ]
        )
        == 2
    )


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_sweep_s_workers_die_with_it(runs, tmp_path, sig):
    """`mecsim sweep --workers 2` killed (kill -9) or terminated while its two replay
    workers work: no worker outlives it (they used to go on, orphaned)."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mecsim",
            "sweep",
            str(runs["base"].run_dir),
            "--set",
            f"{BW}=1e6:2e7:20000",  # minutes of replays: it is killed long before
            "--workers",
            "2",
            "--quiet",
            "--out",
            str(tmp_path / "sweep"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    parent = psutil.Process(proc.pid)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the sweep never started its two workers"
            workers = parent.children()
            time.sleep(0.2)
        time.sleep(1.0)  # the workers are replaying
        assert all(w.is_running() for w in workers)
        proc.send_signal(getattr(signal, sig))
        proc.wait(30)
        alive = wait_gone(workers, 5)  # a zombie has ended too
        assert not alive, f"workers {[w.pid for w in alive]} outlived the sweep ({sig})"
    finally:
        for w in workers:  # only the processes this test started, by their PIDs
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
