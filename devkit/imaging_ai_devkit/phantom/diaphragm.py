"""Diaphragm: takes a patient, gives both hemidiaphragm domes as one signed-distance surface."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import FAR, Arr, Coord

DOME_POWER = 1.6
"""Above 1 the domes are flatter on top and steeper at the sides than a paraboloid."""
Bump = tuple[float, float, float, float]
"""A hump on the diaphragm: centre x, y (mm), height and width (mm)."""


@dataclass(frozen=True)
class Dome:
    """Both hemidiaphragms: saturating paraboloids under each lung, blended across the midline.

    ``sdf`` is negative below the diaphragm (the abdomen), positive above it. ``bumps`` are
    focal humps (eventration, muscle slips): an axial plane through the top of one cuts a round
    island of soft tissue out of the lung base.
    """

    right: tuple[float, float, float]
    left: tuple[float, float, float]
    depth: float
    wx: float
    wy_front: float
    wy_back: float
    midline: float
    power: float = DOME_POWER
    bumps: tuple[Bump, ...] = ()

    @property
    def top(self) -> float:
        """Highest z the diaphragm can reach (a bump may stand above a dome's top)."""
        return max(self.right[2], self.left[2]) + max((b[2] for b in self.bumps), default=0.0)

    @property
    def bounds(self) -> tuple[float, float, float, float, float, float]:
        """Unbounded in x and y; below the highest point in z."""
        return (-FAR, FAR, -FAR, FAR, -FAR, self.top + 1.0)

    def _side(self, x: Coord, y: Coord, top: tuple[float, float, float]) -> tuple[Arr, Arr, Arr]:
        """Surface z and its x and y slopes under one dome (flat-topped: a super-Gaussian)."""
        dx, dy = x - top[0], y - top[1]
        wy = np.where(dy < 0, self.wy_front, self.wy_back)
        r2 = (dx / self.wx) ** 2 + (dy / wy) ** 2
        u = r2**self.power
        e = self.depth * np.exp(-u)
        # d(depth)/d(r2), times d(r2)/dx and d(r2)/dy; r2 ** (power - 1) is u / r2 (one power
        # of an array fewer: this is the costliest line of a plane).
        k = -e * self.power * u / np.maximum(r2, 1e-9)
        return top[2] - self.depth + e, k * 2 * dx / self.wx**2, k * 2 * dy / wy**2

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm, approximately normal to the surface."""
        zr, gxr, gyr = self._side(x, y, self.right)
        zl, gxl, gyl = self._side(x, y, self.left)
        w = 1.0 / (1.0 + np.exp(-(np.asarray(x) - self.midline) / 12.0))
        zs = zr + w * (zl - zr)
        gx = gxr + w * (gxl - gxr) + (zl - zr) * w * (1 - w) / 12.0
        gy = gyr + w * (gyl - gyr)
        for bx, by, height, width in self.bumps:
            dx, dy = x - bx, y - by
            h = height * np.exp(-(dx * dx + dy * dy) / (width * width))
            zs = zs + h
            gx = gx - 2.0 * h * dx / (width * width)
            gy = gy - 2.0 * h * dy / (width * width)
        return np.asarray((z - zs) / np.sqrt(1.0 + gx * gx + gy * gy))


def build_dome(p: Patient) -> Dome:
    """Diaphragm of ``p``: the right dome under the liver stands higher than the left.

    Width, flatness and up to two focal humps vary with the seed.
    """
    a0, b0 = p.cavity
    rng = rng_for(p.seed, "dome")
    right = p.at(-0.4 * a0 / p.frame, -0.05 * b0 / p.frame, 1.0)
    left = (*p.at(0.42 * a0 / p.frame, 0.0, 1.0)[:2], p.z(1.0) - p.left_dome_drop)
    bumps = []
    for _ in range(int(rng.choice(3, p=[0.35, 0.45, 0.2]))):
        top = right if rng.random() < 0.65 else left  # anteromedial right humps are commonest
        x = top[0] + float(rng.uniform(-0.4, 0.4)) * a0
        y = top[1] + float(rng.uniform(-0.6, 0.2)) * b0
        bumps.append((x, y, float(rng.uniform(6.0, 18.0)), float(rng.uniform(12.0, 28.0))))
    u = rng.uniform
    return Dome(
        right=right,
        left=left,
        depth=115.0 * p.frame,
        wx=90.0 * p.frame * float(u(0.85, 1.15)),
        wy_front=105.0 * p.frame * float(u(0.85, 1.15)),
        wy_back=75.0 * p.frame * float(u(0.85, 1.15)),
        midline=p.centre[0] + 10.0 * p.frame,
        power=float(u(1.3, 2.0)),
        bumps=tuple(bumps),
    )
