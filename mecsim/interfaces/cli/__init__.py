"""The ``mecsim`` command.

    mecsim run [SCENARIO.yaml]     run a scenario (default: the embedded one)
    mecsim validate FILE...        check scenario files
    mecsim schema [-o FILE]        JSON Schema of scenario files, for editors
    mecsim devices                 the built-in device profiles and their sources
    mecsim algorithms              the algorithms that can be named in a scenario
    mecsim check NAME              the conformance kit: does an algorithm keep its promises
    mecsim plugins [--json]        what a scenario may name, where it comes from, if it loads
    mecsim new KIND NAME [--dir D] write a plugin package (algorithm, model, dataset, channel)
    mecsim sweep RUN... --set P=V,...  what-if sweeps: replay recorded runs over a grid
    mecsim report RUN_DIR...       the papers' tables (markdown, CSV) and figures of runs
    mecsim serve                   the testbed as a service (queue, API, web page, /metrics)
    mecsim submit / runs / status / cancel / fetch   clients of a service

Exit codes: 0 success, 2 bad input (scenario file, arguments), 1 a run that failed.
Bad input is found before anything starts (:mod:`mecsim.run.preflight`) and printed as one
plain line per problem (no rich markup: paths and messages are printed literally).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from rich.console import Console

from mecsim.interfaces.cli.check import add_check_parser, cmd_check
from mecsim.interfaces.cli.new import add_new_parser, cmd_new
from mecsim.interfaces.cli.options import add_set_option
from mecsim.interfaces.cli.plugins import (
    add_plugin_option,
    add_plugins_parser,
    cmd_plugins,
    load_plugin_files,
)
from mecsim.interfaces.cli.report import add_report_parser, cmd_report
from mecsim.interfaces.cli.service import HANDLERS as SERVICE_HANDLERS
from mecsim.interfaces.cli.service import add_service_parsers
from mecsim.interfaces.cli.sweep import add_sweep_parser, cmd_sweep
from mecsim.run.interrupts import Terminated, from_signal
from mecsim.scenario import ScenarioError

EXIT_BAD_INPUT = 2


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds >= 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mecsim",
        description="Network-emulated MEC testbed for personalised federated learning: real "
        "training, a SimPy model of the wireless network and device CPUs, and per-round "
        "records of time, bytes, FLOPs, memory and accuracy.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run a scenario",
        description="Run a scenario and write its records to OUT/<run-id>/. Without a file, "
        "runs the embedded default scenario (FedAvg, 10 clients, MNIST, ~1 minute).",
    )
    run.add_argument("scenario", nargs="?", help="scenario YAML (default: embedded)")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run that was killed or interrupted (e.g. runs/<run-id>) "
        "from its last checkpoint; its records end up equal to an uninterrupted "
        "run's. Takes no scenario file: the run's own scenario.yaml is used",
    )
    add_set_option(run)
    run.add_argument("--rounds", type=int, help="override the scenario's rounds")
    run.add_argument("--seed", type=int, help="override the scenario's seed")
    run.add_argument("--out", help="records directory (default: the scenario's outputs.dir)")
    run.add_argument("--run-id", help="name of the run's folder (default: name-timestamp)")
    run.add_argument(
        "--backend",
        choices=["ray", "local"],
        help="ray (default): host actors in Ray; local: in this process",
    )
    run.add_argument("--hosts", type=int, help="host actors (default: one per core)")
    run.add_argument(
        "--ray-address", help="attach to an existing Ray cluster, e.g. auto or ray://head:10001"
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        help="port of the Prometheus /metrics endpoint (0: any free port)",
    )
    run.add_argument("--no-metrics", action="store_true", help="do not serve /metrics")
    run.add_argument(
        "--metrics-public",
        action="store_true",
        help="allow a metrics host that is not a loopback address (/metrics "
        "reachable from other machines; sets metrics.public)",
    )
    run.add_argument(
        "--metrics-linger",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="keep /metrics up this long after the last round, so Prometheus "
        "scrapes the final values of a short run (default 0)",
    )
    run.add_argument(
        "--target",
        type=float,
        action="append",
        metavar="ACC",
        help="target mean user accuracy as a fraction (e.g. 0.97; repeat for "
        "several): the summary reports the rounds and emulated seconds to reach "
        "it (sets evaluation.target_accuracy)",
    )
    run.add_argument(
        "--no-plots",
        action="store_true",
        help="do not write the PNG figures to <run dir>/plots at the end",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar or tables")
    add_plugin_option(run)
    run.add_argument(
        "--no-limits",
        action="store_true",
        help="lift the size limits a new run is checked against (at most 1,000,000 "
        "rounds and clients, 10^10 training steps, 16 host processes per core: they "
        "catch a typo such as epochs: 1000000000 before it starts); see docs/service.md",
    )

    val = sub.add_parser(
        "validate",
        help="check scenario files",
        description="Validate scenario files; prints one line per problem.",
    )
    val.add_argument("files", nargs="+")
    add_set_option(val)
    add_plugin_option(val)
    sch = sub.add_parser(
        "schema",
        help="print the scenario JSON Schema",
        description="The JSON Schema of scenario files, for editors.",
    )
    sch.add_argument("-o", "--output", help="write to this file instead of stdout")
    sub.add_parser("devices", help="list device profiles with their sources")
    sub.add_parser("algorithms", help="list the algorithms")
    add_plugins_parser(sub)
    add_new_parser(sub)
    add_check_parser(sub)
    add_sweep_parser(sub)
    add_report_parser(sub)
    add_service_parsers(sub)
    return p


#: Verbs about scenarios and runs, handled by :mod:`mecsim.interfaces.cli.run`.
SCENARIO_VERBS = ("run", "validate", "schema", "devices", "algorithms")


def _handler(command: str) -> Callable[[argparse.Namespace, Console], int]:
    if command in SCENARIO_VERBS:
        # deferred: these verbs need the run loop, torch and matplotlib (~2 s to import);
        # `mecsim --help` and the service's client verbs start without them
        from mecsim.interfaces.cli import run as scenario_verbs

        handler: Callable[[argparse.Namespace, Console], int] = getattr(
            scenario_verbs, f"cmd_{command}"
        )
        return handler
    return {
        "sweep": cmd_sweep,
        "report": cmd_report,
        "check": cmd_check,
        "plugins": cmd_plugins,
        "new": cmd_new,
        **SERVICE_HANDLERS,
    }[command]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=False)
    command = args.command or "run"
    if args.command is None:  # plain `mecsim`: run the default scenario
        args = _parser().parse_args(["run"])
    problem = load_plugin_files(args)  # --plugin FILE: before the scenario names them
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return _handler(command)(args, console)
    except ScenarioError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        if command in USER_CODE_COMMANDS and not from_signal(exc):
            return _user_code_exit(command, exc)
        print("interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BaseException as exc:
        # sys.exit() or a BaseException of its own from a plugin's or an algorithm's code
        # (mecsim's own commands raise neither): a failure, one line, never an exit 0
        if command not in USER_CODE_COMMANDS:
            raise
        return _user_code_exit(command, exc)


#: the commands that run code of plugins and algorithms (validate: the pre-flight builds
#: the algorithm's server; run; check)
USER_CODE_COMMANDS = ("run", "validate", "check")


def _user_code_exit(command: str, exc: BaseException) -> int:
    what = " ".join(repr(exc).split())[:300]
    print(
        f"error: mecsim {command}: code of a plugin or algorithm raised {what} (user code)",
        file=sys.stderr,
    )
    return 1
