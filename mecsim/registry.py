"""What a scenario names, found by name: algorithms and the device-profile catalogue.

Every layer that needs the classes of a named algorithm (the scenario schema validating
its parameters, the network deciding whether downloads are personalised, the records
adding its round columns, the hosts and servers running it) asks here. An entry is an
import string ``module:attribute``, imported when it is first asked for: the scenario
schema, the lowest layer of the package, can then check a scenario against the
algorithms without importing them (they sit above it, with torch), and a Ray worker
resolves the same name to the same classes in its own process.

An algorithm is a ``(server class, client class)`` pair; the device-profile catalogue is
a function returning the built-in profiles by name (:mod:`mecsim.emulation.devices`).
"""

from __future__ import annotations

import importlib
from typing import Any


class UnknownName(ValueError):
    """A name no entry of a registry has; ``str()`` lists the known ones."""


def load(target: str) -> Any:
    """The object an import string ``package.module:attribute.attribute`` names."""
    module_name, _, attrs = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in attrs.split(".") if attrs else []:
        obj = getattr(obj, attr)
    return obj


class Registry:
    """Named entries of one kind, each an import string loaded on first use."""

    def __init__(self, kind: str, entries: dict[str, str]) -> None:
        self.kind = kind
        self._entries = dict(entries)
        self._loaded: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> Any:
        """The entry ``name`` (imported on first use); :class:`UnknownName` if none."""
        if name not in self._entries:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        if name not in self._loaded:
            self._loaded[name] = load(self._entries[name])
        return self._loaded[name]


_ALGORITHMS = "mecsim.agents.algorithms"

#: name -> (ServerAlgorithm subclass, ClientAlgorithm subclass)
ALGORITHMS = Registry(
    "algorithm",
    {
        "fedavg": f"{_ALGORITHMS}.fedavg:FEDAVG",
        "fedprox": f"{_ALGORITHMS}.fedprox:FEDPROX",
        "kapc": f"{_ALGORITHMS}.kapc:KAPC",
        "kapc_bls": f"{_ALGORITHMS}.kapc:KAPC_BLS",
        "local": f"{_ALGORITHMS}.local:LOCAL",
        "mtfl": f"{_ALGORITHMS}.mtfl:MTFL",
        "perfedavg": f"{_ALGORITHMS}.perfedavg:PERFEDAVG",
        "kmeans_cluster": f"{_ALGORITHMS}.kmeans_cluster:KMEANS_CLUSTER",
        "dcpfl": f"{_ALGORITHMS}.dcpfl:DCPFL",
        "dcpfl_nola": f"{_ALGORITHMS}.dcpfl:DCPFL_NOLA",
        "dcpfl_nodc": f"{_ALGORITHMS}.dcpfl:DCPFL_NODC",
        "phsfl": f"{_ALGORITHMS}.phsfl:PHSFL",
        "hsfl": f"{_ALGORITHMS}.phsfl:HSFL",
    },
)

#: A function returning the built-in device profiles by name.
DEVICE_PROFILES = "mecsim.emulation.devices:builtin_profiles"


def algorithm(name: str) -> tuple[Any, Any]:
    """The (server class, client class) of algorithm ``name``; :class:`UnknownName`."""
    pair: tuple[Any, Any] = ALGORITHMS.get(name)
    return pair


def device_profiles() -> dict[str, Any]:
    """The built-in device profiles by name
    (:class:`~mecsim.emulation.devices.DeviceProfile`)."""
    profiles: dict[str, Any] = load(DEVICE_PROFILES)()
    return profiles
