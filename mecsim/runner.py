"""The round loop, written once: plan -> execute -> time -> aggregate -> record.

1. **Plan**: the algorithm's server side picks the round's clients and what each downloads.
2. **Execute**: the selected clients train for real on their hosts; each returns its
   update and its op-trace.
3. **Time**: the SimPy engine plays the op-traces through the round's network and the
   device CPUs; with a deadline, late clients are dropped before aggregation.
4. **Aggregate**: the server aggregates what made the deadline (measured: wall time,
   FLOPs, RSS); its emulated time comes from the edge server's device profile.
5. **Record**: observers (records, metrics, progress) receive the round's rows.

Observers implement :class:`RunObserver`'s do-nothing hooks; the loop knows nothing of
files, Prometheus or progress bars.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from agents.algorithms import TrainConfig
from agents.host import HostSetup
from agents.models import build_model, get_flat, model_layout
from agents.training import make_optimizer, measured_step
from mecsim.data import heterogeneity_dkl, load_dataset, partition
from mecsim.devices import DeviceProfile
from mecsim.engine import time_round
from mecsim.execution import LocalExecutor, RayExecutor
from mecsim.network import NetworkModel, device_profiles
from mecsim.ops import op_to_dict, trace_bytes
from mecsim.scenario import Scenario

MiB = 1024 * 1024


class RunObserver:
    """Hooks of the run loop; override the ones you need."""

    def on_run_start(self, info: RunInfo) -> None: ...

    def on_round_end(self, info: RunInfo, round_row: dict[str, Any],
                     client_rows: list[dict[str, Any]], traces: dict[str, Any]) -> None: ...

    def on_run_end(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None: ...


@dataclass
class RunInfo:
    run_id: str
    scenario: Scenario
    out_dir: Any  # pathlib.Path or None
    num_params: int
    model_nbytes: int
    step_memory_bytes: int
    step_flops: float
    client_devices: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


class ScenarioInfeasible(Exception):
    """The scenario cannot run as written (e.g. the model does not fit a device's RAM)."""


@dataclass
class RunSetup:
    info: RunInfo
    executor: Any
    network: NetworkModel
    server_profile: DeviceProfile


def _step_cost(model: torch.nn.Module, in_shape, num_classes: int, train: TrainConfig):
    """FLOPs and memory of one training step at the scenario's batch size (before the run)."""
    x = torch.zeros((train.batch_size, *in_shape))
    y = torch.arange(train.batch_size) % num_classes
    opt = make_optimizer(train.optimizer, model.parameters(), train.lr, train.momentum)
    _, cost = measured_step(model, opt, x, y, None)
    return cost


def prepare(scenario: Scenario, run_id: str, out_dir, *, hosts: int | None = None,
            backend: str | None = None, ray_address: str | None = None) -> RunSetup:
    """Load data, partition, build the model and network, start hosts and the server."""
    seed = scenario.seed
    n = scenario.topology.clients
    data_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    ds = scenario.dataset
    pools = load_dataset(ds.name, ds.root, ds.train_size, ds.test_size, data_rng)
    part_params = ds.partition.model_dump(exclude={"method"})
    parts = partition(pools, n, ds.partition.method, data_rng, **part_params)

    in_shape = tuple(int(s) for s in pools.train.images.shape[1:])
    num_classes = pools.train.num_classes
    torch.manual_seed(seed)
    model = build_model(scenario.model.name, in_shape, num_classes)
    layout = model_layout(model)
    init_weights = get_flat(model, layout)
    t = scenario.training
    train = TrainConfig(t.epochs, t.batch_size, t.optimizer, t.lr, t.momentum, t.weight_decay)

    profiles = device_profiles(scenario)
    client_devices = scenario.client_profiles()
    cost = _step_cost(build_model(scenario.model.name, in_shape, num_classes), in_shape,
                      num_classes, train)
    for name in sorted(set(client_devices)):
        ram = profiles[name].ram_bytes
        if cost.memory_bytes > ram:
            raise ScenarioInfeasible(
                f"model {scenario.model.name} needs {cost.memory_bytes / MiB:.1f} MiB per "
                f"training step at batch {t.batch_size}, but device profile {name!r} has "
                f"{ram / MiB:.0f} MiB of RAM")

    n_hosts = max(1, min(hosts or scenario.execution.hosts or os.cpu_count() or 1, n))
    host_clients: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(n_hosts)]
    for cid in range(n):
        host_clients[cid % n_hosts][cid] = (parts.train[cid], parts.test[cid])
    setup = HostSetup(scenario.model.name, in_shape, num_classes, scenario.algorithm.name,
                      dict(scenario.algorithm.params), train, seed, init_weights)
    server_kwargs = dict(
        algorithm=scenario.algorithm.name, layout=layout, init_weights=init_weights,
        client_samples={cid: len(parts.train[cid]) for cid in range(n)},
        fraction=scenario.topology.participation, params=dict(scenario.algorithm.params),
        seed=seed, edge_server_of={cid: scenario.edge_server_of(cid) for cid in range(n)},
    )
    backend = backend or scenario.execution.backend
    if backend == "ray":
        executor = RayExecutor(server_kwargs, setup, pools, host_clients,
                               ray_address or scenario.execution.ray_address)
    else:
        executor = LocalExecutor(server_kwargs, setup, pools, host_clients)
    info = RunInfo(run_id, scenario, out_dir, layout.size, layout.nbytes, cost.memory_bytes,
                   cost.flops, client_devices,
                   extra={"hosts": n_hosts, "backend": backend,
                          "train_samples": [len(p) for p in parts.train],
                          "test_samples": [len(p) for p in parts.test],
                          # D-bar_KL of DC-PFL (Eq. 1-2) over the clients' train labels
                          "label_dkl": heterogeneity_dkl(parts.label_histograms(pools)[0])})
    network = NetworkModel(scenario, profiles)
    return RunSetup(info, executor, network, profiles[scenario.devices.edge_server])


def _mean(values: list[float]) -> float:
    """Mean ignoring NaN (a client without test data has NaN accuracy)."""
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


def run_round(rs: RunSetup, rnd: int, elapsed_s: float) -> tuple[dict, list[dict], dict]:
    """One round; returns (round row, client rows, op-traces record)."""
    sc = rs.info.scenario
    wall0 = time.perf_counter()
    selected, tasks = rs.executor.plan(rnd)
    results = rs.executor.fit(rnd, tasks)
    train_wall = time.perf_counter() - wall0
    traces = {r.client_id: r.trace for r in results}
    specs, servers, net, channel_rows = rs.network.round(rnd, selected, elapsed_s)

    timing = time_round(traces, specs, servers, net)
    completed_ids = {c.client_id for c in timing.clients if c.completed}
    agg = rs.executor.aggregate(rnd, [r for r in results if r.client_id in completed_ids])
    aggregate_s = rs.server_profile.compute_time_s(agg.flops, 0)
    timing = time_round(traces, specs, servers, net, aggregate_s=aggregate_s)

    evals: dict[int, tuple[float, float]] = {}
    eval_extras: dict[int, dict[str, float]] = {}  # an algorithm's own per-client figures
    last = rnd == sc.rounds - 1
    if (rnd + 1) % sc.evaluation.every == 0 or last:
        who = list(range(sc.topology.clients)) if sc.evaluation.clients == "all" else selected
        for cid, acc, loss, _, *extra in rs.executor.evaluate(rnd, who):
            evals[cid] = (acc, loss)
            if extra:
                eval_extras[cid] = extra[0]
    host_wall = time.perf_counter() - wall0

    by_id = {r.client_id: r for r in results}
    tl_by_id = {c.client_id: c for c in timing.clients}
    client_rows: list[dict[str, Any]] = []
    for cid in sorted(set(selected) | set(evals)):
        row: dict[str, Any] = {"run_id": rs.info.run_id, "round": rnd, "client_id": cid,
                               "device": rs.info.client_devices[cid],
                               "edge_server": sc.edge_server_of(cid),
                               "selected": cid in by_id}
        if cid in by_id:
            r, tl = by_id[cid], tl_by_id[cid]
            up, down = trace_bytes(r.trace)
            row.update(completed=tl.completed, start_s=tl.start_s, finish_s=tl.finish_s,
                       download_s=tl.download_s, compute_s=tl.compute_s,
                       upload_s=tl.upload_s, server_compute_s=tl.server_compute_s,
                       bytes_up=up, bytes_down=down, gflops=r.flops / 1e9, steps=r.steps,
                       num_samples=r.num_samples, train_loss=r.train_loss,
                       peak_memory_mb=r.peak_memory_bytes / MiB, host_train_s=r.host_seconds)
            row.update(channel_rows.get(cid, {}))
        if cid in evals:
            row["accuracy"], row["test_loss"] = evals[cid]
        client_rows.append(row)

    accs = [a for a, _ in evals.values() if not np.isnan(a)]
    up_total = sum(trace_bytes(r.trace)[0] for r in results)
    down_total = sum(trace_bytes(r.trace)[1] for r in results)
    round_row = {
        "run_id": rs.info.run_id, "round": rnd, "algorithm": sc.algorithm.name,
        "selected": len(selected), "completed": len(completed_ids),
        "dropped": len(timing.dropped),
        "round_time_s": timing.round_time_s, "dl_time_s": timing.download_s,
        "client_time_s": timing.client_s, "ul_time_s": timing.upload_s,
        "server_time_s": timing.server_s, "backhaul_time_s": timing.backhaul_s,
        "idle_time_s": timing.idle_s,
        "elapsed_s": elapsed_s + timing.round_time_s,
        "bytes_up": up_total, "bytes_down": down_total,
        "client_gflops": sum(r.flops for r in results) / 1e9,
        "server_gflops": agg.flops / 1e9,
        "server_rss_mb": agg.rss_bytes / MiB,
        "client_peak_mb": max((r.peak_memory_bytes for r in results), default=0) / MiB,
        "mean_accuracy": _mean(accs),
        "min_accuracy": min(accs) if accs else float("nan"),
        "max_accuracy": max(accs) if accs else float("nan"),
        "mean_test_loss": _mean([lo for _, lo in evals.values()]),
        "train_loss": _mean([r.train_loss for r in results]),
        "host_wall_s": host_wall, "host_train_wall_s": train_wall,
        "host_aggregate_s": agg.wall_s,
        **agg.metrics,
        **{f"mean_{k}": _mean([e[k] for e in eval_extras.values()])
           for k in sorted({k for e in eval_extras.values() for k in e})},
    }
    trace_record = {
        "round": rnd, "aggregate_flops": agg.flops, "selected": list(selected),
        "clients": {str(cid): [op_to_dict(op) for op in tr] for cid, tr in traces.items()},
    }
    return round_row, client_rows, trace_record


def run(scenario: Scenario, run_id: str, out_dir=None, observers: list[RunObserver] = (),
        *, should_stop: Callable[[], bool] | None = None,
        **prepare_kwargs) -> list[dict[str, Any]]:
    """Run every round of ``scenario``; returns the round rows.

    ``should_stop`` is asked after every round; when it returns True the run stops there,
    keeping the rounds done (a service cancelling a running run uses it).
    """
    rs = prepare(scenario, run_id, out_dir, **prepare_kwargs)
    rows: list[dict[str, Any]] = []
    try:
        for obs in observers:
            obs.on_run_start(rs.info)
        elapsed = 0.0
        for rnd in range(scenario.rounds):
            row, client_rows, traces = run_round(rs, rnd, elapsed)
            elapsed = row["elapsed_s"]
            rows.append(row)
            for obs in observers:
                obs.on_round_end(rs.info, row, client_rows, traces)
            if should_stop is not None and should_stop() and rnd + 1 < scenario.rounds:
                break
        for obs in observers:
            obs.on_run_end(rs.info, rows)
    finally:
        rs.executor.close()
    return rows
