"""The service's command-line verbs: ``mecsim serve`` and its clients.

    mecsim serve [--host H] [--port P] [--state DIR] [--workers N] [--ray-address A]
                 [--token-file F] [--data-root DIR] ...
    mecsim submit [SCENARIO] [--rounds N] [--set P=V]... [--wait | --follow]
    mecsim runs [--status S]...     mecsim status ID     mecsim cancel ID
    mecsim fetch ID [-o DIR]

Clients find the server in ``--server`` or ``MECSIM_SERVER`` (default
http://127.0.0.1:8470) and send the token in ``MECSIM_TOKEN``; ``--json`` prints what
the API returned, for scripts. Exit codes as ``mecsim run``: 0 success, 2 bad input (a
refused scenario, an unknown run, a bad argument, a missing token), 1 anything else (no
server, a run that failed or was cancelled with ``--wait``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

import mecsim.registry as registry
from mecsim.interfaces.cli.options import add_set_option
from mecsim.interfaces.console import list_table
from mecsim.interfaces.service.client import Client, ScenarioRejected, ServiceError
from mecsim.run import limits
from mecsim.scenario.overrides import OverrideError, parse_sets

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds >= 0")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _raise_open_files(wanted: int) -> None:
    """Raise this process's soft limit of open files towards ``wanted`` (within the hard
    limit): 1,024 by default on many systems, below ``--max-connections``."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            top = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
    except (ImportError, ValueError, OSError):  # not on this system: keep what it has
        pass


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0")
    return value


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        help="service URL (default: $MECSIM_SERVER, else "
        "http://127.0.0.1:8470); the token is read from $MECSIM_TOKEN",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON (for scripts)")


def add_service_parsers(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the testbed as a service (queued runs, one /metrics, a web page)",
        description="Serve the mecsim API, web page and Prometheus /metrics. Runs are queued "
        "and executed --workers at a time on one Ray instance kept for the server's life; "
        "state (a SQLite database and every run's records) lives in --state. See "
        "docs/service.md.",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs --token-file)",
    )
    serve.add_argument("--port", type=int, default=8470, help="port (default 8470; 0: any free)")
    serve.add_argument(
        "--state",
        default="mecsim-state",
        help="state folder: database and run records (default ./mecsim-state)",
    )
    serve.add_argument(
        "--workers", type=_positive, default=1, help="runs executed at the same time (default 1)"
    )
    serve.add_argument(
        "--ray-address",
        help="attach to this Ray cluster instead of starting one (e.g. auto, or HEAD:6379)",
    )
    serve.add_argument(
        "--token-file",
        help="file holding the bearer token every request but /healthz and /metrics must carry",
    )
    serve.add_argument(
        "--data-root",
        help="folder under which submitted scenarios may name "
        "dataset roots and trace files (default: they may name none)",
    )
    serve.add_argument(
        "--allow-imports",
        action="store_true",
        help="let submitted scenarios name import strings (pkg.module:Attr): code of the "
        "submitter's choosing then runs on this server. Default: only installed plugins "
        "(GET /plugins lists them)",
    )
    serve.add_argument(
        "--flower-app",
        action="append",
        default=[],
        metavar="DIR|MODULE:ATTR",
        help="a Flower app submitted scenarios may name besides the installed ones: its "
        "folder (the components of its pyproject.toml; the folder may then be named as "
        "algorithm.params.app) or one component as module:attribute (repeatable)",
    )
    serve.add_argument(
        "--max-queued",
        type=_positive,
        default=100,
        help="runs that may wait in the queue (default 100; 429 beyond)",
    )
    serve.add_argument(
        "--max-body-kib",
        type=_positive,
        default=1024,
        help="largest request body in KiB (default 1024)",
    )
    d = limits.SERVICE
    serve.add_argument(
        "--max-rounds",
        type=_positive,
        default=d.max_rounds,
        help=f"most rounds a submitted run may have (default {d.max_rounds:,}; 422 beyond)",
    )
    serve.add_argument(
        "--max-clients",
        type=_positive,
        default=d.max_clients,
        help=f"most clients (topology.clients) a submitted run may have (default "
        f"{d.max_clients:,})",
    )
    serve.add_argument(
        "--max-steps",
        type=_positive,
        default=d.max_steps,
        help="most training steps (mini-batches) a submitted run may take in all: rounds x "
        f"clients per round x epochs x batches per epoch (default {d.max_steps:,})",
    )
    serve.add_argument(
        "--max-hosts-per-core",
        type=_positive_float,
        default=d.max_hosts_per_core,
        help="execution.hosts at most this many times the machine's cores (default "
        f"{d.max_hosts_per_core:g})",
    )
    serve.add_argument(
        "--max-sweep-points",
        type=_positive,
        default=d.max_sweep_points,
        help=f"most grid points of one what-if sweep (default {d.max_sweep_points:,})",
    )
    serve.add_argument(
        "--max-client-samples",
        type=_positive,
        default=d.max_client_samples,
        help="most samples the clients of a submitted run may hold in all: clients x "
        f"samples per client (default {d.max_client_samples:,})",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive,
        default=1000,
        help="open connections served at once (default 1000; 503 beyond; a connection "
        "that sends no complete header within 10 s is closed)",
    )
    serve.add_argument(
        "--metrics-retention",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="keep a finished run's series on /metrics this long (default 3600)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="on SIGTERM/Ctrl-C, wait this long for running runs to end their "
        "round (they resume at the next start; default 60)",
    )

    submit = sub.add_parser(
        "submit",
        help="queue a scenario on a mecsim service",
        description="Submit a scenario to a mecsim service.",
    )
    submit.add_argument(
        "scenario", nargs="?", help="scenario YAML or JSON (default: the embedded default scenario)"
    )
    submit.add_argument("--rounds", type=_positive, help="override the scenario's rounds")
    add_set_option(submit)
    how = submit.add_mutually_exclusive_group()
    how.add_argument("--wait", action="store_true", help="wait until the run has ended")
    how.add_argument(
        "--follow",
        action="store_true",
        help="print each round as it finishes, until the run has ended",
    )
    _client_options(submit)

    runs = sub.add_parser(
        "runs", help="list a service's runs", description="List runs, newest first."
    )
    runs.add_argument(
        "--status",
        action="append",
        choices=["queued", "running", "finished", "failed", "cancelled", "interrupted"],
        help="only runs with this status (repeat for several)",
    )
    runs.add_argument("--limit", type=_positive, default=50, help="at most this many (50)")
    _client_options(runs)

    status = sub.add_parser("status", help="a service run's status and progress")
    status.add_argument("run_id", metavar="ID")
    _client_options(status)

    cancel = sub.add_parser(
        "cancel",
        help="cancel a service run",
        description="A queued run leaves the queue; a running run stops "
        "at the end of its current round and keeps its rounds.",
    )
    cancel.add_argument("run_id", metavar="ID")
    _client_options(cancel)

    fetch = sub.add_parser(
        "fetch",
        help="download a service run's records",
        description="Download a run's records as a run folder that "
        "`mecsim report` and `mecsim sweep` accept.",
    )
    fetch.add_argument("run_id", metavar="ID")
    fetch.add_argument("-o", "--out", help="folder to create (default runs/ID)")
    _client_options(fetch)


# --------------------------------------------------------------------------- serve


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"mecsim serve: error: {msg}", file=sys.stderr)
    return code


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # proto given: asyncio sets TCP_NODELAY only on IPPROTO_TCP sockets, and without it a
    # response's body waits ~40 ms for the client's delayed ACK of its headers
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    # deferred: the service's stack (FastAPI, uvicorn, Ray, torch: ~2 s to import) is
    # loaded by `mecsim serve` alone, and only after quiet_ray_signals
    from mecsim.interfaces.service.worker import quiet_ray_signals

    quiet_ray_signals()  # before anything imports ray
    # deferred: (see above)
    from mecsim.interfaces.service.app import ServiceConfig, create_app
    from mecsim.interfaces.service.jobs import StateError, Store
    from mecsim.interfaces.service.security import is_loopback

    token = None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            return _fail(f"--token-file {args.token_file}: cannot read ({exc.strerror})")
        if len(token) < 16 or any(c.isspace() for c in token):
            return _fail(
                f"--token-file {args.token_file}: the token must be at least 16 "
                'characters without spaces (e.g. `python -c "import secrets; '
                'print(secrets.token_urlsafe(32))"`)'
            )
        if Path(args.token_file).stat().st_mode & 0o077:
            print(
                f"mecsim serve: warning: {args.token_file} is readable by other users "
                "(chmod 600 it)",
                file=sys.stderr,
            )
    if not is_loopback(args.host) and token is None:
        return _fail(
            f"--host {args.host} is not a loopback address: give --token-file so "
            "that only holders of the token can use the service"
        )
    data_root = None
    if args.data_root:
        data_root = Path(args.data_root).expanduser()
        if not data_root.is_dir():
            return _fail(f"--data-root {args.data_root}: not a folder")
    flower_apps: list[str] = []
    for item in args.flower_app:
        if registry.is_import_string(item) and not Path(item).is_dir():
            flower_apps.append(item)
            continue
        folder = Path(item).expanduser()
        if not folder.is_dir():
            return _fail(f"--flower-app {item}: neither a folder nor module:attribute")
        if len(registry.flower_app_components(folder)) != 2:
            return _fail(
                f"--flower-app {item}: its pyproject.toml has no [tool.flwr.app.components] "
                "serverapp and clientapp: not a Flower app"
            )
        flower_apps.append(str(folder.resolve()))
    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port}: not a port number")
    _raise_open_files(args.max_connections + 256)  # the connections, Ray's sockets, files
    # the port first: a server that cannot listen writes nothing (no state folder)
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        return _fail(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc})")
    try:
        store = Store(args.state)
    except StateError as exc:
        sock.close()
        return _fail(f"--state {exc}")

    import uvicorn

    # deferred: uvicorn and the HTTP stack, with the rest of the service's imports above
    from mecsim.interfaces.service.connections import server_config

    config = ServiceConfig(
        state_dir=Path(args.state),
        host=args.host,
        port=sock.getsockname()[1],
        workers=args.workers,
        ray_address=args.ray_address,
        token=token,
        data_root=data_root,
        allow_imports=args.allow_imports,
        flower_apps=tuple(flower_apps),
        max_body_bytes=args.max_body_kib * 1024,
        max_queued=args.max_queued,
        metrics_retention_s=args.metrics_retention,
        shutdown_timeout_s=args.shutdown_timeout,
        limits=limits.Limits(
            max_rounds=args.max_rounds,
            max_clients=args.max_clients,
            max_steps=args.max_steps,
            max_hosts_per_core=args.max_hosts_per_core,
            max_sweep_points=args.max_sweep_points,
            max_client_samples=args.max_client_samples,
        ),
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    service_log = logging.getLogger("mecsim.interfaces.service")
    service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)
    app = create_app(config, store)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"mecsim serve: listening on http://{shown}:{config.port}/ (state {args.state}, "
        f"{args.workers} worker{'s' if args.workers > 1 else ''}, pid {os.getpid()})",
        flush=True,
    )
    server = uvicorn.Server(server_config(app, max_connections=args.max_connections))
    import gc

    # the app, torch, pandas... are loaded for good: keep the garbage collector's full
    # passes (which stop every thread, requests included) from walking them again and again
    gc.freeze()
    # a run's loop and the API share this process's GIL: hand it over every 1 ms instead
    # of Python's 5 ms, so a request waiting behind the run's orchestration waits less
    sys.setswitchinterval(0.001)
    try:
        server.run(sockets=[sock])
    finally:
        store.close()
    return 0


# --------------------------------------------------------------------------- clients


def _client(args: argparse.Namespace):

    return Client(args.server)


def _service_error(exc: Exception, args: argparse.Namespace) -> int:

    if isinstance(exc, ScenarioRejected):
        where = getattr(args, "scenario", None) or "scenario"
        for p in exc.problems:
            print(f"{where}: {p['field']}: {p['msg']}", file=sys.stderr)
        return EXIT_BAD_INPUT
    assert isinstance(exc, ServiceError)
    print(f"error: {exc}", file=sys.stderr)
    if exc.status == 401:
        print("  (set MECSIM_TOKEN to the service's token)", file=sys.stderr)
    return EXIT_BAD_INPUT if exc.status in (401, 404, 409, 422) else EXIT_FAILED


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=1))


def _acc(value: Any) -> str:
    return f"{100 * value:.2f} %" if isinstance(value, (int, float)) else "-"


def _round_line(row: dict[str, Any], planned: int) -> str:
    return (
        f"round {int(row['round']) + 1}/{planned}  acc {_acc(row.get('mean_accuracy'))}  "
        f"{row.get('round_time_s', float('nan')):.2f} s emulated  "
        f"{row.get('host_wall_s', float('nan')):.2f} s host"
    )


def _page(client: Client, run_id: str) -> str:
    """The run's web page (what a person opens; ``--json`` gives the API's URL)."""
    return f"{client.url.rstrip('/')}/ui/runs/{run_id}"


def _end_code(status: str) -> int:
    return 0 if status == "finished" else EXIT_FAILED


def cmd_submit(args: argparse.Namespace, console: Console) -> int:

    text = None
    if args.scenario:
        try:
            text = Path(args.scenario).read_text()
        except OSError as exc:
            print(f"{args.scenario}: cannot read scenario file ({exc.strerror})", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        overrides = parse_sets(args.sets)
    except OverrideError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    with _client(args) as client:
        try:
            run_id = client.submit(text, rounds=args.rounds, set=overrides)
            run = client.get(run_id)
            if not (args.wait or args.follow):
                if args.json:
                    _print_json(run)
                else:
                    print(f"submitted {run_id} ({run['status']}): {_page(client, run_id)}")
                return 0
            if not args.json:
                print(f"submitted {run_id}: {_page(client, run_id)}", flush=True)
            if args.follow:
                planned = run["rounds_planned"]
                for event, data in client.events(run_id):
                    if args.json:
                        print(json.dumps({"event": event, "data": data}), flush=True)
                    elif event == "round":
                        print(_round_line(data, planned), flush=True)
            run = client.wait(run_id)
        except ServiceError as exc:
            return _service_error(exc, args)
    if args.json and not args.follow:
        _print_json(run)
    elif not args.json:
        tail = f": {run['error']}" if run.get("error") else ""
        print(
            f"{run_id} {run['status']} after {run['rounds_done']} of "
            f"{run['rounds_planned']} rounds{tail}"
        )
    return _end_code(run["status"])


def cmd_runs(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        try:
            runs = client.runs(args.status, limit=args.limit)
        except ServiceError as exc:
            return _service_error(exc, args)
    if args.json:
        _print_json(runs)
        return 0
    header = ["id", "status", "rounds", "algorithm", "best acc", "emulated (s)", "submitted"]
    rows = []
    for r in runs:
        emulated = r.get("emulated_s")
        rows.append(
            [
                r["id"],
                r["status"],
                f"{r['rounds_done']}/{r['rounds_planned']}",
                r["algorithm"],
                _acc(r.get("best_accuracy")),
                f"{emulated:.1f}" if emulated is not None else "-",
                r["submitted_at"][:19].replace("T", " "),
            ]
        )
    # ids are copied into other commands: never cut; a narrow terminal gets fewer columns
    console.print(
        list_table(f"runs at {client.url}", header, rows, console.width, right=frozenset({2, 4, 5}))
    )
    return 0


def cmd_status(args: argparse.Namespace, console: Console) -> int:

    with _client(args) as client:
        try:
            run = client.get(args.run_id)
        except ServiceError as exc:
            return _service_error(exc, args)
    if args.json:
        _print_json(run)
        return 0
    print(
        f"{run['id']}: {run['status']}"
        + (
            " (stopping after this round)"
            if run["cancel_requested"] and run["status"] == "running"
            else ""
        )
    )
    print(f"  scenario {run['name']}, algorithm {run['algorithm']}")
    print(
        f"  rounds {run['rounds_done']} / {run['rounds_planned']}"
        + (f", ETA {run['eta_s']:.0f} s" if run.get("eta_s") is not None else "")
    )
    if run.get("last_round"):
        print(f"  last: {_round_line(run['last_round'], run['rounds_planned'])}")
    if run.get("best_accuracy") is not None:
        print(
            f"  best mean accuracy {_acc(run['best_accuracy'])}, {run['emulated_s']:.1f} s emulated"
        )
    if run.get("error"):
        print(f"  error: {run['error']}")
    return 0


def cmd_cancel(args: argparse.Namespace, console: Console) -> int:

    with _client(args) as client:
        try:
            run = client.cancel(args.run_id)
        except ServiceError as exc:
            return _service_error(exc, args)
    if args.json:
        _print_json(run)
    elif run["status"] == "cancelled":
        print(f"{run['id']} cancelled")
    else:
        print(
            f"{run['id']} stops at the end of its current round "
            f"({run['rounds_done']} of {run['rounds_planned']} done)"
        )
    return 0


def cmd_fetch(args: argparse.Namespace, console: Console) -> int:

    out = Path(args.out) if args.out else Path("runs") / args.run_id
    with _client(args) as client:
        try:
            run = client.get(args.run_id)
            client.fetch(args.run_id, out)
        except FileExistsError as exc:
            print(f"error: {exc}; choose another -o", file=sys.stderr)
            return EXIT_BAD_INPUT
        except ServiceError as exc:
            return _service_error(exc, args)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    if args.json:
        _print_json({"id": run["id"], "status": run["status"], "dir": str(out), "files": files})
        return 0
    note = "" if run["status"] == "finished" else f" (the run is {run['status']})"
    print(f"fetched {len(files)} files of {run['id']} to {out}/{note}")
    return 0


HANDLERS = {
    "serve": cmd_serve,
    "submit": cmd_submit,
    "runs": cmd_runs,
    "status": cmd_status,
    "cancel": cmd_cancel,
    "fetch": cmd_fetch,
}
