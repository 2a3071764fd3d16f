"""``mecsim run`` and the verbs about scenarios: validate, schema, devices, algorithms."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from mecsim.agents.algorithms import algorithm_classes, algorithm_names
from mecsim.analysis.plots import PlotWriter
from mecsim.emulation.devices import all_profiles
from mecsim.interfaces.console import summary_table
from mecsim.interfaces.metrics import MetricsExporter
from mecsim.run import interrupts, limits, preflight
from mecsim.run.interrupts import Terminated
from mecsim.run.observers import RunObserver
from mecsim.run.progress import ProgressBar
from mecsim.run.setup import RunFailed
from mecsim.scenario import (
    Scenario,
    ScenarioError,
    default_scenario_path,
    json_schema,
    load_scenario,
    scenario_from_dict,
)
from mecsim.scenario.overrides import OverrideError, parse_sets, set_paths
from mecsim.scenario.schema.base import EVERY_FIELD
from mecsim.store.reader import read_meta
from mecsim.store.runfolder import RunFolderError, prepare_resume, status_line
from mecsim.store.session import BadRun, new_run_id, run_in_folder
from mecsim.store.summary import energy_line, run_notes, summarise, target_lines

EXIT_BAD_INPUT = 2


def set_options(scenario: Scenario, sets: list[str], source: str) -> Scenario:
    """``scenario`` with the ``--set PATH=VALUE`` options applied in order and validated
    again as a file is: ScenarioError (exit 2) with one line naming ``source`` and the
    option or the field."""
    if not sets:
        return scenario
    data = scenario.model_dump(mode="json", context=EVERY_FIELD)
    try:
        set_paths(data, parse_sets(sets))
    except OverrideError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    return scenario_from_dict(data, f"{source} (with --set {' --set '.join(sets)})")


def _apply_overrides(scenario: Scenario, args: argparse.Namespace, source: str) -> Scenario:
    """The command line's changes to ``scenario``: the ``--set`` options first, then the
    named options (``--rounds``, ``--seed``, ...), which win over a ``--set`` of the same
    field."""
    data = set_options(scenario, args.sets, source).model_dump(mode="json")
    if args.rounds is not None:
        data["rounds"] = args.rounds
    if args.seed is not None:
        data["seed"] = args.seed
    if args.out is not None:
        data["outputs"]["dir"] = args.out
    if args.run_id is not None:
        data["outputs"]["run_id"] = args.run_id
    if args.no_metrics:
        data["metrics"]["enabled"] = False
    if args.metrics_port is not None:
        data["metrics"]["port"] = args.metrics_port
    if args.metrics_public:
        data["metrics"]["public"] = True
    if args.target:
        data["evaluation"]["target_accuracy"] = args.target
    return scenario_from_dict(data, f"{source} (with command-line overrides)")


def _error(text: str) -> None:
    """A problem line on stderr, printed literally (never interpreted as markup)."""
    print(text, file=sys.stderr)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """``mecsim run`` / ``mecsim run --resume``: one call of
    :func:`mecsim.store.session.run_in_folder` with the terminal's observers (progress
    bar, figures, /metrics), its exit codes and its tables."""
    target = None
    if args.resume:
        if (
            args.scenario
            or args.rounds is not None
            or args.seed is not None
            or args.run_id
            or args.out
            or args.target
            or args.sets
        ):
            _error(
                "error: --resume continues a run as it was planned (its scenario.yaml, "
                "--set overrides included): give no scenario file, --set, --rounds, --seed, "
                "--run-id, --out or --target with it (--hosts, --backend, --ray-address and "
                "the metrics options may differ)"
            )
            return EXIT_BAD_INPUT
        try:
            target = prepare_resume(
                args.resume, warn=lambda m: print(f"warning: {m}", file=sys.stderr)
            )
        except RunFolderError as exc:
            _error(f"error: {exc}")
            return EXIT_BAD_INPUT
        out_dir = target.run_dir
        path = out_dir / "scenario.yaml"
        if args.no_metrics or args.metrics_port is not None:
            data = target.scenario.model_dump(mode="json")
            if args.no_metrics:
                data["metrics"]["enabled"] = False
            if args.metrics_port is not None:
                data["metrics"]["port"] = args.metrics_port
            try:
                target.scenario = scenario_from_dict(data, f"{path} (with command-line overrides)")
            except ScenarioError:
                target.lock.release()
                raise
        scenario = target.scenario
    else:
        path = Path(args.scenario) if args.scenario else default_scenario_path()
        scenario = _apply_overrides(load_scenario(path), args, str(path))
        out_dir = Path(scenario.outputs.dir) / new_run_id(scenario)

    observers: list[RunObserver] = []
    if not args.no_plots:
        observers.append(PlotWriter(out_dir / "plots"))
    exporter = None
    if scenario.metrics.enabled:
        exporter = MetricsExporter(
            scenario.metrics.host, scenario.metrics.port, linger_s=args.metrics_linger
        )
        observers.append(exporter)
    progress = None if args.quiet else ProgressBar(console)
    if progress:
        observers.append(progress)

    def start_metrics() -> None:
        """Listen once the folder is made: a port taken since the pre-flight is still
        refused cleanly (exit 2, the folder removed)."""
        if exporter is None:
            return
        try:
            exporter.start()
        except OSError as exc:
            raise ScenarioError(
                f"{path}: metrics.port: cannot listen on "
                f"{scenario.metrics.host}:{scenario.metrics.port} "
                f"({exc.strerror or exc})"
            ) from None
        if scenario.metrics.port == 0 or not args.quiet:
            print(f"metrics: {exporter.url}", file=sys.stderr)
        if not args.quiet:
            what = (
                f"resuming after round {target.rounds_done} of {scenario.rounds}"
                if target is not None
                else f"{scenario.rounds} rounds"
            )
            console.print(
                f"[bold]mecsim[/] {escape(scenario.name)}: "
                f"{scenario.algorithm.name}, {scenario.topology.clients} clients, "
                f"{what} -> {escape(str(out_dir))}",
                highlight=False,
                soft_wrap=True,
            )

    restore_signals = interrupts.install()
    try:
        outcome = run_in_folder(
            scenario,
            out_dir,
            observers=observers,
            source=str(path),
            resume=target,
            backend=args.backend,
            hosts=args.hosts,
            ray_address=args.ray_address,
            serves_metrics=exporter is not None,
            on_folder_ready=start_metrics,
            warn=_error,
            limits=None if args.no_limits else limits.LOCAL,
        )
    except BadRun as exc:
        _error(str(exc))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        if not interrupts.from_signal(exc):  # code of the run raised it, nobody pressed Ctrl-C
            return _user_code_exit(exc, out_dir)
        done = int(read_meta(out_dir).get("rounds_done") or 0)
        print(
            f"interrupted after {done} of {scenario.rounds} rounds; the finished rounds "
            f"are kept. Resume with: mecsim run --resume {out_dir}",
            file=sys.stderr,
        )
        return 143 if isinstance(exc, Terminated) else 130
    except RunFailed as exc:
        print(
            f"error: the run failed: {exc}. Its finished rounds are kept; resume with: "
            f"mecsim run --resume {out_dir}",
            file=sys.stderr,
        )
        return 1
    except ScenarioError:
        raise
    except Exception as exc:  # a bug or an environment failure mid-run: say where it is
        log: Path | None = out_dir / "error.txt"
        try:
            log.write_text(traceback.format_exc())  # type: ignore[union-attr]
        except OSError:
            log = None
        print(
            f"error: the run failed: {type(exc).__name__}: {exc}. Its finished rounds are "
            f"kept"
            + (f"; the traceback is in {log}" if log else "")
            + f". Resume with: mecsim run --resume {out_dir}",
            file=sys.stderr,
        )
        return 1
    except BaseException as exc:  # sys.exit() or a BaseException of its own, raised by
        # code of the run outside the algorithm calls mecsim names (those are
        # AlgorithmErrors): a failed run, one line, not an exit 0 or a traceback
        return _user_code_exit(exc, out_dir)
    finally:
        restore_signals()
        if progress:
            progress.close()
        if exporter:
            exporter.close()
    rows = outcome.rows
    if not args.quiet:
        if len(rows) < scenario.rounds:
            console.print(Text(status_line("cancelled", len(rows), scenario.rounds)))
        if rows:
            for table in summary_table(scenario.algorithm.name, rows, console.width):
                console.print(table)
            for line in [
                energy_line(summarise(rows)),
                *target_lines(rows, scenario.evaluation.target_accuracy),
                *run_notes(scenario, rows),
            ]:
                if line:
                    console.print(Text(line))
        console.print(Text(f"records: {out_dir}/ (rounds.csv, clients.csv, summary.md, ...)"))
    return 0


def validate_file(path: str | Path, sets: list[str] | None = None) -> list[str]:
    """Every check ``mecsim validate`` makes on one file: the schema and the pre-flight of
    ``mecsim run`` with the file's own settings, after the ``--set`` options ``sets``.
    Raises ScenarioError (one line per problem); returns the warnings."""
    return preflight.check(set_options(load_scenario(path), sets or [], str(path)), str(path))


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    """The schema and the pre-flight of ``mecsim run`` (paths, ports, data, memory,
    cross-field checks) for each file, with the file's own settings."""
    bad = 0
    for f in args.files:
        try:
            for line in validate_file(f, args.sets):
                _error(line)
            print(f"{f}: ok")
        except ScenarioError as exc:
            bad += 1
            _error(str(exc))
    return EXIT_BAD_INPUT if bad else 0


def cmd_schema(args: argparse.Namespace, console: Console) -> int:
    text = json.dumps(json_schema(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    return 0


def cmd_devices(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    table = Table(
        title="Device profiles (t = batches * step_overhead + FLOPs / FLOP/s; "
        "power: docs/devices.md)"
    )
    for col in (
        "name",
        "GFLOP/s",
        "aggregation GFLOP/s",
        "step overhead (ms)",
        "RAM (GiB)",
        "active / idle / sleep W",
        "radio tx (P_tx/eta + P_c) / rx W",
        "source of GFLOP/s",
        "source of power",
    ):
        table.add_column(col)

    def watts(a: float | None, b: float | None, c: float | None = None) -> str:
        if a is None or b is None:
            return "-"
        return f"{a:g} / {b:g}" + ("" if c is None else f" / {c:g}")

    def radio(p) -> str:
        if p.radio_rx_power_w is None:
            return "-"
        if p.radio_tx_power_w is not None:
            return f"{p.radio_tx_power_w:g} / {p.radio_rx_power_w:g}"
        if p.radio_pa_efficiency is None or p.radio_circuit_power_w is None:
            return "-"
        dbm = "" if p.radio_tx_power_dbm is None else f" ({p.radio_tx_power_dbm:g} dBm default)"
        return (
            f"P_tx/{p.radio_pa_efficiency:g} + {p.radio_circuit_power_w:g}{dbm}"
            f" / {p.radio_rx_power_w:g}"
        )

    for p in all_profiles().values():
        cells = (
            p.name,
            f"{p.flops_per_s / 1e9:.2f}",
            "-" if p.aggregate_flops_per_s is None else f"{p.aggregate_flops_per_s / 1e9:.2f}",
            f"{1e3 * p.step_overhead_s:.0f}",
            f"{p.ram_bytes / 2**30:.0f}",
            watts(p.active_power_w, p.idle_power_w, p.sleep_power_w),
            radio(p),
            p.flops_source,
            p.power_source or "-",
        )
        table.add_row(*(escape(c) for c in cells))  # a plugin's profile: literally
    console.print(table)
    return 0


def cmd_algorithms(args: argparse.Namespace, console: Console) -> int:
    for name in algorithm_names():
        try:
            server_cls, _ = algorithm_classes(name)
        except ValueError as exc:  # a plugin that fails to load: named, the others listed
            print(str(exc), file=sys.stderr)
            continue
        module_doc = (sys.modules[server_cls.__module__].__doc__ or "").strip()
        doc = " ".join(module_doc.split("\n\n")[0].split())  # first paragraph
        console.print(f"[bold]{escape(name)}[/]: {escape(doc)}")
    return 0


def _user_code_exit(exc: BaseException, out_dir: Path) -> int:
    """A run that code of its own (an algorithm, a plugin) ended with what is not an
    Exception (``sys.exit(0)``, a ``raise KeyboardInterrupt`` nobody sent, a
    BaseException of its own): a failed run, one line, exit 1."""
    what = " ".join(repr(exc).split())[:300]
    log: Path | None = out_dir / "error.txt"
    try:
        log.write_text("".join(traceback.format_exception(exc)))  # type: ignore[union-attr]
    except OSError:
        log = None
    print(
        f"error: the run failed: code of the run raised {what} (user code). Its finished "
        "rounds are kept"
        + (f"; the traceback is in {log}" if log else "")
        + f". Resume with: mecsim run --resume {out_dir}",
        file=sys.stderr,
    )
    return 1
