"""Clients that go offline and come back (``availability:``, docs/async.md): in an
asynchronous run an offline client starts no cycle and an update whose client goes
offline before it arrives is lost, with its row saying so; in rounds an offline client
is not selected; a bad trace is refused before anything starts, naming file and line;
a run with availability resumes exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from support.paths import ROOT
from support.scenarios import tiny, tiny_async_dict

import mecsim
from mecsim.emulation.availability import Availability, read_trace
from mecsim.scenario import ScenarioError, load_scenario, scenario_from_dict
from mecsim.store.reader import read_csv_exact
from mecsim.store.runfolder import prepare_resume
from mecsim.store.session import run_in_folder
from mecsim.testing import SimulatedKill, StopAfter, assert_same_records

# client 3: online for the first 0.1 s, then not before 1,000 s; client 2: online until
# 3 s and again from 6 s; clients 0 and 1: always (not in the trace)
TRACE = {
    "2": {"active": [0, 6], "inactive": [3, 2000], "finish_time": 2000},
    "3": {"active": [0, 1000], "inactive": [0.1, 1001], "finish_time": 2000},
}


def _async_run(tmp_path: Path, trace: dict, rounds: int = 40) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    data = tiny_async_dict(mode="async", alpha=0.5)
    data.update(rounds=rounds, availability={"model": "trace", "trace": str(path)})
    out = tmp_path / "r"
    run_in_folder(scenario_from_dict(data, "async-tiny"), out)
    return out


def _online_throughout(updates: pd.DataFrame, avail: Availability) -> pd.Series:
    return pd.Series(
        [
            avail.next_off(c, s) >= a
            for c, s, a in zip(updates.client_id, updates.start_s, updates.arrive_s, strict=True)
        ],
        index=updates.index,
    )


@pytest.mark.slow
def test_an_offline_client_starts_nothing_and_its_update_is_lost(tmp_path: Path) -> None:
    out = _async_run(tmp_path, TRACE)
    updates = read_csv_exact(out / "updates.csv")
    rounds = read_csv_exact(out / "rounds.csv")
    assert rounds["elapsed_s"].iloc[-1] > 6.0  # the run outlasts client 2's offline time
    # client 3 starts at 0 and goes offline at 0.1 s, during its download of the model
    # (0.8 MB over a 50 Mb/s cell shared by four: 0.51 s): one row, lost, nothing trained
    c3 = updates[updates.client_id == 3]
    assert len(c3) == 1
    row = c3.iloc[0]
    assert row.status == "lost_offline_download" and row.start_s == 0.0
    assert row.steps == 0 and row.gflops == 0.0 and row.bytes_up == 0
    assert row.weight == 0.0 and row.compute_s == 0.0 and row.upload_s == 0.0
    # client 2: nothing starts while it is offline, [3, 6); once back it starts at 6 s
    c2 = updates[updates.client_id == 2]
    assert not ((c2.start_s >= 3.0) & (c2.start_s < 6.0)).any()
    assert c2[c2.start_s >= 3.0].start_s.min() == 6.0
    # every update that reached the server came from a client online from its start to
    # its arrival; every lost one's client went offline in between
    avail = Availability(read_trace(tmp_path / "trace.json", clients=4))
    lost = updates.status.str.startswith("lost_offline")
    online = _online_throughout(updates, avail)
    assert (online[~lost]).all() and not (online[lost]).any()
    assert (updates[~lost].status == "accepted").all()
    # a version's row counts the lost updates taken with it as dropped out
    assert rounds["dropped_out"].sum() == lost.sum() >= 1
    assert (rounds["dropped"] == rounds["selected"] - rounds["completed"]).all()


def test_in_rounds_an_offline_client_is_not_selected(tmp_path: Path) -> None:
    """Clients 0 and 1 are offline for the whole run: each round selects
    max(1, round(0.5 * 2)) = 1 client of the two online, 2 and 3 (without the trace it
    selects 2 of the 4)."""
    path = tmp_path / "trace.json"
    never = {"active": [1e6], "inactive": [1e6 + 1]}
    path.write_text(json.dumps({"0": never, "1": never}))
    sc = tiny(
        rounds=4,
        topology={"clients": 4, "participation": 0.5},
        availability={"model": "trace", "trace": str(path)},
    )
    run_in_folder(sc, tmp_path / "r")
    rows = read_csv_exact(tmp_path / "r" / "clients.csv")
    clients = rows[rows.selected]
    assert set(clients.client_id) <= {2, 3} and clients.groupby("round").size().tolist() == [1] * 4
    run_in_folder(tiny(rounds=4, topology={"clients": 4, "participation": 0.5}), tmp_path / "a")
    every = read_csv_exact(tmp_path / "a" / "clients.csv")
    every = every[every.selected]
    assert every.groupby("round").size().tolist() == [2] * 4 and set(every.client_id) & {0, 1}


@pytest.mark.slow
def test_a_bad_trace_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(
        '{\n "1": {"active": [0], "inactive": [5]},\n "9": {"active": [0], "inactive": [5]}\n}\n'
    )
    data = tiny_async_dict(mode="async")
    data["availability"] = {"model": "trace", "trace": str(path)}
    with pytest.raises(ScenarioError) as err:
        mecsim.simulate(
            data, out=tmp_path, run_id="x", backend="local", progress=False, plots=False
        )
    message = str(err.value)
    assert "availability.trace:" in message and f"{path}:3: client 9" in message
    assert "4 clients (0 to 3)" in message
    assert not (tmp_path / "x").exists()
    # the command says the same, without a traceback, and exits 2
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(data))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mecsim",
            "run",
            str(scenario),
            "--no-metrics",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and f"{path}:3: client 9" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_run_with_exponential_availability_resumes_exactly(tmp_path: Path) -> None:
    data = tiny_async_dict(mode="buffered", buffer_size=2)
    data.update(
        rounds=8, availability={"model": "exponential", "mean_online_s": 2.0, "mean_offline_s": 1.0}
    )
    sc = scenario_from_dict(data, "async-tiny")
    full = tmp_path / "full"
    run_in_folder(sc, full)
    assert read_csv_exact(full / "updates.csv").status.str.startswith("lost_offline").any()
    out = tmp_path / "cut"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, out, observers=[StopAfter(4)])
    target = prepare_resume(out)
    try:
        assert target.rounds_done == 4
        run_in_folder(None, resume=target)
    finally:
        target.lock.release()
    assert_same_records(full, out)


@pytest.mark.slow
def test_the_shipped_availability_scenario(tmp_path: Path) -> None:
    """scenarios/async-mec-availability.yaml for 60 versions: client 18 (online [0, 20) s
    of every 120) loses the update it was uploading at 20 s; every update taken came
    from a client online throughout its cycle."""
    path = ROOT / "scenarios" / "async-mec-availability.yaml"
    sc = load_scenario(path)
    data = sc.model_dump(mode="json")
    data.update(rounds=60, metrics={"enabled": False}, execution={"backend": "local", "hosts": 2})
    run_in_folder(scenario_from_dict(data, str(path)), tmp_path / "r")
    updates = read_csv_exact(tmp_path / "r" / "updates.csv")
    lost = updates[updates.status.str.startswith("lost_offline")]
    assert lost.client_id.tolist() == [18] and lost.status.tolist() == ["lost_offline_upload"]
    assert lost.start_s.iloc[0] < 20.0 < lost.arrive_s.iloc[0]
    avail = Availability(read_trace(ROOT / "scenarios" / "traces" / "availability-20.json", 20))
    taken = updates[~updates.status.str.startswith("lost_offline")]
    assert _online_throughout(taken, avail).all()
