"""``mecsim new``: plugin packages that install and run with no edits, and bad input that
writes nothing.

The fast tests call the CLI in-process. The slow ones install generated packages into the
session's throwaway venv (``pip install --no-deps --no-build-isolation -e``;
tests/e2e/conftest.py), never into the suite's own environment, run them in subprocesses
of that venv (entry points are read from installed metadata, so a fresh process sees
them) and uninstall them in a ``finally`` block, leaving the venv as it was.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import resources
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT
from support.venv import PluginVenv

from mecsim.interfaces.cli import main
from mecsim.interfaces.cli.new import CHECKED, FILES, KINDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def _new(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["new", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


# -- bad input: one line, exit 2, nothing written ------------------------------------


@pytest.mark.parametrize(
    "name", ["1algo", "my-algo", "class", "lambda", "algo_", "café", "a b", "mod.name", ""]
)
def test_a_name_that_is_not_an_identifier_is_refused(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _new(capsys, "algorithm", name)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "identifier" in err
    assert out == "" and _tree(tmp_path) == []


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("algorithm", "fedavg"),
        ("model", "mlp_2nn"),
        ("dataset", "mnist"),
        ("async_server", "fedbuff"),
    ],
)
def test_a_name_mecsim_already_uses_is_refused(
    kind: str,
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _new(capsys, kind, name)
    assert code == 2
    assert err.strip().splitlines() == [
        f"mecsim new: {kind} {name!r} is already provided by mecsim "
        f"{version('mecsim')}; choose another NAME"
    ]
    assert _tree(tmp_path) == []


def test_a_folder_that_is_not_empty_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    code, out, err = _new(capsys, "algorithm", "fedfoo", "--dir", str(target))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"mecsim new: {target} exists and is not empty; nothing written"
    ]
    assert _tree(tmp_path) == ["pkg", "pkg/notes.txt"]  # no temporary folder left either
    assert (target / "notes.txt").read_text() == "mine"


def test_a_dir_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pkg").write_text("a file")
    code, _, err = _new(capsys, "model", "tiny", "--dir", str(tmp_path / "pkg"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a folder" in err
    assert _tree(tmp_path) == ["pkg"]


def test_an_unknown_kind_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["new", "device", "pi9"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    assert _tree(tmp_path) == []


def test_a_failure_while_writing_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written into a temporary folder next to DIR, renamed at the end: a failure half way
    removes it, and the parents made for DIR."""
    real = Path.write_text
    written: list[Path] = []

    def fail_on_the_third(self: Path, *args: Any, **kwargs: Any) -> int:
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", fail_on_the_third)
    code, out, err = _new(capsys, "dataset", "blobs", "--dir", str(tmp_path / "a" / "b" / "pkg"))
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert "No space left on device" in line and "nothing written" in line
    assert len(written) == 2 and _tree(tmp_path) == []


# -- what is written -----------------------------------------------------------------


def test_the_templates_are_package_data() -> None:
    """Found through importlib.resources (so in an installed wheel too), and declared as
    package data in pyproject.toml."""
    templates = resources.files("mecsim") / "templates"
    assert templates.is_dir()
    for kind in KINDS:
        for _, template, _ in FILES:
            assert templates.joinpath(*template.format(kind=kind).split("/")).is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "templates/**/*" in config["tool"]["setuptools"]["package-data"]["mecsim"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_package_is_written_with_its_entry_point(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _new(capsys, kind, "my_thing")
    assert (code, err) == (0, "")
    pkg = tmp_path / "mecsim-my_thing"
    assert _tree(tmp_path) == [
        "mecsim-my_thing",
        *(
            f"mecsim-my_thing/{p}"
            for p in [
                "README.md",
                "mecsim_my_thing",
                "mecsim_my_thing/__init__.py",
                "pyproject.toml",
                "scenarios",
                "scenarios/my_thing.yaml",
                "tests",
                "tests/test_my_thing.py",
            ]
        ),
    ]
    umask = os.umask(0)
    os.umask(umask)
    assert pkg.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's private mode
    project = tomllib.loads((pkg / "pyproject.toml").read_text())
    assert project["project"]["name"] == "mecsim-my_thing"
    assert project["project"]["dependencies"][0].startswith("mecsim>=")
    group = project["project"]["entry-points"][KINDS[kind].group]
    attribute = KINDS[kind].attribute.format(Name="MyThing")  # a compressor's: its class
    assert group == {"my_thing": f"mecsim_my_thing:{attribute}"}
    for path in pkg.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "{{" not in text, path  # every placeholder filled in
            if path.suffix == ".py":
                compile(text, str(path), "exec")
    if kind == "algorithm":
        module = (pkg / "mecsim_my_thing" / "__init__.py").read_text()
        assert "class MyThingServer(ServerAlgorithm):" in module
    # what was written, and what to do next
    assert "pyproject.toml" in out and "tests/test_my_thing.py" in out
    assert "pip install -e mecsim-my_thing" in out
    assert "mecsim run mecsim-my_thing/scenarios/my_thing.yaml" in out
    assert ("mecsim check my_thing" in out) == (kind in CHECKED)
    assert set(CHECKED) == {"algorithm", "compressor", "async_server"}


def test_an_empty_folder_is_filled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "here").mkdir()
    code, _, _ = _new(capsys, "algorithm", "fedfoo", "--dir", str(tmp_path / "here"))
    assert code == 0
    assert (tmp_path / "here" / "mecsim_fedfoo" / "__init__.py").is_file()
    assert _tree(tmp_path)[0] == "here" and not any(
        p.name.startswith(".") for p in tmp_path.iterdir()
    )


def test_an_empty_working_directory_is_filled_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--dir .``: the files are moved into the folder, which stays the same folder (a
    shell whose working directory it is still sees them)."""
    here = tmp_path / "here"
    here.mkdir()
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    assert _new(capsys, "model", "tiny", "--dir", ".")[0] == 0
    assert here.stat().st_ino == inode
    assert sorted(p.name for p in here.iterdir()) == [
        "README.md",
        "mecsim_tiny",
        "pyproject.toml",
        "scenarios",
        "tests",
    ]
    assert _tree(tmp_path)[0] == "here" and len(list(tmp_path.iterdir())) == 1


def test_help_explains_the_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["new", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in (
        "algorithm",
        "model",
        "dataset",
        "channel",
        "compressor",
        "async_server",
        "--dir",
        "pip install -e DIR",
    ):
        assert word in out


# -- end to end: install, run, uninstall ------------------------------------------------


def _run(*argv: str, timeout: float = 600, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [*argv], capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


#: ``mecsim run ARGS`` (mecsim's ``main``, as ``python -m mecsim`` calls it), then, when it
#: exited 0, ``python -m pytest PYTEST_ARGS`` (``pytest.main``) in the same fresh process:
#: ``-c`` ARGS ``--`` PYTEST_ARGS. One interpreter importing torch and mecsim, not two
_RUN_THEN_TESTS = (
    "import sys\n"
    "from mecsim.interfaces.cli import main\n"
    "cut = sys.argv.index('--')\n"
    "code = main(sys.argv[1:cut])\n"
    "print(f'mecsim run exit {code}', flush=True)\n"
    "if code:\n"
    "    sys.exit(code)\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[cut + 1:]))\n"
)


def _mecsim_run(
    venv: PluginVenv,
    scenario: Path,
    out: Path,
    tests: list[Path] | None = None,
    cwd: Path | None = None,
) -> tuple[dict, str]:
    """``mecsim run SCENARIO`` in a fresh process of ``venv`` (in-process backend); with
    ``tests``, ``python -m pytest -q`` of those folders after it in the same process (in
    ``cwd``). The run's run.json and the process's stdout."""
    argv = ["run", str(scenario), "--backend", "local", "--out", str(out), "--no-plots", "--quiet"]
    if tests is None:
        stdout = _run(venv.python, "-m", "mecsim", *argv)
    else:
        pytest_args = ["-q", "-p", "no:cacheprovider", *(str(t) for t in tests)]
        stdout = _run(venv.python, "-c", _RUN_THEN_TESTS, *argv, "--", *pytest_args, cwd=cwd)
        assert "mecsim run exit 0" in stdout, stdout
    (run_dir,) = out.iterdir()
    info: dict = json.loads((run_dir / "run.json").read_text())
    return info, stdout


def _entry_point_names(venv: PluginVenv, group: str) -> str:
    """The names of ``group``'s entry points, as a new process of ``venv`` sees them."""
    return _run(
        venv.python,
        "-c",
        "import sys; from importlib.metadata import entry_points; "
        "print(sorted(e.name for e in entry_points(group=sys.argv[1])))",
        group,
    )


def _plugins(info: dict) -> dict[str, tuple[str, str]]:
    """kind -> (name, normalised distribution) of what the run used that is not mecsim's."""
    return {p["kind"]: (p["name"], _normal(p["distribution"])) for p in info["plugins"]}


@pytest.mark.slow
def test_a_generated_algorithm_installs_runs_and_passes_its_own_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin_venv: PluginVenv
) -> None:
    name = "newkit_algo"
    pkg = tmp_path / "pkg"
    assert _new(capsys, "algorithm", name, "--dir", str(pkg))[0] == 0
    try:
        plugin_venv.install(pkg)
        scenario = pkg / "scenarios" / f"{name}.yaml"
        if importlib.util.find_spec("mecsim.testing") is None:
            info, _ = _mecsim_run(plugin_venv, scenario, tmp_path / "runs")
            assert info["status"] == "finished"
            assert _plugins(info) == {"algorithm": (name, _normal(f"mecsim-{name}"))}
            pytest.skip(
                "the package installed and its scenario ran; its generated test (which "
                "runs mecsim.testing.check_algorithm) was not run: mecsim.testing cannot "
                "be imported in this checkout yet"
            )
        # the scenario with `mecsim run`, then the package's own tests, one process
        info, out = _mecsim_run(
            plugin_venv, scenario, tmp_path / "runs", tests=[pkg / "tests"], cwd=pkg
        )
        assert info["status"] == "finished"
        assert _plugins(info) == {"algorithm": (name, _normal(f"mecsim-{name}"))}
        assert "2 passed" in out
    finally:
        plugin_venv.uninstall(f"mecsim-{name}")
    assert name not in _entry_point_names(plugin_venv, "mecsim.algorithms")  # as it was


@pytest.mark.slow
def test_a_generated_compressor_installs_runs_and_passes_its_own_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin_venv: PluginVenv
) -> None:
    name = "newkit_codec"
    pkg = tmp_path / "pkg"
    assert _new(capsys, "compressor", name, "--dir", str(pkg))[0] == 0
    try:
        plugin_venv.install(pkg)
        # the scenario with `mecsim run`, then the package's own tests, one process
        info, out = _mecsim_run(
            plugin_venv,
            pkg / "scenarios" / f"{name}.yaml",
            tmp_path / "runs",
            tests=[pkg / "tests"],
            cwd=pkg,
        )
        assert info["status"] == "finished"
        assert _plugins(info) == {"compressor": (name, _normal(f"mecsim-{name}"))}
        assert "4 passed" in out
    finally:
        plugin_venv.uninstall(f"mecsim-{name}")
    assert name not in _entry_point_names(plugin_venv, "mecsim.compressors")  # as it was


@pytest.mark.slow
def test_a_generated_async_server_installs_and_passes_its_own_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin_venv: PluginVenv
) -> None:
    """Its own tests run its scenario (mode async, the server by its entry point), work
    one update out by hand and pass the conformance kit."""
    name = "newkit_server"
    pkg = tmp_path / "pkg"
    assert _new(capsys, "async_server", name, "--dir", str(pkg))[0] == 0
    try:
        plugin_venv.install(pkg)
        assert name in _entry_point_names(plugin_venv, "mecsim.async_servers")
        out = _run(
            plugin_venv.python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(pkg / "tests"),
            cwd=pkg,
        )
        assert "4 passed" in out
    finally:
        plugin_venv.uninstall(f"mecsim-{name}")
    assert name not in _entry_point_names(plugin_venv, "mecsim.async_servers")  # as it was


@pytest.mark.slow
def test_a_generated_model_data_set_and_channel_install_and_run_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin_venv: PluginVenv
) -> None:
    model, dataset, channel = "newkit_model", "newkit_data", "newkit_link"
    assert _new(capsys, "model", model, "--dir", str(tmp_path / "m"))[0] == 0
    assert _new(capsys, "dataset", dataset, "--dir", str(tmp_path / "d"))[0] == 0
    assert _new(capsys, "channel", channel, "--dir", str(tmp_path / "c"))[0] == 0
    scenario = tmp_path / "both.yaml"
    scenario.write_text(
        "name: both\nrounds: 2\n"
        f"dataset: {{name: {dataset}, train_size: 600, test_size: 200}}\n"
        f"model: {{name: {model}}}\n"
        f"channel: {{model: plugin, name: {channel}}}\n"
        "topology: {clients: 4}\n"
        "metrics: {enabled: false}\n"
    )
    try:
        plugin_venv.install(tmp_path / "m", tmp_path / "d", tmp_path / "c")
        # the scenario with `mecsim run`, then each package's own tests (its scenario,
        # its shapes, its registration), one process
        info, out = _mecsim_run(
            plugin_venv,
            scenario,
            tmp_path / "runs",
            tests=[tmp_path / "m" / "tests", tmp_path / "d" / "tests", tmp_path / "c" / "tests"],
            cwd=tmp_path,
        )
        assert info["status"] == "finished"
        assert _plugins(info) == {
            "model": (model, _normal(f"mecsim-{model}")),
            "dataset": (dataset, _normal(f"mecsim-{dataset}")),
            "channel": (channel, _normal(f"mecsim-{channel}")),
        }
        # 11: the model template checks MNIST's and CIFAR-10's shapes (no 1x8x8 input)
        assert re.search(r"\b11 passed\b", out), out
    finally:
        plugin_venv.uninstall(f"mecsim-{model}", f"mecsim-{dataset}", f"mecsim-{channel}")
    assert model not in _entry_point_names(plugin_venv, "mecsim.models")
    assert dataset not in _entry_point_names(plugin_venv, "mecsim.datasets")
    assert channel not in _entry_point_names(plugin_venv, "mecsim.channels")
