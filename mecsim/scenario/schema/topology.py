"""Who takes part: the ``topology:`` section (clients, edge servers, participation),
the ``devices:`` section (device profiles and which clients have them) and the
``energy:`` section (how a client's round is charged)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mecsim.scenario.schema.base import _Strict


class TopologyConfig(_Strict):
    clients: int = Field(
        default=10, ge=1, le=1_000_000, description="number of clients (virtual; not processes)"
    )
    edge_servers: int = Field(default=1, ge=1)
    participation: float = Field(
        default=1.0, gt=0, le=1, description="fraction of clients selected per round (C)"
    )


class CustomProfile(_Strict):
    flops_per_s: float = Field(ge=1, description="at least 1 FLOP/s")
    step_overhead_s: float = Field(ge=0, le=3600)
    ram_bytes: int = Field(gt=0)
    description: str = ""
    flops_source: str = Field(description="where flops_per_s comes from")
    step_overhead_source: str = Field(description="where step_overhead_s comes from")
    ram_source: str = ""
    active_power_w: float | None = Field(
        default=None,
        gt=0,
        description="whole board, every core busy (W); with idle_power_w: energy per round",
    )
    idle_power_w: float | None = Field(default=None, ge=0, description="whole board, idle (W)")
    radio_tx_power_w: float | None = Field(
        default=None,
        ge=0,
        description="a measured transmit draw above idle (W); replaces P_tx/eta + P_circuit",
    )
    radio_rx_power_w: float | None = Field(
        default=None, ge=0, description="the radio's extra draw above idle while receiving (W)"
    )
    radio_pa_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="power amplifier efficiency eta_PA (0, 1]"
    )
    radio_circuit_power_w: float | None = Field(
        default=None,
        ge=0,
        description="transmit chain's circuit draw above idle (W): P_tx/eta_PA + P_circuit",
    )
    radio_tx_power_dbm: float | None = Field(
        default=None,
        ge=-50,
        le=40,
        description="radiated power where the channel gives none (fixed_rate, trace) (dBm)",
    )
    power_source: str = Field(default="", description="where active/idle_power_w come from")
    radio_power_source: str = Field(default="", description="where the radio_* figures come from")
    sleep_power_w: float | None = Field(
        default=None, ge=0, description="whole board asleep (W): energy.idle_policy sleep"
    )
    sleep_power_source: str = Field(default="", description="where sleep_power_w comes from")
    aggregate_flops_per_s: float | None = Field(
        default=None,
        ge=1,
        description="FLOP/s of a server's aggregation (element-wise folds of the uploads, "
        "memory-bound); omit: flops_per_s",
    )
    aggregate_flops_source: str = Field(
        default="", description="where aggregate_flops_per_s comes from"
    )

    @model_validator(mode="after")
    def _power_sourced(self) -> CustomProfile:
        if self.aggregate_flops_per_s is not None and not self.aggregate_flops_source.strip():
            raise ValueError(
                "aggregate_flops_source: say where aggregate_flops_per_s comes from "
                "(a measurement, e.g. benchmarks/speed/aggregation_rate.py, or 'estimate: ...')"
            )
        board = (self.active_power_w, self.idle_power_w)
        given = [v is not None for v in board]
        if any(given) and not all(given):
            missing = ("active_power_w", "idle_power_w")[given.index(False)]
            raise ValueError(f"{missing}: give active_power_w and idle_power_w together")
        if any(given) and not self.power_source.strip():
            raise ValueError(
                "power_source: say where active_power_w and idle_power_w come from (a "
                "measurement, a datasheet, or 'estimate: ...')"
            )
        self._radio_sourced()
        if self.sleep_power_w is not None:
            if not self.sleep_power_source.strip():
                raise ValueError(
                    "sleep_power_source: say where sleep_power_w comes from (a "
                    "measurement, a datasheet, or 'estimate: ...')"
                )
            if self.idle_power_w is not None and self.sleep_power_w > self.idle_power_w:
                raise ValueError(
                    f"sleep_power_w: {self.sleep_power_w} W is above idle_power_w "
                    f"({self.idle_power_w} W)"
                )
        return self

    def _radio_sourced(self) -> None:
        """The radio: a receive draw, and a transmit draw (measured, or eta_PA and
        P_circuit together), with their source."""
        pa = (self.radio_pa_efficiency, self.radio_circuit_power_w)
        radio = (self.radio_tx_power_w, self.radio_rx_power_w, *pa, self.radio_tx_power_dbm)
        if all(v is None for v in radio):
            return
        if (pa[0] is None) != (pa[1] is None):
            missing = "radio_pa_efficiency" if pa[0] is None else "radio_circuit_power_w"
            raise ValueError(
                f"{missing}: give radio_pa_efficiency and radio_circuit_power_w together"
            )
        if self.radio_rx_power_w is None:
            raise ValueError("radio_rx_power_w: give it with the transmit figures")
        if self.radio_tx_power_w is None and pa[0] is None:
            raise ValueError(
                "radio_pa_efficiency: give radio_pa_efficiency and radio_circuit_power_w "
                "(the transmit draw P_tx/eta_PA + P_circuit), or a measured radio_tx_power_w"
            )
        if not self.radio_power_source.strip():
            raise ValueError(
                "radio_power_source: say where the radio figures come from (a "
                "measurement, a datasheet, or 'estimate: ...')"
            )


class DeviceGroup(_Strict):
    profile: str
    count: int | None = Field(
        default=None, ge=1, description="clients in this group; omit: the rest"
    )


class DevicesConfig(_Strict):
    clients: list[DeviceGroup] = Field(
        default_factory=lambda: [DeviceGroup(profile="rpi4")],
        description="groups assigned to clients in id order",
    )
    edge_server: str = "edge-server-x86"
    profiles: dict[str, CustomProfile] = Field(
        default_factory=dict, description="extra or overriding device profiles"
    )


class EnergyConfig(_Strict):
    """How a client's round is charged (mecsim.emulation.energy, docs/devices.md)."""

    idle_policy: Literal["idle", "sleep"] = Field(
        default="sleep",
        description="sleep: a client that has finished its round sleeps (the profile's "
        "sleep_power_w) until the round ends; idle: it idles (idle_power_w)",
    )
