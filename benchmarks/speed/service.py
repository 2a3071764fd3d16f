"""What running through ``mecsim serve`` costs, against ``mecsim run``.

1. **Per round**: the embedded default scenario (FedAvg, 10 clients, 30 rounds) run with
   ``mecsim run`` (its own Ray, started and stopped) and submitted to a warm service (Ray
   already up): end-to-end seconds and the median round wall time (``host_wall_s`` of
   rounds.csv; the first round, which starts the actors, is left out of the median).
   Target: the service's median round within 5 % of the CLI's.
2. **A short run end to end**: the same scenario with ``--short-rounds`` rounds, from the
   command to the last record: the CLI pays Ray's start-up, the warm service does not.
   Target: faster through the service.
3. **Status polls under load**: while a run trains, 50 concurrent pollers each ask
   ``GET /runs/{id}`` and pause ``--poll-interval`` seconds (default 1; 5 of the 50
   scrape ``/metrics`` instead); latency p50 / p99 of the polls answered while rounds
   train. Target: p99 < 50 ms. Each poller starts at its own (seeded) point of the first
   period, as independent users do; ``--in-step`` starts them together instead (a
   burst of 45 requests every period, the worst case). The polls answered after the
   last round, while the run writes its plots, are reported on their own line.

Run order is interleaved (CLI, service, CLI, service, ...) over ``--trials`` to even out
other work on the machine; report ``uptime``'s load with the figures.

    python benchmarks/speed/service.py [--rounds 30] [--short-rounds 3] [--trials 1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import pandas as pd

from mecsim.scenario import default_scenario_path

QUICK_USES_RAY = True  # tests/e2e/test_benchmarks.py marks this benchmark's --quick run "ray"


def _median_round_s(run_dir: Path) -> float:
    walls = pd.read_csv(run_dir / "rounds.csv")["host_wall_s"].tolist()
    return statistics.median(walls[1:] if len(walls) > 1 else walls)


def cli_run(rounds: int, out: Path, run_id: str) -> tuple[float, float]:
    """(end-to-end s, median round s) of `mecsim run` of the default scenario."""
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mecsim",
            "run",
            str(default_scenario_path()),
            "--rounds",
            str(rounds),
            "--out",
            str(out),
            "--run-id",
            run_id,
            "--metrics-port",
            "0",
            "--quiet",
        ],
        check=True,
    )
    return time.perf_counter() - t0, _median_round_s(out / run_id)


class Service:
    def __init__(self, state: Path, overrides: dict[str, object] | None = None) -> None:
        #: the runs' ``set`` (dotted overrides of the default scenario): none but in a smoke run
        self.overrides = {"set": overrides} if overrides else {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mecsim", "serve", "--port", "0", "--state", str(state)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        self.url = re.search(r"(http://\S+?)/ ", line).group(1)
        self.http = httpx.Client(base_url=self.url, timeout=60)
        self.state = state
        self.finished = False
        t0 = time.perf_counter()
        while self.http.get("/readyz").status_code != 200:
            time.sleep(0.2)
        self.ray_start_s = time.perf_counter() - t0

    def run(self, rounds: int) -> tuple[float, float, str]:
        """(end-to-end s from submit to finished, median round s, run id)."""
        text = default_scenario_path().read_text()
        t0 = time.perf_counter()
        run_id = self.http.post(
            "/runs", json={"scenario": text, "rounds": rounds, **self.overrides}
        ).json()["id"]
        while (status := self.http.get(f"/runs/{run_id}").json()["status"]) not in (
            "finished",
            "failed",
            "cancelled",
        ):
            time.sleep(0.25)  # polling is not free: keep it light beside the run
        elapsed = time.perf_counter() - t0
        assert status == "finished", status
        return elapsed, _median_round_s(self.state / "runs" / run_id), run_id

    def poll_latency(
        self, rounds: int, pollers: int, interval_s: float, in_step: bool = False
    ) -> dict[str, list[float]]:
        """Latencies of status polls (and /metrics scrapes) while a run trains."""
        text = default_scenario_path().read_text()
        run_id = self.http.post(
            "/runs", json={"scenario": text, "rounds": rounds, **self.overrides}
        ).json()["id"]
        while self.http.get(f"/runs/{run_id}").json()["rounds_done"] < 1:
            time.sleep(0.1)  # measure while rounds train, not while actors start
        # "status": polls answered while rounds train; "ending": polls answered after the
        # last round's record while the run still writes its plots and summary
        # (matplotlib holds the GIL the API shares, so these wait longer)
        out: dict[str, list[float]] = {"status": [], "ending": [], "metrics": []}
        errors: list[str] = []

        offsets = random.Random(0).random

        async def poller(i: int, session: aiohttp.ClientSession) -> None:
            if not in_step:  # independent users: each starts at its own point of a period
                await asyncio.sleep(offsets() * interval_s)
            while True:
                path = "/metrics" if i < 5 else f"/runs/{run_id}"
                t0 = time.perf_counter()
                try:
                    async with session.get(path) as r:
                        body = await r.read()
                except aiohttp.ClientError as exc:
                    errors.append(repr(exc))
                    return
                took = time.perf_counter() - t0
                if r.status != 200:
                    errors.append(f"{path}: {r.status}")
                    return
                if i < 5:
                    out["metrics"].append(took)
                else:
                    view = json.loads(body)
                    if view["status"] != "running":
                        return
                    training = view["rounds_done"] < view["rounds_planned"]
                    out["status" if training else "ending"].append(took)
                if i < 5 and self.finished:
                    return
                await asyncio.sleep(interval_s)

        self.finished = False

        async def main() -> None:
            # By default each poller starts at its own (seeded) point of the first
            # period, as independent users would; --in-step starts them together, so
            # every period brings a burst of ~45 requests at once (the worst case; the
            # first burst also opens the 45 connections). The client is aiohttp:
            # httpx's AsyncClient spends ~2 ms of CPU per request in this process,
            # which on 2 cores queued the burst in the client and showed as ~100 ms
            # "latency" of a server that answered in under 1 ms.
            connector = aiohttp.TCPConnector(limit=pollers)
            async with aiohttp.ClientSession(
                self.url, connector=connector, timeout=aiohttp.ClientTimeout(total=60)
            ) as s:
                tasks = [asyncio.create_task(poller(i, s)) for i in range(pollers)]
                await asyncio.gather(*tasks[5:])
                self.finished = True
                await asyncio.gather(*tasks[:5])

        asyncio.run(main())
        if errors:
            print(f"poll errors: {len(errors)}, e.g. {errors[:3]}")
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="rounds of the per-round runs")
    p.add_argument("--short-rounds", type=int, default=3, help="rounds of the short runs")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--pollers", type=int, default=50)
    p.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="each poller's pause between requests (default 1)",
    )
    p.add_argument("--poll-rounds", type=int, default=10)
    p.add_argument(
        "--in-step",
        action="store_true",
        help="pollers start together (a burst of requests every period, the "
        "worst case) instead of at their own points of the period",
    )
    p.add_argument("--polls-only", action="store_true", help="only part 3")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where service.json goes (default runs/benchmarks/speed/service)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run through the service only (no mecsim run to compare, no "
        "short run: part 1's run goes through the same calls): 2 rounds on a tenth of "
        "the data, 10 pollers for 2 rounds",
    )
    args = p.parse_args()
    if args.quick:
        args.rounds, args.short_rounds, args.trials = 2, 1, 1
        args.pollers, args.poll_rounds = 10, 2  # 5 scrape /metrics, 5 poll the status
    if args.out is None:
        bench = os.environ.get("MECSIM_BENCH_DIR")
        args.out = Path(bench) / "service" if bench else Path("runs/benchmarks/speed/service")
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # a smoke run trains on a tenth of the data (rounds of a fraction of a second)
        smaller = {"dataset.train_size": 800, "dataset.test_size": 200} if args.quick else None
        service = Service(tmp / "state", smaller)
        results: dict[str, list] = {
            k: []
            for k in ("cli_e2e", "cli_round", "svc_e2e", "svc_round", "cli_short", "svc_short")
        }
        try:
            for t in range(0 if args.polls_only else args.trials):
                if not args.quick:  # a smoke run leaves out the CLI's own Ray starts
                    e2e, rnd = cli_run(args.rounds, tmp / "cli", f"long-{t}")
                    results["cli_e2e"].append(e2e)
                    results["cli_round"].append(rnd)
                e2e, rnd, _ = service.run(args.rounds)
                results["svc_e2e"].append(e2e)
                results["svc_round"].append(rnd)
                if not args.quick:  # a smoke run: part 1 went through the same calls
                    results["cli_short"].append(
                        cli_run(args.short_rounds, tmp / "cli", f"short-{t}")[0]
                    )
                    results["svc_short"].append(service.run(args.short_rounds)[0])
            lat = service.poll_latency(
                args.poll_rounds, args.pollers, args.poll_interval, args.in_step
            )
        finally:
            service.stop()
    med = {k: statistics.median(v) if v else math.nan for k, v in results.items()}
    report = {
        "load_before": load,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "ray_start_s": service.ray_start_s,
        "rounds": args.rounds,
        "short_rounds": args.short_rounds,
        "trials": args.trials,
        **results,
        "round_overhead": med["svc_round"] / med["cli_round"] - 1,
        "pollers_in_step": args.in_step,
        "status_polls": len(lat["status"]),
        "status_p50_ms": 1e3 * _pct(lat["status"], 0.5),
        "status_p99_ms": 1e3 * _pct(lat["status"], 0.99),
        "ending_polls": len(lat["ending"]),
        "ending_p50_ms": 1e3 * _pct(lat["ending"], 0.5),
        "ending_p99_ms": 1e3 * _pct(lat["ending"], 0.99),
        "metrics_scrapes": len(lat["metrics"]),
        "metrics_p50_ms": 1e3 * _pct(lat["metrics"], 0.5),
        "metrics_p99_ms": 1e3 * _pct(lat["metrics"], 0.99),
    }
    (args.out / "service.json").write_text(json.dumps(report, indent=1))
    print(
        f"machine: {os.cpu_count()} cpus, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"before, {report['load_after'][0]:.2f} after; service's Ray start "
        f"{service.ray_start_s:.1f} s"
    )
    print(f"default scenario, {args.rounds} rounds (median of {args.trials}):")
    print(
        f"  mecsim run     {med['cli_e2e']:7.1f} s end to end, median round "
        f"{med['cli_round']:.3f} s"
    )
    print(
        f"  warm service   {med['svc_e2e']:7.1f} s end to end, median round "
        f"{med['svc_round']:.3f} s  (per-round overhead {100 * report['round_overhead']:+.1f} "
        "%, target <= 5 %)"
    )
    print(
        f"short run, {args.short_rounds} rounds: mecsim run {med['cli_short']:.1f} s, warm "
        f"service {med['svc_short']:.1f} s end to end (target: service faster)"
    )
    print(
        f"{args.pollers} pollers{' in step' if args.in_step else ''} every "
        f"{args.poll_interval:g} s while a run trains: "
        f"status p50 {report['status_p50_ms']:.1f} ms, p99 {report['status_p99_ms']:.1f} ms "
        f"over {report['status_polls']} polls (target p99 < 50 ms); /metrics p50 "
        f"{report['metrics_p50_ms']:.1f} ms, p99 {report['metrics_p99_ms']:.1f} ms"
    )
    print(
        f"  after the last round, while the run writes its plots: status p50 "
        f"{report['ending_p50_ms']:.1f} ms, p99 {report['ending_p99_ms']:.1f} ms over "
        f"{report['ending_polls']} polls"
    )
    print(f"wrote {args.out / 'service.json'}")


if __name__ == "__main__":
    main()
