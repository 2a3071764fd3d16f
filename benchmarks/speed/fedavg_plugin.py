"""FedAvg as a plugin: the built-in classes' work, resolved through an import string.

``python overhead.py --algorithm fedavg_plugin:FEDAVG`` (run from benchmarks/speed/) times the
same rounds as ``--algorithm fedavg``: the classes here subclass the built-in FedAvg
classes (imported from ``mecsim.agents``, which :mod:`mecsim.api` does not export: a
plugin of FedAvg's own work has nothing else to subclass) and declare the flags
themselves (``keeps_no_state`` is not inherited), as a plugin must; what differs from
``fedavg`` is only how the classes are found, so any per-round difference is what being
a plugin costs.
"""

from __future__ import annotations

from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer


class PluginFedAvgServer(FedAvgServer):
    """FedAvg's server, as a plugin's (streams its aggregation as FedAvg does)."""


class PluginFedAvgClient(FedAvgClient):
    """FedAvg's client, as a plugin's."""

    keeps_no_state = True  # trains from the downloaded model: any host may train it


FEDAVG = (PluginFedAvgServer, PluginFedAvgClient)
