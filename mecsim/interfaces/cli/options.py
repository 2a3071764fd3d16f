"""Options several verbs share, defined once."""

from __future__ import annotations

import argparse


def add_set_option(p: argparse.ArgumentParser) -> None:
    """``--set PATH=VALUE`` (repeatable), as ``mecsim run``, ``validate`` and ``submit``
    take it; parsed by :func:`mecsim.scenario.overrides.parse_assignment`."""
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a scenario field by its dotted path, e.g. --set topology.clients=4 "
        "--set channel.uplink.bandwidth_hz=1e6 (a list is one value: [a, b]; quote a "
        "string with commas: 'name=\"a, b\"'); checked as the file is, and recorded in "
        "the run's scenario.yaml. Repeat for several",
    )
