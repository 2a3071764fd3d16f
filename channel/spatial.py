"""Spatially consistent LOS state and shadow fading (3GPP TR 38.901 §7.6.3).

A link's LOS state and shadow fading are functions of where its device is, drawn once
per run per site as spatially correlated random fields over the area, so a device that
moves sees them change at the scale of the tables' correlation distances, and two
devices close together see nearly the same values (docs/channel.md, "Spatially
consistent LOS state and shadowing").

For each site s, three independent zero-mean, unit-variance Gaussian fields over the
area, each with the exponential correlation of §7.6.3.1,

    E[z(p) z(p')] = exp(−|p − p'| / d_corr),

- z_LOS,s with d_corr the LOS/NLOS state's correlation distance (Table 7.6.3.1-2:
  50 m for UMi-Street Canyon and UMa);
- z_SF,LOS,s and z_SF,NLOS,s with the shadow fading's correlation distances of Table
  7.5-6 (UMi-Street Canyon 10 m LOS, 13 m NLOS; UMa 37 m LOS, 50 m NLOS).

At position p the link to site s is LOS where ``Φ(z_LOS,s(p)) < Pr_LOS(d_2D)``
(§7.6.3.3: the LOS state by comparing a spatially correlated uniform random variable
with the LOS probability; Φ the standard normal CDF makes the Gaussian field uniform),
and its shadow fading is ``σ_SF,LOS · z_SF,LOS,s(p)`` or ``σ_SF,NLOS · z_SF,NLOS,s(p)``
by that state (the LOS and NLOS large-scale parameters are generated separately, the
state picks one: a link that goes NLOS and back at the same place gets its shadowing
back).

Each field is sampled on a square grid of spacing ``d_corr / 5`` (coarser where that
would exceed :data:`MAX_GRID_POINTS`) by circulant embedding (Dietrich and Newsam
1997): the covariance on a torus padded by :data:`PAD_CORRELATION_DISTANCES`
correlation distances, its 2D FFT's eigenvalues (negative ones, from the padding's
wrap-around, set to 0: their share of the total is :attr:`GaussianField.clipped`), and
``FFT(√(λ / N) · w)`` of complex white noise w, whose real part is the field (its
imaginary part, an independent field, is not used). A position is given the value of
its nearest grid point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtr

from .pathloss import LargeScaleDraw, Tr38901PathLoss

#: Table 7.5-6: the shadow fading's correlation distances (m), (LOS, NLOS)
SHADOW_CORRELATION_DISTANCE_M = {"38.901-umi": (10.0, 13.0), "38.901-uma": (37.0, 50.0)}
#: Table 7.6.3.1-2: the LOS/NLOS state's correlation distance (m)
LOS_CORRELATION_DISTANCE_M = {"38.901-umi": 50.0, "38.901-uma": 50.0}
#: the grid's spacing, as a fraction of the field's correlation distance
GRID_FRACTION = 0.2
#: the most grid points one field may have (a larger area gets a coarser grid)
MAX_GRID_POINTS = 2_000_000
#: the torus of the circulant embedding: the area plus this many correlation distances
PAD_CORRELATION_DISTANCES = 8.0


@dataclass(frozen=True, eq=False)
class GaussianField:
    """A zero-mean, unit-variance Gaussian field on the grid ``(j · spacing_m, i ·
    spacing_m)`` (``values[i, j]``, float32) covering [0, W] × [0, H]; ``clipped``: the
    share of the embedding's eigenvalue mass set to 0 (its error's size)."""

    values: np.ndarray
    spacing_m: float
    correlation_distance_m: float
    clipped: float

    def at(self, positions_m: ArrayLike) -> np.ndarray:
        """The field at ``positions_m`` (..., 2) (m): its nearest grid point's value
        (positions outside the grid: the nearest edge point's)."""
        p = np.asarray(positions_m, dtype=np.float64)
        ny, nx = self.values.shape
        j = np.clip(np.rint(p[..., 0] / self.spacing_m), 0, nx - 1).astype(np.intp)
        i = np.clip(np.rint(p[..., 1] / self.spacing_m), 0, ny - 1).astype(np.intp)
        out: np.ndarray = self.values[i, j].astype(np.float64)
        return out


def grid_spacing_m(correlation_distance_m: float, area_m: tuple[float, float]) -> float:
    """``d_corr · GRID_FRACTION``, or coarser so the padded grid keeps within
    :data:`MAX_GRID_POINTS` points."""
    spacing = correlation_distance_m * GRID_FRACTION
    pad = PAD_CORRELATION_DISTANCES * correlation_distance_m
    w, h = area_m[0] + pad, area_m[1] + pad
    if (w / spacing) * (h / spacing) > MAX_GRID_POINTS:
        spacing = math.sqrt(w * h / MAX_GRID_POINTS)
    return spacing


def gaussian_field(
    area_m: tuple[float, float], correlation_distance_m: float, rng: np.random.Generator
) -> GaussianField:
    """One field of the module's docstring over the area [0, W] × [0, H] (m). Draws: one
    complex N(0, 1) per point of the padded grid (real parts, then imaginary parts, each
    ``(rows, columns)``)."""
    d = float(correlation_distance_m)
    spacing = grid_spacing_m(d, area_m)
    nx = int(math.floor(area_m[0] / spacing)) + 1
    ny = int(math.floor(area_m[1] / spacing)) + 1
    pad = int(math.ceil(PAD_CORRELATION_DISTANCES * d / spacing))
    mx, my = nx + pad, ny + pad
    # the covariance of each torus point with the origin (distances wrapped around)
    kx = np.minimum(np.arange(mx), mx - np.arange(mx)) * spacing
    ky = np.minimum(np.arange(my), my - np.arange(my)) * spacing
    cov = np.exp(-np.hypot(ky[:, None], kx[None, :]) / d)
    lam = np.fft.fft2(cov).real
    negative = -float(lam[lam < 0].sum())
    clipped = negative / float(np.abs(lam).sum())
    lam = np.maximum(lam, 0.0)
    w = rng.standard_normal((my, mx)) + 1j * rng.standard_normal((my, mx))
    z = np.fft.fft2(np.sqrt(lam / (mx * my)) * w).real
    return GaussianField(z[:ny, :nx].astype(np.float32), spacing, d, clipped)


class SpatialLargeScale:
    """Each site's LOS-state and shadowing fields (the module's docstring) for one
    path-loss model over one area. Draws, from ``rng``: site 0's LOS-state field, its
    LOS shadowing field, its NLOS shadowing field, then site 1's, ..."""

    def __init__(
        self,
        path_loss: Tr38901PathLoss,
        area_m: tuple[float, float],
        sites_m: ArrayLike,
        rng: np.random.Generator,
    ) -> None:
        self.path_loss = path_loss
        self.sites_m = np.asarray(sites_m, dtype=float).reshape(-1, 2)
        los_d = LOS_CORRELATION_DISTANCE_M[path_loss.model]
        sf_los_d, sf_nlos_d = SHADOW_CORRELATION_DISTANCE_M[path_loss.model]
        self.los_fields: list[GaussianField] = []
        self.sf_los_fields: list[GaussianField] = []
        self.sf_nlos_fields: list[GaussianField] = []
        for _ in range(len(self.sites_m)):
            self.los_fields.append(gaussian_field(area_m, los_d, rng))
            self.sf_los_fields.append(gaussian_field(area_m, sf_los_d, rng))
            self.sf_nlos_fields.append(gaussian_field(area_m, sf_nlos_d, rng))
        # each kind's fields stacked (site, row, column): one lookup for every link; the
        # LOS state's as the uniform Φ(z) of the field (float64)
        self._los_u = np.stack([ndtr(f.values.astype(np.float64)) for f in self.los_fields])
        self._sf_los = np.stack([f.values for f in self.sf_los_fields])
        self._sf_nlos = np.stack([f.values for f in self.sf_nlos_fields])

    def links(
        self, positions_m: ArrayLike, site: ArrayLike
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(2D distance (m), LOS state, shadow fading (dB)) of the links from
        ``positions_m`` (..., 2) to the sites ``site`` (..., int; the two broadcast)."""
        p = np.asarray(positions_m, dtype=np.float64)
        s = np.asarray(site, dtype=np.intp)
        shape = np.broadcast_shapes(p.shape[:-1], s.shape)
        p = np.broadcast_to(p, (*shape, 2))
        s = np.broadcast_to(s, shape)
        xy = self.sites_m[s]
        d = np.hypot(p[..., 0] - xy[..., 0], p[..., 1] - xy[..., 1])
        pl = self.path_loss
        if pl.los == "always":
            los = np.ones(shape, dtype=bool)
        elif pl.los == "never":
            los = np.zeros(shape, dtype=bool)
        else:
            los = self._lookup(self._los_u, self.los_fields[0].spacing_m, p, s) < (
                pl.los_probability(d)
            )
        if not pl.shadowing:
            return d, los, np.zeros(shape)
        sigma_los, sigma_nlos = pl.shadow_std_db(True), pl.shadow_std_db(False)
        z_los = self._lookup(self._sf_los, self.sf_los_fields[0].spacing_m, p, s)
        z_nlos = self._lookup(self._sf_nlos, self.sf_nlos_fields[0].spacing_m, p, s)
        sf = np.where(los, sigma_los * z_los, sigma_nlos * z_nlos)
        return d, los, sf

    @staticmethod
    def _lookup(stack: np.ndarray, spacing_m: float, p: np.ndarray, s: np.ndarray) -> np.ndarray:
        """``stack[s]``'s nearest grid point's value at ``p`` (as :meth:`GaussianField.at`)."""
        _, ny, nx = stack.shape
        j = np.clip(np.rint(p[..., 0] / spacing_m), 0, nx - 1).astype(np.intp)
        i = np.clip(np.rint(p[..., 1] / spacing_m), 0, ny - 1).astype(np.intp)
        out: np.ndarray = stack[s, i, j].astype(np.float64)
        return out

    def draw(
        self, positions_m: ArrayLike, environment_u: np.ndarray | None = None
    ) -> LargeScaleDraw:
        """Every link's (client × site) LOS state and shadowing at ``positions_m`` (n, 2),
        as :meth:`Tr38901PathLoss.draw` gives them per run, with the links' h_E draws
        ``environment_u`` (n, S, 2) (drawn per link, not spatially)."""
        p = np.asarray(positions_m, dtype=np.float64).reshape(-1, 1, 2)
        _, los, sf = self.links(p, np.arange(len(self.sites_m))[None, :])
        return LargeScaleDraw(los, sf, environment_u)

    @property
    def clipped(self) -> float:
        """The largest share of eigenvalue mass any field's embedding set to 0."""
        fields = (*self.los_fields, *self.sf_los_fields, *self.sf_nlos_fields)
        return max((f.clipped for f in fields), default=0.0)
