"""The map of a run with a geometry: ``plots/map.png`` (docs/mobility.md, "The map").

What it draws, on the area [0, W] × [0, H] in metres (equal aspect):

- each edge server's **cell**: the points of the area nearer to its site than to any
  other (its Voronoi cell clipped to the area), lightly filled in the site's colour, with
  its **border**. The cells are exact polygons: the area's rectangle clipped by the
  half-plane |p − s_k|² ≤ |p − s_j|² of every other site j (Sutherland–Hodgman; with more
  than :data:`ALL_PAIRS_MAX` sites only the Delaunay neighbours' half-planes, which give
  the same cell). They are the cells of the ``nearest`` rule; under ``strongest`` or
  ``sinr`` a client may be served across its cell's border (shadowing), which the map
  shows as a trajectory in another cell's colour;
- each **site** (a triangle) labelled with its edge-server id;
- each client's **trajectory**: its positions in the rounds it was recorded
  (``clients.csv`` ``x_m``, ``y_m``) joined in round order, each segment in the colour of
  the edge server that served the client at the segment's start (the association per
  round); its first position a small open circle and its last a dot in the colour of
  its serving edge server then. A client that never moves is that dot alone;
- **handovers**: a black × at the position of each round whose ``handovers`` is > 0 (or,
  in records without that column, whose ``edge_server`` differs from the client's
  previous recorded round): where the colour of its trajectory changes.

A client is recorded in the rounds it was selected, so with partial selection its
trajectory joins the positions of those rounds. More than :data:`MAX_CLIENTS_DRAWN`
clients: that many, evenly spread over the client ids, are drawn (the title says so).
Colours: ``tab10`` for up to 10 edge servers (one legend entry each), then ``tab20``'s
darker then lighter shades, then repeated (the labels tell the sites apart).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mecsim.scenario import load_recorded_scenario

MAP_NAME = "map.png"
#: at most this many clients' trajectories are drawn (evenly spread over the ids)
MAX_CLIENTS_DRAWN = 500
#: up to this many sites, each cell is clipped by every other site's half-plane
ALL_PAIRS_MAX = 64
#: the clients.csv columns the map reads (``handovers`` when present)
MAP_COLUMNS = ("client_id", "round", "edge_server", "x_m", "y_m")


# ----------------------------------------------------------------------------- cells


def clip_half_plane(polygon: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
    """The part of the convex ``polygon`` (k, 2) where a·p ≤ b (Sutherland–Hodgman)."""
    if len(polygon) == 0:
        return polygon
    side = polygon @ a - b  # ≤ 0 inside
    out: list[np.ndarray] = []
    for i in range(len(polygon)):
        p, q = polygon[i], polygon[(i + 1) % len(polygon)]
        sp, sq = side[i], side[(i + 1) % len(polygon)]
        if sp <= 0:
            out.append(p)
        if (sp < 0 < sq) or (sq < 0 < sp):
            t = sp / (sp - sq)
            out.append(p + t * (q - p))
    return np.array(out).reshape(-1, 2)


def _neighbours(sites: np.ndarray) -> list[set[int]]:
    """Each site's Voronoi neighbours: every other site for a few sites, else the
    Delaunay neighbours (all pairs again when the sites are degenerate, e.g. on a line)."""
    n = len(sites)
    every = [set(range(n)) - {k} for k in range(n)]
    if n <= ALL_PAIRS_MAX:
        return every
    from scipy.spatial import Delaunay, QhullError

    try:
        tri = Delaunay(sites)
    except (QhullError, ValueError):
        return every
    near: list[set[int]] = [set() for _ in range(n)]
    for simplex in tri.simplices:
        for i in simplex:
            near[i].update(int(j) for j in simplex if j != i)
    # coincident sites are left out of the triangulation: they keep every half-plane
    for k in range(n):
        if not near[k]:
            near[k] = every[k]
    return near


def voronoi_cells(sites_m: Any, area_m: tuple[float, float]) -> list[np.ndarray]:
    """Each site's cell within the area: the polygon (k, 2) of the points of
    [0, W] × [0, H] at least as near to the site as to any other,
    |p − s_k|² ≤ |p − s_j|² ⇔ 2·p·(s_j − s_k) ≤ |s_j|² − |s_k|²."""
    sites = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    w, h = area_m
    rect = np.array([[0.0, 0.0], [w, 0.0], [w, h], [0.0, h]])
    cells = []
    for k, near in enumerate(_neighbours(sites)):
        poly = rect
        for j in sorted(near):
            a = 2.0 * (sites[j] - sites[k])
            if not a.any():
                continue  # a coincident site: no border between them
            poly = clip_half_plane(poly, a, float(sites[j] @ sites[j] - sites[k] @ sites[k]))
        cells.append(poly)
    return cells


# ----------------------------------------------------------------------------- colours


def site_colors(n: int) -> list[tuple[float, float, float, float]]:
    """One colour per edge server: tab10, then tab20's darker then lighter shades."""
    import matplotlib

    if n <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return [cmap(i) for i in range(n)]
    cmap = matplotlib.colormaps["tab20"]
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return [cmap(order[i % 20]) for i in range(n)]


# ----------------------------------------------------------------------------- tracks


def tracks(clients: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Each client's recorded rows in round order (``round``, ``edge_server``, ``x_m``,
    ``y_m``, ``handover``: True in a round whose ``handovers`` > 0, or without that column
    where ``edge_server`` differs from the client's previous recorded round)."""
    df = clients.dropna(subset=["x_m", "y_m", "edge_server"]).sort_values(
        ["client_id", "round"], kind="stable"
    )
    out: dict[int, pd.DataFrame] = {}
    for cid, rows in df.groupby("client_id", sort=True):
        t = rows[["round", "edge_server", "x_m", "y_m"]].reset_index(drop=True)
        t["edge_server"] = t["edge_server"].astype(int)
        if "handovers" in rows:
            t["handover"] = rows["handovers"].fillna(0).to_numpy(dtype=float) > 0
        else:
            es = t["edge_server"].to_numpy()
            t["handover"] = np.r_[False, es[1:] != es[:-1]]
        out[int(cid)] = t
    return out


def _drawn(ids: Sequence[int], limit: int) -> list[int]:
    if len(ids) <= limit:
        return list(ids)
    pick = np.unique(np.linspace(0, len(ids) - 1, limit).round().astype(int))
    return [ids[i] for i in pick]


# ----------------------------------------------------------------------------- figure


def map_figure(
    sites_m: Any,
    area_m: tuple[float, float],
    clients: pd.DataFrame,
    title: str = "",
    max_clients: int = MAX_CLIENTS_DRAWN,
) -> Figure:
    """The map (see the module) of ``clients`` (clients.csv's rows: ``client_id``,
    ``round``, ``edge_server``, ``x_m``, ``y_m``, optionally ``handovers``) over the sites
    ``sites_m`` (S, 2) in the area ``area_m`` = (W, H). Artists a test can find by
    ``gid``: ``cells`` (S polygons), ``borders``, ``sites`` (S points), ``trajectories``
    (one segment per pair of consecutive recorded rounds of a drawn client, coloured by
    the serving edge server at its start), ``starts``, ``clients`` (each drawn client's last
    position), ``handovers``."""
    sites = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    w, h = float(area_m[0]), float(area_m[1])
    colors = site_colors(len(sites))
    all_ids = sorted(int(c) for c in clients["client_id"].dropna().unique())
    ids = _drawn(all_ids, max_clients)
    by_client = tracks(clients[clients["client_id"].isin(ids)])
    ids = [c for c in ids if c in by_client]  # clients with positions

    # the data's shape decides the height; the legend takes ~2.3 in to the right
    plot_w = 6.4
    plot_h = min(9.0, max(3.0, plot_w * h / w))
    fig = Figure(figsize=(plot_w + 2.6, plot_h + 0.9), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    cells = voronoi_cells(sites, (w, h))
    ax.add_collection(
        PolyCollection(
            [c for c in cells],
            facecolors=[(*c[:3], 0.13) for c in colors],
            edgecolors="none",
            zorder=0,
            gid="cells",
        )
    )
    ax.add_collection(
        PolyCollection(
            [c for c in cells],
            facecolors="none",
            edgecolors="0.25",
            linewidths=1.4,
            zorder=3.5,  # above the trajectories: the borders stay visible
            gid="borders",
        )
    )

    segments, seg_colors = [], []
    starts, ends, end_colors, hand = [], [], [], []
    moving = 0
    for cid in ids:
        t = by_client[cid]
        xy = t[["x_m", "y_m"]].to_numpy(dtype=float)
        es = t["edge_server"].to_numpy()
        ends.append(xy[-1])
        end_colors.append(colors[es[-1] % len(colors)] if len(colors) else "k")
        if len(xy) > 1 and (xy != xy[0]).any():
            moving += 1
            starts.append(xy[0])
            for i in range(len(xy) - 1):
                segments.append(xy[i : i + 2])
                seg_colors.append(colors[es[i] % len(colors)])
        hand.extend(xy[t["handover"].to_numpy(dtype=bool)])
    if segments:
        ax.add_collection(
            LineCollection(
                segments, colors=seg_colors, linewidths=1.1, alpha=0.9, zorder=2, gid="trajectories"
            )
        )
    if starts:
        s = np.array(starts)
        ax.scatter(
            s[:, 0], s[:, 1], s=12, facecolors="white", edgecolors="0.3", linewidths=0.7,
            zorder=3, gid="starts",
        )  # fmt: skip
    if ends:
        e = np.array(ends)
        ax.scatter(
            e[:, 0], e[:, 1], s=16 if segments else 30, c=end_colors, edgecolors="0.15",
            linewidths=0.4, zorder=4, gid="clients",
        )  # fmt: skip
    if hand:
        hp = np.array(hand)
        ax.scatter(
            hp[:, 0], hp[:, 1], s=42, marker="x", c="black", linewidths=1.6, zorder=5,
            gid="handovers",
        )  # fmt: skip
    ax.scatter(
        sites[:, 0], sites[:, 1], s=130, marker="^", c=colors, edgecolors="black",
        linewidths=1.0, zorder=6, gid="sites",
    )  # fmt: skip
    offset = 0.018 * max(w, h)
    for k, (x, y) in enumerate(sites):
        ax.text(
            x + offset, y + offset, f"ES {k}", fontsize="small", fontweight="bold", zorder=7,
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
        )  # fmt: skip

    ax.set_xlim(0, w)
    ax.set_ylim(0, h)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    n_hand = len(hand)
    rounds = clients["round"].dropna()
    span = (
        f"rounds {int(rounds.min()) + 1}–{int(rounds.max()) + 1}"
        if len(rounds) and rounds.max() > rounds.min()
        else f"round {int(rounds.min()) + 1}"
        if len(rounds)
        else "no rounds"
    )
    drawn = (
        f"{len(ids)} of {len(all_ids)} clients drawn"
        if len(ids) < len(all_ids)
        else f"{len(all_ids)} clients"
    )
    how = f"{moving} moving" if moving else "static"
    facts = (
        f"{len(sites)} cells, {drawn} ({how}), {span}, "
        f"{n_hand} handover{'s' if n_hand != 1 else ''} in recorded rounds"
    )
    ax.set_title(f"{title}\n{facts}" if title else facts, fontsize="medium")

    handles: list[Any] = [
        Line2D([], [], marker="^", ls="none", mfc="white", mec="black", ms=9, label="site"),
        Line2D([], [], color="0.25", lw=1.4, label="cell border\n(nearest site)"),
    ]
    if segments:
        handles.append(
            Line2D(
                [], [], color="0.45", lw=1.3, label="trajectory, coloured by\nserving edge server"
            )
        )
        handles.append(
            Line2D([], [], marker="o", ls="none", mfc="white", mec="0.3", ms=4, label="start")
        )
    handles.append(
        Line2D(
            [], [], marker="o", ls="none", mfc="0.5", mec="0.15", ms=5,
            label="client (end of run)" if segments else "client",
        )
    )  # fmt: skip
    if hand:
        handles.append(
            Line2D([], [], marker="x", ls="none", color="black", mew=1.6, ms=7, label="handover")
        )
    if len(sites) <= 10:
        handles += [Patch(color=c, label=f"edge server {k}") for k, c in enumerate(colors)]
    # an axes legend beside the axes: the constrained layout keeps the y label in view
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
        fontsize="small", frameon=False,
    )  # fmt: skip
    return fig


# ----------------------------------------------------------------------------- a run


def run_map_figure(scenario: Any, clients: pd.DataFrame, run_id: str) -> Figure | None:
    """The map of a run of ``scenario`` with client rows ``clients``; None when the
    scenario has no geometry or the rows no positions."""
    g = getattr(scenario, "geometry", None)
    if g is None or clients is None or "x_m" not in clients or clients["x_m"].isna().all():
        return None
    title = f"{run_id}: association {g.association.rule}"
    return map_figure(g.sites_m(), g.area_m(), clients, title)


def read_map_rows(run_dir: Path) -> pd.DataFrame | None:
    """The columns of ``run_dir/clients.csv`` the map needs (None: no such file)."""
    path = Path(run_dir) / "clients.csv"
    if not path.is_file():
        return None
    wanted = set(MAP_COLUMNS) | {"handovers"}
    try:
        return pd.read_csv(path, usecols=lambda c: c in wanted)
    except pd.errors.EmptyDataError:
        return None


def _save(fig: Figure, path: Path) -> Path:
    """A temporary name of this process's, then renamed (as plots' figures are)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def write_map(
    run_dir: str | Path,
    out_path: str | Path | None = None,
    scenario: Any = None,
    run_id: str | None = None,
) -> Path | None:
    """Draw the map of the run in ``run_dir`` (its ``clients.csv``; its scenario from
    ``scenario.yaml`` unless given) into ``out_path`` (default ``run_dir/plots/map.png``);
    None, writing nothing, for a run without a geometry."""
    run_dir = Path(run_dir)
    if scenario is None:
        path = run_dir / "scenario.yaml"
        if not path.is_file():
            return None
        scenario = load_recorded_scenario(path)
    if scenario.geometry is None:
        return None
    rows = read_map_rows(run_dir)
    if rows is None:
        return None
    fig = run_map_figure(scenario, rows, run_id or run_dir.name)
    if fig is None:
        return None
    out = Path(out_path) if out_path is not None else run_dir / "plots" / MAP_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, out)
