"""Arguments and outputs a hostile or unlucky user gives (issue 41, item 9): refused
before any work with one line naming what is wrong (exit 2), and what the user typed
printed literally, never as Rich markup."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from support.paths import DATA

import mecsim.registry as registry
from mecsim.interfaces.cli import main
from mecsim.scenario import ScenarioError, scenario_from_dict

RECORDED = DATA / "legacy_runs" / "fedavg-finished"
AXIS = "channel.uplink.bandwidth_hz=1e6,2e6"


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """A recorded run of its own (a sweep reads it; nothing of the test data is changed)."""
    run = tmp_path / "rec"
    shutil.copytree(RECORDED, run)
    return run


def _sweep(capfd, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["sweep", *args, "--quiet"])
    except SystemExit as exc:  # argparse: a usage error
        code = int(exc.code or 0)
    out, err = capfd.readouterr()
    return code, out, err


# --- mecsim sweep --out ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["file", "proc", "file-parent", "sys"])
def test_sweep_out_that_cannot_be_written_is_refused_before_the_work(tmp_path: Path, capfd, kind):
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    out = {
        "file": a_file,
        "proc": Path("/proc/mecsim-x"),
        "file-parent": a_file / "x",
        "sys": Path("/sys/mecsim-x"),
    }[kind]
    # the run does not exist: refused for --out first means nothing was replayed
    code, out_text, err = _sweep(
        capfd, str(tmp_path / "no-such-run"), "--set", AXIS, "--out", str(out)
    )
    text = out_text + err
    assert code == 2, text
    assert f"--out {out}" in text and "no-such-run" not in text, text
    assert a_file.read_text() == "mine"


def test_sweep_prints_paths_with_rich_markup_literally(recorded: Path, tmp_path: Path, capfd):
    out = tmp_path / "sets" / "[red]x[/red]"
    code, out_text, err = _sweep(capfd, str(recorded), "--set", AXIS, "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}/sweep.csv" in " ".join(out_text.split()), out_text
    assert (out / "sweep.csv").is_file()
    # an error line that holds the user's markup shows it too
    code, out_text, err = _sweep(
        capfd, str(recorded), "--set", "channel.[bold]nope[/bold]=1", "--out", str(out)
    )
    assert code == 2 and "[bold]nope[/bold]" in out_text + err, out_text + err


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--workers", "0"),
        ("--workers", "-3"),
        ("--workers", "two"),
        ("--target-accuracy", "nan"),
        ("--target-accuracy", "5"),
        ("--target-accuracy", "0"),
        ("--target-accuracy", "-0.5"),
        ("--target-accuracy", "inf"),
    ],
)
def test_sweep_refuses_bad_counts_and_accuracies_as_usage_errors(
    recorded: Path, tmp_path: Path, capfd, option, value
):
    out = tmp_path / "out"
    code, _, err = _sweep(capfd, str(recorded), "--set", AXIS, "--out", str(out), option, value)
    assert code == 2, err
    assert option in err, err
    assert not out.exists()  # refused before anything


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("backhaul.latency_s", "1e308"),
        ("channel.uplink.latency_s", "1e308"),
        ("deadline_s", "1e308"),
        ("channel.downlink.jitter_s", "1e300"),
    ],
)
def test_sweep_refuses_absurd_times_naming_the_field(
    recorded: Path, tmp_path: Path, capfd, path, value
):
    code, out_text, err = _sweep(
        capfd, str(recorded), "--set", f"{path}={value}", "--out", str(tmp_path / "o")
    )
    text = " ".join((out_text + err).split())
    assert code == 2, text
    assert f"{path}: Input should be less than or equal to" in text, text
    assert "Traceback" not in text


# --- the scenario: finite but absurd times ------------------------------------------------
BASE = {
    "name": "t",
    "rounds": 1,
    "dataset": {"name": "mnist-embedded", "train_size": 200, "test_size": 50},
    "topology": {"clients": 2, "edge_servers": 1},
}


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"backhaul": {"latency_s": 1e308}}, "backhaul.latency_s"),
        ({"deadline_s": 1e308}, "deadline_s"),
        (
            {"faults": {"link_outages": [{"start_s": 0, "duration_s": 1e308}]}},
            "faults.link_outages.0.duration_s",
        ),
        (
            {"faults": {"link_outages": [{"start_s": 1e300, "duration_s": 1}]}},
            "faults.link_outages.0.start_s",
        ),
        (
            {
                "faults": {
                    "edge_server_outages": [{"edge_server": 0, "start_s": 0, "duration_s": 1e12}]
                }
            },
            "faults.edge_server_outages.0.duration_s",
        ),
    ],
)
def test_finite_but_absurd_times_are_refused_naming_the_field(over, field):
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict({**BASE, **over}, "s.yaml")
    text = str(info.value)
    assert f"s.yaml: {field}: Input should be less than or equal to" in text, text


def test_the_largest_allowed_times_are_accepted():
    sc = scenario_from_dict({**BASE, "backhaul": {"latency_s": 3600}, "deadline_s": 1e9}, "s.yaml")
    assert sc.backhaul.latency_s == 3600 and sc.deadline_s == 1e9


# --- outputs.dir / --out where no run folder can be made --------------------------------
@pytest.mark.parametrize("where", ["/proc", "/proc/x/y", "/sys/fs"])
def test_a_run_folder_that_cannot_be_made_is_refused_naming_file_and_field(
    tmp_path: Path, capfd, where
):
    data = {**BASE, "metrics": {"enabled": False}, "execution": {"backend": "local"}}
    data["outputs"] = {"dir": where}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    for args in (["run", str(path), "--quiet"], ["validate", str(path)]):
        code = main(args)
        _, err = capfd.readouterr()
        assert code == 2, err
        assert f"{path}: outputs.dir: cannot make" in err, err
    code = main(["run", str(path), "--quiet", "--out", "/proc/mecsim-y"])
    _, err = capfd.readouterr()
    assert code == 2 and f"{path}: outputs.dir: cannot make /proc/mecsim-y in /proc" in err, err


# --- mecsim new --dir ---------------------------------------------------------------------
@pytest.mark.parametrize("where", ["/proc/x", "/proc/self/x/y", "/sys/x", "FILE/x"])
def test_mecsim_new_into_a_folder_that_cannot_be_made_is_a_usage_error(
    tmp_path: Path, capfd, where
):
    a_file = tmp_path / "f"
    a_file.write_text("")
    target = where.replace("FILE", str(a_file))
    code = main(["new", "algorithm", "zz_alg", "--dir", target])
    _, err = capfd.readouterr()
    assert code == 2, err
    assert "nothing written" in err and len(err.strip().splitlines()) == 1, err


# --- register() names ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    ["a\nb", "[red]x[/red]", "", " x", "x y", "-x", "x" * 65, "näme", "a/b", 5, None],
)
def test_register_refuses_names_that_are_not_plugin_names(name):
    with pytest.raises(registry.PluginError) as info:
        registry.register("model", name, lambda *a: None)
    text = str(info.value)
    assert "\n" not in text and "is not a plugin name" in text, text
    assert str(name) not in registry.MODELS.names()


def test_register_accepts_plugin_names():
    try:
        for name in ("my_model", "m-2", "v1.5", "X" * 64):
            registry.register("model", name, lambda *a: None)
            assert name in registry.MODELS.names()
    finally:
        for name in ("my_model", "m-2", "v1.5", "X" * 64):
            if name in registry.MODELS._registered:
                registry.MODELS.unregister(name)
