"""mecsim beside ns-3: every case of the stored reference, timed by mecsim through a
scenario file as a user would write it, and the table of both.

    python -m validation.compare                  # the table, both kinds of case
    python -m validation.compare --markdown       # as docs/validation.md shows it
    python -m validation.compare --plot docs/img/validation.png
    python -m validation.compare --variant 3.44   # beside a variant reference (ns-3.44)

The TCP cases come in three sets: the grid (``reference/tcp.json``), on which the models
were built; the held-out cases (``reference/tcp_holdout.json``: other sizes, rates,
delays, losses and flow counts), never used to adjust a model; and the long round trips
(``reference/tcp_rtt.json``: single flows at 10-100 ms one way, no loss), where mecsim
is known to be short (docs/validation.md, "Long round trips"). All three are shown.

The reference (``validation/reference/tcp.json``, ``wifi.json``) holds ns-3.37's times
(``python -m validation.cases --write``, ``python validation/wifi_reference.py``): each
case's mean over its seeds, min and max, and NewReno's mean beside Cubic's. mecsim's
side: a scenario with the case's link (``fixed_rate`` for a bottleneck; a Shannon
channel with ``phy: wifi_ax`` and the stations placed on the case's distances for a
cell), every flow one upload of the case's bytes, started together; its time is the
last upload's end (one-way latency included), as ns-3's is the last byte received.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mecsim.channel.tcp import (
    TCP_HEADER_BYTES,
    TCP_MSS_BYTES,
    header_efficiency,
    lossy_transfer_times_s,
)
from mecsim.emulation.engine import time_round
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Upload
from mecsim.scenario import Scenario, load_scenario
from validation.cases import variant_path

ROOT = Path(__file__).resolve().parent
REFERENCE = ROOT / "reference"
#: the point-to-point link of ns-3's cell between the access point and the server (s)
WIFI_WIRED_DELAY_S = 0.001


@dataclass(frozen=True)
class Row:
    """One case: ns-3's Cubic mean [min, max] and NewReno mean, mecsim's time (s)."""

    kind: str  # p2p, shared, wifi
    case: str
    ns3_s: float
    ns3_min_s: float
    ns3_max_s: float
    newreno_s: float | None
    mecsim_s: float
    seeds: int
    #: the set the case is from: "grid", "held-out", "rtt" or "held-out-long" (TCP);
    #: "grid", "held-out", "held-out-2" or "small" (Wi-Fi)
    grid: str = "grid"
    #: 10th and 90th percentiles of single transfers, ns-3's runs and mecsim's sample
    #: paths (lossy point-to-point cases; None elsewhere)
    ns3_p10_p90_s: tuple[float, float] | None = None
    mecsim_p10_p90_s: tuple[float, float] | None = None
    #: a variant's row (:func:`variant_rows`: ns3_s is the variant's): the reference's
    #: (ns-3.37's) Cubic mean of the same case, else None
    reference_s: float | None = None

    @property
    def error(self) -> float:
        """mecsim / ns-3 − 1."""
        return self.mecsim_s / self.ns3_s - 1.0

    @property
    def reference_error(self) -> float:
        """A variant's row: mecsim / the reference (ns-3.37) − 1."""
        if self.reference_s is None:
            raise ValueError(f"{self.case}: not a variant's row")
        return self.mecsim_s / self.reference_s - 1.0


def tcp_scenario(case: dict[str, Any]) -> dict[str, Any]:
    """The scenario of a bottleneck case: ``flows`` clients on one fixed-rate uplink
    (shared when there are several), the one-way delay both ways, the loss on the
    uplink, ns-3's minimum RTO, the bottleneck's queue (fq_codel unless the case says fifo)."""
    flows = int(case["flows"])
    up: dict[str, Any] = {
        "rate_bps": case["rate_bps"],
        "latency_s": case["delay_s"],
        "min_rto_s": case.get("min_rto_s", 0.2),
        "shared": flows > 1,
    }
    if case.get("loss"):
        up["loss_rate"] = case["loss"]
    if case.get("queue"):  # ns-3's FifoQueueDisc: mecsim's queue: fifo
        up["queue"] = case["queue"]
    return {
        "name": f"validation-{case['id']}",
        "topology": {"clients": flows, "participation": 1.0},
        "channel": {
            "model": "fixed_rate",
            "uplink": up,
            "downlink": {"rate_bps": case["rate_bps"], "latency_s": case["delay_s"]},
        },
    }


def wifi_scenario(run: dict[str, Any]) -> dict[str, Any]:
    """The scenario of an 802.11ax cell case: the stations on a ray from the access point
    at the case's distances, ns-3's log-distance path loss (exponent 3, 46.6777 dB at
    1 m), its noise (k·290 K, 7 dB noise figure) and transmit power; the cell's uplink a
    shared medium; the wired hop to the server as the latency."""
    summary, stations = run["summary"], run["stations"]
    width_hz = float(summary["width_mhz"]) * 1e6
    power = float(summary["tx_power_dbm"])
    n = len(stations)
    return {
        "name": "validation-wifi",
        "topology": {"clients": n, "participation": 1.0},
        "channel": {
            "model": "shannon",
            "phy": {"model": "wifi_ax", "guard_interval_ns": int(summary["gi_ns"])},
            "noise_figure_db": float(summary["noise_figure_db"]),
            # ns-3's k = 1.3803e-23 J/K at 290 K: -173.975 dBm/Hz
            "noise_psd_dbm_per_hz": 10 * math.log10(1.3803e-23 * 290 * 1e3),
            "path_loss_db": -46.6777,
            "reference_distance_m": 1.0,
            "path_loss_exponent": 3.0,
            "uplink": {
                "access": "shared_cell",
                "bandwidth_hz": width_hz,
                "tx_power_dbm": power,
                "latency_s": WIFI_WIRED_DELAY_S,
            },
            "downlink": {
                "bandwidth_hz": width_hz,
                "tx_power_dbm": power,
                "latency_s": WIFI_WIRED_DELAY_S,
            },
        },
        "geometry": {
            "margin_m": 100.0,
            "min_distance_m": 1.0,
            "sites": {"layout": "explicit", "positions_m": [[0.0, 0.0]]},
            "clients": {
                "placement": "explicit",
                "positions_m": [[float(s["distance_m"]), 0.0] for s in stations],
            },
        },
    }


def mecsim_time_s(data: dict[str, Any], nbytes: list[int]) -> float:
    """Write ``data`` as a scenario file, load it as ``mecsim run`` does, and time one
    upload of ``nbytes[i]`` by each client, all starting together: the last one's end."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        scenario: Scenario = load_scenario(path)
    model = NetworkModel(scenario, device_profiles(scenario))
    clients = list(range(len(nbytes)))
    specs, servers, network, _ = model.round(0, clients, records=False)
    traces = {c: (Upload(int(nbytes[c])),) for c in clients}
    return float(time_round(traces, specs, servers, network).round_time_s)


def mecsim_spread_s(case: dict[str, Any]) -> tuple[float, float]:
    """10th and 90th percentiles of single transfers of a lossy point-to-point case:
    mecsim's sample paths (:func:`~mecsim.channel.tcp.lossy_transfer_times_s`), each
    timed as the engine times the expectation (latency + bits at the goodput + the
    path's time beyond its segments' serialisation)."""
    goodput = float(case["rate_bps"]) * header_efficiency(TCP_MSS_BYTES, TCP_HEADER_BYTES)
    tau = 8.0 * TCP_MSS_BYTES / goodput
    d = math.ceil(int(case["bytes"]) / TCP_MSS_BYTES)
    paths = lossy_transfer_times_s(
        d, 2 * float(case["delay_s"]), tau, 10, float(case["loss"]), "cubic", case["min_rto_s"]
    )[0]
    base = float(case["delay_s"]) + 8.0 * int(case["bytes"]) / goodput - d * tau
    p10, p90 = np.percentile(paths + base, [10, 90])
    return float(p10), float(p90)


def tcp_rows(reference: dict[str, Any], grid: str = "grid") -> list[Row]:
    rows = []
    for case in reference["cases"]:
        cubic = case["cubic"]["time_s"]
        reno = case.get("newreno", {}).get("time_s", {}).get("mean")
        t = mecsim_time_s(tcp_scenario(case), [int(case["bytes"])] * int(case["flows"]))
        spreads: tuple[Any, Any] = (None, None)
        if case.get("loss") and int(case["flows"]) == 1:
            runs = case["cubic"]["runs_s"]
            ns3_p = np.percentile(runs, [10, 90])
            spreads = ((float(ns3_p[0]), float(ns3_p[1])), mecsim_spread_s(case))
        rows.append(
            Row(
                case["kind"],
                case["id"],
                cubic["mean"],
                cubic["min"],
                cubic["max"],
                reno,
                t,
                int(case.get("seeds", 1)),
                grid,
                *spreads,
            )
        )
    return rows


def wifi_rows(reference: dict[str, Any], grid: str = "grid") -> list[Row]:
    """The cells of ``reference``, ns-3's last upload (mean [min, max] over its runs)
    beside mecsim's. A run in which an upload never ended (``all_done`` false: in 2 of
    the 496 runs stored one station's TCP connection never opened, docs/validation.md)
    has no last upload and is left out."""
    rows = []
    for case in reference["cases"]:
        runs = [r for r in case["runs"] if r["summary"]["all_done"]]
        last = [float(r["summary"]["last_time_s"]) for r in runs]
        nbytes = [int(s["bytes"]) for s in runs[0]["stations"]]
        t = mecsim_time_s(wifi_scenario(runs[0]), nbytes)
        rows.append(
            Row(
                "wifi",
                case["case"],
                statistics.fmean(last),
                min(last),
                max(last),
                None,
                t,
                len(runs),
                grid,
            )
        )
    return rows


def all_rows() -> list[Row]:
    """Every stored case, mecsim beside ns-3: the TCP grid, the Wi-Fi cells, the
    held-out TCP cases, the long round trips (``reference/tcp_rtt.json``), the cases held
    out from the AQM model (``reference/tcp_holdout_long.json``), then the held-out cells
    (``reference/wifi_holdout.json``, the second draw, ``wifi_holdout_2.json``, and the
    third, fourth and fifth, with small uploads, ``wifi_holdout_3.json`` to
    ``wifi_holdout_5.json``) and the small uploads in lightly loaded cells
    (``reference/wifi_small.json``)."""
    tcp = json.loads((REFERENCE / "tcp.json").read_text())
    wifi = json.loads((REFERENCE / "wifi.json").read_text())
    held = json.loads((REFERENCE / "tcp_holdout.json").read_text())
    rtt = json.loads((REFERENCE / "tcp_rtt.json").read_text())
    long = json.loads((REFERENCE / "tcp_holdout_long.json").read_text())
    cells = json.loads((REFERENCE / "wifi_holdout.json").read_text())
    cells_2 = json.loads((REFERENCE / "wifi_holdout_2.json").read_text())
    small = json.loads((REFERENCE / "wifi_small.json").read_text())
    cells_3 = json.loads((REFERENCE / "wifi_holdout_3.json").read_text())
    cells_4 = json.loads((REFERENCE / "wifi_holdout_4.json").read_text())
    cells_5 = json.loads((REFERENCE / "wifi_holdout_5.json").read_text())
    return (
        tcp_rows(tcp)
        + wifi_rows(wifi)
        + tcp_rows(held, "held-out")
        + tcp_rows(rtt, "rtt")
        + tcp_rows(long, "held-out-long")
        + wifi_rows(cells, "held-out")
        + wifi_rows(cells_2, "held-out-2")
        + wifi_rows(small, "small")
        + wifi_rows(cells_3, "held-out-3")
        + wifi_rows(cells_4, "held-out-4")
        + wifi_rows(cells_5, "held-out-5")
    )


#: the TCP sets by name (Row.grid) and their reference files (ns-3.37's); a variant's
#: file carries its version: tcp_rtt.json -> tcp_rtt_ns344.json (cases.variant_path)
TCP_SETS = {
    "grid": "tcp.json",
    "held-out": "tcp_holdout.json",
    "rtt": "tcp_rtt.json",
    "held-out-long": "tcp_holdout_long.json",
}


def variant_rows(version: str) -> list[Row]:
    """Every TCP case of the stored references of ns-3 ``version`` (a variant run beside
    ns-3.37 with ``python -m validation.cases --ns3 PREFIX --write``), timed by mecsim:
    ``ns3_s`` is the variant's Cubic mean, ``newreno_s`` its NewReno, ``reference_s``
    ns-3.37's Cubic mean of the same case. Sets with no variant file are left out; a
    variant case the reference lacks is refused."""
    rows: list[Row] = []
    for grid, name in TCP_SETS.items():
        path = variant_path(REFERENCE / name, version)
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        if doc.get("ns3_version") != version:
            raise ValueError(f"{path}: ns3_version {doc.get('ns3_version')!r}, not {version!r}")
        ref = json.loads((REFERENCE / name).read_text())
        ref_s = {c["id"]: c["cubic"]["time_s"]["mean"] for c in ref["cases"]}
        for row in tcp_rows(doc, grid):
            if row.case not in ref_s:
                raise ValueError(f"{path}: case {row.case} is not in {name}")
            rows.append(replace(row, reference_s=ref_s[row.case]))
    if not rows:
        raise FileNotFoundError(f"no variant reference of ns-3 {version} in {REFERENCE}")
    return rows


def variant_groups(rows: list[Row]) -> dict[str, list[Row]]:
    """A variant's rows by set, as the docs report them."""
    groups = {
        "grid, no loss": [r for r in rows if r.grid == "grid" and "loss" not in r.case],
        "grid, loss": [r for r in rows if r.grid == "grid" and "loss" in r.case],
        "held out, no loss": [r for r in rows if r.grid == "held-out" and "loss" not in r.case],
        "held out, loss": [r for r in rows if r.grid == "held-out" and "loss" in r.case],
        "long round trips, fq_codel": [
            r for r in rows if r.grid == "rtt" and not r.case.endswith("-fifo")
        ],
        "long round trips, fifo": [r for r in rows if r.grid == "rtt" and r.case.endswith("-fifo")],
        "held out from the AQM model": [r for r in rows if r.grid == "held-out-long"],
    }
    return {name: group for name, group in groups.items() if group}


def variant_summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per set of a variant's rows: cases; mecsim's median and largest |error| and cases
    within 25 % against the variant and against the reference (ns-3.37); and how far
    the variant is from the reference (median and largest |variant / 3.37 − 1|)."""
    out = {}
    for name, group in variant_groups(rows).items():
        var = [abs(r.error) for r in group]
        ref = [abs(r.reference_error) for r in group]
        apart = [abs(r.ns3_s / r.reference_s - 1) for r in group if r.reference_s]
        out[name] = {
            "cases": len(group),
            "median_abs_error": statistics.median(var),
            "max_abs_error": max(var),
            "within": sum(e <= 0.25 for e in var),
            "reference_median_abs_error": statistics.median(ref),
            "reference_max_abs_error": max(ref),
            "reference_within": sum(e <= 0.25 for e in ref),
            "median_apart": statistics.median(apart),
            "max_apart": max(apart),
        }
    return out


def variant_markdown(rows: list[Row], version: str) -> str:
    """The table of a variant's rows: ns-3.37's Cubic, the variant's Cubic and NewReno,
    mecsim, and mecsim's error against each."""
    lines = [
        f"| set | case | ns-3.37 Cubic (s) | ns-3.{version.split('.')[-1]} Cubic (s) "
        f"| ns-3.{version.split('.')[-1]} NewReno (s) | mecsim (s) | error vs 3.37 "
        f"| error vs {version} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reno = f"{r.newreno_s:.4g}" if r.newreno_s is not None else "–"
        seeds = f" ({r.seeds} seeds)" if r.seeds > 1 else ""
        lines.append(
            f"| {r.grid} | {r.case} | {r.reference_s:.4g} | {r.ns3_s:.4g}{seeds} | {reno} "
            f"| {r.mecsim_s:.4g} | {100 * r.reference_error:+.1f} % | {100 * r.error:+.1f} % |"
        )
    return "\n".join(lines)


def variant_main(version: str, as_markdown: bool) -> int:
    rows = variant_rows(version)
    if as_markdown:
        print(variant_markdown(rows, version))
        print()
    else:
        for r in rows:
            print(
                f"{r.grid:13s} {r.case:30s} ns-3.37 {r.reference_s:9.4f} ns-{version} "
                f"{r.ns3_s:9.4f} mecsim {r.mecsim_s:9.4f} {100 * r.reference_error:+6.1f} % "
                f"{100 * r.error:+6.1f} %"
            )
    for name, s in variant_summary(rows).items():
        print(
            f"{name}: {s['cases']} cases; mecsim vs ns-{version}: median |error| "
            f"{100 * s['median_abs_error']:.1f} %, largest {100 * s['max_abs_error']:.1f} %, "
            f"{s['within']} within 25 %; vs ns-3.37: {100 * s['reference_median_abs_error']:.1f} %,"
            f" {100 * s['reference_max_abs_error']:.1f} %, {s['reference_within']}; "
            f"ns-{version} vs ns-3.37: median {100 * s['median_apart']:.1f} %, "
            f"largest {100 * s['max_apart']:.1f} %"
        )
    return 0


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per kind (and for TCP, point-to-point and shared together): cases, median and
    largest |error|, cases within 25 % (TCP) or 15 % (Wi-Fi)."""
    out = {}
    tcp = [r for r in rows if r.kind in ("p2p", "shared") and r.grid == "grid"]
    held = [r for r in rows if r.kind in ("p2p", "shared") and r.grid == "held-out"]
    groups = {
        "tcp": tcp,
        "tcp, no loss": [r for r in tcp if "loss" not in r.case],
        "tcp, loss": [r for r in tcp if "loss" in r.case],
        "wifi": [r for r in rows if r.kind == "wifi" and r.grid == "grid"],
        "wifi held out": [r for r in rows if r.kind == "wifi" and r.grid == "held-out"],
        "wifi held out, second draw": [
            r for r in rows if r.kind == "wifi" and r.grid == "held-out-2"
        ],
        "wifi small uploads, 1-2 stations": [
            r for r in rows if r.kind == "wifi" and r.grid == "small"
        ],
        "wifi held out, third draw (with small uploads)": [
            r for r in rows if r.kind == "wifi" and r.grid == "held-out-3"
        ],
        "wifi fourth draw (with small uploads; development data since its trace)": [
            r for r in rows if r.kind == "wifi" and r.grid == "held-out-4"
        ],
        "wifi held out, fifth draw (with small uploads)": [
            r for r in rows if r.kind == "wifi" and r.grid == "held-out-5"
        ],
        "tcp held out": held,
        "tcp held out, no loss": [r for r in held if "loss" not in r.case],
        "tcp held out, loss": [r for r in held if "loss" in r.case],
        "tcp long round trips, fq_codel": [
            r for r in rows if r.grid == "rtt" and not r.case.endswith("-fifo")
        ],
        "tcp long round trips, fifo": [
            r for r in rows if r.grid == "rtt" and r.case.endswith("-fifo")
        ],
        "tcp held out from the AQM model": [r for r in rows if r.grid == "held-out-long"],
    }
    for name, group in groups.items():
        if not group:
            continue
        errors = [abs(r.error) for r in group]
        bound = 0.15 if name.startswith("wifi") else 0.25
        out[name] = {
            "cases": len(group),
            "median_abs_error": statistics.median(errors),
            "max_abs_error": max(errors),
            "within": sum(e <= bound for e in errors),
            "bound": bound,
        }
    return out


def markdown(rows: list[Row], grid: str | None = None) -> str:
    """The table of ``rows`` (of one ``grid`` when given): ns-3's Cubic mean [min–max]
    and, for lossy point-to-point cases, the 10th–90th percentiles of single transfers,
    ns-3's runs beside mecsim's sample paths."""
    lines = [
        "| kind | case | ns-3 Cubic mean [min–max] (s) | ns-3 NewReno (s) | mecsim (s) | error "
        "| single transfers p10–p90, ns-3 / mecsim (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if grid is not None and r.grid != grid:
            continue
        reno = f"{r.newreno_s:.4g}" if r.newreno_s is not None else "–"
        spread = f" [{r.ns3_min_s:.4g}–{r.ns3_max_s:.4g}]" if r.seeds > 1 else ""
        single = "–"
        if r.ns3_p10_p90_s and r.mecsim_p10_p90_s:
            (a, b), (c, d) = r.ns3_p10_p90_s, r.mecsim_p10_p90_s
            single = f"{a:.3g}–{b:.3g} / {c:.3g}–{d:.3g}"
        lines.append(
            f"| {r.kind} | {r.case} | {r.ns3_s:.4g}{spread} ({r.seeds} seed"
            f"{'s' if r.seeds > 1 else ''}) | {reno} | {r.mecsim_s:.4g} | {100 * r.error:+.1f} % "
            f"| {single} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib  # deferred: only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: only the figure needs it

    fig, ax = plt.subplots(figsize=(6.0, 6.0))
    for kind, marker in (("p2p", "o"), ("shared", "s"), ("wifi", "^")):
        mine = [r for r in rows if r.kind == kind]
        lossy = [r for r in mine if "loss" in r.case]
        clean = [r for r in mine if "loss" not in r.case]
        for group, label, fill in ((clean, kind, True), (lossy, f"{kind}, loss", False)):
            if not group:
                continue
            ax.scatter(
                [r.ns3_s for r in group],
                [r.mecsim_s for r in group],
                marker=marker,
                label=label,
                facecolors=None if fill else "none",
                edgecolors="C0" if not fill else None,
            )
    lo = min(min(r.ns3_s, r.mecsim_s) for r in rows) * 0.8
    hi = max(max(r.ns3_s, r.mecsim_s) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.75, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ns-3.37 (s, Cubic; mean over seeds)")
    ax.set_ylabel("mecsim (s)")
    ax.set_title("One case a point; dotted: ±25 %")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: how the plain listing marks a case of a set other than the grid
_SET_NOTE = {
    "held-out": "  (held out)",
    "rtt": "  (long round trips)",
    "held-out-long": "  (held out from the AQM model)",
    "held-out-2": "  (held out, second draw)",
    "small": "  (small uploads)",
    "held-out-3": "  (held out, third draw)",
    "held-out-4": "  (fourth draw, development data)",
    "held-out-5": "  (held out, fifth draw)",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.compare",
        description="mecsim's transfer times beside ns-3's stored reference, case by case.",
    )
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--plot", type=Path, help="write the figure (PNG) here")
    parser.add_argument(
        "--variant",
        metavar="VERSION",
        help="the TCP cases beside a variant reference of ns-3 VERSION (e.g. 3.44: "
        "reference/tcp*_ns344.json, from python -m validation.cases --ns3 PREFIX --write)",
    )
    args = parser.parse_args(argv)
    if args.variant:
        if args.plot:
            parser.error("--plot draws the reference's figure; leave it out with --variant")
        try:
            return variant_main(args.variant, args.markdown)
        except (FileNotFoundError, ValueError) as exc:
            parser.error(f"--variant {args.variant}: {exc}")
    rows = all_rows()
    if args.markdown:
        print("Grid and Wi-Fi cells:\n")
        print(markdown(rows, "grid"))
        print("\nHeld-out TCP cases:\n")
        print(markdown([r for r in rows if r.kind != "wifi"], "held-out"))
        print("\nLong round trips (no loss; fq_codel, then a FIFO):\n")
        print(markdown(rows, "rtt"))
        print("\nHeld out from the AQM model (drawn at random, 20-150 ms one way):\n")
        print(markdown(rows, "held-out-long"))
        print("\nHeld-out cells (drawn at random):\n")
        print(markdown([r for r in rows if r.kind == "wifi"], "held-out"))
        print("\nHeld-out cells, second draw:\n")
        print(markdown(rows, "held-out-2"))
        print("\nSmall uploads in lightly loaded cells:\n")
        print(markdown(rows, "small"))
        print("\nHeld-out cells, third draw (with small uploads):\n")
        print(markdown(rows, "held-out-3"))
        print("\nThe fourth draw (with small uploads; development data since its trace):\n")
        print(markdown(rows, "held-out-4"))
        print("\nHeld-out cells, fifth draw (with small uploads):\n")
        print(markdown(rows, "held-out-5"))
        print()
    else:
        for r in rows:
            print(
                f"{r.kind:6s} {r.case:34s} ns-3 {r.ns3_s:9.4f} mecsim {r.mecsim_s:9.4f} "
                f"{100 * r.error:+6.1f} %{_SET_NOTE.get(r.grid, '')}"
            )
    for name, s in summary(rows).items():
        print(
            f"{name}: {s['cases']} cases, median |error| {100 * s['median_abs_error']:.1f} %, "
            f"largest {100 * s['max_abs_error']:.1f} %, {s['within']} within "
            f"{100 * s['bound']:.0f} %"
        )
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
