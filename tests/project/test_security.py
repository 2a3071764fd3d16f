"""Security properties of the code and of what the command line prints and writes.

- The package (mecsim/, channel/, agents/) never calls a general unpickler
  (``pickle.load``/``loads``, ``pickle.Unpickler`` itself, ``marshal``, ``dill``,
  ``shelve``), ``torch.load`` without ``weights_only=True``, ``yaml.load`` /
  ``unsafe_load`` / ``full_load``, or ``eval`` / ``exec`` — found by walking the syntax
  tree of every module, imports and aliases included (a self-test shows the scan finds
  each of them).
- User text is printed literally: paths with rich markup (``[/]``) go through
  ``validate`` and ``run``.
- ``--metrics-port 0`` picks a free port and prints it; a non-loopback metrics host needs
  ``--metrics-public`` and prints a warning.
- Default run ids do not collide: two runs of one scenario started in the same second
  get two folders.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT
from support.scenarios import TINY

from mecsim.interfaces.cli import main
from mecsim.scenario import scenario_from_dict
from mecsim.store.session import new_run_id

PACKAGES = ("mecsim", "channel", "agents")

#: module -> attributes that must never be called
FORBIDDEN = {
    "pickle": {"load", "loads", "Unpickler"},
    "_pickle": {"load", "loads", "Unpickler"},
    "cPickle": {"load", "loads", "Unpickler"},
    "marshal": {"load", "loads"},
    "dill": {"load", "loads"},
    "shelve": {"open"},
    "yaml": {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"},
}
FORBIDDEN_BUILTINS = {"eval", "exec"}


def unsafe_calls(source: str, filename: str = "<src>") -> list[str]:
    """Calls of a general deserialiser or of eval/exec in ``source``, as 'file:line what'."""
    tree = ast.parse(source, filename)
    modules: dict[str, str] = {}  # local name -> module (import pickle as p)
    functions: dict[str, str] = {}  # local name -> module.attr (from pickle import loads)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                functions[a.asname or a.name] = f"{node.module}.{a.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f, what = node.func, None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            module = modules.get(f.value.id, f.value.id)
            if f.attr in FORBIDDEN.get(module, ()):
                what = f"{module}.{f.attr}"
            elif module == "torch" and f.attr == "load":
                weights_only = [k for k in node.keywords if k.arg == "weights_only"]
                if not (
                    weights_only
                    and isinstance(weights_only[0].value, ast.Constant)
                    and weights_only[0].value.value is True
                ):
                    what = "torch.load without weights_only=True"
        elif isinstance(f, ast.Name):
            target = functions.get(f.id)
            if target is not None:
                module, _, attr = target.rpartition(".")
                if attr in FORBIDDEN.get(module, ()):
                    what = target
                elif target == "torch.load":
                    what = "torch.load (imported by name)"
            elif f.id in FORBIDDEN_BUILTINS:
                what = f.id
        if what:
            found.append(f"{filename}:{node.lineno} {what}")
    return found


def test_the_scan_finds_each_unsafe_call():
    snippet = """
import pickle, yaml, torch
import pickle as pk
from pickle import loads as l
from yaml import unsafe_load
pickle.load(f); pk.loads(b); l(b); pickle.Unpickler(f).load()
yaml.load(t, Loader=yaml.Loader); unsafe_load(t)
torch.load(p); torch.load(p, weights_only=False)
eval("1"); exec("x = 1")
torch.load(p, weights_only=True); yaml.safe_load(t); model.eval(); re.compile("x")
class R(pickle.Unpickler): pass
"""
    found = [f.split(" ", 1)[1] for f in unsafe_calls(snippet)]
    assert found.count("pickle.load") == 1 and found.count("pickle.loads") == 2
    assert "pickle.Unpickler" in found and "yaml.load" in found and "yaml.unsafe_load" in found
    assert found.count("torch.load without weights_only=True") == 2
    assert "eval" in found and "exec" in found
    assert len(found) == 10  # and nothing of the last two lines


#: The one exec in the package, and why it is not code from data: the plugin file a user
#: names on their own command line (`mecsim run --plugin FILE`, as `python FILE` would run
#: it), executed in their processes and their Ray workers. Nothing reaches it from a
#: scenario, a record or the service (which takes no plugin files): see
#: test_plugin_files_come_only_from_the_command_line below.
ALLOWED = {("mecsim/registry.py", "exec", "load_plugin_source")}


def _allowed(hit: str, files: dict[str, str]) -> bool:
    where, what = hit.split(" ", 1)
    path, _, line = where.rpartition(":")
    for allowed_path, allowed_what, function in ALLOWED:
        if (path, what) == (allowed_path, allowed_what):
            tree = ast.parse(files[path])
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name == function:
                    if node.lineno <= int(line) <= (node.end_lineno or 0):
                        return True
    return False


def test_the_package_has_no_general_unpickling_yaml_load_or_eval():
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    assert len(files) > 30
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    found = [hit for path, text in sources.items() for hit in unsafe_calls(text, path)]
    assert [hit for hit in found if not _allowed(hit, sources)] == []
    assert len(found) == len(ALLOWED)  # each allowance is used, once
    # and the plain-text view of the same rule
    text = "\n".join(p.read_text() for p in files)
    assert not re.search(r"\bpickle\.loads?\(|\byaml\.(unsafe_|full_)?load\(", text)


# --------------------------------------------------------------------------- the CLI


def _scenario(directory: Path, **sections) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = {**TINY, "rounds": 1, **sections}
    path = directory / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_paths_with_markup_are_printed_literally(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    odd = tmp_path / "a[/]b[bold red]c"
    path = _scenario(odd, outputs={"dir": str(odd / "runs[/]"), "table_format": "csv"})
    assert main(["validate", str(path)]) == 0
    assert f"{path}: ok" in capsys.readouterr().out
    assert main(["run", str(path), "--no-plots", "--run-id", "r"]) == 0
    out = capsys.readouterr().out
    assert str(odd / "runs[/]" / "r") in out.replace("\n", "")
    assert (odd / "runs[/]" / "r" / "rounds.csv").exists()


def test_metrics_port_0_picks_a_free_port_and_prints_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _scenario(tmp_path, metrics={"enabled": True, "port": 0})
    assert main(["run", str(path), "--no-plots", "--quiet", "--out", "runs"]) == 0
    err = capsys.readouterr().err
    port = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", err)
    assert port and int(port.group(1)) > 0, err


def test_a_public_metrics_host_needs_the_flag_and_warns(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _scenario(tmp_path, metrics={"enabled": True, "host": "0.0.0.0", "port": 0})
    assert main(["run", str(path), "--no-plots", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "metrics.host: 0.0.0.0 is not a loopback address" in err
    assert "--metrics-public" in err and not (tmp_path / "runs").exists()
    assert main(["run", str(path), "--no-plots", "--quiet", "--metrics-public"]) == 0
    err = capsys.readouterr().err
    assert "warning: metrics.host: /metrics will be served on 0.0.0.0" in err


def test_default_run_ids_do_not_collide_within_a_second(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import time as time_module

    monkeypatch.setattr(time_module, "strftime", lambda fmt, *a: "20260101-000000")
    scenario = scenario_from_dict({**TINY, "rounds": 1}, "tiny")
    ids = {new_run_id(scenario) for _ in range(200)}
    assert len(ids) == 200 and all(i.startswith("tiny-20260101-000000-") for i in ids)
    path = _scenario(tmp_path)
    assert main(["run", str(path), "--no-plots", "--quiet", "--out", "runs"]) == 0
    assert main(["run", str(path), "--no-plots", "--quiet", "--out", "runs"]) == 0
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and folders[0] != folders[1]


@pytest.mark.parametrize("run_id", ["../x", "a/b", "..", ".hidden", "x" * 129, "a b", ""])
def test_run_ids_from_the_command_line_are_checked(tmp_path, capsys, monkeypatch, run_id):
    monkeypatch.chdir(tmp_path)
    path = _scenario(tmp_path / "s")
    assert main(["run", str(path), "--no-plots", "--quiet", "--run-id", run_id]) == 2
    assert "outputs.run_id" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["s", "s.yaml"]


def test_plugin_files_come_only_from_the_command_line():
    """load_plugin_file is called by the --plugin option alone (and the worker side of
    it, registry.restore, with the driver's own files); no other module of the package
    executes a file, so no scenario, record or request can name one."""
    callers = []
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            text = p.read_text()
            for name in ("load_plugin_file(", "load_plugin_source("):
                if name in text:
                    callers.append((str(p.relative_to(ROOT)), name))
    assert sorted(callers) == [
        ("mecsim/interfaces/cli/plugins.py", "load_plugin_file("),
        ("mecsim/registry.py", "load_plugin_file("),
        ("mecsim/registry.py", "load_plugin_source("),
    ]
