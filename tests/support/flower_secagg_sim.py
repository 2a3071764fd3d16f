"""Flower's own simulation of the SecAgg+ test app (tests/data/flower_secagg_app: the
classic test app under SecAggPlusWorkflow and secaggplus_mod), for
tests/integration/test_flower_secagg.py: ``python tests/support/flower_secagg_sim.py
CLIENTS ROUNDS`` runs ``flwr.simulation.run_simulation`` (Ray backend) with the app's
ServerApp and ClientApp; the strategy waits for all CLIENTS nodes before it samples
($CLASSICAPP_NODES) and the global arrays after every round go to $CLASSICAPP_OUT."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "data" / "flower_secagg_app"


def main() -> None:
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    os.environ["CLASSICAPP_NODES"] = str(clients)
    # Flower's simulation gives the ServerApp an empty run config: rounds by environment
    os.environ["CLASSICAPP_ROUNDS"] = str(rounds)
    sys.path.insert(0, str(APP))
    from flwr.simulation import run_simulation
    from secaggapp.apps import client, server

    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1}},
    )


if __name__ == "__main__":
    main()
