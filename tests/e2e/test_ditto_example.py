"""The external plugin example ``examples/ditto`` (distribution ``mecsim-ditto``): installed
as a real distribution (into the session's throwaway venv, tests/e2e/conftest.py), found
by its ``mecsim.algorithms`` entry point, run under Ray by ``mecsim run``, and Ditto's
maths and costs checked on the client side."""

from __future__ import annotations

import csv
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.paths import ROOT
from support.venv import PluginVenv

from mecsim.agents.models import build_model
from mecsim.agents.training import StepCosts
from mecsim.api import (
    ClientContext,
    ClientTask,
    Compute,
    Download,
    TrainConfig,
    Upload,
    get_flat,
    model_layout,
    set_flat,
)

EXAMPLE = ROOT / "examples" / "ditto"
SCENARIO = EXAMPLE / "scenarios" / "ditto-mnist-dir01.yaml"
DIST = "mecsim-ditto"


def _installed_in(venv: PluginVenv) -> dict:
    """What a fresh process of ``venv`` finds for mecsim-ditto: where it was installed
    from, its version and its ``mecsim.algorithms`` entry points (empty: not installed)."""
    code = (
        "import json, importlib.metadata as md\n"
        "try:\n"
        "    d = md.distribution('mecsim-ditto')\n"
        "except md.PackageNotFoundError:\n"
        "    print('{}'); raise SystemExit\n"
        "eps = [[e.name, e.value] for e in d.entry_points if e.group == 'mecsim.algorithms']\n"
        "url = json.loads(d.read_text('direct_url.json') or '{}').get('url', '')\n"
        "print(json.dumps({'name': d.name, 'version': d.version, 'url': url, 'eps': eps}))\n"
    )
    return json.loads(venv.run("-c", code).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(plugin_venv: PluginVenv) -> PluginVenv:
    """mecsim-ditto installed (editable) from this checkout's examples/ditto into the
    session's throwaway venv (tests/support/venv.py), never into the suite's own
    environment: the venv a fresh process of which the tests run."""
    plugin_venv.install(EXAMPLE)
    found = _installed_in(plugin_venv)
    assert found.get("url", "").rstrip("/") == EXAMPLE.resolve().as_uri(), found
    assert found["eps"] == [["ditto", "mecsim_ditto:DITTO"]], found
    return plugin_venv


def _ditto_module():
    """mecsim_ditto, imported in this process (from the example's folder when the
    editable install came after this process started and its path hook is not active)."""
    try:
        return importlib.import_module("mecsim_ditto")
    except ImportError:
        sys.path.insert(0, str(EXAMPLE))
        try:
            return importlib.import_module("mecsim_ditto")
        finally:
            sys.path.remove(str(EXAMPLE))


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT), check=False
    )


# --------------------------------------------------------------------------- the plugin


def test_entry_point_metadata(installed: PluginVenv) -> None:
    code = (
        "import json, importlib.metadata as md\n"
        "(ep,) = [e for e in md.entry_points(group='mecsim.algorithms') if e.name == 'ditto']\n"
        "print(json.dumps([ep.value, ep.dist.name, ep.dist.version]))\n"
    )
    value, dist, version = json.loads(installed.run("-c", code).stdout.strip().splitlines()[-1])
    assert value == "mecsim_ditto:DITTO"
    assert dist == DIST and version == "0.1.0"


def test_plugin_imports_only_the_public_api() -> None:
    source = (EXAMPLE / "mecsim_ditto" / "__init__.py").read_text()
    imports = [
        line.split()[1]
        for line in source.splitlines()
        if line.startswith(("import ", "from ")) and "mecsim" in line.split()[1]
    ]
    assert imports == ["mecsim.api"], imports


#: one fresh process of the venv (each imports torch, mecsim and Ray): the registry's
#: look-up of ``ditto``, mecsim.testing.check_algorithm("ditto") (its ``ray`` property
#: starts and stops a Ray of its own), then ``mecsim run ARGV`` (mecsim's ``main``, as
#: ``python -m mecsim`` calls it), which starts another; exits 0 when both passed
_KIT_THEN_RUN = (
    "import json, sys, mecsim.registry as r, mecsim.api as api\n"
    "server, client = r.ALGORITHMS.get('ditto')\n"
    "assert issubclass(server, api.ServerAlgorithm), server\n"
    "assert issubclass(client, api.ClientAlgorithm), client\n"
    "print(json.dumps(r.ALGORITHMS.info('ditto').as_dict()))\n"
    "from mecsim.testing import check_algorithm\n"
    "report = check_algorithm('ditto')\n"
    "print(report.render())\n"
    "from mecsim.interfaces.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print(f'mecsim run exit {code}')\n"
    "sys.exit(0 if report.ok and code == 0 else 1)\n"
)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.own_ray  # in a subprocess, which starts Ray of its own (twice)
def test_conformance_kit_and_the_scenario_under_ray(installed: PluginVenv, tmp_path: Path) -> None:
    """In a fresh process of the venv (this one may have enumerated the entry points
    before the install): the registry resolves ``ditto`` to the entry point's server and
    client classes; mecsim.testing.check_algorithm("ditto"): every property of the
    conformance kit (params, determinism, ray, resume, streaming, movable, optraces,
    nan_guard) holds; and ``mecsim run`` of the example's scenario under Ray with 2 hosts
    finishes with Ditto's records. One process for the two, not one each: a fresh
    interpreter importing torch, mecsim and Ray is most of what a second would add."""
    pytest.importorskip("mecsim.testing", reason="mecsim.testing (the conformance kit) missing")
    proc = _run(
        [
            installed.python,
            "-c",
            _KIT_THEN_RUN,
            "run",
            str(SCENARIO),
            "--rounds",
            "2",
            "--backend",
            "ray",
            "--hosts",
            "2",
            "--out",
            str(tmp_path),
            "--no-plots",
            "--quiet",
        ],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the kit
    info = json.loads(proc.stdout.strip().splitlines()[0])
    assert info["distribution"] == DIST and info["version"] == "0.1.0"
    assert info["origin"] == "entry point" and info["target"] == "mecsim_ditto:DITTO"
    assert "all properties hold" in proc.stdout
    # the scenario's run
    assert "mecsim run exit 0" in proc.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "finished" and meta["backend"] == "ray"
    (plugin,) = [p for p in meta["plugins"] if p["name"] == "ditto"]
    assert plugin["kind"] == "algorithm"
    assert plugin["distribution"] == DIST and plugin["version"] == "0.1.0"
    assert plugin["origin"] == "entry point"

    with (run_dir / "rounds.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    nbytes = int(meta["model_bytes"])
    for row in rows:
        personal, glob = float(row["mean_accuracy"]), float(row["mean_global_accuracy"])
        assert math.isfinite(personal) and math.isfinite(glob)
        # the full model each way for each of the 10 clients, nothing else
        assert int(row["bytes_up"]) == int(row["bytes_down"]) == 10 * nbytes
    # Dirichlet(0.1): each client holds a few labels; its personal model knows them far
    # better than the global model does after two rounds (an evaluation of the global
    # model in place of the personal one would make the two equal)
    assert float(rows[-1]["mean_accuracy"]) > float(rows[-1]["mean_global_accuracy"]) + 0.05

    # every client's op-trace: the download, ONE compute of both trainings, the upload
    traces = [json.loads(line) for line in (run_dir / "optraces.jsonl").read_text().splitlines()]
    with (run_dir / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    for tr in traces:
        for cid, ops in tr["clients"].items():
            assert [op["op"] for op in ops] == ["download", "compute", "upload"]
            assert ops[0]["nbytes"] == ops[2]["nbytes"] == nbytes
            (row,) = [
                c for c in clients if int(c["round"]) == tr["round"] and c["client_id"] == cid
            ]
            assert ops[1]["flops"] == pytest.approx(float(row["gflops"]) * 1e9, rel=1e-6)
            # two trainings of one epoch each: twice the steps of one epoch (a batch of one
            # sample is skipped: the 2NN has a BatchNorm layer)
            n, batch = int(row["num_samples"]), 32
            epoch_steps = math.ceil(n / batch) - (1 if n % batch == 1 else 0)
            assert ops[1]["batches"] == int(row["steps"]) == 2 * epoch_steps


# --------------------------------------------------------------------------- the maths


def test_proximal_term_by_hand() -> None:
    ditto = _ditto_module()
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    anchors = [torch.tensor([[0.0, 1.5]])]
    term = ditto.proximal_term(model, anchors, 0.5)
    # lam/2 * ||v - w||^2 = 0.25 * (1 + 0.25)
    assert float(term.detach()) == pytest.approx(0.3125)
    term.backward()
    # gradient lam * (v - w)
    assert torch.allclose(model.weight.grad, torch.tensor([[0.5, 0.25]]))


#: measured step costs of the 2NN, shared by the contexts below (one architecture)
_COSTS = StepCosts()


def _context(seed: int = 0, n: int = 72) -> ClientContext:
    with torch.random.fork_rng():  # the model's initial weights, the global stream untouched
        torch.manual_seed(1234)
        model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(n, 1, 28, 28, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)  # three labels: a skewed client
    return ClientContext(
        client_id=0,
        model=model,
        layout=layout,
        x_train=x,
        y_train=y,
        x_test=x[:24],
        y_test=y[:24],
        state={},
        train=TrainConfig(epochs=1, batch_size=16, optimizer="sgd", lr=0.05),
        generator=torch.Generator().manual_seed(seed),
        costs=_COSTS,
        init_weights=get_flat(model, layout),
    )


def _client(lam: float, **params):
    ditto = _ditto_module()
    return ditto.DittoClient({"lam": lam, **params})


def test_fit_trains_both_models_and_charges_both() -> None:
    ctx = _context()
    w0 = ctx.init_weights.copy()
    client = _client(0.1)
    result = client.fit(ctx, ClientTask(0, w0, ctx.layout.nbytes))
    personal = ctx.state["personal"]
    assert personal.shape == w0.shape and result.weights is not None
    assert not np.array_equal(personal, w0) and not np.array_equal(result.weights, w0)
    assert not np.array_equal(personal, result.weights)  # two models, not one
    # what it sends is what it counts; the trace holds both trainings' compute
    assert result.upload_nbytes == result.weights.nbytes == ctx.layout.nbytes
    steps_one = math.ceil(72 / 16)
    assert result.steps == 2 * steps_one
    assert result.trace == (
        Download(ctx.layout.nbytes),
        Compute(result.flops, result.steps),
        Upload(ctx.layout.nbytes),
    )
    # a FedAvg client's round on the same data is one training: Ditto's costs at least two
    from mecsim.agents.algorithms.fedavg import FedAvgClient

    fedavg = FedAvgClient({}).fit(_context(), ClientTask(0, w0, ctx.layout.nbytes))
    assert fedavg.steps == steps_one
    assert result.flops >= 2 * fedavg.flops * (1 - 1e-12)
    # the second round trains on from the kept personal model
    result2 = client.fit(ctx, ClientTask(0, result.weights, ctx.layout.nbytes))
    assert not np.array_equal(ctx.state["personal"], personal)
    assert result2.upload_nbytes == ctx.layout.nbytes


def test_evaluate_uses_the_personal_model() -> None:
    ctx = _context()
    w0 = ctx.init_weights.copy()
    client = _client(0.1)
    task = ClientTask(0, w0, 0)
    before = client.evaluate(ctx, task)  # not trained yet: the global model
    assert before[0] == before[2]["global_accuracy"]
    client.fit(ctx, ClientTask(0, w0, ctx.layout.nbytes))
    acc, loss, extra = client.evaluate(ctx, task)
    from mecsim.api import evaluate

    set_flat(ctx.model, ctx.layout, ctx.state["personal"])
    assert (acc, loss) == evaluate(ctx.model, ctx.x_test, ctx.y_test)
    set_flat(ctx.model, ctx.layout, w0)
    assert extra["global_accuracy"] == evaluate(ctx.model, ctx.x_test, ctx.y_test)[0]
    assert math.isfinite(acc) and math.isfinite(loss)


@pytest.mark.slow  # eight client rounds of real training
def test_lambda_zero_is_local_training_and_lambda_pulls_towards_global() -> None:
    from mecsim.agents.algorithms.fedavg import FedAvgClient

    w0 = _context().init_weights.copy()
    # lam = 0: the personal model's first round is plain SGD from w^t (the personal model
    # trains first, so it draws the same shuffle a FedAvg client would)
    ctx = _context(seed=7)
    _client(0.0).fit(ctx, ClientTask(0, w0, ctx.layout.nbytes))
    plain = FedAvgClient({}).fit(_context(seed=7), ClientTask(0, w0, ctx.layout.nbytes))
    assert plain.weights is not None
    np.testing.assert_allclose(ctx.state["personal"], plain.weights, atol=1e-6)
    # the larger lam, the closer the personal model's parameters stay to w^t (lam * lr <=
    # 1: stable); BatchNorm running statistics take no proximal pull and are left out
    params = np.zeros(ctx.layout.size, dtype=bool)
    for slot in ctx.layout.slots:
        if slot.is_param:
            params[slot.offset : slot.offset + slot.numel] = True
    dist = []
    for lam in (0.0, 4.0, 20.0):
        ctx = _context(seed=7)
        client = _client(lam, personal_epochs=3)
        for _ in range(2):  # two rounds from the same w^t: the proximal pull acts on v_k
            client.fit(ctx, ClientTask(0, w0, ctx.layout.nbytes))
        dist.append(float(np.linalg.norm((ctx.state["personal"] - w0)[params])))
    assert dist[0] > dist[1] > dist[2] > 0, dist


def test_server_is_a_sample_weighted_average() -> None:
    ditto = _ditto_module()
    from mecsim.api import ClientResult

    ctx = _context()
    server = ditto.DittoServer(ctx.layout, ctx.init_weights, {0: 30, 1: 10}, 1.0, {})
    a = np.full(ctx.layout.size, 1.0, np.float32)
    b = np.full(ctx.layout.size, 5.0, np.float32)
    results = [
        ClientResult(c, w, ctx.layout.nbytes, n, 0.0, (), 0.0, 0, 0)
        for c, w, n in ((0, a, 30), (1, b, 10))
    ]
    stats = server.aggregate_fit(0, results)
    np.testing.assert_allclose(server.weights, 2.0)  # (30 * 1 + 10 * 5) / 40
    assert stats.flops == 2.0 * ctx.layout.size * 2 + ctx.layout.size  # 2|w|K + |w|
