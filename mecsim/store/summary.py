"""The tables a run ends with, shaped like the KAPC paper's Tables 5 and 6.

Table 5 shape: average time per round split into upload / download / client / server
seconds with their share of the round. Table 6 shape: MiB uploaded and downloaded per
round (all selected clients) and client / server GFLOPs per round. Beside them: server
memory and the best mean user accuracy over the evaluated rounds (the papers' "best mean
accuracy").

The papers' "MB" are MiB (ResNet18's 11.17 M float32 parameters are "42.65 MB"), so
bytes are divided by 2**20 here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MiB = 1024 * 1024


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per-round averages over all rounds of one run."""
    n = len(rows)
    if n == 0:
        raise ValueError("no rounds to summarise")

    def avg(key: str) -> float:
        return sum(float(r[key]) for r in rows) / n

    def avg_or_nan(key: str) -> float:  # columns older records may not have
        return avg(key) if all(key in r for r in rows) else float("nan")

    accs = [float(r["mean_accuracy"]) for r in rows if not math.isnan(float(r["mean_accuracy"]))]
    best_round = max(
        range(n),
        key=lambda i: (
            float(rows[i]["mean_accuracy"])
            if not math.isnan(float(rows[i]["mean_accuracy"]))
            else -1.0
        ),
    )
    out = {
        "rounds": float(n),
        "round_time_s": avg("round_time_s"),
        "ul_time_s": avg("ul_time_s"),
        "dl_time_s": avg("dl_time_s"),
        "client_time_s": avg("client_time_s"),
        "server_time_s": avg("server_time_s"),
        "backhaul_time_s": sum(float(r.get("backhaul_time_s", 0.0)) for r in rows) / n,
        "idle_time_s": avg("idle_time_s"),
        "total_time_s": float(rows[-1]["elapsed_s"]),
        "ul_mib": avg("bytes_up") / MiB,
        "dl_mib": avg("bytes_down") / MiB,
        "energy_j": avg_or_nan("energy_j"),
        "energy_compute_j": avg_or_nan("energy_compute_j"),
        "energy_radio_j": avg_or_nan("energy_radio_j"),
        "energy_idle_j": avg_or_nan("energy_idle_j"),
        "energy_sleep_j": avg_or_nan("energy_sleep_j"),
        "client_gflops": avg("client_gflops"),
        "server_gflops": avg("server_gflops"),
        "server_rss_mb": max(float(r["server_rss_mb"]) for r in rows),
        "client_peak_mb": max(float(r["client_peak_mb"]) for r in rows),
        "best_mean_accuracy": max(accs) if accs else float("nan"),
        # counted from 1, as everything a person reads (the records' round index + 1)
        "best_round": float(int(rows[best_round].get("round", best_round)) + 1)
        if accs
        else float("nan"),
        "final_mean_accuracy": accs[-1] if accs else float("nan"),
        "host_wall_s": avg("host_wall_s"),
    }
    if all("mean_staleness" in r for r in rows):
        # an asynchronous run's rows are server versions (mecsim.run.async_rows): its
        # phase times are means over each version's updates, which overlap in time
        out["versions"] = 1.0
        out["mean_staleness"] = avg("mean_staleness")
    return out


def _share(part: float, total: float) -> float:
    return 100.0 * part / total if total > 0 else 0.0


def table_titles(s: dict[str, float]) -> tuple[str, str]:
    """The titles of the two tables of :func:`table_rows`: per round, or per server
    version for an asynchronous run."""
    if s.get("versions"):
        return (
            "Average time per server version (emulated; each update's own phases)",
            "Communication and computation per server version",
        )
    return (
        "Average time per round (emulated, critical path)",
        "Communication and computation per round",
    )


def _version_time_rows(s: dict[str, float]) -> tuple[list[str], list[str]]:
    """An asynchronous run's time table: the seconds between versions, and each phase's
    mean over the updates a version took. An update's phases overlap other updates' (and
    versions'), so they are not shares of the time between versions."""
    header = [
        "Between versions (s)",
        "U-Comm per update (s)",
        "D-Comm per update (s)",
        "Client per update (s)",
        "Server (s)",
        "Staleness (versions)",
    ]
    cells = [f"{s['round_time_s']:.2f}"] + [
        f"{s[k]:.2f}" for k in ("ul_time_s", "dl_time_s", "client_time_s", "server_time_s")
    ]
    return header, [*cells, f"{s['mean_staleness']:.1f}"]


def table_rows(s: dict[str, float]) -> tuple[list[str], list[str], list[str], list[str]]:
    """(time header, time cells, cost header, cost cells) as strings."""
    t = s["round_time_s"]
    if s.get("versions"):
        time_header, time_cells = _version_time_rows(s)
    else:
        time_header = ["Time (s)", "U-Comm (s/%)", "D-Comm (s/%)", "Client (s/%)", "Server (s/%)"]
        time_cells = [f"{t:.2f}"] + [
            f"{s[k]:.2f} ({_share(s[k], t):.2f})"
            for k in ("ul_time_s", "dl_time_s", "client_time_s", "server_time_s")
        ]
        for key, name in (("backhaul_time_s", "Backhaul"), ("idle_time_s", "Idle")):
            if s.get(key, 0.0) > 0:  # phases most runs do not have are shown when present
                time_header.append(f"{name} (s/%)")
                time_cells.append(f"{s[key]:.2f} ({_share(s[key], t):.2f})")
    cost_header = [
        "U-Comm (MiB)",
        "D-Comm (MiB)",
        "C-Comp (GFLOPs)",
        "S-Comp (GFLOPs)",
        "Client energy (J)",
        "Server mem (MiB)",
        "Best mean acc (%)",
    ]
    energy = s.get("energy_j", float("nan"))
    cost_cells = [
        f"{s['ul_mib']:.2f}",
        f"{s['dl_mib']:.2f}",
        f"{s['client_gflops']:.2f}",
        f"{s['server_gflops']:.3f}",
        "-" if math.isnan(energy) else f"{energy:.1f}",
        f"{s['server_rss_mb']:.1f}",
        f"{100 * s['best_mean_accuracy']:.2f}",
    ]
    return time_header, time_cells, cost_header, cost_cells


def target_column(rows: Sequence[dict[str, Any]]) -> str:
    """The accuracy column targets are read from: ``mean_clean_accuracy`` in runs with noisy
    clients (MTFL Table 3 reports the non-noisy clients' UA), else ``mean_accuracy``.

    MTFL records ``mean_clean_accuracy`` in every run; without noisy clients it equals
    ``mean_accuracy``, so a run counts as noisy where the two differ in some round."""
    for r in rows:
        clean, mean = r.get("mean_clean_accuracy"), r.get("mean_accuracy")
        if clean is None or mean is None or math.isnan(float(clean)) or math.isnan(float(mean)):
            continue
        if float(clean) != float(mean):
            return "mean_clean_accuracy"
    return "mean_accuracy"


def times_to_targets(
    rows: Sequence[dict[str, Any]], targets: Sequence[float]
) -> list[tuple[float, int | None, float | None]]:
    """(target, rounds counted from 1 or None, emulated seconds elapsed then or None)
    for each target: :func:`rounds_to_target` on :func:`target_column`."""
    column = target_column(rows)
    by_round = {int(r["round"]): r for r in rows}
    out = []
    for target in targets:
        reached = rounds_to_target(rows, target, column) if rows else None
        elapsed = float(by_round[reached - 1]["elapsed_s"]) if reached is not None else None
        out.append((float(target), reached, elapsed))
    return out


def target_lines(rows: Sequence[dict[str, Any]], targets: Sequence[float]) -> list[str]:
    """One sentence a target, e.g. 'Rounds to 97 % mean user accuracy: 26 (812.3 s
    emulated).' or '... X (not reached in 100 rounds).'"""
    if not targets:
        return []
    what = (
        "mean user accuracy of the non-noisy clients"
        if target_column(rows) == "mean_clean_accuracy"
        else "mean user accuracy"
    )
    lines = []
    for target, reached, elapsed in times_to_targets(rows, targets):
        head = f"Rounds to {100 * target:g} % {what}: "
        if reached is None:
            lines.append(head + f"X (not reached in {len(rows)} rounds).")
        else:
            lines.append(head + f"{reached} ({elapsed:.1f} s emulated).")
    return lines


def run_notes(scenario: Any, rows: Sequence[dict[str, Any]]) -> list[str]:
    """What a run's summary and report print under their tables: the downlink assumption
    (:func:`mecsim.emulation.network.downlink_note`) and the algorithm's warnings about
    the run
    (``ServerAlgorithm.run_notes``, e.g. a mechanism that never acted)."""
    # deferred: the algorithms import torch (~1.5 s), which the figures' child process and
    # `mecsim report` otherwise never need
    from mecsim.agents.algorithms import run_notes as algorithm_notes
    from mecsim.emulation.network import downlink_note

    note = downlink_note(scenario)
    return ([note] if note else []) + algorithm_notes(
        scenario.algorithm.name, dict(scenario.algorithm.params), list(rows)
    )


def energy_line(s: dict[str, float]) -> str | None:
    """'Client energy per round: 123.4 J (compute 60 %, radio 5 %, idle 25 %, sleep 10 %),
    all selected clients.' or None without energy figures (records older than the sleep
    part show the three others)."""
    total = s.get("energy_j", float("nan"))
    if math.isnan(total):
        return None
    parts = ", ".join(
        f"{name} {_share(s[f'energy_{name}_j'], total):.0f} %"
        for name in ("compute", "radio", "idle", "sleep")
        if not math.isnan(s.get(f"energy_{name}_j", math.nan))
    )
    return (
        f"Client energy per round: {total:.1f} J ({parts}), all selected clients, from "
        "the device profiles' power figures (docs/devices.md)."
    )


def markdown(
    run_id: str,
    algorithm: str,
    s: dict[str, float],
    target_text: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> str:
    th, tc, ch, cc = table_rows(s)

    def md(header: list[str], cells: list[str]) -> str:
        return "\n".join(
            [
                "| method | " + " | ".join(header) + " |",
                "|---" * (len(header) + 1) + "|",
                f"| {algorithm} | " + " | ".join(cells) + " |",
            ]
        )

    unit = "version" if s.get("versions") else "round"
    time_title, cost_title = (
        table_titles(s)
        if s.get("versions")
        else (
            "Average time per round (emulated; critical path)",
            "Communication and computation per round",
        )
    )
    return (
        f"# Run {run_id}\n\n"
        f"{int(s['rounds'])} {unit}s, {s['total_time_s']:.1f} emulated seconds in all, "
        f"{s['host_wall_s']:.2f} host seconds per {unit}.\n\n"
        f"## {time_title}\n\n"
        f"{md(th, tc)}\n\n"
        f"## {cost_title}\n\n"
        f"{md(ch, cc)}\n\n"
        f"Best mean user accuracy {100 * s['best_mean_accuracy']:.2f} % "
        f"({unit} {int(s['best_round']) if not math.isnan(s['best_round']) else '-'}); "
        f"final {100 * s['final_mean_accuracy']:.2f} %. Peak modelled client training-step "
        f"memory {s['client_peak_mb']:.1f} MiB.\n"
        + "".join(f"\n{line}\n" for line in [energy_line(s), *target_text, *notes] if line)
    )


def rounds_to_target(
    rows: Sequence[dict[str, Any]], target: float, column: str = "mean_accuracy"
) -> int | None:
    """Rounds needed to reach a target average user accuracy (the MTFL paper's Table 2 figure).

    The number of rounds, counted from 1 (``row["round"] + 1``), until ``column`` of a
    round row first reaches ``target`` (``>=``); ``None`` when it never does within the
    rows (the paper's "X"). Rounds without the column or with NaN (not evaluated) are
    skipped. ``column`` is e.g. ``mean_clean_accuracy`` for MTFL's noisy-client runs.
    """
    if not any(column in r for r in rows):
        raise ValueError(f"no round row has a {column!r} column")
    for r in rows:
        value = r.get(column)
        if value is None or math.isnan(float(value)):
            continue
        if float(value) >= target:
            return int(r["round"]) + 1
    return None
