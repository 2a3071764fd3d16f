"""Every label names the unit its values are in.

The table headers, figure axes, Prometheus help texts and dashboard panels carry a unit
from a small allowed set; where a label says MiB the values are bytes / 2**20, computed
here from the records independently (with sizes chosen so that MiB and MB differ in the
printed digits: 3.5 MiB is 3.67 MB)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT

from mecsim.analysis.labels import axis
from mecsim.analysis.plots import accuracy_figure, bytes_figure, energy_figure, time_split_figure
from mecsim.analysis.tables import RunRecords, build_tables
from mecsim.interfaces.console import summary_table
from mecsim.interfaces.metrics import METRICS
from mecsim.store.summary import markdown, summarise, table_rows

MiB = 2**20

#: the units a table header may name, in parentheses at its end
TABLE_UNITS = {"s", "s/%", "%", "MiB", "GFLOPs", "J", "fraction", "versions"}
#: headers without a unit: names and counts of rounds, versions and updates
UNITLESS = re.compile(
    r"^(method|Method|Learning scheme|Rounds|Best round|Comm\. rounds|Converged at round"
    r"|Rounds? to \d+(\.\d+)? %|mode|Updates|Updates to \d+(\.\d+)? %|Rounds \(versions\))$"
)
#: the units a figure's axis may name; "round" axes count rounds
AXIS_UNITS = {"s", "%", "MiB", "J"}


def _records(n: int = 4) -> RunRecords:
    acc = np.linspace(0.5, 0.8, n)
    df = pd.DataFrame(
        {
            "run_id": "a",
            "round": np.arange(n),
            "algorithm": "fedavg",
            "round_time_s": 4.0,
            "dl_time_s": 1.0,
            "client_time_s": 1.5,
            "ul_time_s": 1.25,
            "server_time_s": 0.25,
            "idle_time_s": 0.0,
            "elapsed_s": 4.0 * np.arange(1, n + 1),
            # 3.5 MiB up and 1.25 MiB down a round: 3.67 and 1.31 if they were MB
            "bytes_up": 3.5 * MiB,
            "bytes_down": 1.25 * MiB,
            "client_gflops": 2.5,
            "server_gflops": 0.004,
            "server_rss_mb": [100.0, 412.5, 300.0, 200.0][:n],  # MiB of RSS, as recorded
            "client_peak_mb": 1.5,
            "mean_accuracy": acc,
            "min_accuracy": acc - 0.1,
            "max_accuracy": acc + 0.1,
            "energy_j": 12.0,
            "energy_compute_j": 6.0,
            "energy_radio_j": 2.0,
            "energy_idle_j": 4.0,
            "host_wall_s": 0.1,
        }
    )
    return RunRecords(Path("a"), "a", "fedavg", df)


def _md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header, rows) of every markdown table in ``text``."""
    lines = text.splitlines()
    out = []
    for k, line in enumerate(lines[:-1]):
        if line.startswith("| ") and lines[k + 1].startswith("|---"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[k + 2 :]:
                if not row.startswith("| "):
                    break
                rows.append([c.strip() for c in row.strip("|").split("|")])
            out.append((header, rows))
    return out


def _unit(label: str) -> str | None:
    m = re.search(r"\(([^()]*)\)$", label)
    return m.group(1) if m else None


def _check_headers(headers: list[str]) -> None:
    for h in headers:
        if UNITLESS.match(h):
            continue
        assert _unit(h) in TABLE_UNITS, f"header {h!r} names no unit of {sorted(TABLE_UNITS)}"


def test_every_report_table_header_names_its_unit():
    tables = build_tables([_records()], target=0.6)
    found = _md_tables(tables.markdown())
    assert len(found) == 6
    for header, _ in found:
        _check_headers(header)


def test_the_run_summary_and_the_terminal_tables_name_their_units():
    s = summarise(_records().rounds.to_dict("records"))
    th, _, ch, _ = table_rows(s)
    _check_headers(th + ch)
    for header, _ in _md_tables(markdown("a", "fedavg", s)):
        _check_headers(header)
    for table in summary_table("fedavg", _records().rounds.to_dict("records"), width=None):
        _check_headers([str(c.header) for c in table.columns])
    # an asynchronous run's rows are server versions: its own time table
    versions = [{**row, "mean_staleness": 1.0} for row in _records().rounds.to_dict("records")]
    th, _, ch, _ = table_rows(summarise(versions))
    _check_headers(th + ch)


def _cell(text: str, header: str) -> str:
    """The first row's cell under ``header`` in the markdown table that has it."""
    for head, rows in _md_tables(text):
        if header in head:
            return rows[0][head.index(header)]
    raise AssertionError(f"no column {header!r}")


def test_mib_columns_hold_bytes_over_2_to_the_20():
    r = _records()
    report = build_tables([r], target=0.6).markdown()
    rows = r.rounds
    # independently of the tables' code: mean bytes a round / 2**20 (MB would print 3.67)
    assert _cell(report, "U-Comm (MiB)") == f"{rows['bytes_up'].mean() / 2**20:.2f}" == "3.50"
    assert _cell(report, "D-Comm (MiB)") == "1.25"
    # the server's RSS: the records hold MiB already (server_rss_mb, a name kept as a
    # contract): the largest, 412.5 MiB (432.5 MB)
    assert _cell(report, "Server mem (MiB)") == "412.5"
    assert _cell(report, "Client step mem (MiB)") == "1.50"
    # to the 60 % target (reached in round 2): 2 rounds x 4.75 MiB
    assert _cell(report, "Sent to 60 % (MiB)") == f"{2 * (3.5 + 1.25):.1f}"
    summary = markdown("a", "fedavg", summarise(rows.to_dict("records")))
    assert _cell(summary, "U-Comm (MiB)") == "3.50"
    assert _cell(summary, "Server mem (MiB)") == "412.5"
    t6 = build_tables([r]).kapc_cost
    # the CSV keeps the old column beside the new one: the same MiB figure
    assert t6["server_mem_mib"].iloc[0] == t6["server_mem_mb"].iloc[0] == 412.5


def test_seconds_joules_gflops_and_fractions_are_what_their_headers_say():
    r = _records()
    report = build_tables([r], target=0.6).markdown()
    assert _cell(report, "Time (s)") == "4.00"
    assert _cell(report, "Server (s/%)") == "0.25 (6.25)"  # 0.25 of 4 s
    assert _cell(report, "C-Comp (GFLOPs)") == "2.50"
    assert _cell(report, "Client energy (J)") == "12.0"
    assert _cell(report, "Best mean acc (%)") == "80.00"
    # DC-PFL's accuracies are fractions (the paper's 0.750): the last 4 rounds' mean
    assert _cell(report, "Final Acc. (fraction)") == f"{r.rounds['mean_accuracy'].mean():.3f}"


def test_a_run_s_server_memory_is_its_rss_in_mib(monkeypatch):
    """The recorded server_rss_mb is the server process's RSS bytes / 2**20."""
    from support.scenarios import tiny

    from mecsim.agents import server as server_module
    from mecsim.run.loop import run

    rss = 5 * MiB + MiB // 2  # 5.5 MiB (5.77 MB)
    monkeypatch.setattr(server_module._ServerProcess, "rss_bytes", lambda self: rss)
    rows = run(tiny(rounds=1), "units")
    assert rows[0]["server_rss_mb"] == rss / 2**20 == 5.5
    assert _cell(markdown("u", "fedavg", summarise(rows)), "Server mem (MiB)") == "5.5"


def _axis_labels(fig) -> list[str]:
    return [t for ax in fig.axes for t in (ax.get_xlabel(), ax.get_ylabel()) if t]


@pytest.mark.parametrize("figure", ["accuracy_round", "accuracy_time", "time", "energy", "bytes"])
def test_every_figure_axis_names_its_unit(figure):
    runs = [_records()]
    fig = {
        "accuracy_round": lambda: accuracy_figure(runs, "round"),
        "accuracy_time": lambda: accuracy_figure(runs, "time"),
        "time": lambda: time_split_figure(runs),
        "energy": lambda: energy_figure(runs),
        "bytes": lambda: bytes_figure(runs),
    }[figure]()
    labels = _axis_labels(fig)
    assert labels
    for label in labels:
        assert label == "round" or _unit(label) in AXIS_UNITS, label


def test_the_bytes_figure_plots_mib():
    fig = bytes_figure([_records()])
    lines = fig.axes[0].get_lines()
    assert "(MiB)" in fig.axes[0].get_ylabel()
    np.testing.assert_allclose(lines[0].get_ydata(), 3.5)  # 3.5 * 2**20 bytes up a round
    np.testing.assert_allclose(lines[1].get_ydata(), 1.25)


def test_sweep_axes_name_mib_for_mecsim_s_mb_columns():
    # mecsim's *_mb columns hold MiB (server_rss_mb = RSS bytes / 2**20)
    assert axis("server_rss_mb").unit == "MiB" and axis("server_rss_mb").scale == 1.0
    assert axis("bytes_up").unit == "MiB" and axis("bytes_up").scale == 1 / 2**20
    assert axis("energy_total_j").text == "client energy, whole run (kJ)"


#: a Prometheus family's unit (its name's suffix, Prometheus conventions) -> the unit its
#: help text names in parentheses at its end
HELP_UNITS = (
    ("_bytes_per_second", "bytes per second"),
    ("_seconds_total", "seconds"),
    ("_seconds", "seconds"),
    ("_bytes_total", "bytes"),
    ("_bytes", "bytes"),
    ("_joules_total", "joules"),
    ("_joules", "joules"),
    ("_ratio", "ratio 0-1"),
    ("_decibels", "decibels"),
    ("_flops_total", "FLOPs"),
    ("_loss", "cross-entropy, nats"),
    ("_info", "value always 1"),
    ("_index", "index"),
    ("_versions", "versions"),
    ("_quantity", "the plugin's unit"),
)


def test_every_prometheus_help_text_names_the_unit_of_its_name():
    for name, (_, help_text) in METRICS.items():
        unit = _unit(help_text)
        assert unit is not None, name
        want = next((u for suffix, u in HELP_UNITS if name.endswith(suffix)), "count")
        assert unit.startswith(want), f"{name}: help says ({unit}), its name says {want}"


#: Grafana units a panel may show for a metric family (bytes: binary prefixes, KiB/MiB,
#: as the tables; si:FLOPs: FLOPs with SI prefixes)
PANEL_UNITS = {
    "mecsim_transferred_bytes_total": {"bytes", "Bps"},
    "mecsim_server_resident_memory_bytes": {"bytes"},
    "mecsim_client_step_memory_bytes": {"bytes"},
    "mecsim_flops_total": {"si:FLOPs"},
    "mecsim_user_accuracy_ratio": {"percentunit"},
    "mecsim_emulated_seconds_total": {"s", "none"},
    "mecsim_round_phase_seconds": {"s"},
}


def test_dashboard_panels_show_their_metric_s_unit():
    seen = set()
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
            exprs = " ".join(t.get("expr", "") for t in panel.get("targets", []))
            for metric, units in PANEL_UNITS.items():
                # the first family a query divides is what it shows
                first = re.match(r"\W*(?:\w+\()*\W*(mecsim_\w+)", exprs)
                if first and first.group(1) == metric:
                    seen.add(metric)
                    assert unit in units, f"{path.name}: {panel['title']!r} shows {unit!r}"
    assert seen == set(PANEL_UNITS)
