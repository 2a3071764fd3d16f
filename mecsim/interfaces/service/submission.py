"""A scenario submitted over HTTP: validated as ``mecsim validate`` does, confined, resolved.

1. The text (YAML or JSON; a mapping is written out as YAML) is spooled to a file under
   the state folder and loaded by :func:`mecsim.scenario.load_scenario`, the loader
   ``mecsim validate FILE`` uses (safe YAML, the schema, finite numbers, safe names).
2. Overrides (``rounds``, dotted-path ``set``) are applied and the result is checked
   again the same way.
3. Files the scenario names (:data:`PATH_FIELDS`) must lie under the service's
   ``--data-root``, after following symbolic links; without ``--data-root`` a submitted
   scenario may name none. They are stored as absolute paths.
4. The run's size (rounds, clients, training steps, hosts) is checked against the
   service's limits (:mod:`mecsim.run.limits`, ``mecsim serve --max-...``).
5. The service's settings replace the run-placement fields (:func:`service_settings`):
   the run executes on the service's Ray and writes under ``--state``; its id is made
   by the server.
6. The placed scenario goes through the pre-flight of ``mecsim run``
   (:mod:`mecsim.run.preflight`: data, model x dataset, step memory, algorithm cross-field
   checks, channel) — only now, since it reads the files the scenario names. The run's
   metrics port is not checked: the service's ``/metrics`` carries its series.

Every problem is a :class:`Problem` naming the field, and nothing is queued.
"""

from __future__ import annotations

import copy
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import mecsim.registry as registry
from mecsim.run import limits as run_limits
from mecsim.run import preflight as checks
from mecsim.run.limits import Limits
from mecsim.scenario import (
    Scenario,
    ScenarioError,
    default_scenario_path,
    load_scenario,
    resolved_yaml,
)
from mecsim.scenario.overrides import OverrideError, check_path
from mecsim.scenario.schema.base import EVERY_FIELD

#: Scenario fields that name files or folders to read: each must lie under --data-root.
PATH_FIELDS = ("dataset.root", "channel.path", "geometry.mobility.trace.path")
#: Scenario fields the service sets itself (see :func:`service_settings`).
SERVICE_FIELDS = ("outputs.dir", "outputs.run_id", "execution.backend", "execution.ray_address")
#: What a submission is called in problems (the file has no name on the server).
SOURCE = "scenario"


@dataclass(frozen=True)
class Problem:
    field: str
    msg: str

    def line(self) -> str:
        return f"{self.field}: {self.msg}"


class Rejected(Exception):
    """A submission that cannot be queued: one :class:`Problem` per thing wrong."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(p.line() for p in problems))
        self.problems = problems


def _problems(exc: ScenarioError, spool: Path) -> list[Problem]:
    """Split ``source: field: message`` lines; the spool file's name becomes 'scenario'."""
    out = []
    for line in str(exc).splitlines():
        line = line.replace(str(spool), SOURCE)
        rest = line.removeprefix(f"{SOURCE}:").strip()
        field, sep, msg = rest.partition(": ")
        out.append(
            Problem(field.strip() or "(top level)", msg.strip())
            if sep
            else Problem("(top level)", rest)
        )
    return out


def _validate_text(text: str, tmp_dir: Path, *, preflight: bool = False) -> Scenario:
    """What ``mecsim validate FILE`` checks, on ``text`` written to a file: the schema,
    and with ``preflight`` the pre-flight of a run too (only once the service has confined
    the scenario's paths and placed its outputs: the pre-flight reads the data it names).
    A run's metrics are served by the service, so their port is not checked."""

    tmp_dir.mkdir(parents=True, exist_ok=True)
    spool = tmp_dir / f"submitted-{os.getpid()}-{secrets.token_hex(8)}.yaml"
    spool.write_text(text)
    try:
        sc = load_scenario(spool, beside_file=False)  # paths: confined below
        if preflight:
            data = sc.model_dump(mode="json")
            data["metrics"]["enabled"] = False  # the service's /metrics carries the run
            checks.check(Scenario.model_validate(data), str(spool))
        return sc
    except ScenarioError as exc:
        raise Rejected(_problems(exc, spool)) from None
    finally:
        spool.unlink(missing_ok=True)


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _put(data: Any, dotted: str, value: Any) -> None:
    """Set ``dotted`` (mapping keys, list indices) in ``data``; the path must exist."""
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def confine(data: dict[str, Any], data_root: Path | None) -> list[Problem]:
    """Check (and make absolute, in ``data``) the paths a scenario names."""
    problems = []
    root = data_root.resolve() if data_root is not None else None
    for dotted in PATH_FIELDS:
        value = _get(data, dotted)
        if value is None:
            continue
        if root is None:
            problems.append(
                Problem(
                    dotted,
                    "this service reads no files named by submitted "
                    "scenarios (it was started without --data-root)",
                )
            )
            continue
        try:
            path = Path(str(value)).expanduser()
            full = (path if path.is_absolute() else root / path).resolve()
        except (OSError, ValueError) as exc:  # a NUL byte, a name too long, ...
            problems.append(Problem(dotted, f"not a usable path ({exc})"))
            continue
        if not full.is_relative_to(root):
            problems.append(
                Problem(
                    dotted,
                    f"{value!r} is outside the service's data root; "
                    "give a path under it (relative paths are taken from it)",
                )
            )
            continue
        _put(data, dotted, str(full))
    return problems


def service_settings(data: dict[str, Any], run_id: str, runs_dir: Path) -> None:
    """The run-placement fields the service decides, whatever the submission said."""
    data["outputs"]["dir"] = str(runs_dir)
    data["outputs"]["run_id"] = run_id
    data["execution"]["backend"] = "ray"
    data["execution"]["ray_address"] = None


def new_run_id(name: str) -> str:
    """``<name>-<UTC time>-<random>``: unique, readable, safe in paths, URLs and labels."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "run"
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def scenario_text(scenario: str | Mapping[str, Any] | None) -> str:
    """The submitted scenario as text: YAML/JSON as given, a mapping dumped, None: default."""
    if scenario is None:
        return default_scenario_path().read_text()
    if isinstance(scenario, str):
        return scenario
    return yaml.safe_dump(dict(scenario), sort_keys=False)


def prepare_submission(
    scenario: str | Mapping[str, Any] | None,
    *,
    rounds: int | None,
    overrides: Mapping[str, Any],
    data_root: Path | None,
    tmp_dir: Path,
    runs_dir: Path,
    limits: Limits | None = None,
    allow_imports: bool = False,
    flower_apps: tuple[str, ...] = (),
) -> tuple[str, Scenario]:
    """Validate, override, confine and place a submission: (run id, scenario to run).
    With ``limits``, a scenario above them is refused before its data are read. Code a
    submission names is refused, before anything is imported, unless ``allow_imports``:
    an import string as a plugin name (``pkg.module:Attr``), a Flower app's components
    that are not those of an installed app or of the operator's ``flower_apps``
    (``--flower-app``); the service runs installed plugins only."""
    with registry.imports(allow_imports, flower_apps):
        return _prepare(scenario, rounds, overrides, data_root, tmp_dir, runs_dir, limits)


def _prepare(
    scenario: str | Mapping[str, Any] | None,
    rounds: int | None,
    overrides: Mapping[str, Any],
    data_root: Path | None,
    tmp_dir: Path,
    runs_dir: Path,
    limits: Limits | None,
) -> tuple[str, Scenario]:
    sc = _validate_text(scenario_text(scenario), tmp_dir)
    data = sc.model_dump(mode="json", context=EVERY_FIELD)  # an override may name any field
    changes: dict[str, Any] = dict(overrides)
    if rounds is not None:
        changes["rounds"] = rounds
    problems = []
    for path, value in changes.items():
        if path in SERVICE_FIELDS or (
            path.split(".")[0] in ("execution", "outputs")
            and path
            not in (
                "execution.hosts",
                "execution.stream_aggregation",
                "outputs.table_format",
                "outputs.save_optraces",
            )
        ):
            problems.append(
                Problem(
                    path, "set by the service (runs use its Ray and write under its state folder)"
                )
            )
            continue
        try:
            check_path(data, path)
        except OverrideError as exc:
            problems.append(Problem(path, str(exc)))
            continue
        _put(data, path, copy.deepcopy(value))
    if problems:
        raise Rejected(problems)
    if changes:  # the overridden scenario is checked again, field by field
        data = _validate_text(yaml.safe_dump(data, sort_keys=False), tmp_dir).model_dump(
            mode="json"
        )
    problems = confine(data, data_root)
    if problems:
        raise Rejected(problems)
    if limits is not None:
        over = run_limits.check(Scenario.model_validate(data), limits)
        if over:
            raise Rejected([Problem(field, msg) for field, msg in over])
    run_id = new_run_id(sc.name)
    service_settings(data, run_id, runs_dir)
    final = _validate_text(resolved_yaml(Scenario.model_validate(data)), tmp_dir, preflight=True)
    return run_id, final
