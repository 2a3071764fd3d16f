"""The TCP cases mecsim's transfer times are validated on, and their ns-3 reference numbers.

Each case is one run of ``validation/ns3/tcp_flows.cc`` per seed and congestion control:
``flows`` flows of ``bytes`` each through one bottleneck of ``rate_bps`` and ``delay_s``
(one way; the ACKs take the same delay back) with per-packet loss ``loss`` on the data
direction, all starting together on already-open connections. The time of a run is its
last flow's (from its first data segment sent to its last byte received); over the seeds
(``--seed=1 --run=k``, k = 1..seeds) the reference keeps mean, min and max, for Cubic
(the default) and for NewReno (ns-3's own variant, to show the spread beside Cubic).
Cases without loss have nothing random in them and run once.

``python -m validation.cases --write`` runs the grid and writes
``validation/reference/tcp.json``; without ``--write`` it prints the table only.
``--ns3 PREFIX`` runs it on another ns-3 install (a variant reference: e.g. the ns-3.44
wheel's ``ns3/`` folder, validation/ns3.py) and writes beside the reference, never over
it (``tcp_holdout_long.json`` -> ``tcp_holdout_long_ns344.json``); ``--seeds N`` caps
the lossy cases' seeds (the file records each case's count).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from validation import ns3

PROGRAM = "tcp_flows"
REFERENCE = Path(__file__).resolve().parent / "reference" / "tcp.json"
#: the seeds of a lossy case: single transfers spread widely (a timeout or none), and the
#: mean of 10 heavy-tailed runs was found to move by a third between seed sets, and of
#: 30 still by up to a fifth (its standard error; docs/validation.md)
SEEDS = 100
#: TCP and queue configuration of every case (tcp_flows.cc's defaults; recorded in the
#: reference so the numbers say what they are the numbers of)
CONFIG = {
    "topology": "dumbbell: senders -10 Gb/s, 0 s- router -rate_bps, delay_s- router2 "
    "-10 Gb/s, 0 s- receiver",
    "segment_size_bytes": 1448,
    "wire_bytes_per_full_segment": 1502,
    "initial_cwnd_segments": 10,
    "sack": True,
    "timestamps": True,
    "send_receive_buffer_bytes": 1 << 27,
    "del_ack_count": 2,
    "del_ack_timeout_s": 0.04,
    "hystart": True,
    "hystart_delay_threshold": "Linux's: clamp(2 * delay_s / 8, 4 ms, 16 ms) "
    "(tcp_flows.cc --hystart_delay_s; ns-3.37's own rule waits for a base RTT of queue)",
    "recovery": "ns3::TcpPrrRecovery (ns-3 default)",
    "rto": "Linux's: SRTT + max(4 RTTVAR, min_rto_s) (TcpSocketBase::ClockGranularity and "
    "MinRto both min_rto_s; ns-3.37's own: max(SRTT + max(1 ms, 4 RTTVAR), MinRto))",
    "bottleneck_queue_disc": "ns3::FqCoDelQueueDisc (ns-3 defaults: 5 ms target, 100 ms interval); "
    "a case with queue 'fifo': ns3::FifoQueueDisc (its default 1000p)",
    "bottleneck_device_queue": "1p",
    "loss_model": "RateErrorModel, per packet, on router2's receiving bottleneck device",
    "timing": "first data segment sent (connection already open) to last byte received",
    "seeds": "--seed=1 --run=k, k = 1..seeds",
}


@dataclass(frozen=True)
class Case:
    bytes: int
    rate_bps: float
    delay_s: float
    loss: float = 0.0
    flows: int = 1
    seeds: int = 1
    min_rto_s: float = 0.2
    #: the bottleneck's queue discipline: "" for CONFIG's (FqCoDel), or "fifo" (ns-3's
    #: FifoQueueDisc, 1,000 packets: a drop-tail queue deep enough never to drop here)
    queue: str = ""

    @property
    def kind(self) -> str:
        return "p2p" if self.flows == 1 else "shared"

    @property
    def id(self) -> str:
        rate = f"{self.rate_bps / 1e9:g}G" if self.rate_bps >= 1e9 else f"{self.rate_bps / 1e6:g}M"
        out = f"{self.bytes}B-{rate}-{self.delay_s * 1e3:g}ms"
        if self.loss:
            out += f"-loss{self.loss:g}"
        if self.flows > 1:
            out += f"-x{self.flows}"
        if self.queue:
            out += f"-{self.queue}"
        return out

    def args(self, cc: str, run: int) -> dict[str, Any]:
        return {
            "flows": self.flows,
            "bytes": self.bytes,
            "rate_bps": self.rate_bps,
            "delay_s": self.delay_s,
            "loss": self.loss,
            "cc": cc,
            "min_rto_s": self.min_rto_s,
            "seed": 1,
            "run": run,
            **({"queue_disc": QUEUE_DISCS[self.queue]} if self.queue else {}),
        }


#: ``Case.queue`` -> tcp_flows.cc's ``--queue_disc``
QUEUE_DISCS = {"fifo": "ns3::FifoQueueDisc"}

KB200, KB800, MB5, MB40 = 200_000, 800_040, 5_000_000, 40_000_000
M1, M10, M100, G1 = 1e6, 10e6, 100e6, 1e9


def _lossy(bytes_: int, rate: float, delay: float, loss: float, seeds: int = SEEDS) -> Case:
    return Case(bytes_, rate, delay, loss, seeds=seeds)


#: ~30 point-to-point cases spanning sizes, rates, delays and losses (not their product:
#: a 40 MB flow at 1 Mb/s is 5 simulated minutes, and 40 MB at 1 Gb/s costs ns-3 minutes of
#: wall time in its SACK scoreboard, so those are left out), then shared bottlenecks
GRID: list[Case] = [
    # no loss
    Case(KB200, M1, 0.02),
    Case(KB200, M10, 0.002),
    Case(KB200, M10, 0.02),
    Case(KB200, M100, 0.02),
    Case(KB200, G1, 0.002),
    Case(KB200, G1, 0.1),
    Case(KB800, M1, 0.02),
    Case(KB800, M10, 0.002),
    Case(KB800, M10, 0.02),
    Case(KB800, M10, 0.1),
    Case(KB800, M100, 0.002),
    Case(KB800, M100, 0.02),
    Case(KB800, M100, 0.1),
    Case(KB800, G1, 0.02),
    Case(MB5, M1, 0.02),
    Case(MB5, M10, 0.02),
    Case(MB5, M100, 0.002),
    Case(MB5, M100, 0.02),
    Case(MB5, M100, 0.1),
    Case(MB5, G1, 0.02),
    Case(MB40, M100, 0.002),
    Case(MB40, M100, 0.02),
    # random loss (seeds)
    _lossy(KB200, M10, 0.02, 0.01),
    _lossy(KB800, M1, 0.1, 0.01),
    _lossy(KB800, M10, 0.002, 0.01),
    _lossy(KB800, M10, 0.02, 0.001),
    _lossy(KB800, M10, 0.02, 0.01),
    _lossy(KB800, M100, 0.02, 0.001),
    _lossy(KB800, M100, 0.02, 0.01),
    _lossy(MB5, M10, 0.02, 0.001),
    _lossy(MB5, M100, 0.02, 0.001),
    _lossy(MB5, M100, 0.002, 0.01),
    # shared bottleneck, 20 ms
    *(Case(KB800, rate, 0.02, flows=n) for rate in (M10, M100) for n in (2, 5, 10, 20)),
]


#: cases kept apart from GRID: other sizes, rates, delays, losses and flow counts, never
#: used to choose or adjust a model (docs/validation.md, "Held-out cases"); the suite holds
#: mecsim to them with the grid's figures
HOLDOUT: list[Case] = [
    # no loss
    Case(150_000, 50e6, 0.04),
    Case(300_000, 2e6, 0.01),
    Case(600_000, 500e6, 0.06),
    Case(1_200_000, 20e6, 0.04),
    Case(2_500_000, 50e6, 0.005),
    Case(3_000_000, 5e6, 0.06),
    Case(12_000_000, 300e6, 0.03),
    Case(20_000_000, 200e6, 0.01),
    # random loss (seeds)
    _lossy(400_000, 5e6, 0.05, 0.003),
    _lossy(1_200_000, 20e6, 0.01, 0.005),
    _lossy(2_500_000, 50e6, 0.03, 0.002),
    _lossy(3_000_000, 200e6, 0.005, 0.005),
    _lossy(6_000_000, 30e6, 0.015, 0.001),
    # shared bottleneck
    Case(1_200_000, 20e6, 0.01, flows=3),
    Case(2_500_000, 5e6, 0.005, flows=4),
    Case(600_000, 50e6, 0.04, flows=8),
    Case(800_040, 200e6, 0.03, flows=15),
]
#: single flows over long round trips, found after the held-out set: every one-way delay of
#: 10-100 ms with rates of 2-50 Mb/s and sizes of 1-10 MB (no loss). The grid had few long
#: round trips, and here slow start overshoots the path (HyStart's delay test fires a
#: round late) into fq_codel's drops. Each case runs twice: through fq_codel (the
#: reference's queue) and through a deep FIFO (drop-tail, 1,000 packets: mecsim's
#: ``queue: fifo``). The set the AQM model (channel/tcp.py item 4) was built on
#: (docs/validation.md, "Long round trips"); HOLDOUT_LONG is held out from it.
RTT_SWEEP: list[Case] = [
    Case(size, rate, delay, queue=queue)
    for queue in ("", "fifo")
    for delay in (0.01, 0.03, 0.05, 0.06, 0.08, 0.1)
    for rate in (2e6, 5e6, 10e6, 20e6, 50e6)
    for size in (1_000_000, 3_000_000, 10_000_000)
]


def _drawn_holdout(seed: int = 20261129) -> list[Case]:
    """Cases drawn, not chosen: 20 single loss-free flows, 4 shared bottlenecks and 2
    lossy flows, sizes log-uniform in 300 kB-20 MB, rates in 3-300 Mb/s (two significant
    digits), one-way delays uniform in 20-150 ms (whole ms), from a fixed seed."""
    rng = random.Random(seed)

    def draw() -> tuple[int, float, float]:
        size = int(float(f"{10 ** rng.uniform(math.log10(3e5), math.log10(2e7)):.2g}"))
        rate = float(f"{10 ** rng.uniform(math.log10(3e6), math.log10(3e8)):.2g}")
        return size, rate, rng.randint(20, 150) / 1000

    cases = [Case(*draw()) for _ in range(20)]
    cases += [Case(*draw(), flows=rng.randint(2, 6)) for _ in range(4)]
    cases += [_lossy(*draw(), loss=rng.choice((0.001, 0.003))) for _ in range(2)]
    return cases


#: held out from the AQM model (channel/tcp.py item 4), which was built on RTT_SWEEP:
#: drawn at random (:func:`_drawn_holdout`), run once after the model, never used to
#: change it (docs/validation.md, "Held-out cases")
HOLDOUT_LONG: list[Case] = _drawn_holdout()

#: the grids by name (``--grid``) and the reference file each is written to
GRIDS = {
    "main": (GRID, REFERENCE),
    "holdout": (HOLDOUT, REFERENCE.with_name("tcp_holdout.json")),
    "rtt": (RTT_SWEEP, REFERENCE.with_name("tcp_rtt.json")),
    "holdout-long": (HOLDOUT_LONG, REFERENCE.with_name("tcp_holdout_long.json")),
}


def variant_path(path: Path, version: str) -> Path:
    """Where a variant reference of ns-3 ``version`` is written beside ``path``
    (``tcp_rtt.json``, ``3.44`` -> ``tcp_rtt_ns344.json``)."""
    return path.with_name(f"{path.stem}_ns{version.replace('.', '')}{path.suffix}")


def _install_label(prefix: Path) -> str:
    """What the install at ``prefix`` is, for the file: the wheel it came from when it is
    an unzipped wheel's ``ns3/`` (its ``*.dist-info`` beside it), else "ns-3 at PREFIX"."""
    infos = prefix.resolve().parent.glob("ns3-*.dist-info")
    wheels = sorted(p.name.removesuffix(".dist-info") for p in infos)
    return f"PyPI wheel {wheels[0]}" if wheels else f"ns-3 at {prefix}"


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def run_cc(case: Case, cc: str) -> dict[str, Any]:
    """Run ``case`` with congestion control ``cc`` over its seeds."""
    last, first, per_flow = [], [], []
    for k in range(1, case.seeds + 1):
        rows = [r for r in ns3.run(PROGRAM, **case.args(cc, k)) if "time_s" in r]
        if len(rows) != case.flows:
            raise ns3.Ns3Error(f"{case.id} {cc} run {k}: {len(rows)} flows of {case.flows}")
        times = [r["time_s"] for r in sorted(rows, key=lambda r: r["flow"])]
        last.append(max(times))
        first.append(min(times))
        if k == 1:
            per_flow = times
    out: dict[str, Any] = {"cc": cc, "time_s": _stats(last), "runs_s": last}
    if case.flows > 1:
        out["first_flow_s"] = _stats(first)
        out["flow_times_s_run1"] = per_flow
    return out


def run_case(case: Case) -> dict[str, Any]:
    t = time.perf_counter()
    cubic = run_cc(case, "cubic")
    wall_cubic = time.perf_counter() - t
    newreno = run_cc(case, "newreno")
    wall = time.perf_counter() - t
    return {
        "id": case.id,
        "kind": case.kind,
        **asdict(case),
        "cubic": cubic,
        "newreno": newreno,
        "ns3_wall_s": {"cubic": round(wall_cubic, 3), "total": round(wall, 3)},
    }


def row_text(r: dict[str, Any]) -> str:
    c, n = r["cubic"]["time_s"], r["newreno"]["time_s"]
    seeds = f"{r['seeds']} seeds" if r["seeds"] > 1 else ""
    return (
        f"{r['id']:<32} cubic {c['mean']:9.4f} [{c['min']:.4f}-{c['max']:.4f}]"
        f"  newreno {n['mean']:9.4f}  wall {r['ns3_wall_s']['total']:6.1f} s  {seeds}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.cases",
        description="Run the TCP case grid on ns-3 (tcp_flows.cc) and print or write the "
        "reference times (last flow, from first data byte sent to last byte received).",
    )
    parser.add_argument("--write", action="store_true", help=f"write the results to {REFERENCE}")
    parser.add_argument("--only", metavar="TEXT", help="run only the cases whose id contains TEXT")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        default="main",
        help="the case grid: main (the cases the models were built on), holdout (kept "
        "apart, never used to adjust a model) or rtt (long round trips, no loss)",
    )
    parser.add_argument("--out", type=Path, help="where --write writes (default: the grid's file)")
    parser.add_argument(
        "--ns3",
        metavar="PREFIX",
        type=Path,
        help="run on the ns-3 install at PREFIX (include/ns3/ and lib64/: e.g. the ns3 "
        "wheel's unzipped ns3/ folder) instead of the system's; --write then writes the "
        "grid's file with _ns<version> added (tcp_rtt_ns344.json), never the reference",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        metavar="N",
        help="run lossy cases over at most N seeds (default: each case's own, 100)",
    )
    args = parser.parse_args(argv)
    grid, default_out = GRIDS[args.grid]
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be at least 1, not {args.seeds}")
    if args.ns3 is not None:
        try:
            ns3.use_prefix(args.ns3)
        except ns3.Ns3Error as exc:
            parser.error(f"--ns3: {exc}")
        default_out = variant_path(default_out, ns3.prefix_install(ns3.ns3_prefix())[0])
        if args.out is not None and args.out.resolve() in {f.resolve() for _, f in GRIDS.values()}:
            parser.error(f"--out {args.out}: a variant never overwrites a reference")
    out_path: Path = args.out or default_out

    cases = [c for c in grid if not args.only or args.only in c.id]
    if args.seeds is not None:
        cases = [replace(c, seeds=min(c.seeds, args.seeds)) for c in cases]
    if args.list:
        for c in cases:
            print(c.id, f"seeds={c.seeds}")
        return 0
    if args.write and args.only:
        parser.error("--write writes the whole grid; leave --only out")
    version = ns3.ns3_available()
    if version is None:
        print("ns-3 is not installed (needs g++, pkg-config, libns3-dev)", file=sys.stderr)
        return 2
    ns3.build(PROGRAM)
    results = []
    t0 = time.perf_counter()
    for i, case in enumerate(cases, 1):
        r = run_case(case)
        results.append(r)
        print(f"[{i}/{len(cases)}] {row_text(r)}", file=sys.stderr, flush=True)
    total = time.perf_counter() - t0
    print(f"{len(cases)} cases, ns-3 wall {total:.1f} s", file=sys.stderr)
    for r in results:
        print(row_text(r))
    if args.write:
        src = ns3.source(PROGRAM).read_bytes()
        doc = {
            "ns3_version": version,
            **({"ns3_install": _install_label(args.ns3)} if args.ns3 is not None else {}),
            **({"seeds_cap": args.seeds} if args.seeds is not None else {}),
            "program": f"validation/ns3/{PROGRAM}.cc",
            "program_sha256": hashlib.sha256(src).hexdigest(),
            "grid": args.grid,
            "config": CONFIG,
            "time": "last flow of a run: first data segment sent -> last byte received, s",
            "ns3_wall_s": round(total, 1),
            "cases": results,
        }
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(out_path)  # never a half-written reference
        print(f"wrote {out_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
