"""Flower's own simulation of the seeded test app (tests/data/flower_seeded_app), for
tests/integration/test_flower.py and benchmarks/speed/flower.py:
``python tests/support/flower_sim.py CLIENTS`` runs ``flwr.simulation.run_simulation``
(Ray backend) with the app's ServerApp and ClientApp; the ServerApp waits for all CLIENTS
nodes before it samples ($SEEDEDAPP_NODES) and writes the global arrays after every round
to $SEEDEDAPP_OUT.
Prints the wall seconds of the simulation on its last line."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "data" / "flower_seeded_app"


def main() -> None:
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    # the strategy samples only once all the nodes are registered (the app's docstring)
    os.environ["SEEDEDAPP_NODES"] = str(clients)
    sys.path.insert(0, str(APP))
    from flwr.simulation import run_simulation
    from seededapp.client_app import app as client_app
    from seededapp.server_app import app as server_app

    start = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1}},
    )
    print(f"wall_s {time.perf_counter() - start:.3f}")


if __name__ == "__main__":
    main()
