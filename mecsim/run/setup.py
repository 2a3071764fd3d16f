"""A run's set-up: data, partition, model, network, and its executor started."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

import mecsim.registry as registry
from mecsim.agents.algorithms import TrainConfig, algorithm_classes
from mecsim.agents.host import HostSetup
from mecsim.agents.models import build_model, get_flat, model_layout
from mecsim.agents.training import make_optimizer, measured_step
from mecsim.data import heterogeneity_dkl, load_dataset, partition
from mecsim.emulation import faults
from mecsim.emulation.availability import Availability
from mecsim.emulation.devices import DeviceProfile
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.run import torch_rng
from mecsim.run.backends.base import Executor
from mecsim.run.backends.local import LocalExecutor
from mecsim.run.backends.placement import PlacementTimeout
from mecsim.run.backends.ray_executor import RayExecutor
from mecsim.run.observers import RunInfo
from mecsim.scenario import PluginChannelConfig, Scenario, ShannonChannelConfig


class RunFailed(Exception):
    """The run cannot go on (e.g. its actors keep dying); its finished rounds are kept."""


MiB = 1024 * 1024


class ScenarioInfeasible(Exception):
    """The scenario cannot run as written (e.g. the model does not fit a device's RAM)."""


@dataclass
class RunSetup:
    info: RunInfo
    executor: Executor
    network: NetworkModel
    server_profile: DeviceProfile
    slowdown: np.ndarray  # per-client compute slow-down of emulated stragglers (1: none)
    # the uploads are streamed into the aggregate while the clients train (see
    # streams_aggregation): which clients a round aggregates is known before it is timed
    streams: bool = False
    # the server's own code drives the rounds (ServerAlgorithm.drives_rounds: a Flower app)
    drives_rounds: bool = False
    # a hierarchical algorithm whose clients move (moving_hierarchy): each round's edge
    # servers group the clients served at its start, and handovers carry Handoff ops
    hierarchy_moves: bool = False
    # the common initial model (an asynchronous run's server starts from it)
    init_weights: np.ndarray | None = None
    # who is online when (availability:); None: every client, always
    availability: Availability | None = None


def streams_aggregation(scenario: Scenario) -> bool:
    """Can a round's uploads be folded into the aggregate while its clients train?

    Only when the algorithm can aggregate in parts (``ServerAlgorithm.streams_aggregation``,
    a flat algorithm) and which clients a round aggregates is known before the round is
    timed: every client that trains and does not crash or drop out (faults drawn before
    training). A deadline, ``faults.wait_for_fraction``, link or edge-server outages and
    rate traces (a rate of 0 stalls a client for ever) decide it from the timing: the
    uploads are then held until the round is timed. ``execution.stream_aggregation: off``
    always holds them. The run loop checks every streamed round's timed clients against
    the prediction.
    """
    server_cls, _ = algorithm_classes(scenario.algorithm.name)
    f = scenario.faults
    return (
        scenario.execution.stream_aggregation == "auto"
        and server_cls.aggregates_in_parts()
        and server_cls.Edge is None
        and scenario.deadline_s is None
        and scenario.channel.model != "trace"
        and (
            f is None
            or (f.wait_for_fraction >= 1 and not f.link_outages and not f.edge_server_outages)
        )
    )


def moving_hierarchy(scenario: Scenario) -> bool:
    """Do the edge servers of a hierarchical algorithm (``ServerAlgorithm.Edge`` set:
    PHSFL, HSFL) serve other clients from round to round? Yes when its clients move: each
    round the run loop gives the executor the association at the round's start
    (:meth:`~mecsim.run.backends.base.Executor.associate`), every edge server of the
    topology has a process, and a client that changed edge server carries a
    :class:`~mecsim.emulation.ops.Handoff` of what its old edge server kept for it
    (docs/mobility.md, "Handover")."""
    g = scenario.geometry
    if g is None or not g.moves():
        return False
    server_cls, _ = algorithm_classes(scenario.algorithm.name)
    return server_cls.Edge is not None


def moving_rate_refusal(scenario: Scenario) -> str | None:
    """Why a moving client's rate cannot follow it on this scenario's media (None: it
    can). ``geometry.mobility.rate: step`` gives each moving client's link a rate that
    changes during the round; the engines integrate it on a dedicated link and re-rate a
    shared medium's processor sharing where a flow's rate changes, but not a shared
    medium whose flows a loss rate caps below their link rates (``transport: ideal``
    with a ``loss_rate``: water-filling, docs/engine.md), which needs each flow's rate
    constant over the round (docs/mobility.md, "Mobility in a run")."""
    g = scenario.geometry
    if g is None or not g.moves() or g.mobility.rate != "step":
        return None
    ch = scenario.channel
    if not isinstance(ch, ShannonChannelConfig):
        return None  # rates that do not follow a distance: nothing changes in a round
    up, down = ch.shared_media(scenario.algorithm.name)
    capped = [
        name
        for name, shared, link in (("uplink", up, ch.uplink), ("downlink", down, ch.downlink))
        if shared and link.loss_rate > 0 and not link.tcp()
    ]
    if not capped:
        return None
    which = " and ".join(capped)
    fields = " and ".join(f"channel.{name}.loss_rate" for name in capped)
    return (
        f"rate: step makes a moving client's rate change during the round, and the "
        f"{which} is a shared medium whose flows {fields} caps below their link rates "
        "(transport: ideal: max-min fair shares of the medium's time), which the engines "
        "time only with rates constant over the round: set geometry.mobility.rate: round "
        "(each client's rate frozen at the round's start), transport: tcp, or dedicated "
        "links (channel.uplink.shared: false, channel.downlink.mode: full)"
    )


def _step_cost(model: torch.nn.Module, in_shape, num_classes: int, train: TrainConfig):
    """FLOPs and memory of one training step at the scenario's batch size (before the run)."""
    x = torch.zeros((train.batch_size, *in_shape))
    y = torch.arange(train.batch_size) % num_classes
    opt = make_optimizer(train.optimizer, model.parameters(), train.lr, train.momentum)
    _, cost = measured_step(model, opt, x, y, None)
    return cost


def _named(scenario: Scenario) -> dict[str, str]:
    """What the scenario names, by kind (the registries it is looked up in)."""
    names = {
        "algorithm": scenario.algorithm.name,
        "model": scenario.model.name,
        "dataset": scenario.dataset.name,
    }
    if isinstance(scenario.channel, PluginChannelConfig):
        names["channel"] = scenario.channel.name
    if scenario.compressor.name is not None:
        names["compressor"] = scenario.compressor.name
    if scenario.aggregation.server is not None:
        names["async_server"] = scenario.aggregation.server.name
    return names


def prepare(
    scenario: Scenario,
    run_id: str,
    out_dir,
    *,
    hosts: int | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
) -> RunSetup:
    """Load data, partition, build the model and network, start hosts and the server."""
    refusal = moving_rate_refusal(scenario)
    if refusal is not None:
        raise ScenarioInfeasible(f"geometry.mobility.rate: {refusal}")
    seed = scenario.seed
    n = scenario.topology.clients
    data_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    ds = scenario.dataset
    pools = load_dataset(ds.name, ds.root, ds.train_size, ds.test_size, data_rng)
    part_params = ds.partition.model_dump(exclude={"method"})
    parts = partition(pools, n, ds.partition.method, data_rng, **part_params)

    c, h, w = (int(s) for s in pools.train.images.shape[1:])  # images are N x C x H x W
    in_shape = (c, h, w)
    num_classes = pools.train.num_classes
    with torch_rng.seeded(seed):  # no other thread draws from torch's generator meanwhile
        model = build_model(scenario.model.name, in_shape, num_classes)
    layout = model_layout(model)
    init_weights = get_flat(model, layout)
    t = scenario.training
    train = TrainConfig(t.epochs, t.batch_size, t.optimizer, t.lr, t.momentum, t.weight_decay)

    profiles = device_profiles(scenario)
    client_devices = scenario.client_profiles()
    with torch_rng.untouched():  # a model (and a step) measured, not trained
        cost = _step_cost(
            build_model(scenario.model.name, in_shape, num_classes), in_shape, num_classes, train
        )
    for name in sorted(set(client_devices)):
        ram = profiles[name].ram_bytes
        if cost.memory_bytes > ram:
            raise ScenarioInfeasible(
                f"model {scenario.model.name} needs {cost.memory_bytes / MiB:.1f} MiB per "
                f"training step at batch {t.batch_size}, but device profile {name!r} has "
                f"{ram / MiB:.0f} MiB of RAM"
            )

    n_hosts = max(1, min(hosts or scenario.execution.hosts or os.cpu_count() or 1, n))
    host_clients: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(n_hosts)]
    for cid in range(n):
        host_clients[cid % n_hosts][cid] = (parts.train[cid], parts.test[cid])
    setup = HostSetup(
        scenario.model.name,
        in_shape,
        num_classes,
        scenario.algorithm.name,
        dict(scenario.algorithm.params),
        train,
        seed,
        init_weights,
        plugins=registry.portable(),
        call_timeout_s=scenario.execution.call_timeout_s,
        compressor=scenario.compressor.name,
        compressor_params=dict(scenario.compressor.params),
    )
    # the network first: with a geometry its association (each client's edge server at
    # the start) is what the servers and the records use
    network = NetworkModel(scenario, profiles)
    if scenario.geometry is not None:
        scenario = scenario.with_association(network.edge_server.tolist())
    server_kwargs = dict(
        algorithm=scenario.algorithm.name,
        layout=layout,
        init_weights=init_weights,
        client_samples={cid: len(parts.train[cid]) for cid in range(n)},
        fraction=scenario.topology.participation,
        params=dict(scenario.algorithm.params),
        seed=seed,
        edge_server_of={cid: int(network.edge_server[cid]) for cid in range(n)},
        plugins=registry.portable(),
        rounds=scenario.rounds,
        call_timeout_s=scenario.execution.call_timeout_s,
    )
    hierarchy_moves = moving_hierarchy(scenario)
    if hierarchy_moves:  # every edge server a process: clients may come to any of them
        server_kwargs["edge_server_ids"] = list(range(scenario.topology.edge_servers))
    backend = backend or scenario.execution.backend
    executor: Executor
    if backend == "ray":
        local_only = [
            f"{i.kind} {i.name!r}"
            for i in registry.used_by(_named(scenario))
            if i.origin == "registered"
        ]
        if local_only:
            raise ScenarioInfeasible(
                f"{', '.join(local_only)}: registered in this process by "
                "mecsim.api.register, which Ray's workers cannot see; run with backend "
                "local, or put it in a plugin file (mecsim run --plugin FILE, "
                "mecsim.api.load_plugin_file) or an installed package"
            )
        try:
            executor = RayExecutor(
                server_kwargs,
                setup,
                pools,
                host_clients,
                ray_address or scenario.execution.ray_address,
            )
        except PlacementTimeout as exc:
            raise RunFailed(str(exc)) from None
    else:
        executor = LocalExecutor(server_kwargs, setup, pools, host_clients)
    info = RunInfo(
        run_id,
        scenario,
        out_dir,
        layout.size,
        layout.nbytes,
        cost.memory_bytes,
        cost.flops,
        client_devices,
        extra={
            "hosts": n_hosts,
            "backend": backend,
            # the optimiser's element-wise update, part of step_flops
            "step_optimizer_flops": cost.optimizer_flops,
            # FLOP/s of the edge server's aggregation (a replay of a run recorded before
            # profiles had this rate aggregates at flops_per_s, as that run did)
            "aggregate_flops_per_s": _aggregate_rate(profiles[scenario.devices.edge_server]),
            "train_samples": [len(p) for p in parts.train],
            "test_samples": [len(p) for p in parts.test],
            # D-bar_KL of DC-PFL (Eq. 1-2) over the clients' train labels
            "label_dkl": heterogeneity_dkl(parts.label_histograms(pools)[0]),
            # what the run used that is not mecsim's own: name, kind, distribution and
            # version, or a plugin file's sha256
            "plugins": [info.as_dict() for info in registry.used_by(_named(scenario))],
        },
    )
    slowdown = faults.slowdown_factors(scenario.faults, seed, n)
    return RunSetup(
        info,
        executor,
        network,
        profiles[scenario.devices.edge_server],
        slowdown,
        streams_aggregation(scenario),
        algorithm_classes(scenario.algorithm.name)[0].drives_rounds,
        hierarchy_moves,
        init_weights,
        Availability.of(scenario.availability, scenario.topology.clients, scenario.seed),
    )


def _aggregate_rate(profile: DeviceProfile) -> float:
    """The FLOP/s at which ``profile`` aggregates (:meth:`DeviceProfile.aggregate_time_s`)."""
    return float(profile.aggregate_flops_per_s or profile.flops_per_s)
