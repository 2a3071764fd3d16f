"""``mecsim plugins``: what a scenario may name, where each comes from, and whether it
loads; and ``--plugin FILE`` for the verbs that take it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import mecsim.registry as registry


def add_plugins_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plugins",
        help="list the installed algorithms, models, datasets, channels, devices and compressors",
        description="Everything a scenario may name, by kind: the name, the distribution "
        "that provides it (mecsim for the built-ins) and its version, and whether it loads "
        "(a plugin that fails to import is listed with its exception; the others still "
        "work). Plugins are entry points of the groups mecsim.algorithms, mecsim.models, "
        "mecsim.datasets, mecsim.channels, mecsim.devices and mecsim.compressors "
        "(docs/extending.md).",
    )
    p.add_argument("--json", action="store_true", help="one JSON document for scripts")
    p.add_argument(
        "--kind",
        choices=sorted(registry.REGISTRIES),
        action="append",
        help="only this kind (repeatable)",
    )
    add_plugin_option(p)


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """``--plugin FILE`` (repeatable): a Python file that registers plugins
    (``mecsim.api.register``) for this command; its source goes to every Ray worker."""
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="FILE",
        help="load a plugin file first (a Python file calling mecsim.api.register(kind, "
        "name, obj)); repeatable. Its names can then be used in the scenario; run.json "
        "records the file's sha256",
    )


def load_plugin_files(args: argparse.Namespace) -> str | None:
    """Load the files of ``--plugin``; None, or the one-line problem (exit 2)."""
    for path in getattr(args, "plugin", None) or []:
        try:
            registry.load_plugin_file(path)
        except registry.PluginError as exc:
            return str(exc)
    return None


def cmd_plugins(args: argparse.Namespace, console: Console) -> int:
    rows = registry.listing(args.kind)
    if args.json:
        print(json.dumps({"plugins": rows}, indent=2))
        return 0
    table = Table(title="Plugins (mecsim plugins --json for scripts)")
    for col in ("kind", "name", "distribution", "version", "loads"):
        table.add_column(col)
    for row in rows:
        table.add_row(  # names and versions are the plugins': printed literally
            *(
                escape(str(cell))
                for cell in (
                    row["kind"],
                    row["name"],
                    row["distribution"] or row["origin"],
                    row["version"] or (row["sha256"][:12] if row["sha256"] else "-"),
                    "yes" if row["loads"] else "no",
                )
            )
        )
    console.print(table)
    for row in rows:
        if not row["loads"]:
            print(row["error"], file=sys.stderr)
    return 0
