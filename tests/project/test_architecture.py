"""The house's rules, checked on the source: layers import only downward, no module imports
itself back through others, emulation needs neither torch nor Ray, and what installs is
only ``mecsim``.

The layers, lowest first (docs/architecture.md draws them):

0. ``mecsim.registry``: what a scenario names, by name (import strings, loaded lazily);
1. ``mecsim.scenario``: the schema, its loader, overrides;
2. ``mecsim.channel``, ``mecsim.emulation``: op-traces, the timing engine, network,
   devices, energy, faults (no torch, no Ray);
3. ``mecsim.data``: data sets and partitions;
4. ``mecsim.agents``: the algorithms, hosts and servers (from the layers below only the
   op-trace vocabulary, data types and the registry);
5. ``mecsim.run``: set-up, the round, the loop, its observers, backends;
6. ``mecsim.store``: run folders, records, checkpoints;
7. ``mecsim.analysis``: replay, sweeps, summaries, tables, plots;
8. ``mecsim.interfaces`` and the package root (``mecsim``, ``python -m mecsim``).

Every import counts, at module level or inside a function (and under TYPE_CHECKING): a
function-level import hides an edge, it does not remove it. A function-level import of
the project's own code is allowed only where it defers a heavy dependency, with a
``# deferred:`` comment on its line or the line above saying so.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

#: where each installed package's source lies in the repository
SOURCES = {
    "mecsim": ROOT / "mecsim",
    "mecsim.agents": ROOT / "agents",
    "mecsim.channel": ROOT / "channel",
}
LAYERS = [
    ("mecsim.registry",),
    ("mecsim.scenario",),
    ("mecsim.channel", "mecsim.emulation"),
    ("mecsim.data",),
    ("mecsim.agents",),
    ("mecsim.run",),
    ("mecsim.store",),
    ("mecsim.analysis",),
    ("mecsim.interfaces", "mecsim"),
]
#: what agents may import from the rest of mecsim
AGENTS_MAY_IMPORT = ("mecsim.agents", "mecsim.emulation.ops", "mecsim.data", "mecsim.registry")


def _modules() -> dict[str, Path]:
    out = {}
    for package, base in SOURCES.items():
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [] if rel.parts == ("__init__",) else list(rel.parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "mecsim" and len(parts) >= 1 and parts[0] in ("agents", "channel"):
                raise AssertionError(f"{path}: mecsim/{parts[0]} would shadow {package}")
            out[name] = path
    return out


MODULES = _modules()


class Import:
    def __init__(
        self, module: str, target: str, line: int, in_function: bool, deferred: bool
    ) -> None:
        self.module, self.target, self.line = module, target, line
        self.in_function, self.deferred = in_function, deferred

    def __repr__(self) -> str:
        return f"{MODULES[self.module].relative_to(ROOT)}:{self.line} imports {self.target}"


def _resolve(name: str) -> str | None:
    """The module (of ours) that an imported dotted name lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _says_deferred(lines: list[str], node: ast.stmt) -> bool:
    """A ``# deferred:`` comment on the import's lines, or above it in the comment and
    import lines that lead up to it."""
    first, last = node.lineno, node.end_lineno or node.lineno
    if any("# deferred:" in line for line in lines[first - 1 : last]):
        return True
    i = first - 2
    while (
        i >= 0
        and lines[i].strip().startswith(("#", "from ", "import ", ")"))
        or (i >= 0 and lines[i].startswith(" ") and lines[i].strip().endswith(","))
    ):
        if "# deferred:" in lines[i]:
            return True
        i -= 1
    return False


def _imports(module: str) -> list[Import]:
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(
                        parts[: len(parts) - child.level + 1] + ([base] if base else [])
                    )
                # X.a is the module X.a when there is one, else the name a of module X
                names = [base, *(f"{base}.{a.name}" for a in child.names)]
            if names:
                first = child.lineno  # type: ignore[attr-defined]
                out.extend(
                    Import(module, n, first, in_function, _says_deferred(lines, child))
                    for n in names
                )
            visit(child, inner)

    visit(tree, False)
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> int:
    best, level = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level >= 0, f"{module} is in no layer"
    return level


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, imports in IMPORTS.items():
        for imp in imports:
            target = _resolve(imp.target)
            # a module does not depend on the package it is in by importing a sibling
            if target is None or target == m or m.startswith(target + "."):
                continue
            edges[m].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_walk_sees_every_package_and_the_known_edges() -> None:
    """The checks below look at what they should: all three source folders, and imports
    at module and function level."""
    assert {
        "mecsim.run.loop",
        "mecsim.agents.host",
        "mecsim.channel.wireless",
        "mecsim.emulation.engine.dispatch",
    } <= set(MODULES)
    edges = _edges()
    assert "mecsim.emulation.engine.specs" in edges["mecsim.emulation.engine.dispatch"]
    assert "mecsim.run.setup" in edges["mecsim.run.loop"]
    assert any(i.in_function for imps in IMPORTS.values() for i in imps)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others() -> None:
    assert _cycles(_edges()) == []


def test_layers_import_only_downward() -> None:
    upward = []
    for m, imports in IMPORTS.items():
        for imp in imports:
            target = _resolve(imp.target)
            if target is None or target == m or m.startswith(target + "."):
                continue
            if _layer(target) > _layer(m):
                upward.append(f"{imp} (layer {_layer(m)} -> {_layer(target)})")
    assert upward == []


def test_agents_import_only_the_op_trace_vocabulary_data_types_and_the_registry() -> None:
    bad = [
        imp
        for m, imports in IMPORTS.items()
        if m.startswith("mecsim.agents")
        for imp in imports
        if (t := _resolve(imp.target)) not in (None, "mecsim")
        and not t.startswith(AGENTS_MAY_IMPORT)
    ]
    assert bad == []


def test_test_modules_have_names_of_their_own() -> None:
    """pytest imports a test module by its file name (the folders have no __init__.py),
    so two test files of one name in two folders cannot both be collected."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py") if "data" not in p.parts]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


@pytest.mark.parametrize("heavy", ["torch", "ray"])
def test_emulation_imports_neither_torch_nor_ray(heavy: str) -> None:
    bad = [
        imp
        for m, imports in IMPORTS.items()
        if m.startswith(
            ("mecsim.emulation", "mecsim.channel", "mecsim.scenario", "mecsim.registry")
        )
        for imp in imports
        if imp.target == heavy or imp.target.startswith(heavy + ".")
    ]
    assert bad == []


def test_function_level_imports_of_our_code_say_why_they_are_deferred() -> None:
    hidden = [
        imp
        for imports in IMPORTS.values()
        for imp in imports
        if imp.in_function and _resolve(imp.target) is not None and not imp.deferred
    ]
    assert hidden == []


def test_nothing_imports_agents_or_channel_as_top_level_packages() -> None:
    """They install as mecsim.agents / mecsim.channel: ``import agents`` would pick up
    another distribution's package of that name (or none)."""
    pattern = re.compile(r"^\s*(from|import)\s+(agents|channel)(\.|\s|$)", re.M)
    files = [
        *ROOT.joinpath("mecsim").rglob("*.py"),
        *ROOT.joinpath("agents").rglob("*.py"),
        *ROOT.joinpath("channel").rglob("*.py"),
        *ROOT.joinpath("tests").rglob("*.py"),
        *ROOT.joinpath("benchmarks").rglob("*.py"),
    ]
    bad = [str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text())]
    assert bad == []


def test_pyproject_lists_every_package_and_only_mecsim_installs() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    on_disk = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert packages == on_disk
    assert {p.split(".")[0] for p in packages} == {"mecsim"}
    assert config["package-dir"] == {
        "mecsim": "mecsim",
        "mecsim.agents": "agents",
        "mecsim.channel": "channel",
    }


def _test_modules_imported(source: str, test_modules: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every import in ``source`` of a module in ``test_modules`` (by its
    last dotted part: ``test_resume``, ``tests.test_resume``, ``from tests import
    test_resume``, ``importlib.import_module("test_resume")``), at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found += [(node.lineno, n) for n in names if n.rpartition(".")[2] in test_modules]
    return found


def test_no_test_module_imports_another() -> None:
    """Helpers that tests share live in one importable place (tests/support, a conftest
    fixture, or :mod:`mecsim.testing` where plugin authors need them too), never in a test
    module that others import: that ties test files together (moving or deleting one
    breaks others) and runs one module's set-up inside another's. Nor is a ``conftest``
    imported: with one in several folders, which one ``import conftest`` finds depends on
    the order pytest loaded them."""
    tests = ROOT / "tests"
    test_modules = {p.stem for p in tests.rglob("test_*.py")} | {"conftest"}
    assert _test_modules_imported(
        "from test_resume import x\nimport tests.test_faults\n"
        "def f():\n    from tests import test_flower\n"
        "    importlib.import_module('test_api')\n",
        {"test_resume", "test_faults", "test_flower", "test_api"},
    ) == [(1, "test_resume"), (2, "tests.test_faults"), (4, "tests.test_flower"), (5, "test_api")]
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted(tests.rglob("*.py"))
        for line, name in _test_modules_imported(path.read_text(), test_modules)
    ]
    assert bad == []
