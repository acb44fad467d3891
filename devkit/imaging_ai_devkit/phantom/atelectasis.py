"""Dependent atelectasis: takes a patient, gives the dense bands and wedges of the posterior bases.

Supine patients collapse the lowest (posterior) lung at the bases: a subpleural band a few mm
to 15 mm thick that thins towards the front and upwards, sometimes with wedges, from -300 HU
at its inner edge to soft tissue at the pleura. It is lung (the lung truth keeps it) but never
a lesion; the structure truth labels it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from imaging_ai_devkit.phantom.canvas import Canvas, Planes, Window
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import Arr, Ellipsoid, occupancy
from imaging_ai_devkit.phantom.structures import ATELECTASIS


@dataclass(frozen=True)
class Atelectasis:
    """Bands and wedges of collapsed lung at the posterior bases.

    Attributes
    ----------
    z_top : float
        Nothing above this patient z; the band thickens over ``fade`` mm below it.
    fade : float
    posterior : float
        Where the band starts, as a fraction of the cavity's half depth behind its centre.
    thickness : tuple of float
        Band thickness at the back of the right and left lung, mm (0: none on that side).
    dense_hu, inner_hu : float
        Attenuation at the pleura and at the band's inner edge.
    wedges : tuple of Ellipsoid
        Wedge-shaped collapse against the posterior pleura (clipped to the lung).
    """

    z_top: float
    fade: float
    posterior: float
    thickness: tuple[float, float]
    dense_hu: float
    inner_hu: float
    wedges: tuple[Ellipsoid, ...]

    def paint(self, canvas: Canvas, win: Window, depth: Arr, lung: Arr, z: float,
              section: tuple[float, float, float], planes: Planes) -> None:  # fmt: skip
        """Paint over the lung just painted on ``win``.

        Parameters
        ----------
        canvas : Canvas
            The plane.
        win : Window
            The lungs' window.
        depth : ndarray
            Distance inside the lung surface, mm (negative outside).
        lung : ndarray
            Lung occupancy on ``win``.
        z : float
            Patient z of the plane.
        section : tuple of float
            Midline x, cavity centre y and cavity half depth at ``z``.
        planes : Planes
            Texture.
        """
        if z > self.z_top:
            return
        midline, cy, b = section
        # Only the back of the window can hold it: cut the rows in front away.
        front = min([cy + self.posterior * b, *(w.bounds[2] for w in self.wedges)])
        skip = int(np.searchsorted(win.y[:, 0], front))
        if skip >= win.y.shape[0]:
            return
        rows = slice(win.rows.start + skip, win.rows.stop)
        win = Window(rows, win.cols, win.x, win.y[skip:])
        depth, lung = depth[skip:], lung[skip:]
        band = np.where(win.x < midline, self.thickness[0], self.thickness[1])
        band = band * min((self.z_top - z) / self.fade, 1.0)
        back = np.clip((win.y - (cy + self.posterior * b)) / (0.35 * b), 0.0, 1.0)
        band = band * back
        d = depth - band
        for wedge in self.wedges:
            if wedge.bounds[4] <= z <= wedge.bounds[5]:
                d = np.minimum(d, wedge.sdf(win.x, win.y, z))
        alpha = occupancy(d, canvas.grid.spacing) * lung
        if not alpha.any():
            return
        inner = np.clip(depth / np.maximum(band, 3.0), 0.0, 1.0)
        value = self.dense_hu + (self.inner_hu - self.dense_hu) * inner
        canvas.blend(win, alpha, value + planes.texture(win, 12.0, 8.0))
        canvas.mark(win, alpha, ATELECTASIS)


def draw_atelectasis(p: Patient, dome_top: float, cavity: tuple[float, float]) -> Atelectasis:
    """Atelectasis of ``p``: on one or both sides, over the posterior bases.

    Parameters
    ----------
    p : Patient
        The synthetic patient.
    dome_top : float
        Patient z of the right dome's top.
    cavity : tuple of float
        Lateral and antero-posterior half-widths of the cavity at the bases.
    """
    rng = rng_for(p.seed, "atelectasis")
    sides = rng.choice(3, p=[0.6, 0.2, 0.2])  # both, right only, left only
    thick = rng.uniform(3.0, 14.0, 2)
    if sides == 1:
        thick[1] = 0.0
    elif sides == 2:
        thick[0] = 0.0
    z_top = dome_top + float(rng.uniform(-20.0, 25.0))
    a, b = cavity
    wedges = []
    for _ in range(int(rng.integers(0, 3))):
        side = -1.0 if thick[1] == 0.0 or (thick[0] > 0.0 and rng.random() < 0.5) else 1.0
        centre = (
            p.centre[0] + side * float(rng.uniform(0.3, 0.65)) * a,
            p.centre[1] + float(rng.uniform(0.75, 0.95)) * b,
            z_top - float(rng.uniform(15.0, 45.0)),
        )
        axes = (float(rng.uniform(15, 35)), float(rng.uniform(8, 18)), float(rng.uniform(15, 35)))
        wedges.append(Ellipsoid(centre, axes))
    return Atelectasis(
        z_top=z_top,
        fade=float(rng.uniform(15.0, 40.0)),
        posterior=float(rng.uniform(0.15, 0.45)),
        thickness=(float(thick[0]), float(thick[1])),
        dense_hu=float(rng.uniform(-100.0, 40.0)),
        inner_hu=float(rng.uniform(-300.0, -150.0)),
        wedges=tuple(wedges),
    )
