"""From the scenario's channel and devices to what the engine times each round.

Client radio properties (distance, bandwidth, transmit power) are drawn once from the
scenario seed; per-round quantities (interference, fading) are drawn from a stream of
the seed keyed by the round, so a round's channel does not depend on earlier rounds'
draws. Every draw is returned per client-round for the records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from channel import FixedRateChannel, ShannonChannel, TraceChannel
from mecsim.devices import DeviceProfile, builtin_profiles
from mecsim.engine import ClientSpec, NetworkSpec, RateSchedule, ServerSpec
from mecsim.scenario import (
    FixedRateChannelConfig,
    Scenario,
    ShannonChannelConfig,
    TraceChannelConfig,
)

_CLIENTS_STREAM = 2
_ROUND_STREAM = 3


def device_profiles(scenario: Scenario) -> dict[str, DeviceProfile]:
    """Built-in profiles, with the scenario's own added or overriding them."""
    profiles = dict(builtin_profiles())
    for name, p in scenario.devices.profiles.items():
        profiles[name] = DeviceProfile(name=name, **p.model_dump())
    return profiles


def _range(value) -> tuple[float, float]:
    return (float(value), float(value)) if isinstance(value, (int, float)) else tuple(value)


def build_channel(cfg) -> Any:
    if isinstance(cfg, ShannonChannelConfig):
        inter = cfg.interference
        return ShannonChannel(
            uplink_bandwidth_range_hz=_range(cfg.uplink.bandwidth_hz),
            tx_power_range_dbm=_range(cfg.uplink.tx_power_dbm),
            distance_range_m=_range(cfg.distance_m),
            path_loss_db=cfg.path_loss_db,
            reference_distance_m=cfg.reference_distance_m,
            path_loss_exponent=cfg.path_loss_exponent,
            fading=cfg.fading,
            noise_psd_dbm_per_hz=cfg.noise_psd_dbm_per_hz,
            interference=inter is not None,
            interference_unit=inter.unit if inter else "noise",
            ul_interference_mean=inter.uplink_mean if inter else 0.0,
            ul_interference_std=inter.uplink_std if inter else 0.0,
            dl_interference_mean=inter.downlink_mean if inter else 0.0,
            dl_interference_std=inter.downlink_std if inter else 0.0,
            server_bandwidth_hz=cfg.downlink.bandwidth_hz,
            server_tx_power_dbm=cfg.downlink.tx_power_dbm,
            downlink_mode="equal_split" if cfg.downlink.mode == "equal_split" else "full",
            snr_offset_db=cfg.snr_offset_db,
        )
    if isinstance(cfg, FixedRateChannelConfig):
        return FixedRateChannel(cfg.uplink.rate_bps, cfg.downlink.rate_bps)
    if isinstance(cfg, TraceChannelConfig):
        return TraceChannel(cfg.path)
    raise TypeError(f"unknown channel config {type(cfg).__name__}")


def shared_media(cfg) -> tuple[bool, bool]:
    """(uplink shared, downlink shared) for this channel configuration."""
    if isinstance(cfg, ShannonChannelConfig):
        return cfg.uplink.shared, cfg.downlink.mode == "shared"
    if isinstance(cfg, FixedRateChannelConfig):
        return cfg.uplink.shared, cfg.downlink.shared
    return False, False


def schedule_from(times_s, rates_bps, start_s: float) -> RateSchedule:
    """An absolute piecewise-constant schedule, re-based to start at ``start_s``."""
    times = np.asarray(times_s, dtype=float)
    rates = np.asarray(rates_bps, dtype=float)
    k = int(np.searchsorted(times, start_s, side="right")) - 1
    rel_times = (0.0, *(float(t - start_s) for t in times[k + 1:]))
    return RateSchedule(rel_times, tuple(float(r) for r in rates[k:]))


class NetworkModel:
    """Per-round ClientSpecs (rates, device), edge servers and media for the engine."""

    def __init__(self, scenario: Scenario, profiles: dict[str, DeviceProfile]) -> None:
        self.scenario = scenario
        self.channel = build_channel(scenario.channel)
        seed = scenario.seed
        self.radio = self.channel.draw_clients(
            scenario.topology.clients, np.random.default_rng([seed, _CLIENTS_STREAM]))
        self.devices = [profiles[name] for name in scenario.client_profiles()]
        server = profiles[scenario.devices.edge_server]
        bh = scenario.backhaul  # each edge server's wired link to the central server
        self.servers = [ServerSpec(server.flops_per_s, server.step_overhead_s,
                                   backhaul_bps=bh.bandwidth_bps, backhaul_latency_s=bh.latency_s)
                        for _ in range(scenario.topology.edge_servers)]
        up_shared, down_shared = shared_media(scenario.channel)
        self.network = NetworkSpec(uplink_shared=up_shared, downlink_shared=down_shared,
                                   deadline_s=scenario.deadline_s)

    def round(self, rnd: int, selected: list[int], elapsed_s: float = 0.0, *,
              records: bool = True):
        """(client specs by id, server specs, network spec, channel records by id).

        ``records=False`` skips building the channel records (an empty dict is returned):
        a replay, which re-draws the same channel, does not need them.
        """
        rng = np.random.default_rng([self.scenario.seed, _ROUND_STREAM, rnd])
        ch = self.channel.draw_round(self.radio, np.asarray(selected, dtype=np.int64), rng,
                                     time_s=elapsed_s)
        records = {int(r["client_id"]): r for r in ch.records()} if records else {}
        specs: dict[int, ClientSpec] = {}
        for i, cid in enumerate(selected):
            up: float | RateSchedule = float(ch.uplink_rate_bps[i])
            down: float | RateSchedule = float(ch.downlink_rate_bps[i])
            if isinstance(self.channel, TraceChannel):
                (ut, ur), (dt, dr) = self.channel.schedules(cid)
                up, down = schedule_from(ut, ur, elapsed_s), schedule_from(dt, dr, elapsed_s)
            dev = self.devices[cid]
            specs[cid] = ClientSpec(cid, up, down, dev.step_overhead_s, dev.flops_per_s,
                                    self.scenario.edge_server_of(cid))
        for rec in records.values():
            rec.pop("client_id", None)
        return specs, self.servers, self.network, records
