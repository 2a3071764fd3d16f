"""``mecsim sweep``: the command-line face of :mod:`mecsim.analysis.whatif_sweep` (parser
and handler).

Kept apart from :mod:`mecsim.analysis.whatif_sweep` so that building the CLI parser imports
nothing heavy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from mecsim.interfaces.cli.plugins import add_plugin_option
from mecsim.interfaces.cli.report import _fraction, _positive_int

EXIT_BAD_INPUT = 2
DEFAULT_METRIC = "round_time_mean_s"

DESCRIPTION = """\
Replay recorded runs under changed network or device parameters, without training,
and write OUT/sweep.csv (one row per run and grid point) and OUT/sweep.png (METRIC
against the first --set parameter, one line per run/algorithm).

RUN is a run directory written by `mecsim run` (it must hold optraces.jsonl), or a
scenario YAML, which is first run once with training and recorded in OUT/recorded/.

Only timing can be replayed: channel.*, devices.*, deadline_s, backhaul.*, and for
runs with clients that move (flat algorithms) geometry.mobility.rate, the mobility
speeds and geometry.sites.inter_site_distance_m. A point is
marked not exact (column `exact`, red crosses in the plot) when the run's outcome would
have depended on timing there: a deadline dropping other clients than the recorded run
did, or an algorithm that decides from emulated time. --retrain re-runs such points
(and any override of training, data or model) with real training; those rows say
source=retrained.

examples:
  mecsim sweep runs/fedavg-mnist-10-X --set channel.uplink.bandwidth_hz=1e6,5e6,10e6,20e6
  mecsim sweep runs/A runs/B --set channel.uplink.bandwidth_hz=1e6:50e6:50 --out sweeps/bw
  mecsim sweep runs/A --set devices.clients.0.profile=rpi2b,rpi3b,rpi4,rpi5 \\
      --set deadline_s=null,30 --target-accuracy 0.8 --metric time_to_target_s
"""


def add_sweep_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sweep",
        help="what-if sweeps: replay recorded runs over a grid",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directory (with optraces.jsonl) or scenario YAML",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PATH=V1,V2,...",
        help="a grid axis: a dotted scenario path and its values, comma-separated "
        "(lists in [..], mappings in {..}; null for none), or START:STOP:COUNT "
        "for evenly spaced numbers. Repeat for a grid over several paths.",
    )
    p.add_argument("--out", help="output directory (default: sweeps/sweep-<timestamp>)")
    p.add_argument(
        "--metric",
        default=DEFAULT_METRIC,
        help=f"column plotted (default {DEFAULT_METRIC}; e.g. total_time_s, "
        "time_to_target_s, round_time_p95_s, ul_time_mean_s)",
    )
    p.add_argument(
        "--target-accuracy",
        type=_fraction,
        help="mean user accuracy for rounds_to_target / time_to_target_s (a fraction in "
        "(0, 1], e.g. 0.8)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        help="replay processes, >= 1 (default: one per core for large sweeps)",
    )
    p.add_argument(
        "--retrain",
        action="store_true",
        help="re-run points whose replay is not exact with real training",
    )
    p.add_argument(
        "--backend",
        choices=["ray", "local"],
        help="backend for training (recording a scenario, --retrain)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    add_plugin_option(p)  # the plugins a recorded run used, when they are plugin files
    return p


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    # deferred: replay and sweeps load the algorithms (torch, ~1.5 s); this module is
    # imported by every `mecsim` command for its parser
    from mecsim.analysis.replay import ReplayInfeasible, RunLoadError
    from mecsim.analysis.whatif_sweep import METRIC_COLUMNS, grid_size, plot_sweep, sweep
    from mecsim.run.limits import LOCAL, check_sweep_points
    from mecsim.scenario import ScenarioError
    from mecsim.scenario.overrides import OverrideError, parse_set

    def fail(msg: str) -> int:  # msg holds what the user typed: printed literally
        console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
        return EXIT_BAD_INPUT

    try:
        grid = dict(parse_set(s) for s in args.sets)
    except OverrideError as exc:
        return fail(str(exc))
    if len(grid) != len(args.sets):
        return fail("the same path is given to --set twice")
    too_many = check_sweep_points(grid_size(grid), LOCAL, "mecsim sweep's limit")
    if too_many:
        return fail(too_many)
    if args.metric not in METRIC_COLUMNS or args.metric in ("source", "notes"):
        numeric = [c for c in METRIC_COLUMNS if c not in ("source", "notes")]
        return fail(f"--metric {args.metric!r} is not a sweep column; one of: {', '.join(numeric)}")
    if args.metric in ("time_to_target_s", "rounds_to_target") and args.target_accuracy is None:
        return fail(f"--metric {args.metric} needs --target-accuracy")
    out = Path(args.out) if args.out else Path("sweeps") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    unusable = _unusable_out(out)  # before the work, not after it
    if unusable:
        return fail(unusable)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            frame = sweep(
                args.runs,
                grid,
                target_accuracy=args.target_accuracy,
                retrain=args.retrain,
                workers=args.workers,
                progress=not args.quiet,
                backend=args.backend,
                record_dir=out / "recorded",
                retrain_dir=out / "retrained",
            )
    except (OverrideError, RunLoadError, ScenarioError, ReplayInfeasible) as exc:
        return fail(str(exc))
    for w in caught:
        console.print(
            f"[yellow]warning:[/] {escape(str(w.message))}", highlight=False, soft_wrap=True
        )

    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "sweep.csv"
    frame.to_csv(csv_path, index=False)
    x = next(iter(grid), None)
    png_path = None
    if x is not None:
        png_path = plot_sweep(frame, x, args.metric, out / "sweep.png")
    if not args.quiet:
        _print_table(console, frame, list(grid), args.metric)
    inexact = frame[~frame["exact"].astype(bool)]
    if len(inexact):
        console.print(
            f"[yellow]{len(inexact)} of {len(frame)} points are not exact[/] "
            "(the outcome depended on timing; see the notes column, or --retrain)"
        )
    console.print(
        escape(
            f"wrote {csv_path}"
            + (f" and {png_path}" if png_path else " (no --set: nothing to plot)")
        ),
        highlight=False,
        soft_wrap=True,
    )
    return 0


def _unusable_out(out: Path) -> str | None:
    """Why ``--out`` cannot take the sweep's files, or None: it, or the nearest folder
    above it that exists, must be a folder in which a folder can be made (one is made
    and removed there to find out; ``os.access`` says yes to root on /proc). Nothing is
    left behind: a refused sweep leaves no ``--out``."""
    here = Path(os.path.abspath(out))
    for folder in [here, *here.parents]:
        if os.path.lexists(folder):
            break
    if not folder.is_dir():
        what = "exists and is not a folder" if folder == here else f"{folder} is not a folder"
        return f"--out {out}: {what}"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mecsim-sweep-", dir=folder))
    except OSError as exc:
        return f"--out {out}: cannot make or write it in {folder} ({exc.strerror or exc})"
    return None


def _print_table(console: Console, frame, paths: list[str], metric: str) -> None:
    from rich.table import Table

    cols = ["algorithm", *paths, "round_time_mean_s", "total_time_s", "exact", "source"]
    if metric not in cols:
        cols.insert(len(paths) + 1, metric)
    table = Table(title=f"sweep: {len(frame)} points")
    for c in cols:  # the --set paths and the values are the user's: printed literally
        table.add_column(escape(c), justify="right")
    shown = frame if len(frame) <= 40 else frame.iloc[:: max(1, len(frame) // 40)]
    for _, row in shown.iterrows():
        table.add_row(*(escape(f"{v:.4g}" if isinstance(v, float) else str(v)) for v in row[cols]))
    console.print(table)
    if len(shown) < len(frame):
        console.print(f"(every {len(frame) // 40}th point shown; all in sweep.csv)")
