"""Build and run the ns-3 programs of ``validation/ns3/<name>.cc``.

The programs are compiled against the system's ns-3 (Debian's ``libns3-dev``, 3.37) with
``g++`` and ``pkg-config``, once per version of their source, into a cache folder
(``$MECSIM_VALIDATION_CACHE`` or ``~/.cache/mecsim-validation``); a lock file keeps two
processes (pytest workers) from compiling the same program at once. A program prints one
JSON object per line on stdout; :func:`run` returns them.

Another ns-3 install — a variant reference beside the system's, e.g. the nsnam project's
PyPI wheel ``ns3==3.44.post0`` unzipped (its ``ns3/`` folder holds ``include/ns3/`` and
``lib64/libns3.44-*.so``) — is named by ``$MECSIM_NS3_PREFIX`` (or :func:`use_prefix`):
the programs are then compiled against its headers and libraries directly (no
pkg-config: the wheel's ``.pc`` files name its build machine's paths), with an rpath to
its library folder so they run without ``LD_LIBRARY_PATH``, and cached under a name
carrying its version (``tcp_flows-ns3.44-<sha>``).

Two traps of Debian's pkg-config files, handled in :func:`compile_flags`: the ``--cflags``
carry a stray ``-I/usr\\;`` token (dropped), and ``--libs`` name
``/usr/lib/x86_64-linux-gnu/libgsl.so`` and ``libgslcblas.so``, which exist only with
``libgsl-dev`` installed (absolute library paths that do not exist are dropped: the
programs here use no GSL, and ``libns3-core`` pulls in its own runtime copy).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

#: the programs' sources
SOURCES = Path(__file__).resolve().parent / "ns3"
#: the ns-3 modules every program is linked with (Wi-Fi ones add theirs, see MODULES)
BASE_MODULES = (
    "ns3-core",
    "ns3-network",
    "ns3-internet",
    "ns3-point-to-point",
    "ns3-applications",
    "ns3-traffic-control",
    "ns3-flow-monitor",
)
#: extra modules by program-name prefix
MODULES = {
    "wifi_": ("ns3-wifi", "ns3-mobility", "ns3-propagation", "ns3-spectrum", "ns3-energy"),
    "pathloss_": ("ns3-mobility", "ns3-propagation"),
}
CXXFLAGS = ("-O2", "-std=c++17")
#: for another install (PREFIX_ENV): ns-3's headers need C++20 from 3.42 on (std::bind_front
#: in timer-impl.h), and older ones compile under it too
PREFIX_CXXFLAGS = ("-O2", "-std=c++20")
#: the environment variable naming another ns-3 install (a folder with include/ns3/ and
#: lib64/ or lib/ holding libns3.<version>-core.so); unset: the system's, via pkg-config
PREFIX_ENV = "MECSIM_NS3_PREFIX"


class Ns3Error(RuntimeError):
    """An ns-3 program did not build or did not run to the end."""


def cache_dir() -> Path:
    env = os.environ.get("MECSIM_VALIDATION_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mecsim-validation"


def ns3_prefix() -> Path | None:
    """The ns-3 install named by ``$MECSIM_NS3_PREFIX``, or None for the system's."""
    env = os.environ.get(PREFIX_ENV)
    return Path(env).resolve() if env else None


def use_prefix(prefix: Path | str | None) -> None:
    """Build and run against the ns-3 install at ``prefix`` from now on (None: the
    system's); set in the environment, so processes started from here inherit it."""
    if prefix is None:
        os.environ.pop(PREFIX_ENV, None)
    else:
        path = Path(prefix).resolve()
        prefix_install(path)  # refuse a folder that is no ns-3 install, now
        os.environ[PREFIX_ENV] = str(path)


@lru_cache(maxsize=8)
def prefix_install(prefix: Path | None) -> tuple[str, Path]:
    """``(version, library folder)`` of the ns-3 install at ``prefix``; raises
    :class:`Ns3Error`, naming the folder and what it lacks, when it is not one."""
    if prefix is None:
        raise Ns3Error(f"${PREFIX_ENV} is not set")
    where = f"{PREFIX_ENV}={prefix}"
    if not (prefix / "include" / "ns3" / "core-module.h").is_file():
        raise Ns3Error(f"{where}: no include/ns3/core-module.h there (not an ns-3 install)")
    for libdir in (prefix / "lib64", prefix / "lib"):
        cores = sorted(libdir.glob("libns3*-core.so"))
        if cores:
            # libns3.44-core.so -> 3.44; a debug build's libns3.44-core-debug.so is not matched
            version = cores[0].name.removeprefix("libns").removesuffix("-core.so")
            return version, libdir
    raise Ns3Error(f"{where}: no lib64/ or lib/ with libns3.<version>-core.so there")


def ns3_available() -> str | None:
    """ns-3's version (e.g. ``"3.37"``), or None when ns-3, g++ or pkg-config is missing.

    With ``$MECSIM_NS3_PREFIX`` set: that install's version (None without g++; a folder
    that is no ns-3 install raises :class:`Ns3Error`, it is never silently skipped)."""
    prefix = ns3_prefix()
    if prefix is not None:
        return prefix_install(prefix)[0] if shutil.which("g++") else None
    return _system_version()


@lru_cache(maxsize=1)
def _system_version() -> str | None:
    if shutil.which("g++") is None or shutil.which("pkg-config") is None:
        return None
    try:
        out = subprocess.run(
            ["pkg-config", "--modversion", "ns3-core"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip()


def modules_for(name: str) -> tuple[str, ...]:
    extra: tuple[str, ...] = ()
    for prefix, mods in MODULES.items():
        if name.startswith(prefix):
            extra += mods
    return BASE_MODULES + extra


def prefix_flags(prefix: Path, modules: tuple[str, ...]) -> list[str]:
    """The flags for ``modules`` of the install at ``prefix``: its headers, its
    ``libns3.<version>-<module>.so`` and an rpath to them."""
    version, libdir = prefix_install(prefix)
    libs = [f"-lns{version}-{m.removeprefix('ns3-')}" for m in modules]
    return [f"-I{prefix / 'include'}", f"-L{libdir}", f"-Wl,-rpath,{libdir}", *libs]


def compile_flags(modules: tuple[str, ...]) -> list[str]:
    """pkg-config's cflags and libs for ``modules``, cleaned of Debian's broken tokens
    (or, with ``$MECSIM_NS3_PREFIX`` set, :func:`prefix_flags`)."""
    prefix = ns3_prefix()
    if prefix is not None:
        return prefix_flags(prefix, modules)
    out = subprocess.run(
        ["pkg-config", "--cflags", "--libs", *modules],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise Ns3Error(f"pkg-config {' '.join(modules)} failed:\n{out.stderr}")
    flags: list[str] = []
    for tok in out.stdout.split():
        if tok.startswith("-I") and not Path(tok[2:]).is_dir():
            continue  # "-I/usr\;"
        if tok.startswith("/") and not Path(tok).exists():
            continue  # libgsl.so without libgsl-dev
        if tok not in flags:  # the files repeat -lns3-core a dozen times
            flags.append(tok)
    return flags


def source(name: str) -> Path:
    path = SOURCES / f"{name}.cc"
    if not path.is_file():
        known = sorted(p.stem for p in SOURCES.glob("*.cc"))
        raise Ns3Error(f"no ns-3 program {name!r} ({path}); known: {', '.join(known)}")
    return path


def cxxflags() -> tuple[str, ...]:
    return CXXFLAGS if ns3_prefix() is None else PREFIX_CXXFLAGS


def compile_command(name: str, output: Path) -> list[str]:
    return [
        "g++",
        *cxxflags(),
        str(source(name)),
        "-o",
        str(output),
        *compile_flags(modules_for(name)),
    ]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build(name: str) -> Path:
    """The compiled program ``validation/ns3/<name>.cc``, compiling it if its source is new.

    The binary's name carries the SHA-256 of the source and of the compile flags, so an
    edited source is rebuilt and an unchanged one never is; built against another install
    (``$MECSIM_NS3_PREFIX``), it carries that install's version and its path is hashed
    too. Compiling takes tens of seconds; a line on stderr says so.
    """
    version = ns3_available()
    if version is None:
        raise Ns3Error("ns-3 is not available (needs g++, pkg-config and libns3-dev)")
    src = source(name)
    digest = hashlib.sha256()
    digest.update(src.read_bytes())
    digest.update(" ".join([version, *cxxflags(), *modules_for(name)]).encode())
    prefix = ns3_prefix()
    if prefix is None:
        binary = cache_dir() / f"{name}-{digest.hexdigest()[:16]}"
    else:
        digest.update(str(prefix).encode())
        binary = cache_dir() / f"{name}-ns{version}-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary
    with _locked(cache_dir() / f"{name}.lock"):
        if binary.exists():  # another process built it while this one waited
            return binary
        print(f"compiling {name} (once)", file=sys.stderr, flush=True)
        tmp = binary.with_name(binary.name + f".tmp{os.getpid()}")
        cmd = compile_command(name, tmp)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise Ns3Error(f"compiling {name} failed:\n$ {' '.join(cmd)}\n{out.stderr[-4000:]}")
        tmp.replace(binary)
    return binary


def _arg(key: str, value: Any) -> str:
    if isinstance(value, bool):
        value = int(value)
    elif isinstance(value, float):
        value = repr(value)
    return f"--{key}={value}"


def run(name: str, timeout: float = 600.0, **args: Any) -> list[dict[str, Any]]:
    """Run program ``name`` with ``--key=value`` for each of ``args``; its JSON lines.

    Keys may be the program's own options or ns-3 attributes
    (``**{"ns3::TcpCubic::HyStart": False}``). Raises :class:`Ns3Error`, with the
    command and its stderr, when it fails, prints no JSON, or runs past ``timeout``.
    """
    binary = build(name)
    cmd = [str(binary), *(_arg(k, v) for k, v in args.items())]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise Ns3Error(f"{name} ran past {timeout} s: {' '.join(cmd)}") from exc
    if out.returncode != 0:
        raise Ns3Error(
            f"{name} exited with {out.returncode}: {' '.join(cmd)}\n{out.stderr[-4000:]}"
        )
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise Ns3Error(f"{name} printed a bad JSON line {line!r}: {exc}") from exc
    if not rows:
        raise Ns3Error(f"{name} printed no JSON: {' '.join(cmd)}\n{out.stderr[-4000:]}")
    return rows
