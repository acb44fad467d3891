"""Tube rendering: takes spheres and an axial plane, gives per-class partial-volume occupancy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from imaging_ai_devkit.phantom.canvas import Canvas, Planes
from imaging_ai_devkit.phantom.sdf import Arr, Index, Mask
from imaging_ai_devkit.phantom.structures import AIRWAY, VESSEL
from imaging_ai_devkit.phantom.trees import CLASSES, Spheres

LABELS = (VESSEL, VESSEL, AIRWAY, AIRWAY)
"""Structure label of each tree class: artery, vein, airway wall, airway lumen."""


def splat(spheres: Spheres, canvas: Canvas, z: float, out: Arr) -> None:
    """Accumulate the occupancy of every sphere the plane at ``z`` cuts into ``out``.

    The union of spheres is taken with a maximum of occupancies, which equals the occupancy of the
    minimum distance; masked spheres are multiplied by the lung occupancy already on the canvas.

    Parameters
    ----------
    spheres : Spheres
        Tubes sampled as spheres, sorted by z.
    canvas : Canvas
        Plane being painted (grid and lung occupancy).
    z : float
        Patient z of the plane.
    out : ndarray
        ``(CLASSES, n, n)`` float32, zeroed by the caller.
    """
    g = canvas.grid
    dx = g.spacing
    lo, hi = np.searchsorted(spheres.z, [z - spheres.r_max - dx, z + spheres.r_max + dx])
    dz = spheres.z[lo:hi] - z
    r = spheres.r[lo:hi]
    reach2 = (r + dx) ** 2 - dz * dz
    hit = np.nonzero(reach2 > 0)[0]
    if hit.size == 0:
        return
    half = np.ceil(np.sqrt(reach2[hit]) / dx).astype(int)
    col = (spheres.x[lo:hi][hit] - g.x0) / dx
    row = (spheres.y[lo:hi][hit] - g.y0) / dx
    stamp = _Stamp(col, row, dz[hit], r[hit], spheres.cls[lo:hi][hit], spheres.masked[lo:hi][hit])
    flat_out = out.reshape(-1)
    lung = canvas.lung.reshape(-1)
    for w in np.unique(half):
        stamp.draw(np.nonzero(half == w)[0], int(w), g.n, dx, flat_out, lung)


@dataclass(frozen=True)
class _Stamp:
    """Spheres cut by one plane: centres in pixel units, height above the plane, radius, class."""

    col: Arr
    row: Arr
    dz: Arr
    r: Arr
    cls: Index
    masked: Mask

    def draw(self, sel: Index, w: int, n: int, dx: float, out: Arr, lung: Arr) -> None:
        """Draw the spheres ``sel`` with square stamps of half-width ``w`` pixels."""
        offs = np.arange(-w, w + 1)
        c0, r0 = np.rint(self.col[sel]).astype(int), np.rint(self.row[sel]).astype(int)
        cc = c0[:, None, None] + offs[None, None, :]
        rr = r0[:, None, None] + offs[None, :, None]
        ddx = (cc - self.col[sel][:, None, None]) * dx
        ddy = (rr - self.row[sel][:, None, None]) * dx
        dist = np.sqrt(ddx * ddx + ddy * ddy + (self.dz[sel] ** 2)[:, None, None])
        occ = np.clip(0.5 - (dist - self.r[sel][:, None, None]) / dx, 0.0, 1.0)
        ok = (occ > 0) & (cc >= 0) & (cc < n) & (rr >= 0) & (rr < n)
        pix = np.broadcast_to(rr * n + cc, occ.shape)[ok]
        occ = occ[ok]
        per = np.broadcast_to(np.arange(len(sel))[:, None, None], ok.shape)[ok]
        masked = self.masked[sel][per]
        occ = np.where(masked, occ * lung[pix], occ).astype(np.float32)
        np.maximum.at(out, self.cls[sel][per] * (n * n) + pix, occ)


@dataclass(frozen=True)
class TreePainter:
    """Paints lung vessels and airways with the HU of each class."""

    spheres: Spheres
    hu: tuple[float, float, float, float]
    """Artery, vein, airway wall and airway lumen HU, in class order."""

    def paint(self, canvas: Canvas, z: float, planes: Planes, buffer: Arr) -> None:
        """Splat the trees into ``buffer`` then blend each class onto the canvas."""
        buffer.fill(0.0)
        splat(self.spheres, canvas, z, buffer)
        rows = np.nonzero(buffer.reshape(CLASSES, canvas.grid.n, -1).any(axis=(0, 2)))[0]
        if rows.size == 0:
            return
        band = slice(int(rows[0]), int(rows[-1]) + 1)
        hu = canvas.hu[band]
        labels = canvas.label[band]
        for cls, value in enumerate(self.hu):
            alpha = buffer[cls, band]
            hu += alpha * (value - hu)
            labels[alpha >= 0.5] = LABELS[cls]
