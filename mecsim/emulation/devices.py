"""Device profiles (Pi-class clients, edge servers): the compute-time model and power.

    t_compute = batches * step_overhead_s + train_flops / flops_per_s

where ``train_flops`` include the optimiser's per-parameter update
(:func:`mecsim.agents.training.optimizer_step_flops`). A server's aggregation (element-wise
folds of the uploads, memory-bound) runs at ``aggregate_flops_per_s`` where the profile
gives it, else at ``flops_per_s``:

    t_aggregate = aggregate_flops / aggregate_flops_per_s

Power figures (``active_power_w``, ``idle_power_w``, ``radio_tx_power_w``,
``radio_rx_power_w``) give each client-round's
energy (:mod:`mecsim.emulation.energy`); a profile without them has no energy (NaN). The
radio's transmit draw is ``P_tx / radio_pa_efficiency + radio_circuit_power_w`` with
``P_tx`` the radiated power the scenario's channel gives the client (``tx_power_dbm``) or,
for channels without one, the profile's ``radio_tx_power_dbm`` (a measured
``radio_tx_power_w`` replaces the formula); ``sleep_power_w`` is what the board draws
asleep (``energy.idle_policy: sleep``).

Profiles are data (``mecsim/profiles/devices.yaml``), each number with its source. A
scenario may add or override profiles under ``devices.profiles``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

import mecsim.registry as registry


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    flops_per_s: float
    step_overhead_s: float
    ram_bytes: int
    description: str = ""
    flops_source: str = ""
    step_overhead_source: str = ""
    ram_source: str = ""
    # power (W): whole board with every core busy / idle, and the radio's extra draw above
    # idle while transmitting / receiving; None: not modelled (energy is NaN)
    active_power_w: float | None = None
    idle_power_w: float | None = None
    # a measured transmit draw (W above idle); None: the power-amplifier model below
    radio_tx_power_w: float | None = None
    radio_rx_power_w: float | None = None
    power_source: str = ""
    radio_power_source: str = ""
    # the transmit draw P_tx / eta_PA + P_circuit (W above idle), P_tx from the channel's
    # tx_power_dbm, or radio_tx_power_dbm where the channel has none
    radio_pa_efficiency: float | None = None
    radio_circuit_power_w: float | None = None
    radio_tx_power_dbm: float | None = None
    # whole board asleep (W); None: the board cannot sleep (it idles)
    sleep_power_w: float | None = None
    sleep_power_source: str = ""
    # FLOP/s of a server's aggregation (element-wise folds); None: flops_per_s
    aggregate_flops_per_s: float | None = None
    aggregate_flops_source: str = ""

    def compute_time_s(self, flops: float, batches: int) -> float:
        """Emulated seconds for ``batches`` optimiser steps totalling ``flops`` FLOPs."""
        return batches * self.step_overhead_s + flops / self.flops_per_s

    def aggregate_time_s(self, flops: float) -> float:
        """Emulated seconds of a server aggregation of ``flops`` FLOPs: at
        ``aggregate_flops_per_s`` (the rate of element-wise folds), else ``flops_per_s``."""
        rate = self.aggregate_flops_per_s or self.flops_per_s
        return flops / rate

    def __repr__(self) -> str:
        return (
            f"DeviceProfile({self.name!r}, flops_per_s={self.flops_per_s:.3g}, "
            f"step_overhead_s={self.step_overhead_s}, ram_bytes={self.ram_bytes})"
        )


POWER_FIELDS = (
    "active_power_w",
    "idle_power_w",
    "radio_tx_power_w",
    "radio_rx_power_w",
    "radio_pa_efficiency",
    "radio_circuit_power_w",
    "radio_tx_power_dbm",
    "sleep_power_w",
)


@lru_cache(maxsize=1)
def builtin_profiles() -> dict[str, DeviceProfile]:
    text = resources.files("mecsim.emulation").joinpath("profiles/devices.yaml").read_text()
    return profiles_from_mapping(yaml.safe_load(text))


def profiles_from_mapping(mapping: Any) -> dict[str, DeviceProfile]:
    """Device profiles from ``{name: fields}`` in the format of the built-in profiles'
    YAML (``flops_per_s``, ``step_overhead_s``, ``ram_bytes`` and their sources, the power
    figures): what a ``mecsim.devices`` plugin or a profiles file gives. ValueError naming
    the profile and the field for a missing or non-numeric number."""
    if not isinstance(mapping, dict):
        raise ValueError(f"device profiles must be a mapping of name -> fields, not {mapping!r}")
    profiles = {}
    for name, fields in mapping.items():
        if isinstance(fields, DeviceProfile):
            profiles[str(name)] = fields
            continue
        if not isinstance(fields, dict):
            raise ValueError(f"device profile {name!r}: its fields must be a mapping")
        try:
            fields = dict(
                fields,
                flops_per_s=float(fields["flops_per_s"]),
                step_overhead_s=float(fields["step_overhead_s"]),
                ram_bytes=int(fields["ram_bytes"]),
            )
            for key in (*POWER_FIELDS, "aggregate_flops_per_s"):
                if fields.get(key) is not None:
                    fields[key] = float(fields[key])
            fields.pop("name", None)
            profiles[str(name)] = DeviceProfile(name=str(name), **fields)
        except KeyError as exc:
            raise ValueError(f"device profile {name!r}: {exc.args[0]} is missing") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"device profile {name!r}: {exc}") from None
    return profiles


def all_profiles() -> dict[str, DeviceProfile]:
    """The built-in profiles and every ``mecsim.devices`` plugin's, by name (the first
    distribution to name a profile keeps it; the built-ins come first)."""
    profiles = dict(builtin_profiles())
    for name, found in registry.device_profiles().items():
        if name not in profiles:
            profiles.update(profiles_from_mapping({name: found}))
    return profiles
