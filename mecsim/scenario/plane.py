"""The arithmetic of a geometry's plane, numbers in and numbers out (no pydantic, no
numpy): a hexagonal grid's sites, the area a layout of sites spans, and clients split
into contiguous blocks.

Both the ``geometry:`` section's validation (:mod:`mecsim.scenario.schema.geometry`,
which needs the sites to check a scenario) and the emulation's placement
(:mod:`mecsim.emulation.geometry`, whose :func:`~mecsim.emulation.geometry.hex_grid_sites`
is the numpy form of :func:`hex_grid_offsets_m`) import it from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def hex_grid_offsets_m(rings: int, inter_site_distance_m: float) -> list[tuple[float, float]]:
    """The sites of a hexagonal grid of ``rings`` rings around a centre site, as offsets
    from that centre (m), in edge-server order: the centre, then ring 1, ring 2, ...

    Ring k has 6k sites on the hexagon whose corners are k·D·(cos 60°j, sin 60°j),
    j = 0..5 (D the inter-site distance): each ring starts at its corner on the +x axis
    and walks counter-clockwise, k sites per side (the corner, then k − 1 evenly spaced
    points towards the next corner). 1 + 3·R·(R + 1) sites in all; every site's six
    nearest neighbours are D away.
    """
    out = [(0.0, 0.0)]
    for k in range(1, rings + 1):
        corners = [
            (
                k * inter_site_distance_m * math.cos(math.pi / 3 * j),
                k * inter_site_distance_m * math.sin(math.pi / 3 * j),
            )
            for j in range(7)
        ]
        for j in range(6):
            (x0, y0), (x1, y1) = corners[j], corners[j + 1]
            out += [(x0 + (x1 - x0) * t / k, y0 + (y1 - y0) * t / k) for t in range(k)]
    return out


def area_m(
    points: Sequence[tuple[float, float]],
    *,
    hex_layout: bool,
    inter_site_distance_m: float,
    margin_m: float | None,
) -> tuple[float, float]:
    """(width, height) of the area a layout of sites spans (m), when no area is given.

    A hexagonal grid's ``points`` are offsets from its centre site: the area is their
    extent with ``margin_m`` on every side (default the cell's circumradius D/√3). Explicit
    sites are positions from the origin: the area reaches ``margin_m`` (default 0) beyond
    the farthest."""
    if hex_layout:
        margin = inter_site_distance_m / math.sqrt(3) if margin_m is None else margin_m
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        return max(xs) - min(xs) + 2 * margin, max(ys) - min(ys) + 2 * margin
    margin = margin_m or 0.0
    return max(p[0] for p in points) + margin, max(p[1] for p in points) + margin


def split_evenly(n: int, parts: int) -> list[int]:
    """``n`` into ``parts`` contiguous blocks of ⌈n / parts⌉ (the last ones smaller):
    the blocks :meth:`~mecsim.scenario.schema.Scenario.edge_server_of` gives without a
    geometry."""
    per = math.ceil(n / parts)
    return [max(0, min(per, n - k * per)) for k in range(parts)]


def hotspot_counts(given: Sequence[int | None], n_clients: int) -> list[int]:
    """Clients per hotspot, in hotspot order (client ids in contiguous blocks): the
    hotspots' own counts when the first gives one (validation makes it all or none),
    else ``n_clients`` split evenly over them."""
    if given and given[0] is not None:
        return [int(c or 0) for c in given]
    return split_evenly(n_clients, len(given))
