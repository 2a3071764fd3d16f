"""What a scenario names, found by name: algorithms, models, datasets, channels, devices,
compressors, asynchronous servers.

Every kind of thing a scenario names by ``name`` is a :class:`Registry` whose entries
are **entry points** of one group, the same path for mecsim's built-ins (declared in
mecsim's own ``pyproject.toml``) and for plugins (any installed distribution declaring
the group):

========== ===================== ====================================================
kind       group                 an entry is
========== ===================== ====================================================
algorithm  ``mecsim.algorithms`` a ``(server class, client class)`` pair
model      ``mecsim.models``     a factory ``(in_shape, num_classes) -> nn.Module``
dataset    ``mecsim.datasets``   a :class:`mecsim.data.DatasetSpec` (or a callable
                                 returning one)
channel    ``mecsim.channels``   a link model (reserved: not yet open to plugins)
device     ``mecsim.devices``    ``{profile name: fields}`` or a callable returning it
compressor ``mecsim.compressors`` a :class:`mecsim.agents.compressors.Compressor`
                                 subclass (built with its ``params``)
async_     ``mecsim.async_       a :class:`mecsim.agents.algorithms.asynchronous.
server     servers``             AsyncServer` subclass (``aggregation.server``)
========== ===================== ====================================================

An entry is imported when it is first asked for: the scenario schema, the lowest layer
of the package, checks a scenario against the algorithms without importing them (they
sit above it, with torch), and a Ray worker resolves the same name to the same classes
in its own process. Besides installed entry points a name may be

* an **import string** ``package.module:attribute`` (local experiments; a service
  refuses them unless its operator allows imports: :data:`allow_imports`), or
* registered by a **plugin file** (``mecsim run --plugin FILE``): the file is executed
  as a module and calls :func:`register`. Its source travels to every Ray worker with
  the run (:func:`portable`, :func:`restore`), so workers on other nodes load it too.

Every import a scenario can cause passes one gate, :func:`check_import`: where imports
are refused (a service's validation threads, :func:`imports`), only the values of
installed ``mecsim.*`` entry points and the components of Flower apps the operator
installed or listed (:func:`flower_components`) load, decided from metadata before
anything is imported.

Every entry resolved by a run is remembered (:func:`used`) with where it came from:
``run.json`` records its name, kind, distribution and version (a plugin file's sha256).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class UnknownName(ValueError):
    """A name no entry of a registry has; ``str()`` lists the known ones."""


#: what a registered name may be (register(); entry points are named by their packages)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


class PluginError(ValueError):
    """A plugin that cannot be used: ``str()`` is one line naming it and why."""


#: Whether names may be import strings (``module:attribute``). ``mecsim serve`` turns this
#: off (its operator's ``--allow-imports`` turns it back on): a submission names installed
#: plugins only, so no code of a submission's choosing is imported.
allow_imports = True

_THREAD = threading.local()


def imports_allowed() -> bool:
    """:data:`allow_imports`, or what :func:`imports` set for this thread."""
    allowed = getattr(_THREAD, "allow_imports", None)
    return allow_imports if allowed is None else bool(allowed)


@contextmanager
def imports(allowed: bool, flower_apps: Iterable[str] = ()) -> Iterator[None]:
    """Allow or refuse import strings in this thread for a while (a service validating a
    submission: ``with registry.imports(config.allow_imports, config.flower_apps): ...``).
    ``flower_apps``: what the operator listed with ``mecsim serve --flower-app`` (Flower
    app folders, or components as ``module:attribute``), loadable even when imports are
    refused (:func:`operator_flower_apps`)."""
    previous = getattr(_THREAD, "allow_imports", None), getattr(_THREAD, "flower_apps", ())
    _THREAD.allow_imports = allowed
    _THREAD.flower_apps = tuple(flower_apps)
    try:
        yield
    finally:
        _THREAD.allow_imports, _THREAD.flower_apps = previous


def operator_flower_apps() -> tuple[str, ...]:
    """What :func:`imports` was given as ``flower_apps`` in this thread."""
    return tuple(getattr(_THREAD, "flower_apps", ()))


class ImportRefused(ValueError):
    """An import a submission asked for that this thread may not do (:func:`check_import`)."""


def check_import(target: str, field: str) -> None:
    """Refuse, with :class:`ImportRefused` naming ``field``, an import of ``target``
    (``module:attribute``) that this thread may not do. Nothing is imported: the answer
    comes from installed distributions' metadata (:func:`loadable_targets`) and what the
    operator listed. Where imports are allowed (``mecsim run``, ``mecsim serve
    --allow-imports``) everything passes."""
    if imports_allowed():
        return
    allowed = loadable_targets()
    if target in allowed:
        return
    raise ImportRefused(
        f"{field}: {target!r} is not an installed plugin or Flower app of this server, "
        "and it runs no other code (nothing was imported); GET /plugins lists what it "
        "has (its operator may list more with --flower-app, or start it with "
        "--allow-imports)"
    )


def loadable_targets() -> dict[str, str]:
    """Every ``module:attribute`` a thread where imports are refused may still load, with
    where it is declared: the values of installed entry points of the ``mecsim.*`` groups,
    the components of installed Flower apps (:func:`flower_components`) and those of the
    operator's ``--flower-app`` list. Read from metadata, never by importing."""
    with _LOCK:
        if _GROUPS is None:
            _entry_points("")
        groups = dict(_GROUPS or {})
    out: dict[str, str] = {}
    for group, eps in groups.items():
        for ep in eps:
            out.setdefault(ep.value, f"entry point {ep.name} of {group} ({ep.distribution})")
    out.update({k: v for k, v in flower_components().items() if k not in out})
    return out


#: the entry-point group of installed Flower apps' components (besides a Flower app's
#: own pyproject.toml: :func:`flower_components`)
FLOWER_GROUP = "mecsim.flower_apps"


def flower_components() -> dict[str, str]:
    """The Flower app components (``module:attribute``) this thread may load where imports
    are refused, with where each is declared:

    * the entry points of :data:`FLOWER_GROUP` of installed distributions;
    * the ``[tool.flwr.app.components]`` of an installed Flower app: a distribution
      installed from a local folder (``pip install [-e] DIR``: its ``direct_url.json``
      names the folder) whose ``pyproject.toml`` declares them;
    * the operator's ``--flower-app`` list (:func:`operator_flower_apps`): folders (their
      ``pyproject.toml``'s components) and components given as ``module:attribute``.

    A submission can change none of these: they are files of the server's installation
    and the server's command line."""
    out: dict[str, str] = {}
    for ep in _entry_points(FLOWER_GROUP):
        out.setdefault(ep.value, f"entry point {ep.name} of {FLOWER_GROUP} ({ep.distribution})")
    for dist, folder in _installed_from_folders():
        for ref in flower_app_components(folder):
            out.setdefault(ref, f"Flower app {dist} (installed from {folder})")
    for item in operator_flower_apps():
        if is_import_string(item):
            out.setdefault(item, "--flower-app")
        else:
            for ref in flower_app_components(item):
                out.setdefault(ref, f"--flower-app {item}")
    return out


def flower_app_components(folder: str | Path) -> tuple[str, ...]:
    """The ``serverapp`` and ``clientapp`` of ``folder/pyproject.toml``'s
    ``[tool.flwr.app.components]``, or () when it has none (read as text, not imported)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Flower's own dependency
        import tomli as tomllib
    try:
        text = (Path(folder) / "pyproject.toml").read_text(encoding="utf-8")
        project = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return ()
    tool = project.get("tool")
    flwr = tool.get("flwr") if isinstance(tool, dict) else None
    app = flwr.get("app") if isinstance(flwr, dict) else None
    components = app.get("components") if isinstance(app, dict) else None
    if not isinstance(components, dict):
        return ()
    refs = (components.get("serverapp"), components.get("clientapp"))
    return tuple(r for r in refs if isinstance(r, str) and is_import_string(r))


_FOLDERS: list[tuple[str, str]] | None = None


def _installed_from_folders() -> list[tuple[str, str]]:
    """(distribution, folder) of every distribution on ``sys.path`` installed from a
    local folder (``direct_url.json`` with ``dir_info``), once per process."""
    global _FOLDERS
    with _LOCK:
        if _FOLDERS is not None:
            return list(_FOLDERS)
    import json
    from urllib.parse import unquote, urlparse

    found: list[tuple[str, str]] = []
    for folder, entry in _dist_infos():
        try:
            with open(os.path.join(folder, entry, "direct_url.json"), encoding="utf-8") as f:
                direct = json.load(f)
        except (OSError, ValueError):
            continue
        url = direct.get("url") if isinstance(direct, dict) else None
        if not (isinstance(url, str) and "dir_info" in direct and url.startswith("file:")):
            continue
        name, _ = _name_and_version(os.path.join(folder, entry), entry)
        found.append((name, unquote(urlparse(url).path)))
    with _LOCK:
        _FOLDERS = found
        return list(found)


def _dist_infos() -> Iterator[tuple[str, str]]:
    """(sys.path folder, metadata folder name) of every distribution on ``sys.path``."""
    for folder in sys.path:
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:  # a missing folder, a zip file on sys.path
            continue
        for entry in names:
            if entry.endswith((".dist-info", ".egg-info")):
                yield folder or ".", entry


def rescan() -> None:
    """Forget what was read of the installed distributions (tests that install one)."""
    global _GROUPS, _FOLDERS
    with _LOCK:
        _GROUPS, _FOLDERS = None, None
        for reg in REGISTRIES.values():
            reg._entries = None
            reg._conflicts = {}


#: The distribution that provides mecsim's built-ins.
BUILTIN_DISTRIBUTION = "mecsim"


@dataclass(frozen=True)
class PluginInfo:
    """Where one named entry comes from (what ``mecsim plugins`` lists and ``run.json``
    records)."""

    kind: str
    name: str
    target: str  # the import string (module:attribute), or the file for a plugin file
    distribution: str  # the installed distribution; "" for an import string or a file
    version: str  # the distribution's version; "" when none
    origin: str  # "entry point" | "import string" | "file"
    sha256: str = ""  # a plugin file's

    @property
    def builtin(self) -> bool:
        return self.origin == "entry point" and self.distribution == BUILTIN_DISTRIBUTION

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load(target: str, field: str = "") -> Any:
    """The object an import string ``package.module:attribute.attribute`` names.
    :class:`ImportRefused` (naming ``field``), before anything is imported, where this
    thread may not import it (:func:`check_import`)."""
    check_import(target, field or target)
    module_name, _, attrs = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in attrs.split(".") if attrs else []:
        obj = getattr(obj, attr)
    return obj


def is_import_string(name: str) -> bool:
    """Does ``name`` look like ``package.module:attribute`` rather than a registered name?"""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


_LOCK = threading.RLock()
#: plugin files loaded in this process: sha256 -> (file name, source)
_FILES: dict[str, tuple[str, str]] = {}
#: what a run resolved in this process: (kind, name) -> PluginInfo
_USED: dict[tuple[str, str], PluginInfo] = {}
_CURRENT_FILE: list[tuple[str, str]] = []  # (file name, sha256) of the file being executed


class Registry:
    """Named entries of one kind: entry points of :attr:`group` (discovered on first
    use), names registered by plugin files, and import strings."""

    def __init__(self, kind: str, group: str, validate: Any = None) -> None:
        self.kind = kind
        self.group = group
        self._validate = validate  # obj -> obj (raises TypeError/ValueError on a wrong one)
        self._entries: dict[str, PluginInfo] | None = None
        self._conflicts: dict[str, list[PluginInfo]] = {}
        self._registered: dict[str, tuple[PluginInfo, Any]] = {}
        self._loaded: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"

    # -- discovery

    def _discover(self) -> dict[str, PluginInfo]:
        if self._entries is not None:
            return self._entries
        found: dict[str, list[PluginInfo]] = {}
        for ep in _entry_points(self.group):
            info = PluginInfo(
                kind=self.kind,
                name=ep.name,
                target=ep.value,
                distribution=ep.distribution,
                version=ep.version,
                origin="entry point",
            )
            same = found.setdefault(ep.name, [])
            # one distribution seen twice on sys.path (an editable install and a build
            # folder, say) is one plugin, not a conflict
            if not any(i.distribution == info.distribution for i in same):
                same.append(info)
        entries: dict[str, PluginInfo] = {}
        for name, infos in found.items():
            if len(infos) == 1:
                entries[name] = infos[0]
            else:
                self._conflicts[name] = sorted(infos, key=lambda i: i.distribution)
        self._entries = entries
        return entries

    def entries(self) -> list[PluginInfo]:
        """Every installed or registered entry (conflicting names included, once per
        distribution), sorted by name."""
        infos = list(self._discover().values()) + [i for i, _ in self._registered.values()]
        for same in self._conflicts.values():
            infos.extend(same)
        return sorted(infos, key=lambda i: (i.name, i.distribution))

    def names(self) -> list[str]:
        """Every name a scenario may give, sorted."""
        return sorted(set(self._discover()) | set(self._registered) | set(self._conflicts))

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._discover() or name in self._registered or name in self._conflicts:
            return True
        return is_import_string(name)

    def info(self, name: str) -> PluginInfo:
        """Where ``name`` comes from; :class:`UnknownName` or :class:`PluginError`."""
        if name in self._registered:
            return self._registered[name][0]
        if name in self._conflicts:
            dists = " and ".join(
                f"{i.distribution} {i.version} ({i.target})" for i in self._conflicts[name]
            )
            raise PluginError(
                f"{self.kind} {name!r} is provided by two distributions: {dists}; "
                "uninstall one of them"
            )
        entries = self._discover()
        if name in entries:
            return entries[name]
        if is_import_string(name):
            if not imports_allowed():
                raise PluginError(
                    f"{self.kind} {name!r} is an import string, and this server runs only "
                    f"installed plugins (its operator may start it with --allow-imports); "
                    f"installed: {', '.join(self.names())}"
                )
            module = name.partition(":")[0]
            dist, version = distribution_of(module)
            return PluginInfo(self.kind, name, name, dist, version, "import string")
        raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    # -- resolution

    def get(self, name: str) -> Any:
        """The entry ``name``, imported on first use. :class:`UnknownName` for a name no
        entry has; :class:`PluginError` (one line) for one that fails to import, is not
        what its kind needs, or is claimed by two distributions."""
        with _LOCK:
            if name in self._loaded:
                _USED.setdefault((self.kind, name), self.info(name))
                return self._loaded[name]
            info = self.info(name)
            if name in self._registered:
                obj = self._registered[name][1]
            else:
                try:
                    obj = load(info.target)
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:  # any import-time failure of a plugin's own
                    # code, SystemExit included: one line, not a server thread's end
                    where = f" (from {info.distribution})" if info.distribution else ""
                    raise PluginError(
                        f"{self.kind} plugin {name!r}{where} failed to load: {_one_line(exc)}"
                    ) from None
            if self._validate is not None:
                try:
                    obj = self._validate(obj)
                except (TypeError, ValueError) as exc:
                    raise PluginError(
                        f"{self.kind} plugin {name!r} ({info.target}): {exc}"
                    ) from None
            self._loaded[name] = obj
            _USED[(self.kind, name)] = info
            return obj

    def register(self, name: str, obj: Any, info: PluginInfo | None = None) -> None:
        """Add ``name`` (a plugin file's :func:`register` call, or a test's); a name an
        installed entry or another registration already has is refused, and so is a
        name that is not :data:`NAME_PATTERN` (it is printed, written to records and
        put in scenario files: no newlines, no Rich markup, no spaces)."""
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            shown = " ".join(repr(name).split())[:80]
            raise PluginError(
                f"{self.kind} name {shown} is not a plugin name: 1 to 64 letters, digits, "
                "'_', '-' or '.', starting with a letter or digit (e.g. my_fedavg)"
            )
        with _LOCK:
            if info is None:
                info = PluginInfo(self.kind, name, repr(obj), "", "", "registered")
            if name in self._discover() or name in self._conflicts:
                other = self._discover().get(name) or self._conflicts[name][0]
                raise PluginError(
                    f"{self.kind} {name!r} of {info.target} is already provided by "
                    f"{other.distribution or other.target}"
                )
            if name in self._registered:
                old = self._registered[name][0]
                if old.sha256 and old.sha256 == info.sha256:
                    return  # the same file loaded again (a worker that has it already)
                raise PluginError(
                    f"{self.kind} {name!r} of {info.target} is already registered by {old.target}"
                )
            self._registered[name] = (info, obj)
            self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        """Forget a registered name (tests); a plugin file none of whose names is left is
        forgotten too (it no longer goes to workers; loading it again runs it again)."""
        with _LOCK:
            info = self._registered.pop(name, (None, None))[0]
            self._loaded.pop(name, None)
            sha = info.sha256 if info is not None else ""
            if sha and not any(
                i.sha256 == sha for r in REGISTRIES.values() for i, _ in r._registered.values()
            ):
                _FILES.pop(sha, None)

    def check(self, name: str) -> str | None:
        """None when ``name`` resolves, else the one-line reason."""
        try:
            self.get(name)
        except (UnknownName, PluginError) as exc:
            return str(exc)
        return None


@dataclass(frozen=True)
class _EntryPoint:
    name: str
    value: str  # module:attribute
    group: str
    distribution: str
    version: str


_GROUPS: dict[str, list[_EntryPoint]] | None = None


def _entry_points(group: str) -> list[_EntryPoint]:
    """The entry points of ``group``, every ``mecsim.*`` group read in one pass over the
    installed distributions' metadata, once per process.

    What importlib.metadata would find (``*.dist-info`` and ``*.egg-info`` folders on
    ``sys.path``; of a distribution found twice, the first on ``sys.path``), read
    without importing it (its imports alone cost ~30 ms): only ``entry_points.txt`` files
    are opened, and the ``METADATA`` of a distribution that declares a mecsim group."""
    global _GROUPS
    with _LOCK:
        if _GROUPS is None:
            _GROUPS = _scan_entry_points()
        return list(_GROUPS.get(group, []))


def _scan_entry_points() -> dict[str, list[_EntryPoint]]:
    groups: dict[str, list[_EntryPoint]] = {}
    seen: set[str] = set()
    for folder in sys.path:
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:  # a missing folder, a zip file on sys.path
            continue
        for entry in names:
            if not entry.endswith((".dist-info", ".egg-info")):
                continue
            meta = os.path.join(folder or ".", entry)
            try:
                with open(os.path.join(meta, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                text = ""
            name, version = _name_and_version(meta, entry)
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key in seen:  # shadowed by the same distribution earlier on sys.path
                continue
            seen.add(key)
            if "[mecsim." not in text:
                continue
            current = ""
            for raw in text.splitlines():
                line = raw.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    current = line[1:-1].strip()
                    continue
                if current.startswith("mecsim.") and "=" in line:
                    ep_name, _, value = line.partition("=")
                    groups.setdefault(current, []).append(
                        _EntryPoint(ep_name.strip(), value.strip(), current, name, version)
                    )
    return groups


def _name_and_version(meta: str, folder_name: str) -> tuple[str, str]:
    """(Name, Version) from a distribution's METADATA (PKG-INFO for an egg-info), else
    from the folder's name (``name-version.dist-info``)."""
    stem = folder_name.rsplit(".", 1)[0]
    name, _, version = stem.partition("-")
    for file in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(meta, file), encoding="utf-8", errors="replace") as f:
                head = f.read(4096)
        except OSError:
            continue
        found: dict[str, str] = {}
        for line in head.splitlines():
            if not line:  # the headers end at the first blank line
                break
            key, sep, value = line.partition(":")
            if sep and key in ("Name", "Version"):
                found.setdefault(key, value.strip())
        return found.get("Name", name), found.get("Version", version)
    return name, version


def distribution_of(module: str) -> tuple[str, str]:
    """(distribution, version) providing the top-level package of ``module``, or ("", "")."""
    from importlib.metadata import packages_distributions, version

    top = module.split(".")[0]
    try:
        dists = packages_distributions().get(top) or []
        if dists:
            return dists[0], version(dists[0])
    except Exception:  # metadata of a broken install: unknown, not fatal
        pass
    return "", ""


def _algorithm_pair(obj: Any) -> Any:
    """An algorithm entry is a (server class, client class) pair, or a server class whose
    ``Client`` attribute is its client class."""
    if isinstance(obj, type) and isinstance(getattr(obj, "Client", None), type):
        obj = (obj, getattr(obj, "Client"))  # noqa: B009 (obj is a type: mypy knows no Client)
    if not (isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(c, type) for c in obj)):
        raise TypeError(
            "an algorithm entry must be a (server class, client class) pair or a server "
            f"class with a Client attribute, not {type(obj).__name__}"
        )
    return obj


def _callable(obj: Any) -> Any:
    if not callable(obj):
        raise TypeError(f"a model entry must be callable (in_shape, num_classes), not {obj!r}")
    return obj


def _compressor_class(obj: Any) -> Any:
    """A compressor entry is a class with ``encode`` and ``decode`` (a subclass of
    :class:`mecsim.agents.compressors.Compressor`), built with the scenario's params."""
    if not (isinstance(obj, type) and callable(getattr(obj, "encode", None))):
        raise TypeError(
            "a compressor entry must be a class with encode and decode (a subclass of "
            f"mecsim.api.Compressor), not {type(obj).__name__}"
        )
    if not callable(getattr(obj, "decode", None)):
        raise TypeError(f"compressor class {obj.__name__} has no decode method")
    return obj


def _async_server_class(obj: Any) -> Any:
    """An asynchronous server entry is a class with ``on_update`` (a subclass of
    :class:`mecsim.agents.algorithms.asynchronous.AsyncServer`), built with the
    scenario's ``aggregation`` section and ``aggregation.server.params``."""
    if not (isinstance(obj, type) and callable(getattr(obj, "on_update", None))):
        raise TypeError(
            "an async_server entry must be a class with on_update (a subclass of "
            f"mecsim.api.AsyncServer), not {type(obj).__name__}"
        )
    return obj


ALGORITHMS = Registry("algorithm", "mecsim.algorithms", _algorithm_pair)
MODELS = Registry("model", "mecsim.models", _callable)
DATASETS = Registry("dataset", "mecsim.datasets")
CHANNELS = Registry("channel", "mecsim.channels")
DEVICES = Registry("device", "mecsim.devices")
COMPRESSORS = Registry("compressor", "mecsim.compressors", _compressor_class)
ASYNC_SERVERS = Registry("async_server", "mecsim.async_servers", _async_server_class)

#: every registry by kind
REGISTRIES: dict[str, Registry] = {
    r.kind: r for r in (ALGORITHMS, MODELS, DATASETS, CHANNELS, DEVICES, COMPRESSORS, ASYNC_SERVERS)
}


def registry(kind: str) -> Registry:
    """The registry of ``kind`` (algorithm, model, dataset, channel, device, compressor,
    async_server)."""
    try:
        return REGISTRIES[kind]
    except KeyError:
        raise ValueError(f"unknown plugin kind {kind!r}; kinds: {', '.join(REGISTRIES)}") from None


def algorithm(name: str) -> tuple[Any, Any]:
    """The (server class, client class) of algorithm ``name``; :class:`UnknownName`."""
    pair: tuple[Any, Any] = ALGORITHMS.get(name)
    return pair


def device_profiles() -> dict[str, Any]:
    """Every device profile by name: each ``mecsim.devices`` entry's
    (:class:`~mecsim.emulation.devices.DeviceProfile`, built from its fields)."""
    profiles: dict[str, Any] = {}
    for name in DEVICES.names():
        try:
            found = DEVICES.get(name)
        except PluginError:
            continue  # listed by `mecsim plugins` with its reason; the others still work
        for profile_name, profile in (found() if callable(found) else found).items():
            profiles.setdefault(profile_name, profile)
    return profiles


# -- plugin files ---------------------------------------------------------------------


def register(kind: str, name: str, obj: Any) -> None:
    """Register ``obj`` as the ``kind`` named ``name``: what a plugin file
    (``mecsim run --plugin FILE``) calls for each thing it provides, e.g.
    ``register("algorithm", "ditto", (DittoServer, DittoClient))``."""
    file_name, sha = _CURRENT_FILE[-1] if _CURRENT_FILE else ("", "")
    info = PluginInfo(
        kind,
        name,
        file_name or getattr(obj, "__module__", repr(obj)),
        "",
        "",
        "file" if file_name else "registered",
        sha,
    )
    registry(kind).register(name, obj, info)


def load_plugin_file(path: str | Path) -> list[PluginInfo]:
    """Execute a plugin file as a module (its :func:`register` calls add its names) and
    keep its source for the run's workers; returns what it registered. One-line
    :class:`PluginError` if it cannot be read or raises."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PluginError(f"{path}: cannot read the plugin file: {_one_line(exc)}") from None
    return load_plugin_source(path.name, source)


def load_plugin_source(file_name: str, source: str) -> list[PluginInfo]:
    """:func:`load_plugin_file` from the file's name and text (a worker's copy)."""
    sha = hashlib.sha256(source.encode("utf-8")).hexdigest()
    with _LOCK:
        if sha in _FILES:
            return [
                info
                for r in REGISTRIES.values()
                for info, _ in r._registered.values()
                if info.sha256 == sha
            ]
        module_name = f"mecsim_plugin_{Path(file_name).stem}_{sha[:12]}"
        spec = importlib.util.spec_from_loader(module_name, loader=None, origin=file_name)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__file__ = file_name
        before = {k: set(r._registered) for k, r in REGISTRIES.items()}
        _CURRENT_FILE.append((file_name, sha))
        sys.modules[module_name] = module  # pickling by reference finds its classes

        def forget() -> None:  # a file that fails leaves nothing behind
            sys.modules.pop(module_name, None)
            for kind, names in before.items():
                for name in set(REGISTRIES[kind]._registered) - names:
                    REGISTRIES[kind].unregister(name)

        try:
            # Running code is the point here, and it is not code from data: the source is
            # a Python file the user named on their own command line (--plugin FILE, as
            # `python FILE` would run it), or, in a Ray worker, that same file's text sent
            # by the user's own driver (registry.portable). No scenario, record or service
            # request reaches this (the service takes no plugin files;
            # tests/project/test_security.py checks that --plugin is the only caller).
            exec(compile(source, file_name, "exec"), module.__dict__)
        except PluginError:  # a register() call refused (a name taken): its own line
            forget()
            raise
        except BaseException as exc:  # the file's own code raised: one line, not a trace
            forget()
            raise PluginError(f"plugin file {file_name} failed: {_one_line(exc)}") from None
        finally:
            _CURRENT_FILE.pop()
        added = [
            REGISTRIES[kind]._registered[name][0]
            for kind, names in before.items()
            for name in sorted(set(REGISTRIES[kind]._registered) - names)
        ]
        if not added:
            forget()
            raise PluginError(
                f"plugin file {file_name} registered nothing: call "
                "mecsim.api.register(kind, name, obj) for what it provides"
            )
        _FILES[sha] = (file_name, source)  # only a file that worked goes to the workers
        return added


@dataclass(frozen=True)
class Portable:
    """What a worker process needs to resolve the names its driver resolves: the plugin
    files' sources, and the folders import strings' modules were found in."""

    files: tuple[tuple[str, str], ...] = ()  # (file name, source)
    paths: tuple[str, ...] = ()  # sys.path folders of import-string modules


def portable() -> Portable:
    """This process's plugin files and import-string folders, for its workers."""
    paths: list[str] = []
    for info in list(_USED.values()):
        if info.origin != "import string":
            continue
        module = sys.modules.get(info.target.partition(":")[0])
        top = sys.modules.get(info.target.split(".")[0].partition(":")[0])
        origin = getattr(top or module, "__file__", None)
        if origin:
            p = Path(origin).resolve().parent
            folder = p.parent if Path(origin).name == "__init__.py" else p
            if str(folder) not in paths:
                paths.append(str(folder))
    with _LOCK:
        return Portable(tuple(_FILES.values()), tuple(paths))


def restore(state: Portable | None) -> None:
    """Make this (worker) process resolve what the driver resolves (:func:`portable`)."""
    if state is None:
        return
    for folder in state.paths:
        if folder not in sys.path:
            sys.path.append(folder)
    for file_name, source in state.files:
        load_plugin_source(file_name, source)


def listing(kinds: list[str] | None = None) -> list[dict[str, Any]]:
    """One dict per entry of each registry (``mecsim plugins --json``, ``GET /plugins``):
    kind, name, target, distribution, version, origin, sha256, loads, error."""
    out = []
    for kind, reg in REGISTRIES.items():
        if kinds and kind not in kinds:
            continue
        for info in reg.entries():
            error = reg.check(info.name)
            row = info.as_dict()
            row.update(loads=error is None, error=error or "")
            out.append(row)
    return out


def used() -> list[PluginInfo]:
    """Every entry resolved in this process that is not one of mecsim's built-ins."""
    with _LOCK:
        return sorted((i for i in _USED.values() if not i.builtin), key=lambda i: (i.kind, i.name))


def used_by(names: dict[str, str]) -> list[PluginInfo]:
    """The non-built-in entries among ``{kind: name}`` (what a run records in run.json)."""
    out = []
    for kind, name in names.items():
        try:
            info = registry(kind).info(name)
        except (UnknownName, PluginError):
            continue
        if not info.builtin:
            out.append(info)
    return out
