"""Flower's classic API on mecsim: a ServerApp from ``server_fn`` with a strategy of
``flwr.server.strategy`` and a ClientApp from ``client_fn`` with a ``NumPyClient`` run
like Message-API apps, their messages charged on the emulated network.

tests/data/flower_classic_app is tests/data/flower_seeded_app written the classic way
(the same MLP, data, seeds and FedAvg): the two must learn the same, round for round.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytest.importorskip("flwr")

from support.paths import DATA, ROOT

from mecsim.agents.algorithms.flower_app import FlowerAppError, FlowerParams, resolve_app

CLASSIC = DATA / "flower_classic_app"
SEEDED = DATA / "flower_seeded_app"
#: the MLP's values: 784 * 32 + 32 + 32 * 10 + 10, float32
VALUES = 25_450


def run(tmp_path: Path, app: Path, name: str, **over) -> Path:
    data = {
        "name": name,
        "seed": 0,
        "rounds": 2,
        "topology": {"clients": 4},
        "algorithm": {"name": "flower", "params": {"app": str(app)}},
        "checkpoint": {"every": 0},
        "metrics": {"enabled": False},
        "outputs": {"dir": str(tmp_path / name)},
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    from mecsim.interfaces.cli import main

    err = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stderr(err):
            code = main(["run", str(path), "--quiet", "--no-plots", "--backend", "local"])
    finally:
        os.chdir(cwd)
    assert code == 0, err.getvalue()[-2000:]
    (folder,) = sorted((tmp_path / name).iterdir())
    return folder


@pytest.mark.slow
def test_a_classic_app_learns_as_its_message_api_twin_and_is_charged_its_messages(
    tmp_path: Path,
) -> None:
    classic = run(tmp_path, CLASSIC, "classic")
    twin = run(tmp_path, SEEDED, "twin")
    a, b = (pd.read_csv(f / "clients.csv") for f in (classic, twin))
    assert len(a) == 8 and a["selected"].all()  # 4 clients, 2 rounds, fraction 1.0
    # the same training from the same global model every round: FedAvg aggregated the
    # same (the order of the sum aside)
    assert a["train_loss"].to_numpy() == pytest.approx(b["train_loss"].to_numpy(), rel=1e-6)
    ra, rb = (pd.read_csv(f / "rounds.csv") for f in (classic, twin))
    assert ra["mean_accuracy"].to_numpy() == pytest.approx(rb["mean_accuracy"].to_numpy())
    assert (ra["eval_clients"] == 4).all()
    # the strategy's evaluate_fn scores the global model on partition 0's test images,
    # which are client 0's: the centralised accuracy is client 0's, round for round
    client0 = a[a["client_id"] == 0].sort_values("round")["accuracy"].to_numpy()
    assert ra["central_accuracy"].to_numpy() == pytest.approx(client0)
    assert (ra["central_loss"] > 0).all()
    assert rb["central_accuracy"].isna().all()  # the twin's strategy has no evaluate_fn
    # every client has 50 test images: the weighted mean is the unweighted one
    assert ra["eval_accuracy_weighted"].to_numpy() == pytest.approx(ra["mean_accuracy"])
    # a FitIns message holds the model (4 bytes a value) and a little more: the names
    # and shapes of its arrays, the config (server-round, lr) and the metadata; the
    # reply holds the model, num_examples and the train loss
    for column in ("bytes_down", "bytes_up"):
        per_message = ra[column] / 4
        assert ((per_message > 4 * VALUES) & (per_message < 4 * VALUES + 1_000)).all()
    assert (ra["client_gflops"] > 0).all() and (ra["energy_j"] > 0).all()
    # 200 samples in batches of 32: 7 optimiser steps a client and round
    assert (a["steps"] == 7).all()


def _write_app(tmp_path: Path, server: str) -> Path:
    pkg = tmp_path / "ownserver"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "server_app.py").write_text(server)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.flwr.app.components]\n"
        'serverapp = "ownserver.server_app:app"\nclientapp = "classicapp.client_app:app"\n'
    )
    return tmp_path


def test_a_classic_server_app_with_a_server_of_its_own_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    from mecsim.agents.algorithms.flower_bridge import load_components

    monkeypatch.syspath_prepend(str(CLASSIC))
    folder = _write_app(
        tmp_path,
        "from flwr.server import Server, ServerApp, ServerConfig, SimpleClientManager\n"
        "from flwr.server.strategy import FedAvg\n"
        "app = ServerApp(server=Server(client_manager=SimpleClientManager(), "
        "strategy=FedAvg()), config=ServerConfig(num_rounds=1))\n",
    )
    with pytest.raises(FlowerAppError, match=r"a Server of its own \(ServerApp\(server=\.\.\.\)\)"):
        load_components(resolve_app(FlowerParams(app=str(folder)), 1))


def test_a_classic_strategy_that_waits_for_more_clients_than_the_scenario_has_is_refused() -> None:
    from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg

    from mecsim.agents.algorithms.flower_bridge import _check_min_clients

    _check_min_clients(FedAvg(min_available_clients=4), 4)
    with pytest.raises(FlowerAppError, match="min_available_clients is 5, more than the"):
        _check_min_clients(FedAvg(min_available_clients=5), 4)
    wrapped = DifferentialPrivacyClientSideFixedClipping(
        FedAvg(min_fit_clients=6), noise_multiplier=0.1, clipping_norm=1.0, num_sampled_clients=4
    )
    with pytest.raises(FlowerAppError, match="min_fit_clients is 6.*topology.clients"):
        _check_min_clients(wrapped, 4)


def test_the_supported_flower_range_is_written_once_and_pip_s_extra_repeats_it() -> None:
    import tomllib

    from mecsim.agents.algorithms.flower_app import (
        FLOWER_OLDEST,
        FLOWER_REQUIREMENT,
        FLOWER_TESTED,
    )

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["optional-dependencies"]["flower"] == [FLOWER_REQUIREMENT]
    (low, high) = FLOWER_TESTED
    assert FLOWER_REQUIREMENT == f"flwr>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    assert tuple(int(p) for p in FLOWER_OLDEST.split(".")[:2]) == low


@pytest.mark.slow
def test_a_message_api_strategy_s_evaluate_fn_is_recorded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SEEDEDAPP_CENTRAL", "1")
    folder = run(tmp_path, SEEDED, "central")
    rounds, clients = (pd.read_csv(folder / f) for f in ("rounds.csv", "clients.csv"))
    # partition 0's test images are client 0's: its accuracy on the same global model
    client0 = clients[clients["client_id"] == 0].sort_values("round")["accuracy"]
    assert rounds["central_accuracy"].to_numpy() == pytest.approx(client0.to_numpy())
    assert (rounds["central_loss"] > 0).all()


@pytest.mark.slow
def test_client_side_differential_privacy_runs_and_its_config_is_charged(
    tmp_path: Path, monkeypatch
) -> None:
    """The DP wrapper adds ``clipping_norm`` (a double) to every train message's config:
    a protobuf map entry of 28 bytes (its field tag and length, 2; the key's tag, length
    and 13 bytes, 15; the value's tag and length, 2, holding a double's tag and 8 bytes,
    9). Four train messages a round: 112 bytes more down, nothing more up."""
    monkeypatch.syspath_prepend(str(CLASSIC))
    algorithm = {
        "name": "flower",
        "params": {
            "serverapp": "classicapp.dp:server",
            "clientapp": "classicapp.dp:client",
            # components named by import string: no pyproject, so its config given here
            "run_config": {"lr": 0.1, "fraction-train": 1.0, "fraction-evaluate": 1.0},
        },
    }
    plain = run(tmp_path, CLASSIC, "plain")
    private = run(tmp_path, CLASSIC, "private", algorithm=algorithm)
    ra, rb = (pd.read_csv(f / "rounds.csv") for f in (plain, private))
    assert (rb["bytes_down"] - ra["bytes_down"] == 4 * 28).all()
    assert (rb["bytes_up"] == ra["bytes_up"]).all()
    # clipped and noised updates: the model learns otherwise
    assert (rb["central_accuracy"] != ra["central_accuracy"]).any()
