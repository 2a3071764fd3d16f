"""Flower apps on mecsim (``algorithm: flower``): the same global arrays as Flower's own
simulation, stateful clients, mecsim's records, the conformance kit, and bad input.

The app is tests/data/flower_seeded_app (a ServerApp with one of Flower's strategies, a
ClientApp that seeds its training from its partition id and the round); Flower's side
runs in a subprocess (tests/support/flower_sim.py: ``run_simulation`` starts Ray of its own).
Skipped, with the reason, where Flower is not installed (``pip install "mecsim[flower]"``).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support.paths import DATA, ROOT, TESTS

flwr = pytest.importorskip("flwr", reason='Flower is not installed: pip install "mecsim[flower]"')

from mecsim.agents.algorithms.flower_app import (  # noqa: E402
    FlowerAppError,
    FlowerParams,
    flower_version_problem,
    node_ids,
    resolve_app,
)

APP = DATA / "flower_seeded_app"


def scenario(tmp_path: Path, **over) -> Path:
    data = {
        "name": "flower-test",
        "seed": 0,
        "rounds": 3,
        "topology": {"clients": 4},
        "algorithm": {"name": "flower", "params": {"app": str(APP)}},
        "checkpoint": {"every": 0},
        "metrics": {"enabled": False},
        "outputs": {"dir": str(tmp_path / "runs")},
    }
    for key, value in over.items():
        data[key] = value
    path = tmp_path / "flower.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Ran:
    returncode: int
    stderr: str


def mecsim_run(path: Path, *args: str, env: dict[str, str] | None = None) -> Ran:
    """``mecsim run PATH --quiet --no-plots ARGS`` in this process (the app's
    environment switches set for the while), from the scenario's folder."""
    import contextlib
    import io

    from mecsim.interfaces.cli import main

    err = io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    cwd = os.getcwd()
    os.environ.update(env or {})
    os.chdir(path.parent)
    try:
        with contextlib.redirect_stderr(err):
            code = main(["run", str(path), "--quiet", "--no-plots", *args])
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Ran(code, err.getvalue())


def only_run(tmp_path: Path) -> Path:
    (run,) = sorted((tmp_path / "runs").iterdir())
    return run


# ------------------------------------------------------------------ same as Flower


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedavg"])
def test_the_global_arrays_after_every_round_equal_flowers_simulation(
    tmp_path: Path, strategy: str
) -> None:
    """Full participation, a ClientApp seeded from its partition id: mecsim's run and
    Flower's run_simulation of the same app agree round by round to float tolerance (the
    only difference: the order the strategy sums the replies in)."""
    env = {"SEEDEDAPP_STRATEGY": strategy}
    theirs = tmp_path / "flower.npz"
    sim = subprocess.run(
        [sys.executable, str(TESTS / "support" / "flower_sim.py"), "4"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "SEEDEDAPP_OUT": str(theirs)},
        timeout=600,
    )
    assert sim.returncode == 0, sim.stderr[-2000:]
    ours = tmp_path / "mecsim.npz"
    run = mecsim_run(
        scenario(tmp_path), "--backend", "local", env={**env, "SEEDEDAPP_OUT": str(ours)}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    a, b = np.load(theirs), np.load(ours)
    names = [f"round{r}" for r in range(4)] + ["faults"]
    names += [f"{k}{r}" for k in ("times", "wall") for r in (1, 2, 3)]
    assert sorted(a.files) == sorted(b.files) == sorted(names)
    # each side's strategy heard every client it sent to once, without an error
    assert list(a["faults"]) == list(b["faults"]) == []
    assert np.array_equal(a["round0"], b["round0"])  # the same initial model
    for r in range(1, 4):
        moved = np.abs(b[f"round{r}"] - b[f"round{r - 1}"]).max()
        assert moved > 1e-3  # the rounds trained: equality below is not of unchanged arrays
        np.testing.assert_allclose(
            b[f"round{r}"], a[f"round{r}"], rtol=0, atol=1e-6, err_msg=f"round {r}"
        )
        # stateful clients: each counts its trainings in its Context, kept between rounds
        assert float(a[f"times{r}"]) == float(b[f"times{r}"]) == r


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedadam", "fedprox", "fedavgm"])
def test_more_of_flowers_strategies_run_unchanged(tmp_path: Path, strategy: str) -> None:
    out = tmp_path / "m.npz"
    run = mecsim_run(
        scenario(tmp_path),
        "--backend",
        "local",
        env={"SEEDEDAPP_STRATEGY": strategy, "SEEDEDAPP_OUT": str(out)},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    arrays = np.load(out)
    assert np.isfinite(arrays["round3"]).all()
    assert np.abs(arrays["round3"] - arrays["round0"]).max() > 1e-3


# ------------------------------------------------------------------ mecsim's records


def test_a_flower_run_records_every_round_with_mecsims_costs(tmp_path: Path) -> None:
    """Each train batch is a round of rounds.csv with bytes (the messages' protocol
    buffers), FLOPs (counted), times and energy; the evaluate batches are in the eval_*
    columns and give each client's accuracy; partial participation follows the
    strategy's own sampling (fraction-train 0.5: 2 of 4 clients a round)."""
    path = scenario(
        tmp_path,
        algorithm={
            "name": "flower",
            "params": {"app": str(APP), "run_config": {"fraction-train": 0.5}},
        },
    )
    run = mecsim_run(path, "--backend", "local")
    assert run.returncode == 0, run.stderr[-2000:]
    folder = only_run(tmp_path)
    rounds = pd.read_csv(folder / "rounds.csv")
    clients = pd.read_csv(folder / "clients.csv")
    assert list(rounds["round"]) == [0, 1, 2]
    assert (rounds["selected"] == 2).all() and (rounds["completed"] == 2).all()
    # the MLP has 784*32 + 32 + 32*10 + 10 = 25,450 float32 values: a message holds them
    # (101,800 bytes) and a little more (names, shapes, config, metadata)
    per_message = rounds["bytes_down"] / 2
    assert ((per_message > 101_800) & (per_message < 101_800 + 2_000)).all()
    assert ((rounds["bytes_up"] / 2 > 101_800) & (rounds["bytes_up"] / 2 < 103_800)).all()
    # FLOPs counted: 200 samples x (2 x 25,088 + 2 x 320) multiply-adds forward, about 3x
    # that with the backward pass: ~30 MFLOPs per client and round
    per_client = rounds["client_gflops"] / 2
    assert ((per_client > 0.02) & (per_client < 0.05)).all()
    assert (rounds["round_time_s"] > 0).all() and (rounds["energy_j"] > 0).all()
    assert (rounds["eval_clients"] == 4).all()  # fraction-evaluate 1.0
    assert (rounds["eval_time_s"] > 0).all() and (rounds["eval_bytes_up"] > 0).all()
    assert rounds["mean_accuracy"].iloc[-1] > rounds["mean_accuracy"].iloc[0]
    trained = clients[clients["selected"]]
    assert (trained["steps"] == 7).all()  # ceil(200 / 32) optimizer steps each round
    assert (trained["num_samples"] == 200).all()
    assert clients["accuracy"].notna().sum() == 12  # every client evaluated every round


def test_a_train_batchs_radio_energy_is_its_own_whatever_batches_follow(tmp_path: Path) -> None:
    """Each trained client's radio energy is charged at its own air rates of the round's
    train batch: the same with an evaluate batch after it as without one. (The evaluate
    batch draws its own links; read after it, a client was charged another's rates: 0.054
    J for client 1's 0.376 s upload instead of 0.566 J, until 2026-11-29.)"""
    radio = []
    for fraction_evaluate in (1.0, 0.0):
        run_config = {"fraction-train": 0.5, "fraction-evaluate": fraction_evaluate}
        out = tmp_path / f"eval{fraction_evaluate}"
        out.mkdir()
        path = scenario(
            out,
            rounds=1,
            algorithm={"name": "flower", "params": {"app": str(APP), "run_config": run_config}},
        )
        run = mecsim_run(path, "--backend", "local")
        assert run.returncode == 0, run.stderr[-2000:]
        clients = pd.read_csv(only_run(out) / "clients.csv")
        trained = clients[clients["selected"]].set_index("client_id")
        assert len(trained) == 2 and (trained["energy_radio_j"] > 0).all()
        radio.append(trained["energy_radio_j"])
    # the same two clients trained (the strategy's sampling comes first), each charged the
    # same radio energy; their uploads differ, so a swap of rates would show
    pd.testing.assert_series_equal(radio[0], radio[1])
    assert radio[0].iloc[0] != radio[0].iloc[1]


def test_a_client_dropped_by_the_deadline_is_a_failed_reply_to_the_strategy(
    tmp_path: Path,
) -> None:
    """The strategy goes on without the replies of clients the emulated network drops:
    Flower's FedAvg aggregates the others (an error reply for each dropped one)."""
    path = scenario(tmp_path, deadline_s=1.2, rounds=2)
    out = tmp_path / "m.npz"
    run = mecsim_run(path, "--backend", "local", env={"SEEDEDAPP_OUT": str(out)})
    assert run.returncode == 0, run.stderr[-2000:]
    rounds = pd.read_csv(only_run(tmp_path) / "rounds.csv")
    assert (rounds["dropped_deadline"] > 0).any() and (rounds["completed"] > 0).all()
    assert np.isfinite(np.load(out)["round2"]).all()


# ------------------------------------------------------------------ the kit


@pytest.mark.slow
@pytest.mark.ray
def test_the_conformance_kit_passes_on_a_flower_app() -> None:
    from mecsim.testing import TINY, check_algorithm

    data = copy.deepcopy(TINY)
    data["algorithm"] = {"name": "flower", "params": {"app": str(APP)}}
    data["checkpoint"] = {"every": 0}
    report = check_algorithm("flower", data, ray=True)
    report.assert_ok()
    assert not report.result("ray").skipped  # in-process and Ray: identical records
    assert not report.result("determinism").skipped


# ------------------------------------------------------------------ bad input


def test_node_ids_are_distinct_and_fixed_by_the_seed() -> None:
    a, b = node_ids(list(range(100)), 7), node_ids(list(range(100)), 7)
    assert a == b and len(set(a.values())) == 100
    assert node_ids(list(range(100)), 8) != a
    assert all(0 < n < 2**63 for n in a.values())


def test_params_name_exactly_one_app() -> None:
    with pytest.raises(ValueError, match="name the Flower app"):
        FlowerParams()
    with pytest.raises(ValueError, match="not both"):
        FlowerParams(app=".", serverapp="a:b", clientapp="c:d")
    with pytest.raises(ValueError, match="set rounds instead"):
        FlowerParams(app=".", run_config={"num-server-rounds": 5})


def test_the_app_folder_is_checked_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    noflwr = tmp_path / "noflwr"
    noflwr.mkdir()
    (noflwr / "pyproject.toml").write_text('[project]\nname = "x"\n')
    broken = tmp_path / "broken"
    (broken / "pkg").mkdir(parents=True)
    (broken / "pkg" / "__init__.py").write_text("")
    (broken / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nserverapp = "pkg.nothere:app"\nclientapp = "pkg:app"\n'
    )
    cases = {
        str(tmp_path / "missing"): "no folder",
        str(tmp_path / "empty"): "has no pyproject.toml",
        str(noflwr): "has no [tool.flwr.app.components]",
        str(broken): "cannot load serverapp 'pkg.nothere:app': ModuleNotFoundError",
    }
    for app, says in cases.items():
        with pytest.raises(FlowerAppError, match=None) as err:
            from mecsim.agents.algorithms.flower_bridge import load_components

            load_components(resolve_app(FlowerParams(app=app), 3))
        assert says in str(err.value) and "algorithm.params.app" in str(err.value)
    with pytest.raises(FlowerAppError, match="not in the app's"):
        resolve_app(FlowerParams(app=str(APP), run_config={"nope": 1}), 3)


def test_a_bad_app_is_one_line_exit_2_and_nothing_written(tmp_path: Path) -> None:
    path = scenario(tmp_path, algorithm={"name": "flower", "params": {"app": "no/such/app"}})
    run = mecsim_run(path, "--backend", "local")
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "algorithm.params.app" in lines[0] and "no folder" in lines[0]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_checkpoints_are_refused_before_the_run_starts(tmp_path: Path) -> None:
    path = scenario(tmp_path, checkpoint={"every": 1})
    run = mecsim_run(path, "--backend", "local")
    assert run.returncode == 2
    assert "checkpoint.every" in run.stderr and "cannot be checkpointed" in run.stderr
    assert "checkpoint: {every: 0}" in run.stderr


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SEEDEDAPP_RAISE": "2"}, "RuntimeError: partition 2 was told to fail"),
        ({"SEEDEDAPP_NAN": "1"}, "NaN or inf"),
    ],
)
def test_a_clientapp_that_raises_or_replies_nan_fails_the_run_naming_the_client(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    run = mecsim_run(scenario(tmp_path, rounds=1), "--backend", "local", env=env)
    assert run.returncode == 1
    client = env.get("SEEDEDAPP_RAISE") or env.get("SEEDEDAPP_NAN")
    said = f"the ClientApp's train of client {client} in round 1:"
    assert said in run.stderr and says in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_a_flower_outside_the_tested_range_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(flwr, "__version__", "1.20.0")
    problem = flower_version_problem()
    assert problem is not None and "Flower 1.20.0 is installed" in problem
    assert "flwr>=1.38,<1.43" in problem
    for ok in ("1.38.0", "1.42.0"):
        monkeypatch.setattr(flwr, "__version__", ok)
        assert flower_version_problem() is None
    monkeypatch.setattr(flwr, "__version__", "1.43.0")
    assert "Flower 1.43.0 is installed" in str(flower_version_problem())


def test_a_server_without_allow_imports_runs_only_installed_apps() -> None:
    import mecsim.registry as registry

    with registry.imports(False):
        with pytest.raises(FlowerAppError, match="runs only installed Flower apps"):
            resolve_app(FlowerParams(app=str(APP)), 3)
        with pytest.raises(FlowerAppError, match="not a component of a Flower app installed"):
            resolve_app(FlowerParams(serverapp="seededapp.x:app", clientapp="seededapp:y"), 3)
        # an installed distribution is not a Flower app: its modules are not components
        before = set(sys.modules)
        for ref in ("PIL.__main__:x", "certifi.__main__:x", "flwr.cli.app:app"):
            with pytest.raises(FlowerAppError, match="algorithm.params.serverapp.*nothing was"):
                resolve_app(FlowerParams(serverapp=ref, clientapp=ref), 3)
        assert "PIL.__main__" in before or "PIL.__main__" not in sys.modules
        assert "certifi.__main__" in before or "certifi.__main__" not in sys.modules
    # mecsim run (a local user's own command line) keeps taking any import string
    app = resolve_app(FlowerParams(serverapp="anything.at:all", clientapp="x.y:z"), 3)
    assert app.serverapp == "anything.at:all"


def _fake_install(site: Path, name: str, *, direct_url: Path | None = None, eps: str = ""):
    """A distribution's metadata folder as pip leaves it (no code: what the server reads
    is the metadata), in ``site``."""
    import json

    meta = site / f"{name}-1.0.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0.0\n")
    if direct_url is not None:
        url = {"url": direct_url.as_uri(), "dir_info": {"editable": True}}
        (meta / "direct_url.json").write_text(json.dumps(url))
    if eps:
        (meta / "entry_points.txt").write_text(eps)


@pytest.mark.parametrize("how", ["pip install -e APP", "entry points", "--flower-app APP"])
def test_a_server_runs_the_flower_apps_its_operator_installed_or_listed(
    tmp_path: Path, monkeypatch, how: str
) -> None:
    """Where imports are refused, a Flower app's components load when the operator
    installed the app (a distribution installed from the app's folder, whose
    pyproject.toml declares them; or one declaring them as mecsim.flower_apps entry
    points) or listed it (mecsim serve --flower-app): a submission can fake none of
    these. Components of another app, or of no app, stay refused."""
    import mecsim.registry as registry
    from mecsim.agents.algorithms.flower_bridge import load_components
    from mecsim.interfaces.service.submission import Rejected, prepare_submission

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(APP))  # the app's code, importable once allowed
    monkeypatch.syspath_prepend(str(site))
    listed: tuple[str, ...] = ()
    if how == "pip install -e APP":
        _fake_install(site, "seededapp", direct_url=APP)
    elif how == "entry points":
        _fake_install(
            site,
            "seededapp",
            eps="[mecsim.flower_apps]\nserverapp = seededapp.server_app:app\n"
            "clientapp = seededapp.client_app:app\n",
        )
    else:
        listed = (str(APP),)
    registry.rescan()
    try:
        with registry.imports(False, listed):
            refs = registry.flower_components()
            assert {"seededapp.server_app:app", "seededapp.client_app:app"} <= set(refs)
            params = FlowerParams(
                serverapp="seededapp.server_app:app", clientapp="seededapp.client_app:app"
            )
            server_app, client_app = load_components(resolve_app(params, 1))
            assert type(server_app).__name__ == "ServerApp"
            with pytest.raises(FlowerAppError, match="algorithm.params.clientapp"):
                resolve_app(
                    FlowerParams(serverapp="seededapp.server_app:app", clientapp="os:system"), 1
                )
            if how == "--flower-app APP":  # the listed folder may be named as the app
                assert resolve_app(FlowerParams(app=str(APP)), 1).app_dir == str(APP)
            else:
                with pytest.raises(FlowerAppError, match="algorithm.params.app"):
                    resolve_app(FlowerParams(app=str(APP)), 1)
        text = yaml.safe_dump(
            {
                "name": "installed-app",
                "rounds": 1,
                "topology": {"clients": 2},
                "algorithm": {"name": "flower", "params": dict(params)},
                "checkpoint": {"every": 0},
            }
        )
        kwargs = dict(
            rounds=None,
            overrides={},
            data_root=None,
            tmp_dir=tmp_path / "tmp",
            runs_dir=tmp_path / "runs",
            flower_apps=listed,
        )
        _, sc = prepare_submission(text, **kwargs)
        assert sc.algorithm.params["serverapp"] == "seededapp.server_app:app"
        # another attribute of the app's own modules is no component: refused
        other = text.replace("seededapp.client_app:app", "seededapp.server_app:main")
        with pytest.raises(Rejected) as refused:
            prepare_submission(other, **kwargs)
        assert [p.field for p in refused.value.problems] == ["algorithm.params.clientapp"]
        if listed:  # the same server without the operator's list: refused
            with pytest.raises(Rejected) as refused:
                prepare_submission(text, **{**kwargs, "flower_apps": ()})
            assert [p.field for p in refused.value.problems] == ["algorithm.params.serverapp"]
    finally:
        monkeypatch.undo()
        registry.rescan()


def test_mecsim_serve_refuses_a_flower_app_option_that_names_no_app(tmp_path: Path) -> None:
    from mecsim.interfaces.cli import main

    assert (
        main(
            ["serve", "--port", "0", "--state", str(tmp_path / "s"), "--flower-app", str(tmp_path)]
        )
        == 2
    )
    assert (
        main(
            ["serve", "--port", "0", "--state", str(tmp_path / "s"), "--flower-app", "not a folder"]
        )
        == 2
    )
    assert not (tmp_path / "s").exists()


def test_flops_counted_on_the_first_message_equal_flops_counted_on_every_one(
    tmp_path: Path,
) -> None:
    """By default each client's first message of each kind is counted with torch's FLOP
    counter and later ones of the same work take its count: on this app (the same data,
    epochs and model every round) that is what counting every call gives, call for call."""
    figures = {}
    for flops in ("first_message", "every_message"):
        folder = tmp_path / flops
        folder.mkdir()
        params = {"app": str(APP), "flops": flops}
        path = scenario(folder, algorithm={"name": "flower", "params": params})
        assert mecsim_run(path, "--backend", "local").returncode == 0
        run = only_run(folder)
        figures[flops] = (
            pd.read_csv(run / "clients.csv")["gflops"].tolist(),
            pd.read_csv(run / "rounds.csv")[["client_gflops", "eval_gflops"]].values.tolist(),
        )
    assert figures["first_message"] == figures["every_message"]
    assert all(g > 0 for g in figures["first_message"][0])


@pytest.mark.slow
@pytest.mark.ray
def test_the_flwr_new_example_app_runs_and_gives_the_same_records_on_ray_and_in_process(
    tmp_path: Path,
) -> None:
    """examples/flower-app: the PyTorch template `flwr new` generates (its ServerApp draws
    its initial model from torch's unseeded generator, its ClientApp shuffles with it):
    the same seed gives the same records in-process and on Ray (mecsim seeds and keeps
    the app's global generators)."""
    from mecsim.testing import first_difference

    app = ROOT / "examples" / "flower-app"
    data = yaml.safe_load((app / "flower-app.yaml").read_text())
    data["algorithm"]["params"]["app"] = str(app)
    # the final model in the test's folder: never the working directory of a process
    # (on Ray, the repository's root where the suite started Ray)
    saved = tmp_path / "final_model.pt"
    data["algorithm"]["params"]["run_config"] = {"final-model-path": str(saved)}
    data["rounds"] = 2
    data["outputs"] = {"dir": str(tmp_path / "runs")}
    data["metrics"] = {"enabled": False}
    path = tmp_path / "flower-app.yaml"
    path.write_text(yaml.safe_dump(data))
    for backend in ("local", "ray"):
        run = mecsim_run(path, "--backend", backend, "--run-id", backend)
        assert run.returncode == 0, run.stderr[-2000:]
    runs = tmp_path / "runs"
    assert first_difference(runs / "local", runs / "ray") is None
    rounds = pd.read_csv(runs / "local" / "rounds.csv")
    assert rounds["mean_accuracy"].iloc[-1] > 0.5 and (rounds["selected"] == 5).all()
    assert saved.is_file() and not (ROOT / "final_model.pt").exists()


def test_the_service_refuses_a_submitted_app_folder_and_takes_an_allowed_one(
    tmp_path: Path,
) -> None:
    """A submission naming an app folder is refused by a service started without
    --allow-imports (nothing of the submission is imported), with the field named; the
    same submission passes where the operator allowed imports."""
    from mecsim.interfaces.service.submission import Rejected, prepare_submission

    text = yaml.safe_dump(
        {
            "name": "flower-sub",
            "rounds": 2,
            "topology": {"clients": 4},
            "algorithm": {"name": "flower", "params": {"app": str(APP)}},
            "checkpoint": {"every": 0},
        }
    )
    kwargs = dict(
        rounds=None, overrides={}, data_root=None, tmp_dir=tmp_path / "tmp", runs_dir=tmp_path
    )
    with pytest.raises(Rejected) as refused:
        prepare_submission(text, **kwargs)
    (problem,) = refused.value.problems
    assert problem.field == "algorithm.params.app"
    assert "runs only installed Flower apps" in problem.msg
    run_id, sc = prepare_submission(text, allow_imports=True, **kwargs)
    assert sc.algorithm.name == "flower" and run_id


@pytest.mark.parametrize("how", ["sys.exit(0)", "raise KeyboardInterrupt"])
def test_a_clientapp_that_exits_fails_the_run_in_one_line(
    tmp_path: Path, monkeypatch, how: str
) -> None:
    """A ClientApp's sys.exit(0) (or a KeyboardInterrupt nobody sent) used to end
    `mecsim run` with exit 0 and nothing printed: it is a failed run naming where."""
    name = "exitapp" if "exit" in how else "interruptapp"  # one module per case
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "client_app.py").write_text(
        "import sys\n"
        "from flwr.clientapp import ClientApp\n"
        "app = ClientApp()\n"
        "@app.train()\n"
        "def train(msg, context):\n"
        f"    {how}\n"
    )
    monkeypatch.syspath_prepend(str(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    params = {"serverapp": "seededapp.server_app:app", "clientapp": f"{name}.client_app:app"}
    path = scenario(tmp_path, rounds=1, algorithm={"name": "flower", "params": params})
    run = mecsim_run(path, "--backend", "local")
    assert run.returncode == 1, run.stderr
    exc = "SystemExit(0)" if "exit" in how else "KeyboardInterrupt()"
    said = (
        f"algorithm flower: the ClientApp's train of client 0 in round 1 raised {exc} (user code)"
    )
    assert said in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    (meta,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/run.json")]
    assert meta["status"] == "failed"


def _wrapped_apps(tmp_path: Path, name: str, train: str, evaluate: str, server: str) -> dict:
    """A package ``name`` with a ClientApp and a ServerApp around the seeded app's, each
    running a line of code first (``pass``: nothing)."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "client_app.py").write_text(
        "import time\n"
        "from flwr.clientapp import ClientApp\n"
        "from seededapp import client_app as seeded\n"
        "app = ClientApp()\n"
        "@app.train()\n"
        "def train(msg, context):\n"
        f"    {train}\n"
        "    return seeded.train_fn(msg, context)\n"
        "@app.evaluate()\n"
        "def evaluate(msg, context):\n"
        f"    {evaluate}\n"
        "    return seeded.evaluate_fn(msg, context)\n"
    )
    (pkg / "server_app.py").write_text(
        "import time\n"
        "from flwr.serverapp import ServerApp\n"
        "from seededapp import server_app as seeded\n"
        "app = ServerApp()\n"
        "@app.main()\n"
        "def main(grid, context):\n"
        f"    {server}\n"
        "    return seeded.main(grid, context)\n"
    )
    return {"serverapp": f"{name}.server_app:app", "clientapp": f"{name}.client_app:app"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "train", "evaluate", "server", "timeout", "says"),
    [
        (
            "evalfails",
            "pass",
            "raise ValueError('no test data')",
            "pass",
            None,
            "AlgorithmError: algorithm 'flower' failed in the ClientApp's evaluate of client 0 "
            "in round 1: ValueError: no test data",
        ),
        (
            "trainfails",
            "raise ValueError('no train data')",
            "pass",
            "pass",
            None,
            "AlgorithmError: algorithm 'flower' failed in the ClientApp's train of client 0 "
            "in round 1: ValueError: no train data",
        ),
        (
            "evalsleeps",
            "pass",
            "time.sleep(20)",
            "pass",
            3.0,
            "CallTimeout: algorithm 'flower': the ClientApp's evaluate of client 0 in round 1 "
            "did not return within 3 s (execution.call_timeout_s)",
        ),
        (
            "serverblocks",
            "pass",
            "pass",
            "time.sleep(20)",
            3.0,
            "CallTimeout: algorithm 'flower': select in round 1 did not return within 3 s "
            "(execution.call_timeout_s)",
        ),
    ],
)
def test_a_flower_app_s_failure_or_hang_names_the_app_s_call_and_the_round(
    tmp_path: Path, monkeypatch, name, train, evaluate, server, timeout, says
) -> None:
    """A ClientApp that fails in evaluate used to be reported as failed in fit; a
    ServerApp that blocks or a ClientApp that sleeps held the run until Ctrl-C."""
    monkeypatch.syspath_prepend(str(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    params = _wrapped_apps(tmp_path, name, train, evaluate, server)
    path = scenario(
        tmp_path,
        rounds=1,
        algorithm={"name": "flower", "params": params},
        execution={"backend": "local", "call_timeout_s": timeout},
    )
    start = time.monotonic()
    run = mecsim_run(path)
    assert time.monotonic() - start < 30
    assert run.returncode == 1, run.stderr
    lines = [line for line in run.stderr.splitlines() if "the run failed" in line]
    assert len(lines) == 1 and lines[0].startswith(f"error: the run failed: {says}"), run.stderr
    assert "Traceback" not in run.stderr
    (meta,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/run.json")]
    assert meta["status"] == "failed"
