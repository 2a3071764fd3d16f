"""Draw the two maps shown in docs/mobility.md ("The map"):

    python docs/img/make_maps.py [OUT_DIR]      # default: docs/img

- ``map-static.png``: a run of docs/mobility.md's example scenario (21 clients, 7
  hexagonal UMi cells, association ``strongest``), 2 rounds, on the tiny test data set
  (its records only place clients; the map reads ``clients.csv`` and the scenario);
- ``map-moving.png``: the same 7 cells with 100 clients that move by random waypoint
  at walking speed (1-2 m/s, pauses up to 30 s, 20 rounds of 6 s), re-associated at
  each round's start by ``nearest`` with A3 hysteresis 20 m
  (mecsim.emulation.geometry.a3_handover): a synthetic ``clients.csv`` of the columns
  a moving run writes (``x_m``, ``y_m``, ``edge_server``, ``handovers``), since runs
  do not move clients yet.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]


def static_map(out: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import tiny  # the tiny data set the tests use

    from mecsim.analysis.maps import write_map
    from mecsim.store.session import run_in_folder

    block = re.search(r"```yaml\n(.*?)```", (ROOT / "docs/mobility.md").read_text(), re.S)
    data = yaml.safe_load(block.group(1))  # type: ignore[union-attr]
    data["rounds"] = 2
    sc = tiny(**data)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "docs-example"
        run_in_folder(sc, run)
        path = write_map(run, out / "map-static.png", run_id="docs/mobility.md example")
    assert path is not None
    return path


def moving_rows(
    n_clients: int = 100, rounds: int = 20, round_s: float = 6.0, seed: int = 7
) -> tuple[np.ndarray, tuple[float, float], pd.DataFrame]:
    """Sites, area and the clients.csv rows of the synthetic moving case."""
    from mecsim.emulation import geometry as geo
    from mecsim.emulation.mobility.area import Area
    from mecsim.emulation.mobility.models import RandomWaypoint, trajectory

    d = 200.0
    margin = d / np.sqrt(3)
    offsets = geo.hex_grid_sites(1, d)
    size = offsets.max(axis=0) - offsets.min(axis=0) + 2 * margin
    area = (float(size[0]), float(size[1]))
    sites = offsets + size / 2
    rng = np.random.default_rng(seed)
    start = geo.place_uniform(n_clients, area, sites, 10.0, rng)
    model = RandomWaypoint(
        start, Area.of_size(*area), 1.0, rng, speed_mps=(1.0, 2.0), pause_s=(0.0, 30.0)
    )
    path = trajectory(model, rounds * round_s).positions_m
    rows = []
    serving = held = None
    for r in range(rounds):
        xy = np.asarray(path[:, int(r * round_s)], dtype=float)
        metric = geo.association_metric("nearest", geo.distances_m(xy, sites))
        if serving is None:
            serving, held = geo.associate(metric), np.full(metric.shape, np.nan)
            changed = np.zeros(n_clients, dtype=bool)
        else:
            before = serving
            serving, held = geo.a3_handover(metric, serving, held, round_s, 20.0, 0.0)
            changed = serving != before
        for c in range(n_clients):
            rows.append(
                {
                    "round": r,
                    "client_id": c,
                    "edge_server": int(serving[c]),
                    "x_m": xy[c, 0],
                    "y_m": xy[c, 1],
                    "handovers": int(changed[c]),
                }
            )
    return sites, area, pd.DataFrame(rows)


def moving_map(out: Path) -> Path:
    from mecsim.analysis.maps import _save, map_figure

    sites, area, rows = moving_rows()
    fig = map_figure(sites, area, rows, "synthetic: random waypoint 1-2 m/s, nearest + 20 m")
    return _save(fig, out / "map-moving.png")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    for p in (static_map(out), moving_map(out)):
        print(p, p.stat().st_size, "bytes")
