"""The map of a run with a geometry (``plots/map.png``, docs/mobility.md "The map"): its
cells against a brute-force nearest site, its artists for a hand-built clients.csv of
moving clients with one handover, and where it is written and shown (``mecsim run``'s
plots, ``mecsim report``, the service's figures and run page) — only for runs with a
geometry."""

from __future__ import annotations

import httpx
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.path import Path as MplPath
from support.scenarios import tiny
from support.service import TOKEN, ThreadServer

from mecsim.analysis import maps
from mecsim.analysis.loaded_run import load_run
from mecsim.analysis.plots import PLOT_NAMES
from mecsim.analysis.tables import ReportError
from mecsim.emulation import geometry as geo
from mecsim.interfaces.cli import main
from mecsim.store.session import run_in_folder

SITES = [[100.0, 100.0], [500.0, 100.0], [300.0, 350.0]]
AREA = (600.0, 400.0)


def _artist(ax, gid):
    found = [a for a in ax.get_children() if a.get_gid() == gid]
    assert len(found) == 1, (gid, found)
    return found[0]


def _has(ax, gid):
    return any(a.get_gid() == gid for a in ax.get_children())


# ----------------------------------------------------------------------------- cells


def test_two_sites_split_the_area_at_their_bisector():
    """Sites (100, 200) and (600, 200) in 700 x 400: the bisector is x = 350, so the
    cells are [0, 350] x [0, 400] and [350, 700] x [0, 400] (areas 140,000 m² each)."""
    a, b = maps.voronoi_cells([[100, 200], [600, 200]], (700, 400))
    assert sorted(map(tuple, a.tolist())) == [(0, 0), (0, 400), (350, 0), (350, 400)]
    assert sorted(map(tuple, b.tolist())) == [(350, 0), (350, 400), (700, 0), (700, 400)]


@pytest.mark.parametrize("rings", [1, 5])  # 7 sites: all pairs; 91: Delaunay neighbours
def test_cells_are_the_nearest_site_regions_within_the_area(rings):
    """Each cell holds exactly the points whose nearest site is its own (brute force
    over 4,000 uniform points), and the cells tile the area (areas add up to W·H)."""
    d = 200.0
    offsets = geo.hex_grid_sites(rings, d)
    size = offsets.max(axis=0) - offsets.min(axis=0) + 2 * d / np.sqrt(3)
    sites = offsets + size / 2
    cells = maps.voronoi_cells(sites, (size[0], size[1]))
    assert len(cells) == len(sites)

    def shoelace(p):
        x, y = p[:, 0], p[:, 1]
        return 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))

    assert sum(shoelace(c) for c in cells) == pytest.approx(size[0] * size[1], rel=1e-9)
    points = np.random.default_rng(0).random((4000, 2)) * size
    nearest = geo.nearest_site(points, sites)
    dist = geo.distances_m(points, sites)
    clear = np.sort(dist, axis=1)[:, 1] - dist.min(axis=1) > 1e-6  # not on a border
    for k, cell in enumerate(cells):
        inside = MplPath(cell).contains_points(points, radius=-1e-9)
        assert np.array_equal(inside[clear], (nearest == k)[clear]), k


# ----------------------------------------------------------------------------- artists


def _moving_rows(with_handovers_column: bool = True) -> pd.DataFrame:
    """Three rounds of four clients over SITES. Client 0 walks from site 0's cell into
    site 1's: (150, 100) -> (320, 100) -> (450, 120), served by 0, then 1 from round 1
    (its one handover, at (320, 100)); client 1 moves within cell 0; clients 2 and 3
    stay put (2 in cell 2, 3 in cell 1)."""
    track = {
        0: [((150, 100), 0, 0), ((320, 100), 1, 1), ((450, 120), 1, 0)],
        1: [((80, 60), 0, 0), ((120, 90), 0, 0), ((140, 150), 0, 0)],
        2: [((300, 300), 2, 0)] * 3,
        3: [((520, 150), 1, 0)] * 3,
    }
    rows = [
        {"round": r, "client_id": c, "edge_server": es, "x_m": x, "y_m": y, "handovers": h}
        for c, steps in track.items()
        for r, ((x, y), es, h) in enumerate(steps)
    ]
    df = pd.DataFrame(rows).sort_values(["round", "client_id"])  # as clients.csv: by round
    return df if with_handovers_column else df.drop(columns="handovers")


@pytest.mark.parametrize("handovers_column", [True, False])
def test_the_map_draws_sites_trajectories_and_the_handover(handovers_column):
    fig = maps.map_figure(SITES, AREA, _moving_rows(handovers_column), "r-1: association nearest")
    ax = fig.axes[0]
    colors = maps.site_colors(3)
    # three site markers, three cells
    assert len(_artist(ax, "sites").get_offsets()) == 3
    assert len(_artist(ax, "cells").get_paths()) == 3
    assert [t.get_text() for t in ax.texts] == ["ES 0", "ES 1", "ES 2"]
    # two moving clients x two steps each = 4 segments; client 0's second is edge server 1's
    lines = _artist(ax, "trajectories")
    segs = [np.asarray(s).tolist() for s in lines.get_segments()]
    assert segs == [
        [[150, 100], [320, 100]],
        [[320, 100], [450, 120]],
        [[80, 60], [120, 90]],
        [[120, 90], [140, 150]],
    ]
    want = [colors[0], colors[1], colors[0], colors[0]]
    np.testing.assert_allclose(lines.get_colors()[:, :3], np.array(want)[:, :3])
    # starts of the two moving clients; every client's last position, in its colour
    assert np.asarray(_artist(ax, "starts").get_offsets()).tolist() == [[150, 100], [80, 60]]
    ends = _artist(ax, "clients")
    assert np.asarray(ends.get_offsets()).tolist() == [
        [450, 120],
        [140, 150],
        [300, 300],
        [520, 150],
    ]
    np.testing.assert_allclose(
        ends.get_facecolors()[:, :3], np.array([colors[i] for i in (1, 0, 2, 1)])[:, :3]
    )
    # the one handover, where client 0's colour changes
    assert np.asarray(_artist(ax, "handovers").get_offsets()).tolist() == [[320, 100]]
    assert "4 clients (2 moving), rounds 1–3, 1 handover" in ax.get_title()
    assert ax.get_xlim() == (0, 600) and ax.get_ylim() == (0, 400)
    assert ax.get_aspect() == 1.0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "handover" in labels and "edge server 2" in labels


def test_a_static_map_has_dots_and_no_trajectories():
    rows = _moving_rows()
    static = rows[rows["client_id"] >= 2]
    ax = maps.map_figure(SITES, AREA, static).axes[0]
    assert not _has(ax, "trajectories") and not _has(ax, "handovers") and not _has(ax, "starts")
    assert len(_artist(ax, "clients").get_offsets()) == 2
    assert "2 clients (static), rounds 1–3, 0 handovers" in ax.get_title()


def test_many_clients_are_sampled_and_the_title_says_so():
    rows = pd.DataFrame(
        {"round": 0, "client_id": range(30), "edge_server": 0, "x_m": 50.0, "y_m": 50.0}
    )
    ax = maps.map_figure(SITES, AREA, rows, max_clients=10).axes[0]
    assert len(_artist(ax, "clients").get_offsets()) == 10
    assert "10 of 30 clients drawn" in ax.get_title()
    assert to_rgba(maps.site_colors(12)[10]) != to_rgba(maps.site_colors(12)[0])


# ----------------------------------------------------------------------------- a run


def _geo_run():
    return tiny(
        rounds=2,
        topology={"clients": 6, "edge_servers": 3},
        geometry={
            "area": {"width_m": AREA[0], "height_m": AREA[1]},
            "sites": {"layout": "explicit", "positions_m": SITES},
        },
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A geometry run and one without, each by simulate (mecsim run's PlotWriter)."""
    from mecsim.api import simulate

    base = tmp_path_factory.mktemp("maps")
    geo_run = simulate(_geo_run(), base, run_id="geo", backend="local", progress=False)
    plain = simulate(tiny(), base, run_id="plain", backend="local", progress=False)
    return geo_run.run_dir, plain.run_dir


def test_a_geometry_run_writes_its_map_and_a_run_without_does_not(runs, tmp_path):
    geo_dir, plain_dir = runs
    assert (geo_dir / "plots" / "map.png").stat().st_size > 10_000
    plain_plots = sorted(p.name for p in (plain_dir / "plots").glob("*.png"))
    assert "map.png" not in plain_plots and set(plain_plots) <= set(PLOT_NAMES)
    geo_plots = sorted(p.name for p in (geo_dir / "plots").glob("*.png"))
    assert geo_plots == sorted([*plain_plots, "map.png"])
    # the map shows the run's sites and six static clients at their recorded positions
    fig = load_run(geo_dir).plot("map")
    ax = fig.axes[0]
    assert len(_artist(ax, "sites").get_offsets()) == 3
    clients = pd.read_csv(geo_dir / "clients.csv")
    last = clients[clients["round"] == 1].sort_values("client_id")
    assert np.asarray(_artist(ax, "clients").get_offsets()).tolist() == (
        last[["x_m", "y_m"]].to_numpy().tolist()
    )
    assert "geo: association nearest" in ax.get_title()
    with pytest.raises(ReportError, match="no geometry"):
        load_run(plain_dir).plot("map")


@pytest.mark.slow  # draws every plot of the run again
def test_mecsim_report_lists_the_map_of_a_geometry_run(runs, tmp_path, capsys):
    geo_dir, plain_dir = runs
    assert main(["report", str(geo_dir), "--out", str(tmp_path / "g")]) == 0
    assert "map.png" in capsys.readouterr().out.splitlines()[-1]
    assert (tmp_path / "g" / "map.png").is_file()
    assert main(["report", str(plain_dir), "--out", str(tmp_path / "p")]) == 0
    assert "map" not in capsys.readouterr().out.splitlines()[-1]
    assert not list((tmp_path / "p").glob("map*.png"))
    assert main(["report", str(geo_dir), str(plain_dir), "--out", str(tmp_path / "b")]) == 0
    assert [p.name for p in (tmp_path / "b").glob("map*.png")] == ["map-geo.png"]


@pytest.mark.slow
def test_the_service_draws_the_map_and_its_run_page_shows_it(tmp_path):
    """The service's plot child (plot_run_folder) draws map.png from the run folder; the
    run page references it for a geometry run, not for another."""
    import yaml

    from mecsim.interfaces.service.app import ServiceConfig, create_app
    from mecsim.interfaces.service.plotjob import plot_run_folder

    config = ServiceConfig(state_dir=tmp_path / "state", token=TOKEN, start_workers=False)
    with ThreadServer(create_app(config)) as server:
        store = server.server.config.app.state.store
        for run_id, sc in (("geo-1", _geo_run()), ("plain-1", tiny(rounds=1))):
            text = yaml.safe_dump(sc.model_dump(mode="json"))
            store.add_run(run_id, "tiny", "fedavg", text, sc.rounds, max_waiting=100)
            run_in_folder(sc, store.run_dir(run_id), backend="local")
            written = [p.name for p in plot_run_folder(store.run_dir(run_id), sc.rounds)]
            assert ("map.png" in written) == (run_id == "geo-1")
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            page = c.get("/ui/runs/geo-1")
            assert page.status_code == 200
            assert 'src="/runs/geo-1/plots/map.png"' in page.text
            assert c.get("/runs/geo-1/plots/map.png").content[:4] == b"\x89PNG"
            assert "map" in c.get("/runs/geo-1").json()["plots"]
            page = c.get("/ui/runs/plain-1")
            assert page.status_code == 200 and "accuracy_vs_round.png" in page.text
            assert "map.png" not in page.text
