"""``mecsim check NAME``: the conformance kit (:mod:`mecsim.testing`) from the shell.

Prints PASS / FAIL / SKIP per property with its reason and, for a comparison that
failed, the first differing record (``--json``: the report as JSON). Exit 0 when every
property holds, 1 when some fail, 2 on bad input (an unknown name, listing the installed
ones; a plugin file or a scenario that cannot be used).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from rich.console import Console

from mecsim.registry import ALGORITHMS, ASYNC_SERVERS, COMPRESSORS, PluginError, UnknownName
from mecsim.scenario import ScenarioError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def positive_seconds(text: str) -> float:
    """A time in seconds > 0, finite (argparse type: a usage error, exit 2, otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite time > 0 (s), got {text!r}")
    return value


def add_check_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="check that an algorithm keeps mecsim's promises (the conformance kit)",
        description="Run algorithm NAME on a tiny scenario (4 clients, the embedded MNIST, "
        "3 rounds) several times and check its properties: documented parameters, "
        "determinism, in-process = Ray, resume = uninterrupted, streamed = held "
        "aggregation, no hidden client state, complete op-traces, FLOPs charged = "
        "FLOPs performed, the NaN guard. "
        "Exit 0: all hold; 1: some fail; 2: bad input.",
    )
    p.add_argument(
        "name",
        help="the algorithm (a registered name or module:attribute), a compressor "
        "(checked with its own properties: error bound, bytes, determinism, resume) or an "
        "asynchronous server (its own: versions, weights, determinism, resume)",
    )
    p.add_argument("--scenario", metavar="FILE", help="run on this scenario instead")
    p.add_argument(
        "--plugin",
        metavar="FILE",
        action="append",
        help="load this plugin file first (repeatable); it registers NAME",
    )
    p.add_argument(
        "--params",
        metavar="MAPPING",
        help="a compressor's or an asynchronous server's params, e.g. '{bits: 4}'",
    )
    p.add_argument(
        "--mode",
        choices=("async", "buffered", "semi_sync"),
        help="the aggregation.mode an asynchronous server is checked in (default: a "
        "built-in's own; semi_sync for a server with flush(), else async)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-ray", action="store_true", help="skip the comparison with Ray")
    p.add_argument(
        "--property",
        action="append",
        metavar="NAME",
        help="check only this property (repeatable)",
    )
    p.add_argument(
        "--call-timeout",
        type=positive_seconds,
        metavar="S",
        help="the longest one call of the algorithm may take in the kit's runs "
        "(execution.call_timeout_s; default 120 s for the tiny scenario, else the "
        "scenario's): one that has not returned fails its property",
    )


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    if args.name not in ALGORITHMS and args.name in COMPRESSORS:
        return cmd_check_compressor(args)
    if args.name not in ALGORITHMS and args.name in ASYNC_SERVERS:
        return cmd_check_compressor(args, "async_server")
    if args.params is not None:
        print(
            "error: --params is for a compressor's or an asynchronous server's parameters",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.mode is not None:
        print("error: --mode is for an asynchronous server", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:  # --plugin files are loaded before any verb runs (mecsim.interfaces.cli.main)
        ALGORITHMS.get(args.name)
    except UnknownName:
        print(
            f"error: unknown algorithm, compressor or asynchronous server {args.name!r}; "
            f"installed algorithms: {', '.join(ALGORITHMS.names())}; compressors: "
            f"{', '.join(COMPRESSORS.names())}; asynchronous servers: "
            f"{', '.join(ASYNC_SERVERS.names())}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # deferred: the kit runs the algorithm (torch, the run loop; ~2 s to import)
    from mecsim import testing

    wanted = args.property
    if wanted:
        unknown = [p for p in wanted if p not in testing.PROPERTIES]
        if unknown:
            print(
                f"error: unknown properties {', '.join(unknown)}; known: "
                f"{', '.join(testing.PROPERTIES)}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT

    def show(result: Any) -> None:
        if not args.json:
            print(result.render(), flush=True)

    try:  # a scenario that cannot run is bad input, found before anything runs
        testing.check_scenario_data(args.name, args.scenario, validate=True)
    except ScenarioError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.json:
        print(f"mecsim check {args.name}: running tiny scenarios...", flush=True)
    start = time.perf_counter()
    try:
        report = testing.check_algorithm(
            args.name,
            args.scenario,
            ray=not args.no_ray,
            properties=wanted,
            on_result=show,
            call_timeout_s=args.call_timeout,
        )
    except ScenarioError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        failed = report.failures
        print(
            f"{args.name}: "
            + (
                "all properties hold"
                if not failed
                else f"{len(failed)} of {len(report.results)} properties fail: "
                + ", ".join(r.name for r in failed)
            )
            + f" ({time.perf_counter() - start:.1f} s)"
        )
    return 0 if report.ok else EXIT_FAILED


def cmd_check_compressor(args: argparse.Namespace, kind: str = "compressor") -> int:
    """``mecsim check NAME`` of a compressor (:func:`mecsim.testing.check_compressor`) or,
    ``kind`` async_server, of an asynchronous server
    (:func:`mecsim.testing.check_async_server`)."""
    import yaml

    server = kind == "async_server"
    try:
        (ASYNC_SERVERS if server else COMPRESSORS).get(args.name)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    params: Any = {}
    if args.params is not None:
        try:
            params = yaml.safe_load(args.params)
        except yaml.YAMLError:
            params = None
        if not isinstance(params, dict):
            print(
                f"error: --params {args.params!r} is not a mapping like '{{bits: 4}}'",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    if args.scenario is not None:
        print(
            "error: --scenario is for algorithms; "
            + (
                "an asynchronous server is checked on the kit's tiny asynchronous scenario"
                if server
                else "a compressor is checked with FedAvg on the kit's tiny scenario"
            ),
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.mode is not None and not server:
        print("error: --mode is for an asynchronous server", file=sys.stderr)
        return EXIT_BAD_INPUT
    from mecsim import testing  # deferred: the kit runs FedAvg (torch, the run loop)

    known = testing.ASYNC_SERVER_PROPERTIES if server else testing.COMPRESSOR_PROPERTIES
    wanted = args.property
    if wanted and any(p not in known for p in wanted):
        print(
            f"error: unknown properties; {'an asynchronous server' if server else 'a compressor'}"
            f"'s: {', '.join(known)}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT

    def show(result: Any) -> None:
        if not args.json:
            print(result.render(), flush=True)

    if not args.json:
        what = (
            "(asynchronous server): tiny asynchronous runs..."
            if server
            else "(compressor): encoding test vectors, tiny FedAvg runs..."
        )
        print(f"mecsim check {args.name} {what}", flush=True)
    try:
        if server:
            report = testing.check_async_server(
                args.name, params, mode=args.mode, properties=wanted, on_result=show
            )
        else:
            report = testing.check_compressor(args.name, params, properties=wanted, on_result=show)
    except ScenarioError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        failed = report.failures
        print(
            f"{args.name}: "
            + (
                "all properties hold"
                if not failed
                else f"{len(failed)} of {len(report.results)} properties fail: "
                + ", ".join(r.name for r in failed)
            )
            + f" ({report.seconds:.1f} s)"
        )
    return 0 if report.ok else EXIT_FAILED
