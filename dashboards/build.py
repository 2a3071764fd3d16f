"""Build the Grafana dashboards of mecsim with the Grafana Foundation SDK.

    pip install 'grafana-foundation-sdk==1769699379!11.6.0'   # once (Grafana 11.6 schema)
    python dashboards/build.py              # rewrites dashboards/*.json
    python dashboards/build.py --check      # exit 1 if a JSON file differs from the build

The SDK publishes one release line per Grafana version (the number after ``!``), and a
plain ``pip install grafana-foundation-sdk`` picks whichever line was uploaded last: pin
it, or the generated JSON changes with it.

The JSON files next to this script are generated: edit this file, not them (a test
checks that they match the build). Every query names only metrics that
``mecsim.interfaces.metrics.MetricsExporter`` exports and filters on the ``run`` and ``algorithm``
dashboard variables; the variables ``$__rate_interval`` and ``$__range`` are Grafana's.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
    VisibilityMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

HERE = Path(__file__).resolve().parent
#: The SDK release the committed JSON was built with (tests/e2e/test_monitoring.py reads it).
SDK_PIN = "1769699379!11.6.0"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
FILTER = 'run=~"$run",algorithm=~"$algorithm"'
RI = "$__rate_interval"
LAST = ReduceDataOptions().calcs(["lastNotNull"]).values(False)


def sel(metric: str, **labels: str) -> str:
    """``metric{run=~"$run",algorithm=~"$algorithm",k="v",...}``; ``k__re`` gives ``=~``."""
    extra = "".join(
        f',{k.removesuffix("__re")}{"=~" if k.endswith("__re") else "="}"{v}"'
        for k, v in labels.items()
    )
    return f"{metric}{{{FILTER}{extra}}}"


def q(expr: str, legend: str, ref: str = "A", fmt: PromQueryFormat | None = None) -> Dataquery:
    d = Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    if fmt is not None:
        d = d.format(fmt)
    return d


def variables(dash: Dashboard) -> Dashboard:
    all_opt = VariableOption(selected=True, text="All", value="$__all")
    return (
        dash.with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            QueryVariable("run")
            .label("Run")
            .datasource(DS)
            .query("label_values(mecsim_run_info, run)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(all_opt)
        )
        .with_variable(
            QueryVariable("algorithm")
            .label("Algorithm")
            .datasource(DS)
            .query('label_values(mecsim_run_info{run=~"$run"}, algorithm)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(all_opt)
        )
    )


def base(uid: str, title: str, description: str) -> Dashboard:
    dash = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["mecsim", "federated-learning"])
        .refresh("5s")
        .time("now-30m", "now")
        .timezone("browser")
        .editable()
    )
    return variables(dash)


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def ts(
    ids: Ids,
    title: str,
    desc: str,
    unit: str,
    *targets: Dataquery,
    span: int = 12,
    height: int = 8,
    stacked: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .id(ids())
        .title(title)
        .description(desc)
        .unit(unit)
        .datasource(DS)
        .span(span)
        .height(height)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
    )
    for t in targets:
        p = p.with_target(t)
    if stacked:
        p = p.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(60)
    if vmin is not None:
        p = p.min(vmin)
    if vmax is not None:
        p = p.max(vmax)
    return p


def st(ids: Ids, title: str, desc: str, unit: str, target: Dataquery, span: int = 4) -> stat.Panel:
    return (
        stat.Panel()
        .id(ids())
        .title(title)
        .description(desc)
        .unit(unit)
        .datasource(DS)
        .span(span)
        .height(4)
        .reduce_options(LAST)
        .with_target(target)
    )


def bar(
    ids: Ids, title: str, desc: str, unit: str, target: Dataquery, span: int = 12, height: int = 8
) -> bargauge.Panel:
    return (
        bargauge.Panel()
        .id(ids())
        .title(title)
        .description(desc)
        .unit(unit)
        .datasource(DS)
        .span(span)
        .height(height)
        .reduce_options(LAST)
        .orientation(VizOrientation.HORIZONTAL)
        .with_target(target)
    )


# ----------------------------------------------------------------------------- overview


def overview() -> Dashboard:
    ids = Ids()
    rounds = sel("mecsim_rounds_total")
    d = base(
        "mecsim-overview",
        "mecsim / Run overview",
        "Progress, accuracy, emulated round time and its split, bytes, FLOPs, memory "
        "and clients of the selected mecsim runs (one series per run).",
    )
    d = d.with_row(Row("Progress").id(ids()))
    d = d.with_panel(
        st(ids, "Rounds completed", "Rounds finished so far.", "none", q(rounds, "{{run}}"))
    )
    d = d.with_panel(
        st(
            ids,
            "Progress",
            "Rounds completed / rounds the scenario asks for.",
            "percentunit",
            q(f"{rounds} / {sel('mecsim_rounds_planned')}", "{{run}}"),
        )
    )
    d = d.with_panel(
        st(
            ids,
            "Emulated time",
            "Emulated seconds of the modelled testbed elapsed since the run started.",
            "s",
            q(sel("mecsim_emulated_seconds_total"), "{{run}}"),
        )
    )
    d = d.with_panel(
        st(
            ids,
            "Host time in rounds",
            "Wall-clock seconds this machine spent in rounds.",
            "s",
            q(sel("mecsim_host_wall_seconds_total"), "{{run}}"),
        )
    )
    d = d.with_panel(
        st(
            ids,
            "Mean user accuracy",
            "Mean over evaluated clients, last evaluated round.",
            "percentunit",
            q(sel("mecsim_user_accuracy_ratio", stat="mean"), "{{run}}"),
        )
    )
    d = d.with_panel(
        st(
            ids,
            "Clients dropped",
            "Client-rounds dropped by the deadline, whole run.",
            "none",
            q(sel("mecsim_clients_total", status="dropped"), "{{run}}"),
        )
    )

    d = d.with_row(Row("Accuracy and loss").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "User accuracy",
            "Mean, min and max user accuracy over the "
            "evaluated clients of the last evaluated round.",
            "percentunit",
            q(sel("mecsim_user_accuracy_ratio"), "{{run}} {{stat}}"),
            vmin=0,
            vmax=1,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Loss",
            "Mean training loss of the last round's clients and "
            "mean test loss of the last evaluated round.",
            "none",
            q(sel("mecsim_train_loss"), "{{run}} train"),
            q(sel("mecsim_test_loss"), "{{run}} test", "B"),
        )
    )

    d = d.with_row(Row("Round time (emulated)").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "Round time split (last round)",
            "Emulated critical-path "
            "seconds of the last round by phase: download, client compute, "
            "upload, backhaul, server, idle (waiting for a deadline).",
            "s",
            q(sel("mecsim_round_phase_seconds"), "{{run}} {{phase}}"),
            stacked=True,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Round duration: emulated vs host",
            "Emulated seconds of the "
            "last round beside the host wall-clock seconds it took to compute.",
            "s",
            q(sel("mecsim_round_duration_seconds"), "{{run}} emulated"),
            q(sel("mecsim_host_round_wall_seconds"), "{{run}} host", "B"),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Share of emulated time by phase (whole run)",
            "Each phase's emulated seconds summed over rounds / all emulated seconds.",
            "percentunit",
            q(
                f"{sel('mecsim_emulated_phase_seconds_total')} / ignoring(phase) "
                f"group_left {sel('mecsim_emulated_seconds_total')}",
                "{{run}} {{phase}}",
            ),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Emulated seconds per host second",
            "How much faster than the "
            "modelled testbed this machine runs the rounds (emulated / host "
            "seconds over the rate window).",
            "none",
            q(
                f"rate({sel('mecsim_emulated_seconds_total')}[{RI}]) / "
                f"rate({sel('mecsim_host_wall_seconds_total')}[{RI}])",
                "{{run}}",
            ),
        )
    )

    d = d.with_row(Row("Communication, computation, memory, clients").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "Bytes per round (run average)",
            "Bytes sent over the air so far / rounds completed; up = clients to server.",
            "bytes",
            q(
                f"{sel('mecsim_transferred_bytes_total')} / ignoring(direction) "
                f"group_left {rounds}",
                "{{run}} {{direction}}",
            ),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "FLOPs per round (run average)",
            "Client (local training of "
            "all selected clients) and server (aggregation) FLOPs per round.",
            "si:FLOPs",
            q(
                f"{sel('mecsim_flops_total')} / ignoring(side) group_left {rounds}",
                "{{run}} {{side}}",
            ),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Memory",
            "Edge-server process RSS after aggregation and the "
            "peak modelled memory of a client training step.",
            "bytes",
            q(sel("mecsim_server_resident_memory_bytes"), "{{run}} server RSS"),
            q(sel("mecsim_client_step_memory_bytes"), "{{run}} client step", "B"),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Clients in the last round",
            "Selected, completed (made the deadline) and dropped clients of the last round.",
            "none",
            q(sel("mecsim_round_clients"), "{{run}} {{status}}"),
        )
    )

    d = d.with_row(Row("Asynchronous runs: staleness and updates in flight").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "Staleness of the last version's updates (versions)",
            "Versions the server made between a client's download and its update's "
            "arrival, mean and max over the updates aggregated into the last version "
            "(asynchronous runs only: docs/async.md).",
            "none",
            q(sel("mecsim_update_staleness_versions"), "{{run}} {{stat}}"),
            span=8,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Staleness of the last version's updates (seconds)",
            "Mean emulated seconds between the making of the version an update trained "
            "on and the update's arrival (asynchronous runs only).",
            "s",
            q(sel("mecsim_update_staleness_seconds"), "{{run}}"),
            span=8,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Updates in flight",
            "Clients between a download's start and their update's arrival when the last "
            "version was made (asynchronous runs only).",
            "none",
            q(sel("mecsim_updates_in_flight"), "{{run}}"),
            span=8,
        )
    )
    return d


# ----------------------------------------------------------------------------- algorithms


def algorithms() -> Dashboard:
    ids = Ids()
    rounds = sel("mecsim_rounds_total")
    lg = "{{algorithm}} ({{run}})"
    d = base(
        "mecsim-algorithms",
        "mecsim / Algorithm comparison",
        "The selected runs side by side, labelled by algorithm: accuracy, the KAPC "
        "Table 5/6 quantities per round, memory and dropped clients.",
    )
    d = d.with_row(Row("Accuracy").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "Mean user accuracy",
            "Mean user accuracy of the last evaluated round, per algorithm and run.",
            "percentunit",
            q(sel("mecsim_user_accuracy_ratio", stat="mean"), lg),
            vmin=0,
            vmax=1,
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Best mean user accuracy (time range)",
            "Highest mean user accuracy seen in the dashboard's time range.",
            "percentunit",
            q(f"max_over_time({sel('mecsim_user_accuracy_ratio', stat='mean')}[$__range])", lg),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Train loss",
            "Mean training loss of the last round.",
            "none",
            q(sel("mecsim_train_loss"), lg),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Emulated time elapsed",
            "Emulated seconds since each run "
            "started: with the accuracy panel, which algorithm gets where "
            "first in testbed time.",
            "s",
            q(sel("mecsim_emulated_seconds_total"), lg),
        )
    )

    d = d.with_row(Row("Time per round (KAPC Table 5 shape)").id(ids()))
    d = d.with_panel(
        bar(
            ids,
            "Average emulated round time",
            "Emulated seconds / rounds completed.",
            "s",
            q(f"{sel('mecsim_emulated_seconds_total')} / {rounds}", lg),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Average time per round by phase",
            "Each phase's emulated "
            "critical-path seconds / rounds completed (U-Comm = upload, "
            "D-Comm = download, Client, Server).",
            "s",
            q(
                f"{sel('mecsim_emulated_phase_seconds_total')} / ignoring(phase) "
                f"group_left {rounds}",
                lg + " {{phase}}",
            ),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Share of round time by phase",
            "Each phase's emulated seconds "
            "/ all emulated seconds (the % in KAPC Table 5, MTFL Table 4).",
            "percentunit",
            q(
                f"{sel('mecsim_emulated_phase_seconds_total')} / ignoring(phase) "
                f"group_left {sel('mecsim_emulated_seconds_total')}",
                lg + " {{phase}}",
            ),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Dropped clients (share of selected)",
            "Client-rounds dropped by the deadline / client-rounds selected, whole run.",
            "percentunit",
            q(
                f"{sel('mecsim_clients_total', status='dropped')} / "
                f"ignoring(status) {sel('mecsim_clients_total', status='selected')}",
                lg,
            ),
        )
    )

    d = d.with_row(Row("Communication, computation, memory (KAPC Table 6 shape)").id(ids()))
    d = d.with_panel(
        bar(
            ids,
            "Bytes per round",
            "Bytes up (U-Comm) and down (D-Comm) per round, all selected clients.",
            "bytes",
            q(
                f"{sel('mecsim_transferred_bytes_total')} / ignoring(direction) "
                f"group_left {rounds}",
                lg + " {{direction}}",
            ),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "FLOPs per round",
            "Client (C-Comp) and server (S-Comp) FLOPs per round.",
            "si:FLOPs",
            q(
                f"{sel('mecsim_flops_total')} / ignoring(side) group_left {rounds}",
                lg + " {{side}}",
            ),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Peak server memory (time range)",
            "Highest edge-server RSS in the time range.",
            "bytes",
            q(f"max_over_time({sel('mecsim_server_resident_memory_bytes')}[$__range])", lg),
        )
    )
    d = d.with_panel(
        bar(
            ids,
            "Client training-step memory",
            "Peak modelled memory of a client training step, last round.",
            "bytes",
            q(sel("mecsim_client_step_memory_bytes"), lg),
        )
    )
    return d


# ----------------------------------------------------------------------------- network


def network() -> Dashboard:
    ids = Ids()
    lg = "{{run}} {{direction}}"
    d = base(
        "mecsim-network",
        "mecsim / Channel and network",
        "The wireless channel as the clients saw it: distributions of per-client link "
        "rates and SNRs (histograms over client-rounds, not one series per client), "
        "per-client transfer times and the communication phases of the rounds.",
    )
    rate_bucket = "mecsim_channel_rate_bytes_per_second_bucket"

    d = d.with_row(Row("Link rates").id(ids()))
    for direction, name in (("up", "Uplink"), ("down", "Downlink")):
        d = d.with_panel(
            heatmap.Panel()
            .id(ids())
            .title(f"{name} rate distribution")
            .description(
                f"Client-rounds per {name.lower()}-rate bucket in each interval: "
                "the spread of the channel across clients and rounds."
            )
            .datasource(DS)
            .span(12)
            .height(8)
            .calculate(False)
            .mode(TooltipDisplayMode.SINGLE)
            .show_legend()
            .y_axis(heatmap.YAxisConfig().unit("Bps"))
            .with_target(
                q(
                    f"sum by (le) (increase({sel(rate_bucket, direction=direction)}[{RI}]))",
                    "{{le}}",
                    fmt=PromQueryFormat.HEATMAP,
                )
            )
        )
    quantiles = [
        q(
            f"histogram_quantile({p}, sum by (le, run, direction) ({sel(rate_bucket)}))",
            f"{lg} p{int(100 * p)}",
            ref,
        )
        for p, ref in ((0.1, "A"), (0.5, "B"), (0.9, "C"))
    ]
    d = d.with_panel(
        ts(
            ids,
            "Per-client link rate quantiles (run so far)",
            "10th, 50th and "
            "90th percentile of the per-client rate over all client-rounds so "
            "far (bucket resolution: half a decade).",
            "Bps",
            *quantiles,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Mean per-client link rate (run so far)",
            "Sum of per-client rates / client-rounds.",
            "Bps",
            q(
                f"sum by (run, direction) "
                f"({sel('mecsim_channel_rate_bytes_per_second_sum')}) / "
                f"sum by (run, direction) "
                f"({sel('mecsim_channel_rate_bytes_per_second_count')})",
                lg,
            ),
        )
    )

    d = d.with_row(Row("Signal and transfers").id(ids()))
    snr = [
        q(
            f"histogram_quantile({p}, sum by (le, run, direction) "
            f"({sel('mecsim_channel_snr_decibels_bucket')}))",
            f"{lg} p{int(100 * p)}",
            ref,
        )
        for p, ref in ((0.1, "A"), (0.5, "B"), (0.9, "C"))
    ]
    d = d.with_panel(
        ts(
            ids,
            "SNR quantiles (run so far)",
            "Effective SNR (with the "
            "scenario's snr_offset_db) of the client-rounds, 10th/50th/90th "
            "percentile; Shannon channels only (5 dB buckets).",
            "dB",
            *snr,
        )
    )
    phase_bucket = "mecsim_client_phase_seconds_bucket"
    d = d.with_panel(
        ts(
            ids,
            "Per-client transfer and compute time quantiles (run so far)",
            "Median and 90th percentile of each selected client's emulated "
            "download, compute and upload seconds (stragglers show as a wide "
            "gap).",
            "s",
            q(
                f"histogram_quantile(0.5, sum by (le, run, phase) ({sel(phase_bucket)}))",
                "{{run}} {{phase}} p50",
            ),
            q(
                f"histogram_quantile(0.9, sum by (le, run, phase) ({sel(phase_bucket)}))",
                "{{run}} {{phase}} p90",
                "B",
            ),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Communication phases of the last round",
            "Critical-path "
            "download, upload and backhaul seconds of the last round (backhaul "
            "is 0 until hierarchical scenarios record it).",
            "s",
            q(
                sel("mecsim_round_phase_seconds", phase__re="download|upload|backhaul"),
                "{{run}} {{phase}}",
            ),
            stacked=True,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Bytes per emulated second",
            "Bytes over the air per emulated second of the modelled testbed, over the rate window.",
            "Bps",
            q(
                f"increase({sel('mecsim_transferred_bytes_total')}[{RI}]) / "
                f"ignoring(direction) group_left "
                f"increase({sel('mecsim_emulated_seconds_total')}[{RI}])",
                lg,
            ),
        )
    )

    d = d.with_row(Row("Cells and handover (runs with a geometry)").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "Handovers per round (run average)",
            "Clients that changed edge server at a round's start, summed over the run / "
            "rounds completed (every client, selected or not; 0 for static clients).",
            "none",
            q(f"{sel('mecsim_handovers_total')} / {sel('mecsim_rounds_total')}", "{{run}}"),
            span=8,
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Selected clients per serving cell (last round)",
            "The last round's selected clients by the edge server (cell) serving them at "
            "the round's start: how the clients spread over the cells as they move.",
            "none",
            q(sel("mecsim_cell_clients"), "{{run}} cell {{edge_server}}"),
            span=16,
            stacked=True,
        )
    )
    d = d.with_panel(
        statetimeline.Panel()
        .id(ids())
        .title("Serving cell per client")
        .description(
            "Each client's serving edge server (cell) at the start of the last round it "
            "was selected in; a change of colour is a handover. Runs of at most 100 "
            "clients (larger runs: the counts per cell above, and the run's map)."
        )
        .datasource(DS)
        .span(24)
        .height(10)
        .show_value(VisibilityMode.NEVER)
        .merge_values(True)
        .decimals(0)
        .with_target(q(sel("mecsim_client_edge_server_index"), "{{run}} client {{client}}"))
    )

    d = d.with_row(Row("Clients").id(ids()))
    d = d.with_panel(
        ts(
            ids,
            "Clients selected, completed, dropped",
            "Per round (last round shown at each instant).",
            "none",
            q(sel("mecsim_round_clients"), "{{run}} {{status}}"),
        )
    )
    d = d.with_panel(
        ts(
            ids,
            "Client-rounds observed",
            "Client-rounds whose channel was drawn so far (the histograms' sample count).",
            "none",
            q(
                f"sum by (run) "
                f"({sel('mecsim_channel_rate_bytes_per_second_count', direction='up')})",
                "{{run}}",
            ),
        )
    )
    return d


DASHBOARDS = {
    "mecsim-overview.json": overview,
    "mecsim-algorithms.json": algorithms,
    "mecsim-network.json": network,
}


def render(build) -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if a file differs from the build"
    )
    args = ap.parse_args(argv)
    installed = metadata.version("grafana-foundation-sdk")
    if installed != SDK_PIN:
        print(
            f"warning: grafana-foundation-sdk {installed} installed; the dashboards are "
            f"built with {SDK_PIN}",
            file=sys.stderr,
        )
    stale = []
    for name, build in DASHBOARDS.items():
        text, path = render(build), HERE / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python dashboards/build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
