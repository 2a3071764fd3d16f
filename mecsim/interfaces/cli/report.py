"""``mecsim report``: the papers' tables and figures from the records of finished runs.

Only argparse and pathlib are imported at module level (the CLI builds its parser for
every command); pandas and matplotlib are imported when a report is made.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DESCRIPTION = """\
Print and write the comparison tables of the papers for one or more finished (or
interrupted) runs, and draw their figures. Each RUN_DIR is a run's records folder,
e.g. runs/fedavg-mnist-10-20250101-120000 (it must hold rounds.csv).

Tables (markdown on stdout and in tables.md; one CSV each):
  KAPC Table 5 shape   average emulated time per round, split U-Comm / D-Comm / Client /
                       Server (+ Backhaul, Idle when present), seconds and %
  KAPC Table 6 shape   MiB up / down, client / server GFLOPs per round, server and client
                       memory, best mean accuracy
  MTFL Table 4 shape   round time and % in Down / Client / Up / Server
  DC-PFL Tables I-II   final accuracy, comm. rounds, comm. time, total time at
                       convergence (see --window, --tolerance), ratio to the
                       first run
  accuracy             best mean user accuracy and its round, final accuracy, rounds and
                       emulated time to --target
  time to accuracy     sync and async runs alike: updates, emulated seconds, clients'
                       joules and MiB until a common target (--target, else the highest
                       whole point every run reaches); the per-round tables leave
                       asynchronous runs out (their rows are overlapping server versions)
Figures (PNG): accuracy vs round and vs emulated time, time split per round, bytes per
round, per-client accuracy distribution; several runs are overlaid. A run with a
geometry also gets its map (map.png; map-<run folder>.png for several runs): the
cells, each client's trajectory and serving edge server per round, the handovers.
"""

EPILOG = """\
examples:
  mecsim report runs/fedavg-20250101-120000
  mecsim report runs/fedavg-a runs/local-b --target 0.9 --out reports/fedavg-vs-local
definitions: docs/reports.md
"""


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in (0, 1]; e.g. 0.97 for 97 %")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return value


def add_report_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="the papers' tables and figures from finished runs",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's records folder")
    p.add_argument(
        "--out",
        help="where to write tables.md, the CSVs and the PNGs "
        "(default: RUN_DIR/report for one run, reports/<timestamp> for several)",
    )
    p.add_argument(
        "--target",
        type=_fraction,
        help="target mean user accuracy as a fraction (e.g. 0.97): adds rounds "
        "and emulated time to reach it",
    )
    p.add_argument(
        "--tolerance",
        type=_fraction,
        default=0.01,
        help="convergence: how far below the final accuracy the trailing mean may "
        "stay (default 0.01 = 1 percentage point)",
    )
    p.add_argument(
        "--window",
        type=_positive_int,
        default=5,
        help="convergence: evaluated rounds in the final accuracy and the "
        "trailing mean (default 5; 1 = the last round alone)",
    )
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--quiet", action="store_true", help="do not print the tables")
    return p


def _rounds_text(r) -> str:
    """``12 rounds``, or ``interrupted after 6 of 12 rounds`` for a run that stopped."""
    # deferred: the run folder's module brings the run loop (torch); this module is
    # imported by every `mecsim` command for its parser
    from mecsim.store.runfolder import run_status, status_line

    st = run_status(r.path)
    done = len(r.rounds)
    if st["status"] in ("interrupted", "cancelled", "failed", "running"):
        return status_line(st["status"], done, r.planned_rounds or st["rounds_planned"])
    if r.planned_rounds and r.planned_rounds != done:
        return f"{done} rounds of {r.planned_rounds}"
    return f"{done} rounds"


def _maps(runs, out: Path) -> list[Path]:
    """The map of each run with a geometry: ``out/map.png`` for one run, else
    ``out/map-<run folder>.png`` each."""
    from mecsim.analysis.maps import MAP_NAME, write_map  # deferred: matplotlib

    written = []
    for r in runs:
        name = MAP_NAME if len(runs) == 1 else f"map-{Path(r.path).name}.png"
        path = write_map(r.path, out / name, run_id=Path(r.path).name)
        if path is not None:
            written.append(path)
    return written


def cmd_report(args: argparse.Namespace, console=None) -> int:
    # deferred: the tables read records with pandas (~0.3 s); this module is imported by
    # every `mecsim` command for its parser
    from mecsim.analysis.tables import ReportError, build_tables, label_runs, load_run

    dirs = [Path(d) for d in args.runs]
    seen: set[Path] = set()
    for d in dirs:
        if d.resolve() in seen:
            print(f"error: {d}: given twice", file=sys.stderr)
            return 2
        seen.add(d.resolve())
    try:
        runs = [load_run(d) for d in dirs]
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label_runs(runs)
    if args.out:
        out = Path(args.out)
    elif len(runs) == 1:
        out = dirs[0] / "report"
    else:
        out = Path("reports") / time.strftime("%Y%m%d-%H%M%S")
    if out.exists() and not out.is_dir():
        print(f"error: {out}: exists and is not a directory", file=sys.stderr)
        return 2
    tables = build_tables(runs, args.target, args.tolerance, args.window)
    text = tables.markdown()
    out.mkdir(parents=True, exist_ok=True)
    header = (
        "# mecsim report\n\nRuns: "
        + ", ".join(f"`{r.path}` ({r.algorithm}, {_rounds_text(r)})" for r in runs)
        + "\n\n"
    )
    (out / "tables.md").write_text(header + text)
    written = tables.write_csv(out)
    if not args.no_plots:
        from mecsim.analysis.plots import write_plots  # deferred: matplotlib (~0.5 s)

        written += write_plots(runs, out, args.target)
        written += _maps(runs, out)
    if not args.quiet:
        print(header + text)
        print(f"written to {out}/: " + ", ".join(p.name for p in [out / "tables.md", *written]))
    return 0
