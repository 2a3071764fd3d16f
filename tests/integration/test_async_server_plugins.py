"""A user's own asynchronous server as a plugin (docs/extending.md, "Your own
asynchronous server"): registered in-process, named by ``aggregation.server``, run end to
end in a real asynchronous run; the scenarios the schema refuses; and the conformance kit
(:func:`mecsim.testing.check_async_server`) passing the built-ins and failing servers
that break the contract, naming the property."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
from pydantic import Field
from support.scenarios import tiny_async_dict

from mecsim.api import AsyncServer, AsyncServerParams, Update, register
from mecsim.interfaces.cli import main
from mecsim.registry import ASYNC_SERVERS
from mecsim.run import async_run
from mecsim.run.setup import RunFailed
from mecsim.scenario import ScenarioError, scenario_from_dict
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import check_async_server


class LastKParams(AsyncServerParams):
    k: int = Field(2, ge=1, le=100, description="the global model: the mean of the last k uploads")


class MeanOfLastK(AsyncServer):
    """Every update makes a version: the mean of the last ``k`` uploads (whatever their
    staleness)."""

    Params = LastKParams

    def __init__(self, init_weights: np.ndarray, config: Any, params: Any = None) -> None:
        super().__init__(init_weights, config, params)
        self.recent: list[np.ndarray] = []

    def factor(self, staleness: int) -> float:
        return 1.0 / self.params.k

    def on_update(self, update: Update, staleness: int) -> bool:
        self.recent = [*self.recent, update.weights][-self.params.k :]
        stacked = np.stack(self.recent).astype(np.float64)
        self.weights = stacked.mean(axis=0).astype(np.float32)
        self.version += 1
        return True


class Recorded(MeanOfLastK):
    """MeanOfLastK, keeping what it was given and what it made (for the test)."""

    seen: ClassVar[list[dict[str, Any]]] = []
    init: ClassVar[list[np.ndarray]] = []

    def __init__(self, init_weights: np.ndarray, config: Any, params: Any = None) -> None:
        super().__init__(init_weights, config, params)
        Recorded.init.append(self.weights.copy())

    def on_update(self, update: Update, staleness: int) -> bool:
        made = super().on_update(update, staleness)
        Recorded.seen.append(
            {
                "client_id": update.client_id,
                "trained_on": update.trained_on,
                "num_samples": update.num_samples,
                "staleness": staleness,
                "upload": update.weights.copy(),
                "base": update.base.copy(),
                "after": self.weights.copy(),
            }
        )
        return made


class Noisy(AsyncServer):
    """FedAsync's mixing with an α from unseeded randomness: not reproducible."""

    def on_update(self, update: Update, staleness: int) -> bool:
        alpha = np.random.default_rng().uniform(0.3, 0.7)
        self.weights = ((1 - alpha) * self.weights + alpha * update.weights).astype(np.float32)
        self.version += 1
        return True


class Forgetful(AsyncServer):
    """Says it made a version and does not count it."""

    def on_update(self, update: Update, staleness: int) -> bool:
        self.weights = update.weights.copy()
        return True


class Hoarder(AsyncServer):
    """Keeps every update and never makes a version."""

    def on_update(self, update: Update, staleness: int) -> bool:
        return False


class Wide(AsyncServer):
    """Keeps its model in float64."""

    def on_update(self, update: Update, staleness: int) -> bool:
        self.weights = update.weights.astype(np.float64)
        self.version += 1
        return True


SERVERS = {
    "mean_last_k": MeanOfLastK,
    "mean_last_k_recorded": Recorded,
    "noisy_async": Noisy,
    "forgetful_async": Forgetful,
    "wide_async": Wide,
    "hoarder_async": Hoarder,
}


@pytest.fixture(autouse=True)
def _servers():
    for name, cls in SERVERS.items():
        register("async_server", name, cls)
    Recorded.seen.clear()
    Recorded.init.clear()
    yield
    for name in SERVERS:
        ASYNC_SERVERS.unregister(name)


@pytest.mark.slow
def test_a_user_server_runs_end_to_end(tmp_path: Path) -> None:
    """Mean of the last 2 uploads, mode async: each of the 6 versions is one update; the
    records hold what the server was given, the versions it made are the means worked out
    here from the uploads, and each update's base is the version it trained on."""
    data = tiny_async_dict(mode="async", server={"name": "mean_last_k_recorded"})
    sc = scenario_from_dict(data, "async-tiny")
    out = tmp_path / "r"
    assert run_in_folder(sc, out).status == "finished"
    seen = Recorded.seen
    updates = read_csv_exact(out / "updates.csv")
    accepted = updates[updates["status"] == "accepted"].reset_index(drop=True)
    assert len(seen) == len(accepted) == 6 == sc.rounds
    for i, got in enumerate(seen):
        row = accepted.iloc[i]
        assert row["client_id"] == got["client_id"]
        assert row["trained_on"] == got["trained_on"]
        assert row["staleness"] == got["staleness"]
        assert row["num_samples"] == got["num_samples"]
        assert row["weight"] == 0.5  # factor: 1 / k
        assert row["version"] == i + 1  # each update made the next version
    # the versions: version 0 the initial model, version i + 1 the mean of uploads i-1, i
    uploads = [g["upload"].astype(np.float64) for g in seen]
    versions = [Recorded.init[0]]
    for i in range(len(seen)):
        mean = uploads[i] if i == 0 else (uploads[i - 1] + uploads[i]) / 2.0
        versions.append(mean.astype(np.float32))
        assert np.array_equal(seen[i]["after"], versions[i + 1])
    for got in seen:
        assert np.array_equal(got["base"], versions[got["trained_on"]])
        assert got["upload"].dtype == np.float32 and got["upload"].shape == versions[0].shape
    # uploads came in while other versions were made: some updates were stale
    assert max(g["staleness"] for g in seen) >= 1
    rounds = read_csv_exact(out / "rounds.csv")
    assert list(rounds["completed"]) == [1] * 6
    n = versions[0].size
    assert np.allclose(rounds["server_gflops"], 3.0 * n / 1e9, rtol=1e-12)  # 3 n a take
    plugins = json.loads((out / "run.json").read_text())["plugins"]
    assert {"kind": "async_server", "name": "mean_last_k_recorded", "origin": "registered"} in [
        {k: p[k] for k in ("kind", "name", "origin")} for p in plugins
    ]


def test_the_mode_s_own_server_by_name_is_the_default(tmp_path: Path) -> None:
    """Naming FedBuff in mode buffered is what mode buffered runs anyway."""
    base = tiny_async_dict(mode="buffered", buffer_size=2)
    named = tiny_async_dict(mode="buffered", buffer_size=2, server={"name": "fedbuff"})
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_folder(scenario_from_dict(base, "a"), a)
    run_in_folder(scenario_from_dict(named, "b"), b)
    cols = ["client_id", "trained_on", "staleness", "weight", "version", "arrive_s"]
    pd.testing.assert_frame_equal(
        read_csv_exact(a / "updates.csv")[cols], read_csv_exact(b / "updates.csv")[cols]
    )
    weights = read_csv_exact(b / "updates.csv")["weight"]
    staleness = read_csv_exact(b / "updates.csv")["staleness"]
    accepted = read_csv_exact(b / "updates.csv")["status"] == "accepted"
    expected = [1 / math.sqrt(1 + s) for s in staleness[accepted]]
    assert np.allclose(weights[accepted], expected, rtol=1e-15)


@pytest.mark.parametrize(
    ("aggregation", "message"),
    [
        (
            {"mode": "sync", "server": {"name": "mean_last_k"}},
            "s.yaml: aggregation: server is a setting of the asynchronous modes",
        ),
        (
            {"mode": "async", "server": {"name": "nope"}},
            "s.yaml: aggregation.server.name: unknown async_server 'nope'; known: fedasync, "
            "fedbuff",
        ),
        (
            {"mode": "async", "server": {"name": "mean_last_k", "params": {"k": 0}}},
            "s.yaml: aggregation.server.params.k: Input should be greater than or equal to 1 "
            "(async_server mean_last_k)",
        ),
        (
            {"mode": "async", "server": {"name": "mean_last_k", "params": {"kk": 3}}},
            "s.yaml: aggregation.server.params.kk: Extra inputs are not permitted "
            "(async_server mean_last_k)",
        ),
        (
            {"mode": "async", "server": {"name": "fedasync", "params": {"alpha": 0.3}}},
            "s.yaml: aggregation.server.params.alpha: Extra inputs are not permitted "
            "(async_server fedasync)",
        ),
        (
            {"mode": "semi_sync", "server": {"name": "mean_last_k"}},
            "s.yaml: aggregation.server.name: async_server 'mean_last_k' has no flush(), "
            "which mode semi_sync calls every period_s",
        ),
        (
            {"mode": "async", "server": {"name": "fedbuff"}},
            "s.yaml: aggregation.server.name: fedbuff is mode buffered's own server",
        ),
    ],
)
def test_refused_before_anything_starts(aggregation: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(tiny_async_dict(**aggregation), "s.yaml")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_a_server_that_miscounts_its_versions_stops_the_run(tmp_path: Path) -> None:
    """Outside the kit too: it would otherwise never reach the scenario's rounds."""
    data = tiny_async_dict(mode="async", server={"name": "forgetful_async"})
    with pytest.raises(RunFailed) as err:
        run_in_folder(scenario_from_dict(data, "s"), tmp_path / "r")
    assert str(err.value) == (
        "aggregation.server: Forgetful.on_update returned True and took the version from "
        "0 to 0: it must return True when it made a new version (version one more), False "
        "when it did not (version unchanged)"
    )


@pytest.mark.slow
def test_a_server_that_widens_the_weights_stops_the_run(tmp_path: Path) -> None:
    data = tiny_async_dict(mode="async", server={"name": "wide_async"})
    with pytest.raises(RunFailed) as err:
        run_in_folder(scenario_from_dict(data, "s"), tmp_path / "r")
    assert str(err.value) == (
        "aggregation.server: Wide made version 1 of ndarray float64 (200010,): the weights "
        "must stay a flat float32 array of the model's 200010 values"
    )


def test_a_server_that_never_makes_a_version_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rather than run for ever: 3 updates per client (12 with 4 clients) here."""
    monkeypatch.setattr(async_run, "STALL_UPDATES_PER_CLIENT", 3)
    data = tiny_async_dict(mode="async", server={"name": "hoarder_async"})
    with pytest.raises(RunFailed) as err:
        run_in_folder(scenario_from_dict(data, "s"), tmp_path / "r")
    assert str(err.value) == (
        "aggregation.server: Hoarder took 12 updates (3 per client) since version 0 without "
        "making another: it would never reach the scenario's rounds"
    )


@pytest.mark.parametrize("name", ["fedasync", "fedbuff", "semi_sync"])
def test_the_kit_passes_the_builtins(name: str) -> None:
    report = check_async_server(name)
    report.assert_ok()
    versions = report.result("versions").reason
    mode = {"fedasync": "async", "fedbuff": "buffered", "semi_sync": "semi_sync"}[name]
    assert f"in a run of mode {mode}, 6 versions" in versions
    if name == "fedasync":
        assert versions.startswith("6 on_update calls")  # one version per update
    if name == "fedbuff":
        assert versions.startswith("12 on_update calls")  # K = 2: two per version


@pytest.mark.slow
def test_the_kit_passes_a_user_server_whose_state_is_a_list() -> None:
    """MeanOfLastK keeps its last k uploads in a list: the checkpoint holds it."""
    check_async_server("mean_last_k", {"k": 3}).assert_ok()


@pytest.mark.slow
def test_the_kit_fails_broken_servers_naming_the_property() -> None:
    noisy = check_async_server("noisy_async")
    assert [r.name for r in noisy.failures] == ["determinism", "resume"]
    assert noisy.result("determinism").reason.startswith("the same seed twice: the records differ")
    # the first version evaluated (the 3rd): its accuracy or test loss; the times before
    # it do not depend on the weights
    diff = noisy.result("determinism").first_difference or ""
    assert diff.startswith("rounds.csv row 2 (round=2) column m"), diff
    forgetful = check_async_server("forgetful_async", properties=["versions"])
    assert not forgetful.ok
    assert forgetful.result("versions").reason == (
        "on_update returned True and the version went from 0 to 0 (True: one more; False: "
        "unchanged)"
    )
    wide = check_async_server("wide_async", properties=["versions", "weights"])
    assert [r.name for r in wide.failures] == ["weights"]
    assert wide.result("versions").skipped  # the run stopped at the first take
    assert wide.result("versions").reason == (
        "not checked to the end: the run stopped at the weights failure (1 on_update calls held)"
    )
    assert wide.result("weights").reason.startswith(
        "after on_update the weights are ndarray (200010,) float64, not float32 of shape (200010,)"
    )


def test_mecsim_check_runs_the_async_server_kit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = tmp_path / "forgetful.py"
    plugin.write_text(
        "from mecsim.api import AsyncServer, register\n"
        "class Forgetful(AsyncServer):\n"
        "    def on_update(self, update, staleness):\n"
        "        return True\n"
        "register('async_server', 'forgetful_file', Forgetful)\n"
    )
    try:
        code = main(["check", "forgetful_file", "--plugin", str(plugin), "--property", "versions"])
        assert code == 1
        out = capsys.readouterr().out
        assert "FAIL versions: on_update returned True and the version went from 0 to 0" in out
        assert main(["check", "fedasync", "--params", "{alpha: 0.3}"]) == 2
        assert "aggregation.server.params.alpha: Extra inputs" in capsys.readouterr().err
    finally:
        ASYNC_SERVERS.unregister("forgetful_file")
