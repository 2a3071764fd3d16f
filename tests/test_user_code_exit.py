"""Code of a run that ends with what is not an Exception — ``sys.exit(0)`` in an
algorithm's ``fit`` or ``aggregate_fit``, in a Flower ClientApp, a ``raise
KeyboardInterrupt`` nobody sent, a BaseException of its own — fails the run: exit 1,
one line naming the algorithm and where, run.json ``failed``; ``mecsim check`` reports
it. A real Ctrl-C in the middle of ``fit`` still interrupts the run (exit 130)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mecsim.interfaces.cli import main

SCENARIO = {
    "name": "exits",
    "seed": 1,
    "rounds": 2,
    "dataset": {"name": "mnist-embedded", "train_size": 400, "test_size": 100},
    "topology": {"clients": 4},
    "training": {"epochs": 1, "batch_size": 32},
    "metrics": {"enabled": False},
    "checkpoint": {"every": 0},
    "execution": {"backend": "local", "hosts": 1},
}

PLUGIN = '''
import os, sys, time
from mecsim.api import register
from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer


class Boom(BaseException):
    """A BaseException of the plugin's own."""


def settings():
    """EXITS_* from the environment, or from exits.json beside the scenario (Ray's
    workers, started before the test set its environment, read the file)."""
    found = {k: v for k, v in os.environ.items() if k.startswith("EXITS_")}
    if not found and os.path.exists(SETTINGS):
        import json

        with open(SETTINGS) as f:
            found = json.load(f)
    return found


def act(where, rnd):
    env = settings()
    if env.get("EXITS_WHERE") != where or rnd != int(env.get("EXITS_ROUND", "0")):
        return
    how = env["EXITS_HOW"]
    if how == "exit0":
        sys.exit(0)
    if how == "exit3":
        sys.exit(3)
    if how == "keyboard":
        raise KeyboardInterrupt
    if how == "boom":
        raise Boom("its own")
    if how == "sleep":  # a long fit: the test sends a real SIGINT meanwhile
        open(env["EXITS_MARK"], "w").close()
        time.sleep(120)


class C(FedAvgClient):
    def fit(self, ctx, task):
        rnd = ctx.state.get("fits", 0)  # every client trains every round
        ctx.state["fits"] = rnd + 1
        act("fit", rnd)
        return super().fit(ctx, task)


class S(FedAvgServer):
    Client = C

    def __init__(self, *args, **kwargs):
        act("init", 0)
        super().__init__(*args, **kwargs)

    def aggregate_fit(self, rnd, results):
        act("aggregate_fit", rnd)
        return super().aggregate_fit(rnd, results)


register("algorithm", "exits", (S, C))
'''


@pytest.fixture
def files(tmp_path: Path, monkeypatch):
    settings = tmp_path / "exits.json"
    (tmp_path / "exits.py").write_text(f"SETTINGS = {str(settings)!r}\n" + PLUGIN)
    data = {**SCENARIO, "algorithm": {"name": "exits"}, "outputs": {"dir": str(tmp_path / "runs")}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import mecsim.registry as registry

    if "exits" in registry.ALGORITHMS._registered:
        registry.ALGORITHMS.unregister("exits")


def _run(tmp_path: Path, monkeypatch, capfd, where: str, how: str, rnd: int = 0):
    monkeypatch.setenv("EXITS_WHERE", where)
    monkeypatch.setenv("EXITS_HOW", how)
    monkeypatch.setenv("EXITS_ROUND", str(rnd))
    code = main(["run", "s.yaml", "--plugin", "exits.py", "--quiet", "--no-plots"])
    out, err = capfd.readouterr()
    folders = list((tmp_path / "runs").glob("*/run.json"))
    meta = json.loads(folders[0].read_text()) if folders else {}
    return code, out, err, meta


@pytest.mark.parametrize(
    "where, how, rnd, says",
    [
        ("fit", "exit0", 0, "algorithm exits: fit of client 0 raised SystemExit(0) (user code)"),
        ("fit", "exit3", 1, "algorithm exits: fit of client 0 raised SystemExit(3) (user code)"),
        ("fit", "keyboard", 0, "fit of client 0 raised KeyboardInterrupt() (user code)"),
        ("aggregate_fit", "exit0", 1, "algorithm exits: aggregate_fit raised SystemExit(0)"),
        ("aggregate_fit", "boom", 0, "aggregate_fit raised Boom('its own') (user code)"),
    ],
)
def test_code_of_the_run_that_exits_fails_the_run_in_one_line(
    files, monkeypatch, capfd, where, how, rnd, says
):
    code, out, err, meta = _run(files, monkeypatch, capfd, where, how, rnd)
    assert code == 1, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert says in lines[0] and lines[0].startswith("error: the run failed:"), err
    assert "Traceback" not in err
    assert (
        meta["status"] == "failed" and says.split(" (user")[0].split(": ", 1)[-1] in meta["error"]
    )
    assert meta["rounds_done"] == rnd  # the rounds before are kept


def test_an_exit_outside_the_algorithm_calls_is_a_failed_run_too(files, monkeypatch, capfd):
    """sys.exit(3) in the server's constructor (no call mecsim names around it)."""
    code, out, err, _ = _run(files, monkeypatch, capfd, "init", "exit3")
    assert code == 1, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "SystemExit(3)" in lines[0] and "(user code)" in lines[0], err
    assert "Traceback" not in err
    # mecsim validate builds the algorithm's server in its pre-flight: the same
    monkeypatch.setenv("EXITS_HOW", "exit0")
    assert main(["validate", "s.yaml", "--plugin", "exits.py"]) == 1
    _, err = capfd.readouterr()
    assert "mecsim validate: code of a plugin or algorithm raised SystemExit(0)" in err, err


def test_mecsim_check_reports_an_algorithm_that_exits(files, monkeypatch, capfd):
    monkeypatch.setenv("EXITS_WHERE", "fit")
    monkeypatch.setenv("EXITS_HOW", "exit0")
    code = main(["check", "exits", "--plugin", "exits.py", "--no-ray", "--property", "params"])
    out, err = capfd.readouterr()
    assert code == 1, (out, err)
    assert "FAIL params" in out and "fit of client 0 raised SystemExit(0)" in out, out


def test_a_real_ctrl_c_in_the_middle_of_fit_still_interrupts_the_run(files):
    mark = files / "in-fit"
    env = {
        **os.environ,
        "EXITS_WHERE": "fit",
        "EXITS_HOW": "sleep",
        "EXITS_ROUND": "1",
        "EXITS_MARK": str(mark),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "mecsim", "run", "s.yaml", "--plugin", "exits.py", "--quiet"],
        cwd=files,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "fit of round 1 never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted after 1 of 2 rounds" in err and "user code" not in err
    (meta,) = [json.loads(p.read_text()) for p in (files / "runs").glob("*/run.json")]
    assert meta["status"] == "interrupted"


def test_the_signal_mark_is_the_same_on_both_sides():
    from mecsim.agents.algorithms import base
    from mecsim.run import interrupts

    assert base.SIGNAL_MARK == interrupts.SIGNAL_MARK


@pytest.mark.ray
@pytest.mark.parametrize("where", ["fit", "aggregate_fit"])
def test_on_ray_an_exit_in_an_actor_fails_the_run_in_one_line(files, monkeypatch, capfd, where):
    """Under Ray the host and the server are actors: sys.exit(0) there is one line too
    (not an actor that dies and is re-created, nor an exit 0)."""
    settings = {"EXITS_WHERE": where, "EXITS_HOW": "exit0", "EXITS_ROUND": "0"}
    (files / "exits.json").write_text(json.dumps(settings))
    args = ["run", "s.yaml", "--plugin", "exits.py", "--quiet", "--no-plots", "--backend", "ray"]
    code = main(args)
    _, err = capfd.readouterr()
    assert code == 1, err
    says = "fit of client 0" if where == "fit" else "aggregate_fit"
    lines = [line for line in err.splitlines() if "the run failed" in line]
    assert len(lines) == 1 and f"{says} raised SystemExit(0) (user code)" in lines[0], err
    assert "Traceback" not in err
