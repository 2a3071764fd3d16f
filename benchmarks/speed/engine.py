"""How fast does the timing engine time rounds? Client-rounds per second for each path.

Three workloads, built from op-traces that real training runs of the shipped scenarios
recorded (each recorded once, in-process, into ``--record-dir``, and reused):

1. **Shared access point**: ``scenarios/fedavg-mnist-100-wifi.yaml`` (FedAvg, a shared
   20 Mbps uplink and 50 Mbps downlink, a 20 s deadline, half Pi 2B / half Pi 4). Its
   recorded clients' op-traces are dealt out to ``--clients`` clients (10,000), each
   round's client specs come from the scenario's network model with that many clients,
   all selected. Target: 10,000 clients x 100 rounds in <= 10 s (the default path).
2. **Contention-free**: the same rounds with every link dedicated (the closed form).
3. **PHSFL 4 x 25, per batch**: ``scenarios/phsfl-mnist-4x25.yaml`` (split learning:
   per batch a client computes, uploads activations over its edge server's shared
   uplink, waits for the edge server's shared CPU and downloads the gradient; backhaul
   transfers to the central server), recorded with the paper's N = 5 batches per epoch
   (12,900 ops a round) on 2 clients per edge server and dealt out to the 4 x 25
   clients. Target: <= 0.05 s a round. (--quick: one batch of one epoch, one client
   per edge server.)

4. **Moving clients, geometric interference** (the mobility speed case): the shared-AP
   scenario's clients (``--clients``, all selected, the same op-traces dealt out) on 7
   hexagonal 3GPP UMi cells 200 m apart, walking by random waypoint (0.5-1.5 m/s, pauses
   up to 60 s, as ``scenarios/mec-campus-walk.yaml``), association ``strongest`` with 3 dB
   of hysteresis and 1 s to trigger, ``channel.interference: {model: geometric, reuse:
   --reuse}``, **dedicated links** (contention-free: every client has its own band, so
   the engine takes the closed form; the shared medium is the first workload's case),
   the scenario's 20 s deadline. What is timed is the **whole per-round path a run
   takes** (:func:`mecsim.emulation.timing.emulate_round` and ``EmulatedRound.time``, as
   :func:`mecsim.run.round.run_round`): the network model (positions at the round's start,
   path losses and re-association with A3, the channel's draws, the per-round
   interference, the per-client records) and then the engine; each round starts where the
   last ended (emulated time), so the clients move between rounds. Target: 10,000
   clients x 100 rounds in <= 15 s. The network's and the engine's shares are printed.
   ``--instant``: the interference per instant (``channel.interference.timing:
   instant``), each round timed as a run times it (per-instant rounds are solved on
   client specs, not columns: ``emulate_round`` without records, then the solutions).

5. **Moving clients on shared cells**: workload 4's walkers with each cell's uplink and
   downlink one shared medium (``access: shared_cell``, 20 MHz; ``downlink.mode:
   shared``) and ``rate: step``: processor sharing re-rated where a walker's rate
   changes (at the 1 s grid). Timed as a run times it (:func:`emulate_round`, then the
   engine, apart), and on ``--simpy-rounds`` rounds ``events`` and SimPy, checked
   identical. No target yet.

Each path is timed on the same rounds: ``auto`` (what runs use; the path it takes is
printed), ``media``, ``events``, and the SimPy model on ``--simpy-rounds`` rounds
(extrapolated), checking that every path gives identical timelines on those rounds.

    nice -n 10 python benchmarks/speed/engine.py [--clients 10000] [--rounds 100] \
        [--reuse 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
WIFI = ROOT / "scenarios" / "fedavg-mnist-100-wifi.yaml"
PHSFL = ROOT / "scenarios" / "phsfl-mnist-4x25.yaml"

# where recorded runs are kept and reused (MECSIM_BENCH_DIR, else /tmp/mecsim-bench)
RECORD_DIR = Path(os.environ.get("MECSIM_BENCH_DIR", "/tmp/mecsim-bench"))


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def recorded(path: Path, record_dir: Path, changes: dict, label: str):
    """The run of ``path`` with ``changes`` (top-level sections merged), recorded once."""
    from mecsim.analysis.whatif_sweep import record
    from mecsim.scenario import load_scenario, scenario_from_dict

    def merge(into: dict, changes: dict) -> None:
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    data = load_scenario(path).model_dump(mode="json")
    merge(data, changes)
    data["execution"] = {**data["execution"], "backend": "local", "hosts": 1}
    scenario = scenario_from_dict(data, f"{path} ({label})")
    t0 = time.perf_counter()
    run = record(scenario, record_dir)
    print(f"  recorded run: {run.run_dir} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return run


def scaled(path: Path, clients: int):
    """The scenario with ``clients`` clients, all selected, device groups scaled alike."""
    from mecsim.scenario import load_scenario, scenario_from_dict

    data = load_scenario(path).model_dump(mode="json")
    old = data["topology"]["clients"]
    data["topology"] = {**data["topology"], "clients": clients, "participation": 1.0}
    groups = data["devices"]["clients"]
    for g in groups:
        if g.get("count") is not None:
            g["count"] = max(1, g["count"] * clients // old)
    return scenario_from_dict(data, f"{path} x {clients} clients")


class Workload:
    """Rounds of (traces, specs, servers, network), built on the fly (not timed)."""

    def __init__(
        self, scenario, pools: list[list[tuple]], n_rounds: int, dedicated: bool = False
    ) -> None:
        from dataclasses import replace

        from mecsim.emulation.network import NetworkModel, device_profiles

        self.network = NetworkModel(scenario, device_profiles(scenario))
        self.n_clients = scenario.topology.clients
        self.pools, self.n_rounds = pools, n_rounds
        if dedicated:
            self.network.network = replace(
                self.network.network, uplink_shared=False, downlink_shared=False
            )

    def rounds(self):
        ids = list(range(self.n_clients))
        for r in range(self.n_rounds):
            pool = self.pools[r % len(self.pools)]
            traces = {c: pool[(c + 7 * r) % len(pool)] for c in ids}
            specs, servers, net, _ = self.network.round(r, ids, 0.0, records=False)
            yield traces, specs, servers, net

    def ops_per_round(self) -> float:
        ops = [sum(map(len, traces.values())) for traces, *_ in self.rounds()]
        return sum(ops) / max(len(ops), 1)


def timed(workload: Workload, method: str, n_rounds: int | None = None):
    """(wall s, CPU s spent in time_round, results, path auto takes) over the first
    ``n_rounds`` rounds. CPU seconds (this process's) tell apart the time the engine
    needs from the time it waited for a core on a busy machine."""
    from mecsim.emulation.engine import time_round

    try:
        from mecsim.emulation.engine import engine_path
    except ImportError:  # a mecsim from before the engine had paths (for before/after)

        def engine_path(*_):
            return "?"

    wall = cpu = 0.0
    results, path = [], None
    for k, (traces, specs, servers, net) in enumerate(workload.rounds()):
        if n_rounds is not None and k >= n_rounds:
            break
        c0, t0 = time.process_time(), time.perf_counter()
        results.append(time_round(traces, specs, servers, net, method=method))
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        if path is None:
            path = engine_path(traces, specs, servers, net)
    return wall, cpu, results, path


def bench(
    name: str,
    workload: Workload,
    methods: list[str],
    simpy_rounds: int,
    target_s: float | None,
    per_round_target: bool = False,
) -> None:
    n, r = workload.n_clients, workload.n_rounds
    print(f"{name}: {n:,} clients x {r} rounds ({load()})", flush=True)
    firsts = {}  # each method's timings of the first rounds, to compare
    for method in methods:
        k = simpy_rounds if method == "simpy" else r
        if k == 0:
            continue
        spent, cpu, results, path = timed(workload, method, k)
        firsts[method] = results[: max(simpy_rounds, 1)]
        rate = n * k / spent
        via = f" -> {path}" if method == "auto" else ""
        line = (
            f"  {method}{via}: {spent:.3f} s for {k} rounds (CPU {cpu:.3f} s), "
            f"{spent / k:.4f} s a round, {rate:,.0f} client-rounds/s"
        )
        if k < r:
            line += f" (x{r} = {spent / k * r:.1f} s extrapolated)"
        if method == "auto" and target_s is not None:
            total = spent / k if per_round_target else spent
            unit = "a round" if per_round_target else "in all"
            verdict = "met" if total <= target_s else "MISSED"
            line += f"  [target <= {target_s:g} s {unit}: {verdict}]"
        print(line, flush=True)
    if len(firsts) > 1:
        k = min(map(len, firsts.values()))
        ref = next(iter(firsts.values()))[:k]
        same = all(v[:k] == ref for v in firsts.values())
        print(
            f"  identical timelines on the first {k} round(s) from {', '.join(firsts)}: {same}",
            flush=True,
        )


def moving_scenario(clients: int, reuse: int, handover: bool = False, instant: bool = False):
    """The shared-AP scenario with ``clients`` clients on 7 hexagonal UMi cells, walking,
    geometric interference of reuse factor ``reuse`` (the module's docstring, 4);
    ``handover``: with handover during rounds (``geometry.handover`` at its defaults);
    ``instant``: the interference per instant (``channel.interference.timing:
    instant``)."""
    from mecsim.scenario import load_scenario, scenario_from_dict

    data = scaled(WIFI, clients).model_dump(mode="json")
    data["topology"] = {**data["topology"], "edge_servers": 7}
    data["channel"] = {
        "model": "shannon",
        "interference": {
            "model": "geometric",
            "reuse": reuse,
            **({"timing": "instant"} if instant else {}),
        },
        "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5},
    }
    campus = load_scenario(ROOT / "scenarios" / "mec-campus-walk.yaml")
    assert campus.geometry is not None
    data["geometry"] = campus.geometry.model_dump(mode="json", exclude_none=True)
    # each transfer's rate follows its client (the default for clients that move)
    data["geometry"]["mobility"]["rate"] = "step"
    if handover:
        data["geometry"]["handover"] = {}
    return scenario_from_dict(data, f"{WIFI.name} x {clients} clients, moving, reuse {reuse}")


def bench_moving(
    scenario,
    pools: list[list[tuple]],
    n_rounds: int,
    target_s: float | None,
    run_path: bool = True,
):
    """The mobility speed case, each round starting at the emulated time the previous one
    ended, timed two ways on the same rounds:

    - **engine** (the target): what re-timing such a run takes, as a replay or a what-if
      sweep does it: the network model's round (positions at the round's start, path
      losses, re-association with A3, the channel's draws, the geometric interference,
      each client's links as columns: :meth:`NetworkModel.links` and ``columns``) and
      the engine on columns (the traces planned once, as a replay caches them per
      recorded round; the moving links' rates integrated over the mobility grid);
    - **run path**: what a training run's round adds on top (:func:`emulate_round`: a
      ClientSpec and a rate object per client, the per-client channel records), which
      the engine's other workloads leave out too (their specs are built untimed)."""
    from dataclasses import replace

    from mecsim.emulation.engine import plan_traces, time_round_columns
    from mecsim.emulation.faults import slowdown_factors
    from mecsim.emulation.network import NetworkModel, device_profiles
    from mecsim.emulation.timing import emulate_round

    def network_model():
        network = NetworkModel(scenario, device_profiles(scenario))
        # dedicated links: contention-free, the engine's closed form
        network.network = replace(network.network, uplink_shared=False, downlink_shared=False)
        return network

    n = scenario.topology.clients
    ids = list(range(n))
    slowdown = slowdown_factors(scenario.faults, scenario.seed, n)
    g = scenario.geometry
    print(
        f"moving clients, geometric interference (reuse {scenario.channel.interference.reuse}, "
        f"{len(g.sites_m())} cells, {g.mobility.model}, rate: {g.mobility.rate}, dedicated "
        f"links): {n:,} clients x {n_rounds} rounds ({load()})",
        flush=True,
    )
    rounds = []
    for r in range(n_rounds):
        pool = pools[r % len(pools)]
        traces = {c: pool[(c + 7 * r) % len(pool)] for c in ids}
        rounds.append((traces, plan_traces(traces)))  # not timed (a replay caches plans)

    # the engine: network model and engine on columns
    t0 = time.perf_counter()
    network = network_model()
    setup_s = time.perf_counter() - t0
    elapsed_s = net_wall = eng_wall = cpu = 0.0
    handovers, ul_w, engine_times = 0, [], []
    instant = network.instant
    for r, (traces, plan) in enumerate(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        if instant:
            # per instant: the round is solved on ClientSpecs (EmulatedRound.time), no
            # records; network model = the links and specs, engine = the solutions
            emulated = emulate_round(
                network, scenario.faults, slowdown, r, ids, elapsed_s, (), (), records=False
            )
            w1 = time.perf_counter()
            round_time_s = emulated.time(traces).round_time_s
        else:
            links = network.links(r, ids, elapsed_s)
            cols = network.columns(links, ids)
            w1 = time.perf_counter()
            round_time_s = time_round_columns(plan, cols, network.network).summary.round_time_s
        w2 = time.perf_counter()
        cpu += time.process_time() - c0
        net_wall, eng_wall = net_wall + (w1 - w0), eng_wall + (w2 - w1)
        elapsed_s += round_time_s
        engine_times.append(round_time_s)
        handovers += int(network.round_cells.handovers.sum())
        if not instant:
            ul_w.append(float(np.median(links.channel.ul_interference_w)))
    total = net_wall + eng_wall
    line = (
        f"  engine: {total:.3f} s for {n_rounds} rounds (CPU {cpu:.3f} s), "
        f"{total / n_rounds:.4f} s a round, {n * n_rounds / total:,.0f} client-rounds/s; "
        f"network model {net_wall:.3f} s, engine {'per instant' if instant else 'on columns'} "
        f"{eng_wall:.3f} s (setup, not "
        f"timed: {setup_s:.2f} s)"
    )
    if target_s is not None:
        line += f"  [target <= {target_s:g} s in all: {'met' if total <= target_s else 'MISSED'}]"
    print(line, flush=True)
    timeline = network.moving.timeline if network.moving is not None else None
    during = (
        ""
        if timeline is None
        else f" ({int(timeline.count.sum())} at measurement times, during the rounds)"
    )
    print(
        f"  emulated {elapsed_s:.1f} s, {handovers} handovers{during}"
        + ("" if instant else f", median uplink interference {np.median(ul_w):.3e} W")
        + f" ({load()})",
        flush=True,
    )

    if not run_path:
        return
    # the run path: emulate_round (ClientSpecs, rate objects, records) and the engine
    network = network_model()
    elapsed_s = wall = cpu = 0.0
    for r, (traces, _) in enumerate(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        emulated = emulate_round(network, scenario.faults, slowdown, r, ids, elapsed_s, (), ())
        timing = emulated.time(traces)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        if timing.round_time_s != engine_times[r]:
            raise SystemExit(f"round {r}: run path {timing.round_time_s} != columns")
        elapsed_s += timing.round_time_s
    print(
        f"  run path (+ a ClientSpec, rate objects and channel records per client): "
        f"{wall:.3f} s (CPU {cpu:.3f} s), the same round times ({load()})",
        flush=True,
    )


def moving_shared_scenario(clients: int, reuse: int):
    """Workload 5: workload 4's walkers on shared cells: each cell's uplink one medium of
    20 MHz (``access: shared_cell``) and its downlink one medium (``mode: shared``), the
    moving rates re-rating the media where they change (``rate: step``)."""
    from mecsim.scenario import scenario_from_dict

    data = moving_scenario(clients, reuse).model_dump(mode="json")
    data["channel"]["uplink"] = {
        **data["channel"]["uplink"],
        "shared": True,
        "access": "shared_cell",
        "bandwidth_hz": 20e6,
    }
    data["channel"]["downlink"] = {**data["channel"]["downlink"], "mode": "shared"}
    return scenario_from_dict(data, f"{WIFI.name} x {clients} clients, moving, shared cells")


def bench_moving_shared(scenario, pools: list[list[tuple]], n_rounds: int, check_rounds: int):
    """Workload 5, each round starting where the last ended: the run path
    (:func:`emulate_round`: the network model and a ClientSpec per client, whose moving
    links are :class:`~mecsim.emulation.moving_rate.MovingRate` objects) and the engine
    (``auto``: ``media`` for groups this large), timed apart; on the first
    ``check_rounds`` rounds ``events`` and the SimPy model time the same specs too,
    checked identical, and timed."""
    from mecsim.emulation.engine import engine_path, time_round
    from mecsim.emulation.faults import slowdown_factors
    from mecsim.emulation.network import NetworkModel, device_profiles
    from mecsim.emulation.timing import emulate_round

    n = scenario.topology.clients
    ids = list(range(n))
    slowdown = slowdown_factors(scenario.faults, scenario.seed, n)
    g = scenario.geometry
    print(
        f"moving clients on shared cells ({len(g.sites_m())} cells, shared uplink and "
        f"downlink per cell, {g.mobility.model}, rate: {g.mobility.rate}, reuse "
        f"{scenario.channel.interference.reuse}): {n:,} clients x {n_rounds} rounds ({load()})",
        flush=True,
    )
    network = NetworkModel(scenario, device_profiles(scenario))
    assert network.network.uplink_shared and network.network.downlink_shared
    elapsed_s = net_wall = eng_wall = cpu = 0.0
    other = {"events": 0.0, "simpy": 0.0}
    path = ""
    for r in range(n_rounds):
        pool = pools[r % len(pools)]
        traces = {c: pool[(c + 7 * r) % len(pool)] for c in ids}
        c0, w0 = time.process_time(), time.perf_counter()
        emulated = emulate_round(network, scenario.faults, slowdown, r, ids, elapsed_s, (), ())
        w1 = time.perf_counter()
        timing = emulated.time(traces)
        w2 = time.perf_counter()
        cpu += time.process_time() - c0
        net_wall, eng_wall = net_wall + (w1 - w0), eng_wall + (w2 - w1)
        if r < check_rounds:
            args = (traces, emulated.specs, emulated.servers, emulated.network)
            path = engine_path(*args)
            for method in other:
                t = time.perf_counter()
                got = time_round(*args, method=method)
                other[method] += time.perf_counter() - t
                if got != timing:
                    raise SystemExit(f"round {r}: {method} != {path}")
        elapsed_s += timing.round_time_s
    total = net_wall + eng_wall
    k = min(check_rounds, n_rounds)
    print(
        f"  run path: {total:.3f} s for {n_rounds} rounds (CPU {cpu:.3f} s), "
        f"{total / n_rounds:.4f} s a round: network model and specs {net_wall:.3f} s, "
        f"engine ({path or 'auto'}) {eng_wall:.3f} s, {eng_wall / n_rounds:.4f} s a round; "
        f"emulated {elapsed_s:.1f} s",
        flush=True,
    )
    if k:
        print(
            f"  on the first {k} round(s), the same specs: events "
            f"{other['events'] / k:.4f} s a round, SimPy {other['simpy'] / k:.4f} s a "
            f"round; identical timelines ({load()})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10_000, help="shared-AP round size")
    p.add_argument("--rounds", type=int, default=100, help="shared-AP rounds")
    p.add_argument("--phsfl-rounds", type=int, default=30, help="PHSFL rounds (>= 1)")
    p.add_argument("--simpy-rounds", type=int, default=3)
    p.add_argument(
        "--reuse", type=int, choices=(1, 3), default=3, help="moving case: the reuse factor"
    )
    p.add_argument(
        "--only-moving",
        action="store_true",
        help="time the moving-clients case alone (the mobility speed case)",
    )
    p.add_argument(
        "--handover",
        action="store_true",
        help="moving case: with handover during rounds (geometry.handover at its defaults)",
    )
    p.add_argument(
        "--instant",
        action="store_true",
        help="moving case: interference per instant (channel.interference.timing: instant)",
    )
    p.add_argument(
        "--engine-only",
        action="store_true",
        help="moving case: the engine's figure only (not the run path's)",
    )
    p.add_argument(
        "--only-moving-shared",
        action="store_true",
        help="time the moving-clients-on-shared-cells case alone (workload 5)",
    )
    p.add_argument("--methods", nargs="+", default=["auto", "media", "events", "simpy"])
    p.add_argument(
        "--record-dir",
        type=Path,
        default=RECORD_DIR,
        help="where the recorded runs are kept and reused (default %(default)s, "
        "or $MECSIM_BENCH_DIR)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds, not minutes: 1,000 clients x 5 rounds, small records",
    )
    args = p.parse_args(argv)
    if min(args.clients, args.rounds, args.phsfl_rounds) < 1 or args.simpy_rounds < 0:
        p.error("--clients, --rounds, --phsfl-rounds must be >= 1, --simpy-rounds >= 0")
    if args.quick:
        args.clients, args.rounds, args.phsfl_rounds, args.simpy_rounds = 1000, 5, 3, 1
    print(f"engine benchmark on {os.cpu_count()} cores ({load()})", flush=True)

    wifi_run = recorded(WIFI, args.record_dir, {"rounds": 1 if args.quick else 3}, "engine")
    pools = [list(rec.traces.values()) for rec in wifi_run.rounds]
    print(f"  {sum(map(len, pools))} recorded client op-traces, e.g. {pools[0][0]}")
    if args.only_moving:
        bench_moving(
            moving_scenario(args.clients, args.reuse, args.handover, args.instant),
            pools,
            args.rounds,
            15.0,
            run_path=not args.engine_only,
        )
        return
    shared = moving_shared_scenario(args.clients, args.reuse)
    if args.only_moving_shared:
        bench_moving_shared(shared, pools, args.rounds, args.simpy_rounds)
        return
    wifi = scaled(WIFI, args.clients)
    bench(
        "shared access point (FedAvg, shared uplink + downlink)",
        Workload(wifi, pools, args.rounds),
        args.methods,
        args.simpy_rounds,
        10.0,
    )
    bench(
        "contention-free (the same rounds, dedicated links)",
        Workload(wifi, pools, args.rounds, dedicated=True),
        ["auto", *(m for m in args.methods if m != "auto")],
        args.simpy_rounds,
        None,
    )

    bench_moving(moving_scenario(args.clients, args.reuse), pools, args.rounds, 15.0)
    bench_moving_shared(shared, pools, args.rounds, args.simpy_rounds)

    per_epoch = 1 if args.quick else 5
    phsfl_run = recorded(
        PHSFL,
        args.record_dir,
        {
            "rounds": 1 if args.quick else 3,
            "topology": {"clients": 4 if args.quick else 8},
            "training": {"epochs": 1 if args.quick else 5},
            "algorithm": {"params": {"batches_per_epoch": per_epoch}},
        },
        "engine",
    )
    pools = [list(rec.traces.values()) for rec in phsfl_run.rounds]
    phsfl = scaled(PHSFL, 100)
    work = Workload(phsfl, pools, args.phsfl_rounds)
    print(f"  PHSFL rounds of {work.ops_per_round():,.0f} ops on average")
    bench(
        f"PHSFL 4 x 25 per batch (N = {per_epoch})",
        work,
        args.methods,
        args.simpy_rounds,
        0.05,
        per_round_target=True,
    )


if __name__ == "__main__":
    main()
