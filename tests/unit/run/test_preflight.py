"""The pre-flight checks, one by one, against real sockets, files and measured steps."""

from __future__ import annotations

import os
import socket
from collections import namedtuple

import pytest
import torch
from support.paths import ROOT
from support.scenarios import tiny

from mecsim.agents.models import build_model
from mecsim.agents.training import make_optimizer, measured_step, step_cost_on_meta
from mecsim.run import preflight
from mecsim.run.preflight import Findings
from mecsim.scenario import ScenarioError

MODELS = [
    ("mlp_2nn", (1, 28, 28)),
    ("mtfl_cnn", (3, 32, 32)),
    ("kapc_cnn", (1, 28, 28)),
    ("phsfl_cnn", (3, 32, 32)),
    ("resnet18", (3, 32, 32)),
]


@pytest.mark.parametrize("name,shape", MODELS, ids=[m for m, _ in MODELS])
@pytest.mark.parametrize("optimizer,momentum", [("sgd", 0.0), ("sgd", 0.9), ("adam", 0.0)])
def test_step_cost_on_meta_equals_a_real_measured_step(name, shape, optimizer, momentum):
    """Same bytes and FLOPs as the real step (mecsim.agents.training.measured_step), without
    storage: the pre-flight can then measure any batch size. (ResNet18's real steps are
    slow on a small machine: one optimiser, one batch.)"""
    if name == "resnet18" and optimizer != "adam":
        pytest.skip("ResNet18 is checked with Adam (the largest optimiser state) only")
    for batch in (3,) if name == "resnet18" else (2, 7, 33):
        torch.manual_seed(0)
        model = build_model(name, shape, 10)
        opt = make_optimizer(optimizer, model.parameters(), 0.01, momentum, 0.0)
        _, real = measured_step(
            model, opt, torch.rand((batch, *shape)), torch.arange(batch) % 10, None
        )
        meta = step_cost_on_meta(name, shape, 10, optimizer, batch, 0.01, momentum)
        assert meta.memory_bytes == real.memory_bytes
        assert meta.flops == real.flops


# --------------------------------------------------------------------------- network


def test_metrics_port_in_use_is_found():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        found = Findings()
        preflight.check_metrics("127.0.0.1", port, False, found)
    assert [p.field for p in found.problems] == ["metrics.port"]
    assert f"port {port} on 127.0.0.1 is in use" in found.problems[0].message


def test_metrics_free_port_loopback_and_port_0_pass():
    found = Findings()
    preflight.check_metrics("127.0.0.1", 0, False, found)
    preflight.check_metrics("localhost", 0, False, found)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    preflight.check_metrics("127.0.0.1", free, False, found)
    assert found.problems == [] and found.warnings == []


def test_privileged_port_is_reported_as_such(monkeypatch):
    """As a user without the privilege, bind() of a port < 1024 raises PermissionError
    (the subprocess test in test_bad_input runs that for real without the capability)."""
    real_bind = socket.socket.bind

    def bind(self, address):
        if address[1] < 1024:
            raise PermissionError(13, "Permission denied")
        return real_bind(self, address)

    monkeypatch.setattr(socket.socket, "bind", bind)
    found = Findings()
    preflight.check_metrics("127.0.0.1", 80, False, found)
    assert "port 80 is privileged" in found.problems[0].message


def test_non_loopback_metrics_host_needs_public_and_warns():
    found = Findings()
    preflight.check_metrics("0.0.0.0", 0, False, found)
    assert found.problems and found.problems[0].field == "metrics.host"
    found = Findings()
    preflight.check_metrics("0.0.0.0", 0, True, found)
    assert found.problems == [] and found.warnings[0].field == "metrics.host"


def test_metrics_host_that_is_not_this_machine():
    found = Findings()
    preflight.check_metrics("192.0.2.123", 9999, True, found)  # TEST-NET-1: never ours
    assert [p.field for p in found.problems] == ["metrics.host"]
    assert "not an address of this machine" in found.problems[0].message


def test_ray_addresses():
    def problems(address):
        found = Findings()
        preflight.check_ray_address(address, found)
        return [p.message for p in found.problems]

    assert problems("auto") == []
    assert "is not 'auto', HOST:PORT" in problems("head")[0]
    assert "is not 'auto', HOST:PORT" in problems("head:99999")[0]
    assert "cannot resolve 'no-such-host.invalid'" in problems("no-such-host.invalid:6379")[0]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert "nothing answers at 127.0.0.1" in problems(f"127.0.0.1:{closed}")[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert problems(f"ray://127.0.0.1:{s.getsockname()[1]}") == []


# --------------------------------------------------------------------------- outputs


def test_outputs(tmp_path):
    def problems(**outputs):
        found = Findings()
        sc = tiny(outputs=outputs)
        preflight.check_outputs(sc, None, found)
        return [(p.field, p.message) for p in found.problems]

    assert problems(dir=str(tmp_path / "new" / "deeper")) == []  # created when the run starts
    (tmp_path / "file").write_text("x")
    assert problems(dir=str(tmp_path / "file"))[0][0] == "outputs.dir"
    assert problems(dir=str(tmp_path / "file" / "runs"))[0][0] == "outputs.dir"
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    assert problems(dir=str(tmp_path / "runs"), run_id="taken")[0][0] == "outputs.run_id"
    assert problems(dir=str(tmp_path / "runs"), run_id="free") == []
    found = Findings()  # resuming: the folder must exist
    preflight.check_outputs(
        tiny(outputs={"dir": str(tmp_path / "runs")}),
        tmp_path / "runs" / "taken",
        found,
        resume=True,
    )
    preflight.check_outputs(
        tiny(outputs={"dir": str(tmp_path / "runs")}),
        tmp_path / "runs" / "gone",
        found,
        resume=True,
    )
    assert [p.message for p in found.problems] == [
        f"there is no run folder {tmp_path / 'runs' / 'gone'} to resume"
    ]
    found = Findings()
    preflight.check_outputs(
        tiny(outputs={"dir": str(tmp_path / "runs")}), tmp_path / "elsewhere" / "x", found
    )
    assert "would not be directly inside outputs.dir" in found.problems[0].message
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert "no permission" in problems(dir=str(locked / "runs"))[0][1]


# --------------------------------------------------------------------------- memory


def test_memory_against_this_machine_counts_the_host_processes(monkeypatch):
    import psutil

    step = step_cost_on_meta("mlp_2nn", (1, 28, 28), 10, "sgd", 16, 0.05).memory_bytes
    total = 2 * step + 1  # room for two steps, not three
    VM = namedtuple("VM", "total available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: VM(total, total))

    def problems(backend, hosts):
        found = Findings()
        sc = tiny(execution={"backend": backend, "hosts": hosts})
        preflight.check_model_and_memory(sc, None, backend, None, None, found)
        return [p.message for p in found.problems]

    assert problems("local", 3) == []  # one process trains
    assert problems("ray", 2) == []
    msg = problems("ray", 3)
    assert len(msg) == 1 and "in each of 3 host processes" in msg[0]
    found = Findings()  # a remote cluster's hosts are not on this machine
    preflight.check_model_and_memory(
        tiny(execution={"backend": "ray", "hosts": 3}), None, "ray", None, "10.0.0.1:6379", found
    )
    assert found.problems == []


def test_check_raises_one_line_per_problem_naming_the_source(tmp_path):
    sc = tiny(
        training={"batch_size": 1}, channel={"model": "trace", "path": str(tmp_path / "no.csv")}
    )
    with pytest.raises(ScenarioError) as info:
        preflight.check(sc, "s.yaml")
    lines = str(info.value).splitlines()
    assert lines == [
        "s.yaml: training.batch_size: mlp_2nn has BatchNorm layers, which cannot train on a "
        "batch of 1: use a batch_size of 2 or more",
        f"s.yaml: channel.path: {tmp_path / 'no.csv'}: no such file",
    ]


def test_the_preflight_leaves_the_global_torch_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert preflight.find_problems(tiny()).problems == []
    assert torch.equal(torch.rand(3), expected)


def test_every_shipped_scenario_passes_the_preflight():
    from mecsim.scenario import default_scenario_path, load_scenario

    root = ROOT
    for path in [*sorted((root / "scenarios").glob("*.yaml")), default_scenario_path()]:
        found = preflight.find_problems(load_scenario(path))
        found.problems = [p for p in found.problems if p.field != "metrics.port"]  # 9464 busy?
        assert found.problems == [], path
