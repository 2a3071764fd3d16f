"""What both sides of a Flower app on mecsim share: the algorithm's parameters, the app
they name (resolved and checked before anything starts) and what is read off a message.
Imports Flower only inside the functions that need it (it is an optional dependency).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

import mecsim.registry as registry
from mecsim.agents.algorithms.base import NoParams

#: The Flower releases mecsim runs apps with: [low, high), the one place the range is
#: written (pyproject.toml's ``flower`` extra repeats it for pip). Others are refused with
#: one line. CI runs the Flower tests on the newest (the extra's pick) and on
#: :data:`FLOWER_OLDEST` (older releases were not tried).
FLOWER_TESTED = ((1, 38), (1, 43))
FLOWER_REQUIREMENT = "flwr>=1.38,<1.43"
#: the oldest supported release, tested by CI (.ci/run)
FLOWER_OLDEST = "1.38.0"

#: metric keys read from an evaluate reply, in order (the first present wins)
ACCURACY_KEYS = ("accuracy", "eval_acc", "acc", "eval_accuracy")
LOSS_KEYS = ("loss", "eval_loss")

ConfigValue = StrictBool | StrictInt | StrictFloat | StrictStr


class FlowerParams(NoParams):
    """Which Flower app runs: ``app`` (a Flower app directory: its ``pyproject.toml``'s
    ``[tool.flwr.app.components]`` name the ServerApp and the ClientApp), or
    ``serverapp`` and ``clientapp`` (two import strings, ``module:attribute``)."""

    app: str | None = Field(
        default=None,
        description="a Flower app directory (relative to where mecsim runs), whose "
        "pyproject.toml has [tool.flwr.app.components] serverapp and clientapp",
    )
    serverapp: str | None = Field(default=None, description="the ServerApp, module:attribute")
    clientapp: str | None = Field(default=None, description="the ClientApp, module:attribute")
    run_config: dict[str, ConfigValue] = Field(
        default_factory=dict,
        description="overrides of the app's [tool.flwr.app.config] (context.run_config); "
        "num-server-rounds is the scenario's rounds",
    )
    flops: str = Field(
        default="first_message",
        description="first_message: each client's first message of each kind is counted "
        "with torch's FLOP counter, later ones take its count (scaled by the elements its "
        "modules processed when that differs); every_message: count every call (exact, "
        "about 2x slower on small models)",
    )

    #: what a scenario must give (the conformance kit's ``params`` property)
    must_give: ClassVar[str] = "app, or serverapp and clientapp"

    log_level: str = Field(
        default="INFO",
        description="Flower's own log level while the app runs (INFO, Flower's own "
        "default: the strategy's round, sampling and aggregation lines on stderr)",
    )

    @model_validator(mode="after")
    def _one_app(self) -> FlowerParams:
        if self.app is not None and (self.serverapp or self.clientapp):
            raise ValueError("give either app (a directory) or serverapp and clientapp, not both")
        if self.app is None and not (self.serverapp and self.clientapp):
            raise ValueError(
                "name the Flower app: app (a Flower app directory) or both serverapp and "
                "clientapp (import strings, module:attribute)"
            )
        if "num-server-rounds" in self.run_config:
            raise ValueError(
                "run_config.num-server-rounds is the scenario's rounds: set rounds instead"
            )
        if self.flops not in ("first_message", "every_message"):
            raise ValueError(f"flops {self.flops!r}: first_message or every_message")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"log_level {self.log_level!r}: one of DEBUG, INFO, WARNING, ERROR")
        return self


class FlowerAppError(ValueError):
    """The Flower app cannot run (not installed, no components, a version outside the
    tested range): one line naming what is wrong."""


def flower_version_problem() -> str | None:
    """Why Flower apps cannot run here, or None."""
    try:
        import flwr
    except ImportError:
        return f'Flower is not installed: pip install "mecsim[flower]" ({FLOWER_REQUIREMENT})'
    text = getattr(flwr, "__version__", "0")
    try:
        have = tuple(int(p) for p in text.split(".")[:2])
    except ValueError:
        have = (0, 0)
    low, high = FLOWER_TESTED
    if not low <= have < high:
        return (
            f"Flower {text} is installed; mecsim runs Flower apps with {FLOWER_REQUIREMENT} "
            '(pip install "mecsim[flower]")'
        )
    return None


@dataclass(frozen=True)
class FlowerApp:
    """A resolved Flower app: its components as import strings, the folder to import
    them from (None: installed), and the run config its ServerApp and ClientApp see."""

    serverapp: str
    clientapp: str
    app_dir: str | None
    run_config: dict[str, Any]


def resolve_app(params: FlowerParams, rounds: int | None) -> FlowerApp:
    """The app ``params`` name, checked (FlowerAppError naming the field): its folder and
    components, whether this process may import them (a server without
    ``--allow-imports`` runs only installed apps), and its run config with the scenario's
    rounds as ``num-server-rounds``."""
    problem = flower_version_problem()
    if problem:
        raise FlowerAppError(problem)
    from flwr.common.config import flatten_dict

    if params.app is not None:
        folder = Path(params.app).expanduser().resolve()
        if not registry.imports_allowed() and not _operator_folder(folder):
            raise FlowerAppError(
                f"algorithm.params.app: {params.app!r} is a folder, and this server runs "
                "only installed Flower apps (pip install the app on the server, or list its "
                "folder with mecsim serve --flower-app, and name its components as "
                "serverapp and clientapp)"
            )
        if not folder.is_dir():
            raise FlowerAppError(f"algorithm.params.app: no folder {str(folder)!r}")
        toml = folder / "pyproject.toml"
        if not toml.is_file():
            raise FlowerAppError(
                f"algorithm.params.app: {str(folder)!r} has no pyproject.toml: not a Flower app"
            )
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Flower's own dependency
            import tomli as tomllib
        try:
            project = tomllib.loads(toml.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise FlowerAppError(f"algorithm.params.app: {toml}: {exc}") from None
        flwr_app = project.get("tool", {}).get("flwr", {}).get("app", {})
        components = flwr_app.get("components", {})
        server_ref, client_ref = components.get("serverapp"), components.get("clientapp")
        if not (isinstance(server_ref, str) and isinstance(client_ref, str)):
            raise FlowerAppError(
                f"algorithm.params.app: {toml} has no [tool.flwr.app.components] "
                "serverapp and clientapp: not a Flower app"
            )
        config = flatten_dict(flwr_app.get("config", {}))
        unknown = sorted(set(params.run_config) - set(config))
        if unknown:
            raise FlowerAppError(
                f"algorithm.params.run_config: {', '.join(unknown)} not in the app's "
                f"[tool.flwr.app.config] ({', '.join(sorted(config)) or 'empty'})"
            )
        app_dir: str | None = str(folder)
    else:
        server_ref, client_ref = str(params.serverapp), str(params.clientapp)
        for field, ref in (("serverapp", server_ref), ("clientapp", client_ref)):
            if not registry.is_import_string(ref):
                raise FlowerAppError(
                    f"algorithm.params.{field}: {ref!r} is not an import string (module:attribute)"
                )
            # before anything is imported: where imports are refused (a service), only
            # the components of the Flower apps its operator installed or listed
            if not registry.imports_allowed() and ref not in registry.flower_components():
                known = ", ".join(sorted(registry.flower_components())) or "none"
                raise FlowerAppError(
                    f"algorithm.params.{field}: {ref!r} is not a component of a Flower app "
                    "installed on this server, and it runs no other code (nothing was "
                    f"imported); installed: {known} (its operator may list more with "
                    "mecsim serve --flower-app)"
                )
        config, app_dir = {}, None
    config.update(params.run_config)
    if rounds is not None:
        config["num-server-rounds"] = int(rounds)
    return FlowerApp(server_ref, client_ref, app_dir, config)


def _operator_folder(folder: Path) -> bool:
    """Is ``folder`` one the operator listed with ``mecsim serve --flower-app``?"""
    for item in registry.operator_flower_apps():
        if registry.is_import_string(item):
            continue
        try:
            if Path(item).expanduser().resolve() == folder:
                return True
        except (OSError, ValueError):
            continue
    return False


def node_ids(clients: list[int], seed: int) -> dict[int, int]:
    """Client id -> its Flower node id: distinct positive 63-bit integers drawn from the
    scenario seed (Flower's own node ids are random integers too)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xF10E3]))
    while True:
        ids = rng.integers(1, 2**63 - 1, size=len(clients), dtype=np.int64)
        if len(set(ids.tolist())) == len(clients):
            return dict(zip(clients, (int(i) for i in ids), strict=True))


def to_wire(message: Any) -> bytes:
    """A message as it goes over the wire: Flower's protocol buffer, serialised. Its
    length is what mecsim charges on the air; the message travels to the client's host
    (and the reply back) in this form, so the ClientApp gets its own copy, as on Flower."""
    from flwr.common import serde

    return bytes(serde.message_to_proto(message).SerializeToString())


def from_wire(data: bytes) -> Any:
    """The message :func:`to_wire` serialised."""
    from flwr.common import serde
    from flwr.proto.message_pb2 import Message as ProtoMessage

    proto = ProtoMessage()
    proto.ParseFromString(data)
    return serde.message_from_proto(proto)


def reply_arrays_finite(message: Any) -> bool:
    """Are all floating-point numbers of a reply's arrays and metrics finite?"""
    if message.has_error():
        return True
    content = message.content
    for record in content.array_records.values():
        for array in record.values():
            values = array.numpy()
            if values.dtype.kind in "fc" and not np.isfinite(values).all():
                return False
    for metrics in content.metric_records.values():
        for value in metrics.values():
            items = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in items):
                return False
    return True


def reply_metric(message: Any, keys: tuple[str, ...]) -> float | None:
    """The first of ``keys`` found in a reply's metric records, then in its config
    records (where a classic ``NumPyClient``'s metrics travel: ``fitres.metrics``,
    ``evaluateres.metrics``), or None."""
    if message.has_error():
        return None
    content = message.content
    for records in (content.metric_records, content.config_records):
        for metrics in records.values():
            for key in keys:
                if key in metrics:
                    value = metrics[key]
                    if isinstance(value, (int, float)):
                        return float(value)
    return None
