"""``mecsim new KIND NAME``: write a ready-to-install plugin package (parser and handler).

The package, in ``DIR`` (default ``./mecsim-NAME``), is made from the templates in
``mecsim/templates/`` (installed with the package: ``importlib.resources``):

* ``pyproject.toml``: the distribution ``mecsim-NAME``, depending on mecsim, with the
  entry point ``NAME`` in the kind's group (:mod:`mecsim.registry`);
* ``mecsim_NAME/__init__.py``: the plugin itself, a working starting point;
* ``scenarios/NAME.yaml``: a tiny scenario that uses it (embedded MNIST, seconds);
* ``tests/test_NAME.py`` and ``README.md``.

``pip install -e DIR`` then ``mecsim run DIR/scenarios/NAME.yaml`` work with no edits.
Nothing is half-written: the files go into a temporary folder next to ``DIR``, renamed
to ``DIR`` once they are all there, and removed on any failure. Bad input (a NAME that
is not an identifier, a name already taken, a ``DIR`` that is not empty) is one line on
stderr and exit code 2 before anything is written.

Light on purpose: building the CLI parser and writing the files import nothing heavy
(the registry reads installed metadata only).
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rich.console import Console

from mecsim import __version__, registry

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


@dataclass(frozen=True)
class Kind:
    group: str  # the entry-point group
    attribute: str  # what in mecsim_NAME the entry point names
    summary: str  # the distribution's one-line description ({name} filled in)
    what: str  # what the module holds, for the list of files written
    #: how a scenario names it ({name} filled in)
    names_it: str = "{kind}: {{name: {name}}}"


KINDS: dict[str, Kind] = {
    "algorithm": Kind(
        "mecsim.algorithms",
        "ALGORITHM",
        "The {name} federated-learning algorithm for mecsim",
        "the server and client classes and their Params (FedAvg to start from)",
    ),
    "model": Kind(
        "mecsim.models",
        "build_model",
        "The {name} model for mecsim",
        "build_model(in_shape, num_classes), a small CNN to start from",
    ),
    "dataset": Kind(
        "mecsim.datasets",
        "DATASET",
        "The {name} data set for mecsim",
        "the DatasetSpec: synthetic arrays from a seed, or NAME.npz under dataset.root",
    ),
    "channel": Kind(
        "mecsim.channels",
        "Channel",
        "The {name} link model for mecsim",
        "the Channel class and its Params: per-client rates with per-round shadowing",
    ),
    "compressor": Kind(
        "mecsim.compressors",
        "{Name}",
        "The {name} compressor of uploads for mecsim",
        "the compressor class and its Params: sign bits and one scale, to start from",
    ),
    "async_server": Kind(
        "mecsim.async_servers",
        "{Name}",
        "The {name} asynchronous server for mecsim",
        "the server class and its Params: FedAsync with server momentum, to start from",
        "aggregation: {{mode: async, server: {{name: {name}}}}}",
    ),
}

#: the kinds the conformance kit checks (``mecsim check NAME``)
CHECKED = ("algorithm", "compressor", "async_server")

#: (file in the package, template under mecsim/templates/, what it is)
FILES = (
    ("pyproject.toml", "common/pyproject.toml.tmpl", "the distribution and its entry point"),
    ("{module}/__init__.py", "{kind}/module.py.tmpl", "{what}"),
    ("scenarios/{name}.yaml", "{kind}/scenario.yaml.tmpl", "a tiny scenario that uses it"),
    ("tests/test_{name}.py", "{kind}/test.py.tmpl", "its tests"),
    ("README.md", "{kind}/README.md.tmpl", "how to use and change it"),
)

#: NAME: an identifier that also makes a valid distribution name (mecsim-NAME: ASCII,
#: ending in a letter or digit)
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*")

DESCRIPTION = """\
Write a ready-to-install plugin package for mecsim: an algorithm, a model, a data set,
a channel (link model), a compressor (of uploads) or an asynchronous server (what the
server of mode async / buffered / semi_sync does with each update), found by mecsim
through an entry point once installed, and named by a scenario.

DIR (default ./mecsim-NAME) gets pyproject.toml (the distribution mecsim-NAME and its
entry point), the module mecsim_NAME/ (a working starting point whose docstrings say
what each part must do), scenarios/NAME.yaml (a tiny scenario that uses it: embedded
MNIST, a few clients and rounds), tests/test_NAME.py and README.md. It runs with no
edits:

  pip install -e DIR
  mecsim run DIR/scenarios/NAME.yaml
  mecsim check NAME                    (algorithms, compressors, asynchronous servers:
                                        the conformance kit)

NAME is what scenarios give (algorithm: {name: NAME}; an asynchronous server:
aggregation: {mode: async, server: {name: NAME}}): ASCII letters, digits and
underscores, starting with a letter, not ending with an underscore, not a Python
keyword, and not a name mecsim or another installed plugin already uses. DIR must not
exist or be empty: nothing is overwritten, and nothing is left half-written.

examples:
  mecsim new algorithm fedfoo
  mecsim new model tiny_cnn --dir plugins/tiny-cnn
  mecsim new dataset blobs
  mecsim new channel lossy_wifi
  mecsim new compressor signs
  mecsim new async_server fedasync_m
"""


def add_new_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "new",
        help="write a new plugin package (algorithm, model, data set, channel, compressor, "
        "asynchronous server)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "kind",
        choices=list(KINDS),
        metavar="KIND",
        help="algorithm (a server and client pair), model (a torch module factory), "
        "dataset (a DatasetSpec), channel (a link model), compressor (of uploads) or "
        "async_server (the server of the asynchronous modes)",
    )
    p.add_argument("name", metavar="NAME", help="the name scenarios give it, e.g. fedfoo")
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="the package's folder (default: ./mecsim-NAME); it must not exist or be empty",
    )
    return p


class BadInput(ValueError):
    """One line on stderr, exit code 2, nothing written."""


def camel(name: str) -> str:
    """``my_algo`` -> ``MyAlgo`` (the prefix of the generated class names)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def check_name(kind: str, name: str) -> None:
    if not NAME_PATTERN.fullmatch(name) or name.endswith("_") or keyword.iskeyword(name):
        raise BadInput(
            f"mecsim new: NAME {name!r} must be a Python identifier of ASCII letters, digits "
            "and underscores that starts with a letter, does not end with an underscore and "
            "is not a keyword"
        )
    dist = distribution_name(name)
    reg = registry.REGISTRIES[kind]
    taken = [
        i for i in reg.entries() if i.name == name and _normal(i.distribution) != _normal(dist)
    ]
    if taken:
        where = ", ".join(f"{i.distribution or i.origin} {i.version}".strip() for i in taken)
        raise BadInput(
            f"mecsim new: {kind} {name!r} is already provided by {where}; choose another NAME"
        )


def distribution_name(name: str) -> str:
    return f"mecsim-{name}"


def _normal(dist: str) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def check_dir(folder: Path) -> None:
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise BadInput(f"mecsim new: {folder} exists and is not a folder; nothing written")
    if folder.is_dir() and any(folder.iterdir()):
        raise BadInput(f"mecsim new: {folder} exists and is not empty; nothing written")
    here = Path(os.path.abspath(folder))
    for parent in [here, *here.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(f"mecsim new: {parent} is not a folder; nothing written")
            try:  # where the package would be made: can a folder be made there at all?
                os.rmdir(tempfile.mkdtemp(prefix=".mecsim-new-", dir=parent))
            except OSError as exc:
                raise BadInput(
                    f"mecsim new: --dir {folder}: cannot make a folder in {parent} "
                    f"({exc.strerror or exc}); nothing written"
                ) from None
            break


def _requirement() -> str:
    """``mecsim>=MAJOR.MINOR`` of the mecsim that writes the package."""
    major, minor = (__version__.split(".") + ["0"])[:2]
    return f"mecsim>={major}.{re.sub(r'[^0-9].*', '', minor) or '0'}"


def render(text: str, values: dict[str, str]) -> str:
    """``{{key}}`` of ``text`` replaced by ``values[key]`` (every one must be known)."""

    def one(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return re.sub(r"\{\{(\w+)\}\}", one, text)


def package_files(kind: str, name: str) -> dict[str, str]:
    """The package's files, relative path -> text."""
    spec = KINDS[kind]
    module = f"mecsim_{name}"
    values = {
        "kind": kind,
        "name": name,
        "Name": camel(name),
        "module": module,
        "dist": distribution_name(name),
        "group": spec.group,
        "target": f"{module}:{spec.attribute.format(Name=camel(name))}",
        "summary": spec.summary.format(name=name),
        "names_it": spec.names_it.format(kind=kind, name=name),
        "requires": _requirement(),
    }
    templates = resources.files("mecsim") / "templates"
    out: dict[str, str] = {}
    for path, template, _ in FILES:
        source = templates.joinpath(*template.format(kind=kind).split("/"))
        out[path.format(module=module, name=name)] = render(
            source.read_text(encoding="utf-8"), values
        )
    return out


def write_package(folder: Path, files: dict[str, str]) -> None:
    """Write ``files`` to ``folder`` all at once: into a temporary folder next to it,
    renamed to ``folder`` (or, when ``folder`` is an existing empty folder, which may be
    someone's working directory, its entries moved into it). On any failure nothing is
    left behind, parents made for it included."""
    folder = Path(os.path.abspath(folder))  # "." and ".." have no name or parent of their own
    made: list[Path] = []  # parents made here, outermost first
    for parent in reversed(folder.parents):
        if not parent.exists():
            parent.mkdir()
            made.append(parent)
    tmp: Path | None = None
    moved: list[Path] = []
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", suffix=".tmp", dir=folder.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's folder is private: make it an ordinary one
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if folder.is_dir():
            for entry in sorted(tmp.iterdir()):
                entry.rename(folder / entry.name)
                moved.append(folder / entry.name)
            tmp.rmdir()
        else:
            tmp.rename(folder)
        tmp = None
    finally:
        if tmp is not None:
            for path in moved:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            for parent in reversed(made):
                try:
                    parent.rmdir()
                except OSError:
                    break


def cmd_new(args: argparse.Namespace, console: Console) -> int:
    kind, name = args.kind, args.name
    folder = Path(args.dir) if args.dir else Path(distribution_name(name))
    try:
        check_name(kind, name)
        check_dir(folder)
    except BadInput as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # a DIR that cannot be looked into
        print(f"mecsim new: cannot use {folder}: {exc}; nothing written", file=sys.stderr)
        return EXIT_BAD_INPUT
    files = package_files(kind, name)
    try:
        write_package(folder, files)
    except OSError as exc:
        print(f"mecsim new: cannot write {folder}: {exc}; nothing written", file=sys.stderr)
        return EXIT_FAILED
    spec = KINDS[kind]
    print(f"wrote the {kind} {name!r} (distribution {distribution_name(name)}) to {folder}:")
    width = max(len(rel) for rel in files)
    module = f"mecsim_{name}"
    for path, _, what in FILES:
        rel = path.format(module=module, name=name)
        print(f"  {rel.ljust(width)}  {what.format(what=spec.what)}")
    q = shlex.quote
    print("next:")
    print(f"  pip install -e {q(str(folder))}")
    print(f"  mecsim run {q(str(folder / 'scenarios' / f'{name}.yaml'))}")
    if kind in CHECKED:
        print(f"  mecsim check {name}")
    print(f"  python -m pytest -q {q(str(folder / 'tests'))}")
    return 0
