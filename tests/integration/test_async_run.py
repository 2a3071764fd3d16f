"""Asynchronous runs end to end: real training, real SimPy, in-process and on Ray.

Same seed -> the same records; Ray gives the in-process records; bad input is refused
before anything starts, naming the field and the file.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from support.scenarios import tiny_async_dict

import mecsim
from mecsim.scenario import ScenarioError
from mecsim.store.reader import read_csv_exact
from mecsim.testing import compared_columns


def _run(tmp_path: Path, run_id: str, backend: str = "local", **aggregation) -> Path:
    run = mecsim.simulate(
        tiny_async_dict(**aggregation),
        out=tmp_path,
        run_id=run_id,
        backend=backend,
        hosts=2,
        progress=False,
        plots=False,
        metrics__enabled=False,
    )
    assert run.status == "finished"
    return tmp_path / run_id


def _same(a: Path, b: Path) -> None:
    for name in ("rounds.csv", "updates.csv"):
        x, y = read_csv_exact(a / name), read_csv_exact(b / name)
        assert list(x.columns) == list(y.columns)
        cols = compared_columns(x.columns)
        pd.testing.assert_frame_equal(x[cols], y[cols], check_exact=True)
    assert (a / "optraces.jsonl").read_text() == (b / "optraces.jsonl").read_text()


def test_fedasync_run_records_and_determinism(tmp_path):
    a = _run(tmp_path, "a", mode="async", alpha=0.5)
    b = _run(tmp_path, "b", mode="async", alpha=0.5)
    _same(a, b)
    rounds = read_csv_exact(a / "rounds.csv")
    updates = read_csv_exact(a / "updates.csv")
    assert not (a / "clients.csv").exists()
    assert list(rounds["round"]) == list(range(6))
    assert (rounds["completed"] == 1).all()  # one update, one version
    assert rounds["elapsed_s"].is_monotonic_increasing
    assert rounds["mean_accuracy"].notna().tolist() == [False, False, True] * 2
    assert 0.0 < rounds["mean_accuracy"].iloc[-1] <= 1.0
    # the records agree with themselves: staleness = server version met - trained on,
    # updates arrive in order, a version's updates are those recorded with it
    assert (updates["staleness"] == updates["server_version"] - updates["trained_on"]).all()
    assert updates["arrive_s"].is_monotonic_increasing
    assert (updates["status"] == "accepted").all()
    assert updates.groupby("version").size().tolist() == rounds["selected"].tolist()
    # every client starts on version 0 at time 0; the first fit trains all four
    assert sorted(updates[updates["cycle"] == 0]["trained_on"].unique()) == [0]
    assert (updates[updates["cycle"] == 0]["start_s"] == 0.0).all()
    # FedAsync's weight: 0.5 * (s + 1)^-0.5 (the default polynomial staleness)
    assert updates["weight"].tolist() == pytest.approx(
        [0.5 * (s + 1) ** -0.5 for s in updates["staleness"]]
    )


def test_fedbuff_run_steps_on_a_full_buffer_of_staleness_weighted_deltas(tmp_path):
    local = _run(tmp_path, "local", mode="buffered", buffer_size=2)
    rounds = read_csv_exact(local / "rounds.csv")
    updates = read_csv_exact(local / "updates.csv")
    assert (rounds["completed"] == 2).all()
    assert updates["weight"].tolist() == pytest.approx(
        [(1 + s) ** -0.5 for s in updates["staleness"]]
    )


@pytest.mark.ray
@pytest.mark.slow
def test_fedbuff_run_in_process_equals_ray(tmp_path):
    """Under Ray (the process's shared instance, tests/conftest.py) an asynchronous run's
    records are the in-process run's (the fast tier checks the in-process run above)."""
    local = _run(tmp_path, "local", mode="buffered", buffer_size=2)
    ray = _run(tmp_path, "ray", "ray", mode="buffered", buffer_size=2)
    assert len(read_csv_exact(ray / "updates.csv")) > 0  # the Ray run did record updates
    _same(local, ray)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"algorithm": {"name": "phsfl"}}, "aggregation.mode", "hierarchical"),
        ({"algorithm": {"name": "kapc"}}, "aggregation.mode", "cannot run asynchronously"),
        (
            {"aggregation": {"mode": "buffered", "buffer_size": 5}},
            "aggregation.buffer_size",
            "4 clients",
        ),
        ({"deadline_s": 10.0}, "deadline_s", "no meaning"),
        ({"faults": {"crash_prob": 0.1}}, "faults", "stragglers only"),
        (
            {"topology": {"clients": 4, "participation": 0.5}},
            "topology.participation",
            "concurrency",
        ),
    ],
)
def test_refused_before_anything_starts(tmp_path, change, field, words):
    sc = tiny_async_dict(mode="async")
    sc.update(change)
    with pytest.raises(ScenarioError) as err:
        mecsim.simulate(sc, out=tmp_path, run_id="x", backend="local", progress=False, plots=False)
    assert f"{field}:" in str(err.value) and words in str(err.value)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("aggregation", "field"),
    [
        (
            {"mode": "async", "staleness": {"function": "exponential"}},
            "aggregation.staleness.function",
        ),
        ({"mode": "async", "alpha": 1.5}, "aggregation.alpha"),
        ({"mode": "async", "buffer_size": 3}, "aggregation"),
        ({"mode": "lazy"}, "aggregation.mode"),
    ],
)
def test_bad_aggregation_fields_name_the_field(tmp_path, aggregation, field):
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump(tiny_async_dict(**aggregation)))
    with pytest.raises(ScenarioError) as err:
        mecsim.scenario.load_scenario(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_fedbuff_and_fedasync_agree_where_their_equations_meet(tmp_path):
    """One client at a time (concurrency 1): nothing is stale, and FedBuff with K = 1,
    η_g = 1 gives x + (y - x) = y, FedAsync with α = 1 (constant) gives 0·x + 1·y = y:
    both servers take each client's model as it is, so the two runs' models, and so
    their accuracies and losses, are the same to the bit."""
    fedbuff = _run(tmp_path, "fb", mode="buffered", buffer_size=1, server_lr=1.0, concurrency=1)
    fedasync = _run(
        tmp_path,
        "fa",
        mode="async",
        alpha=1.0,
        staleness={"function": "constant"},
        concurrency=1,
    )
    a, b = read_csv_exact(fedbuff / "rounds.csv"), read_csv_exact(fedasync / "rounds.csv")
    # (not the times: FedBuff's step counts more FLOPs, so its server takes longer)
    cols = ["mean_accuracy", "mean_test_loss", "train_loss", "max_staleness"]
    pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=True)
    assert (a["max_staleness"] == 0).all() and (a["in_flight"] == 0).all()


@pytest.mark.slow
def test_an_async_run_without_checkpoints_resumes_from_its_start(tmp_path):
    """checkpoint.every 0: a run killed after its second version keeps no checkpoint, so
    ``mecsim run --resume`` starts it over (its records cut to none) and ends with the
    records of an uninterrupted run."""
    import subprocess
    import sys

    from mecsim.scenario import scenario_from_dict
    from mecsim.store.session import run_in_folder
    from mecsim.testing import SimulatedKill, StopAfter, assert_same_records

    sc = scenario_from_dict(
        {
            **tiny_async_dict(mode="async"),
            "metrics": {"enabled": False},
            "execution": {"backend": "local"},
            "checkpoint": {"every": 0},
        }
    )
    full = tmp_path / "full"
    run_in_folder(sc, full, hosts=2)
    run_dir = tmp_path / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, run_dir, observers=[StopAfter(1)], hosts=2)
    assert len(read_csv_exact(run_dir / "rounds.csv")) == 2
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "mecsim", "run", "--resume", str(run_dir), "--no-metrics"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert_same_records(full, run_dir)


@pytest.mark.parametrize(
    "aggregation",
    [
        {"mode": "async", "alpha": 0.5},
        {"mode": "buffered", "buffer_size": 2, "concurrency": 3},
        {"mode": "semi_sync", "period_s": 2.0},
    ],
)
def test_the_versions_kept_are_the_current_and_those_cycles_in_flight_train_on(
    tmp_path, monkeypatch, aggregation
):
    """The run counts the cycles in flight per version instead of looking at every
    cycle after every update; after every update taken or lost and every version made,
    the versions it keeps are exactly the published one and those the cycles in flight
    downloaded (clients going offline too: exponential availability loses cycles)."""
    from mecsim.run.async_run import AsyncRun

    checked: list[int] = []

    def check(run: AsyncRun) -> None:
        in_flight = {c.version for c in run.in_flight.values()}
        assert set(run.versions) == in_flight | {max(run.published_at)}
        assert run.current == max(run.published_at)
        counts: dict[int, int] = {}
        for c in run.in_flight.values():
            counts[c.version] = counts.get(c.version, 0) + 1
        assert run.users == counts
        checked.append(len(run.versions))

    def wrap(name: str) -> None:
        original = getattr(AsyncRun, name)

        def checked_call(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            check(self)
            return out

        monkeypatch.setattr(AsyncRun, name, checked_call)

    for name in ("_release", "_publish"):
        wrap(name)
    data = tiny_async_dict(**aggregation)
    data["availability"] = {"model": "exponential", "mean_online_s": 6.0, "mean_offline_s": 1.0}
    data["topology"] = {"clients": 4}
    run = mecsim.simulate(
        data,
        out=tmp_path,
        run_id="v",
        backend="local",
        hosts=1,
        progress=False,
        plots=False,
        metrics__enabled=False,
    )
    assert run.status == "finished"
    updates = read_csv_exact(tmp_path / "v" / "updates.csv")
    assert len(checked) >= len(updates) + 6
    assert max(checked) >= 2  # some cycle trained on an older version while a new one was out
