"""Plugins: what a scenario names is found through entry points (mecsim's built-ins and
installed distributions alike), import strings and plugin files; conflicts, plugins that
fail to load and a service's refusal of import strings.

The installed distributions here are real ones as far as importlib.metadata is
concerned: a ``*.dist-info`` folder with METADATA and entry_points.txt beside the module,
on the PYTHONPATH of a ``mecsim`` subprocess (what ``pip install`` leaves behind).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import yaml
from support.scenarios import TINY
from support.service import ThreadServer

import mecsim.registry as registry
from mecsim.api import simulate
from mecsim.interfaces.service.app import ServiceConfig, create_app
from mecsim.interfaces.service.submission import Rejected, prepare_submission
from mecsim.scenario import ScenarioError, scenario_from_dict

PLUGIN_MODULE = '''
"""A plugin distribution's module: an algorithm, a model and a data set."""
import numpy as np
from torch import nn

from mecsim.api import DatasetSpec, Params
from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer
from pydantic import Field


class HalfParams(Params):
    scale: float = Field(1.0, gt=0, description="nothing but a checked parameter")


class HalfServer(FedAvgServer):
    Params = HalfParams


class HalfClient(FedAvgClient):
    Params = HalfParams
    keeps_no_state = True


HALF = (HalfServer, HalfClient)


def tiny_mlp(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 16), nn.ReLU(),
                         nn.Linear(16, num_classes))


def _blobs(root):
    rng = np.random.default_rng(0)
    y = np.arange(600) % 3
    x = (rng.normal(size=(600, 1, 4, 4)) + y[:, None, None, None]).astype(np.float32)
    return x[:400], y[:400], x[400:], y[400:]


BLOBS = DatasetSpec(in_shape=(1, 4, 4), num_classes=3, load=_blobs,
                    description="three Gaussian blobs (made, not read)")
'''


def _dist(site: Path, name: str, version: str, entry_points: str, module: str = "") -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    if module:
        (site / f"{name}.py").write_text(module)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Three installed distributions: one good plugin, one claiming the same algorithm
    name, one whose module raises on import."""
    site = tmp_path_factory.mktemp("site")
    _dist(
        site,
        "halfplug",
        "1.2.0",
        """
        [mecsim.algorithms]
        half = halfplug:HALF
        twin = halfplug:HALF
        [mecsim.models]
        tiny_mlp = halfplug:tiny_mlp
        [mecsim.datasets]
        blobs = halfplug:BLOBS
        [mecsim.devices]
        boards = halfplug:BOARDS
        """,
        PLUGIN_MODULE + '\nBOARDS = {"pi-zero-2": {"flops_per_s": 1.5e9, "step_overhead_s": 0.02, '
        '"ram_bytes": 536870912, "flops_source": "a test figure", '
        '"step_overhead_source": "a test figure"}}\n',
    )
    _dist(site, "twinplug", "0.1", "[mecsim.algorithms]\ntwin = twinplug:X\n", "X = None\n")
    _dist(
        site,
        "brokenplug",
        "3.0",
        "[mecsim.algorithms]\nbroken = brokenplug:ALGO\n",
        "raise RuntimeError('no licence server')\n",
    )
    return site


def _mecsim(site: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, "-m", "mecsim", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: runs ``mecsim`` command lines (a JSON list of argv lists, argv[1]) one after another in
#: one fresh process, as ``python -m mecsim`` would each: prints each one's exit code and
#: standard error as a JSON list
_MANY = """
import contextlib, io, json, sys
from mecsim.interfaces.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out.append([code, err.getvalue()])
print(json.dumps(out))
"""


def _mecsim_many(site: Path, *argvs: list[str]) -> list[tuple[int, str]]:
    """``mecsim`` command lines in one fresh process that sees ``site``'s distributions
    (one interpreter start and torch import for all): each one's (exit code, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run(
        [sys.executable, "-c", _MANY, json.dumps(argvs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return [(code, err) for code, err in json.loads(done.stdout.strip().splitlines()[-1])]


def _scenario(tmp_path: Path, name: str = "s", **changes) -> Path:
    data = json.loads(json.dumps(TINY))
    data["rounds"] = 1
    for key, value in changes.items():
        data[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_builtins_are_entry_points_of_mecsim_itself() -> None:
    for kind, names in {
        "algorithm": ["fedavg", "kapc_bls", "phsfl"],
        "model": ["mlp_2nn", "resnet18"],
        "dataset": ["mnist-embedded", "cifar10"],
        "device": ["builtin"],
    }.items():
        for name in names:
            info = registry.registry(kind).info(name)
            assert (info.origin, info.distribution) == ("entry point", "mecsim"), info
            assert info.builtin
    assert registry.algorithm("fedavg")[0].__name__ == "FedAvgServer"
    assert registry.used_by({"algorithm": "fedavg", "model": "mlp_2nn"}) == []


@pytest.mark.slow
def test_installed_plugins_are_listed_with_their_distributions_and_failures(site) -> None:
    out = _mecsim(site, "plugins", "--json")
    assert out.returncode == 0, out.stderr
    rows = {(r["kind"], r["name"], r["distribution"]): r for r in json.loads(out.stdout)["plugins"]}
    half = rows[("algorithm", "half", "halfplug")]
    assert (half["version"], half["loads"], half["target"]) == ("1.2.0", True, "halfplug:HALF")
    assert rows[("model", "tiny_mlp", "halfplug")]["loads"]
    assert rows[("dataset", "blobs", "halfplug")]["loads"]
    broken = rows[("algorithm", "broken", "brokenplug")]
    assert not broken["loads"]
    assert broken["error"] == (
        "algorithm plugin 'broken' (from brokenplug) failed to load: "
        "RuntimeError: no licence server"
    )
    # the same name from two distributions: listed under both, and refused naming both
    for dist in ("halfplug", "twinplug"):
        twin = rows[("algorithm", "twin", dist)]
        assert not twin["loads"] and "halfplug 1.2.0" in twin["error"]
        assert "twinplug 0.1" in twin["error"]
    assert rows[("algorithm", "fedavg", "mecsim")]["loads"]  # the others still work


@pytest.mark.slow
def test_a_scenario_names_plugins_like_builtins_and_run_json_records_them(site, tmp_path) -> None:
    scenario = _scenario(
        tmp_path,
        algorithm={"name": "half", "params": {"scale": 2.0}},
        model={"name": "tiny_mlp"},
        dataset={"name": "blobs", "partition": {"method": "iid"}},
        devices={"clients": [{"profile": "pi-zero-2"}]},
    )
    out = _mecsim(
        site,
        "run",
        str(scenario),
        "--out",
        str(tmp_path),
        "--run-id",
        "p",
        "--no-plots",
        "--quiet",
        "--backend",
        "local",
    )
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "p" / "run.json").read_text())
    assert meta["status"] == "finished"
    recorded = {(p["kind"], p["name"]): p for p in meta["plugins"]}
    assert set(recorded) == {("algorithm", "half"), ("model", "tiny_mlp"), ("dataset", "blobs")}
    assert recorded[("algorithm", "half")]["distribution"] == "halfplug"
    assert recorded[("algorithm", "half")]["version"] == "1.2.0"
    # 3 classes of 4x4 inputs: the model was built for the plugin's data
    assert meta["num_params"] == (16 * 16 + 16) + (16 * 3 + 3)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.own_ray
def test_ray_workers_resolve_installed_plugins_by_entry_point(site, tmp_path) -> None:
    scenario = _scenario(tmp_path, algorithm={"name": "half"})
    out = _mecsim(
        site,
        "run",
        str(scenario),
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
        "--no-plots",
        "--quiet",
        "--backend",
        "ray",
        "--hosts",
        "2",
    )
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["status"] == "finished" and meta["backend"] == "ray"
    assert [p["distribution"] for p in meta["plugins"]] == ["halfplug"]


@pytest.mark.slow
def test_bad_plugins_are_one_line_and_exit_2(site, tmp_path) -> None:
    cases = [
        ("broken", "failed to load: RuntimeError: no licence server"),
        ("twin", "provided by two distributions: halfplug 1.2.0 (halfplug:HALF) and twinplug"),
        ("nope", "unknown algorithm 'nope'; known: broken, dcpfl"),
    ]
    runs = [
        [
            "run",
            str(_scenario(tmp_path, name, algorithm={"name": name})),
            "--out",
            f"{tmp_path}/{name}",
        ]
        for name, _ in cases
    ]
    bad_params = _scenario(tmp_path, "bad", algorithm={"name": "half", "params": {"scale": -1}})
    *ran, validated = _mecsim_many(site, *runs, ["validate", str(bad_params)])
    for (name, expected), (code, err) in zip(cases, ran, strict=True):
        assert code == 2, err
        assert expected in err, err
        assert "Traceback" not in err
        assert not (tmp_path / name).exists()  # nothing written
    code, err = validated
    assert code == 2
    assert "algorithm.params.scale: Input should be greater than 0 (algorithm half)" in err


PLUGIN_FILE = """
from mecsim.api import register
from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer


class FileServer(FedAvgServer):
    pass


class FileClient(FedAvgClient):
    keeps_no_state = True


register("algorithm", "from_file", (FileServer, FileClient))
"""


@pytest.mark.slow
@pytest.mark.ray
def test_a_plugin_file_reaches_ray_workers_and_is_recorded_by_sha256(tmp_path) -> None:
    import hashlib

    path = tmp_path / "myalgo.py"
    path.write_text(PLUGIN_FILE)
    try:
        added = registry.load_plugin_file(path)
        assert [(i.kind, i.name, i.origin) for i in added] == [("algorithm", "from_file", "file")]
        data = json.loads(json.dumps(TINY))
        data["algorithm"] = {"name": "from_file"}
        run = simulate(
            data,
            out=tmp_path,
            run_id="f",
            rounds=2,
            backend="ray",
            hosts=2,
            progress=False,
            plots=False,
        )
        assert run.status == "finished" and len(run.rounds) == 2
        (info,) = run.plugins
        assert info["sha256"] == hashlib.sha256(PLUGIN_FILE.encode()).hexdigest()
        assert (info["origin"], info["target"]) == ("file", "myalgo.py")
        # the same run as FedAvg's: the plugin's classes add nothing
        data["algorithm"] = {"name": "fedavg"}
        ref = simulate(
            data,
            out=tmp_path,
            run_id="ref",
            rounds=2,
            backend="local",
            progress=False,
            plots=False,
        )
        assert run.rounds["mean_accuracy"].tolist() == ref.rounds["mean_accuracy"].tolist()
    finally:
        registry.ALGORITHMS.unregister("from_file")


def test_a_plugin_file_that_raises_or_registers_nothing_is_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import math\nmath.sqrt(-1)\n")
    with pytest.raises(registry.PluginError, match=r"^plugin file bad.py failed: ValueError"):
        registry.load_plugin_file(bad)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(registry.PluginError, match="registered nothing"):
        registry.load_plugin_file(empty)
    clash = tmp_path / "clash.py"
    clash.write_text("from mecsim.api import register\nregister('algorithm', 'fedavg', 1)\n")
    with pytest.raises(registry.PluginError, match="'fedavg' .* already provided by mecsim"):
        registry.load_plugin_file(clash)
    half = tmp_path / "half.py"  # registers one name, then fails: neither is kept
    half.write_text(
        "from mecsim.api import register\nregister('model', 'half_model', len)\n1 / 0\n"
    )
    with pytest.raises(registry.PluginError, match="ZeroDivisionError"):
        registry.load_plugin_file(half)
    assert "half_model" not in registry.MODELS.names()
    # none of these files goes to a run's workers
    shipped = {name for name, _ in registry.portable().files}
    assert not shipped & {"bad.py", "empty.py", "clash.py", "half.py"}


@pytest.mark.slow
def test_import_strings_resolve_locally_and_are_refused_where_imports_are_not_allowed(
    tmp_path, monkeypatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "mylab_algo.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
        "from mecsim.agents.algorithms.fedavg import FEDAVG as ALGO\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = json.loads(json.dumps(TINY))
    data["algorithm"] = {"name": "mylab_algo:ALGO"}
    with registry.imports(False), pytest.raises(ScenarioError, match="import string"):
        scenario_from_dict(data, "s.yaml")
    assert not marker.exists()  # refused before anything was imported
    # the service refuses it too (its default), naming the field, nothing imported
    with pytest.raises(Rejected) as caught:
        prepare_submission(
            data,
            rounds=None,
            overrides={},
            data_root=None,
            tmp_dir=tmp_path / "t",
            runs_dir=tmp_path / "runs",
        )
    assert any(
        "algorithm" in p.line() and "--allow-imports" in p.line() for p in caught.value.problems
    )
    assert not marker.exists()
    run_id, accepted = prepare_submission(  # an operator's --allow-imports
        data,
        rounds=None,
        overrides={},
        data_root=None,
        tmp_dir=tmp_path / "t",
        runs_dir=tmp_path / "runs",
        allow_imports=True,
    )
    assert accepted.algorithm.name == "mylab_algo:ALGO" and marker.exists()
    sc = scenario_from_dict(data, "s.yaml")  # where imports are allowed: mecsim run
    assert sc.algorithm.name == "mylab_algo:ALGO"
    assert registry.ALGORITHMS.info("mylab_algo:ALGO").origin == "import string"


def test_the_service_lists_its_plugins_and_says_whether_it_takes_imports(tmp_path) -> None:
    config = ServiceConfig(state_dir=tmp_path / "state", start_workers=False)
    data = json.loads(json.dumps(TINY))
    data["algorithm"] = {"name": "os:system"}
    with ThreadServer(create_app(config)) as server:
        page = httpx.get(f"{server.url}/plugins", timeout=30).json()
        refused = httpx.post(f"{server.url}/runs", json={"scenario": data}, timeout=30)
    assert refused.status_code == 422
    assert "import string" in refused.text and "--allow-imports" in refused.text
    assert page["allow_imports"] is False
    names = {(p["kind"], p["name"]) for p in page["plugins"] if p["loads"]}
    assert {("algorithm", "fedavg"), ("model", "resnet18"), ("dataset", "cifar10")} <= names


CHANNEL_FILE = '''
import dataclasses

import numpy as np
from pydantic import Field

from mecsim.api import ClientRadio, Params, RoundChannel, register


class SlotParams(Params):
    base_bps: float = Field(1e6, gt=0, description="client k's uplink runs at (k+1) x this")


class SlotChannel:
    """Client k's uplink at (k + 1) * base_bps, its downlink at twice that; records the
    client's slot (k mod 2) as a quantity of its own."""

    Params = SlotParams
    record_keys = ("slot",)

    def __init__(self, params):
        self.base_bps = params.base_bps

    def draw_clients(self, n_clients, rng):
        return ClientRadio.unmodelled(n_clients)

    def draw_round(self, radio, client_ids, rng, *, time_s=0.0):
        ids = np.asarray(client_ids)
        up = self.base_bps * (ids + 1)
        rc = RoundChannel.constant_rates(radio, ids, up, 2 * up)
        return dataclasses.replace(rc, extra={"slot": (ids % 2).astype(float)})


register("channel", "slot", SlotChannel)
'''


def test_a_channel_plugin_times_transfers_and_its_quantities_reach_the_records(
    tmp_path,
) -> None:
    from mecsim.interfaces.metrics import MetricsExporter

    path = tmp_path / "slot.py"
    path.write_text(CHANNEL_FILE)
    try:
        registry.load_plugin_file(path)
        data = json.loads(json.dumps(TINY))
        data["channel"] = {
            "model": "plugin",
            "name": "slot",
            "params": {"base_bps": 2e6},
            # bits / rate, as the hand numbers below
            "uplink": {"transport": "ideal"},
            "downlink": {"transport": "ideal"},
        }
        bad = json.loads(json.dumps(data))
        bad["channel"]["params"] = {"base_bps": 0}
        with pytest.raises(ScenarioError, match=r"params.base_bps: .* \(channel slot\)"):
            scenario_from_dict(bad, "s.yaml")
        bad["channel"] = {"model": "plugin", "name": "shannon"}
        with pytest.raises(ScenarioError, match="built in: write `model: shannon`"):
            scenario_from_dict(bad, "s.yaml")
        exporter = MetricsExporter(registry=__import__("prometheus_client").CollectorRegistry())
        run = simulate(data, out=tmp_path, run_id="c", rounds=1, progress=False, plots=False)
        clients = run.clients
        assert list(clients.columns)[-1] == "slot"
        assert [(p["kind"], p["name"], p["origin"]) for p in run.plugins] == [
            ("channel", "slot", "file")
        ]
        for _, row in clients.iterrows():
            cid = int(row["client_id"])
            assert row["slot"] == cid % 2
            assert row["uplink_rate_bps"] == 2e6 * (cid + 1)
            # worked by hand: no latency, a dedicated link: 8 bits per byte at the rate
            assert row["upload_s"] == pytest.approx(8 * row["bytes_up"] / (2e6 * (cid + 1)))
            assert row["download_s"] == pytest.approx(8 * row["bytes_down"] / (4e6 * (cid + 1)))
        # the exporter's gauge: the mean slot of the round's 4 clients (0, 1, 0, 1)
        from mecsim.run.observers import RunInfo

        info = RunInfo("c", run.scenario, run.run_dir, 0, 0, 0, 0.0, [])
        exporter.on_round_end(info, run.rows[0], clients.to_dict("records"), [])
        value = exporter.registry.get_sample_value(
            "mecsim_channel_quantity", {"run": "c", "algorithm": "fedavg", "quantity": "slot"}
        )
        assert value == 0.5
    finally:
        registry.CHANNELS.unregister("slot")


FLAKY_FILE = '''
import os

import numpy as np

from mecsim.api import register
from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer

CALLS = {}


class FlakyServer(FedAvgServer):
    pass


class FlakyClient(FedAvgClient):
    """FedAvg, but client 2's second fit raises while MECSIM_TEST_FLAKY is set, and
    client 1 uploads float64 halves while MECSIM_TEST_SHAPE is set."""

    keeps_no_state = True

    def fit(self, ctx, task):
        CALLS[ctx.client_id] = CALLS.get(ctx.client_id, 0) + 1
        if os.environ.get("MECSIM_TEST_FLAKY") and ctx.client_id == 2 and CALLS[2] == 2:
            raise RuntimeError("the licence expired")
        result = super().fit(ctx, task)
        if os.environ.get("MECSIM_TEST_SHAPE") and ctx.client_id == 1:
            result.weights = result.weights[: result.weights.size // 2].astype(np.float64)
        return result


register("algorithm", "flaky", (FlakyServer, FlakyClient))
'''


@pytest.mark.slow
def test_a_plugin_that_raises_in_fit_fails_the_run_naming_it_and_resumes_after_a_fix(
    tmp_path,
) -> None:
    plugin = tmp_path / "flaky.py"
    plugin.write_text(FLAKY_FILE)
    data = json.loads(json.dumps(TINY))
    data.update(rounds=3, algorithm={"name": "flaky"})
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    run = [sys.executable, "-m", "mecsim", "run", str(scenario), "--plugin", str(plugin)]
    common = ["--out", str(tmp_path), "--no-plots", "--quiet"]
    env = dict(os.environ, MECSIM_TEST_FLAKY="1")
    out = subprocess.run(
        [*run, *common, "--run-id", "f"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "error: the run failed: AlgorithmError: algorithm 'flaky' failed in fit of client 2 "
        "in round 2: "
        "RuntimeError: the licence expired. Its finished rounds are kept"
    ), out.stderr
    meta = json.loads((tmp_path / "f" / "run.json").read_text())
    assert (meta["status"], meta["rounds_done"]) == ("failed", 1)
    # fixed (the variable unset): the run resumes and ends as an uninterrupted one
    resume = [
        sys.executable,
        "-m",
        "mecsim",
        "run",
        "--resume",
        str(tmp_path / "f"),
        "--plugin",
        str(plugin),
        "--no-plots",
        "--quiet",
    ]
    out = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [*run, *common, "--run-id", "g"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    import pandas as pd

    a, b = (pd.read_csv(tmp_path / rid / "rounds.csv") for rid in ("f", "g"))
    for col in ("round", "mean_accuracy", "round_time_s", "bytes_up", "energy_j"):
        assert a[col].tolist() == b[col].tolist(), col
    # an upload of the wrong shape or dtype is refused before aggregation, named
    env = dict(os.environ, MECSIM_TEST_SHAPE="1")
    out = subprocess.run(
        [*run, *common, "--run-id", "h"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1
    assert (
        "AlgorithmError: algorithm 'flaky': client 1 uploaded 100005 values, the server "
        "expects 200010 (refused before aggregation)"
    ) in out.stderr, out.stderr


def test_a_name_registered_in_process_only_is_refused_for_ray_before_anything_starts(
    tmp_path,
) -> None:
    from mecsim.agents.algorithms.fedavg import FEDAVG
    from mecsim.store.session import BadRun

    registry.register("algorithm", "notebook_fedavg", FEDAVG)
    try:
        data = json.loads(json.dumps(TINY))
        data["algorithm"] = {"name": "notebook_fedavg"}
        with pytest.raises(BadRun, match="algorithm 'notebook_fedavg': registered in this"):
            simulate(data, out=tmp_path, run_id="n", backend="ray", progress=False, plots=False)
        assert not (tmp_path / "n").exists()  # nothing left behind
        run = simulate(
            data, out=tmp_path, run_id="m", rounds=1, backend="local", progress=False, plots=False
        )
        assert run.status == "finished"
    finally:
        registry.ALGORITHMS.unregister("notebook_fedavg")


def test_the_entry_point_scan_finds_what_importlib_metadata_finds(site, monkeypatch) -> None:
    """registry reads entry_points.txt itself (importlib.metadata's imports alone cost
    ~30 ms of start-up): the same entry points, distributions and versions, with the
    fake distributions of this module on sys.path too."""
    import importlib.metadata as metadata

    monkeypatch.syspath_prepend(str(site))
    groups = [
        f"mecsim.{g}"
        for g in (
            "algorithms",
            "models",
            "datasets",
            "channels",
            "devices",
            "compressors",
            "async_servers",
        )
    ]
    expected = {
        (ep.group, ep.name, ep.value, ep.dist.name, ep.dist.version)
        for group in groups
        for ep in metadata.entry_points(group=group)
    }
    found = {
        (ep.group, ep.name, ep.value, ep.distribution, ep.version)
        for eps in registry._scan_entry_points().values()
        for ep in eps
    }
    assert found == expected
    assert ("mecsim.algorithms", "half", "halfplug:HALF", "halfplug", "1.2.0") in found
