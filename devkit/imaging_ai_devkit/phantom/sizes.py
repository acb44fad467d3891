"""Exact nodule sizes: takes a :class:`Nodule`, gives what its continuous body measures.

A nodule's mask is drawn from its signed distance, voxel by voxel; this module measures the
shape itself, so that tests can hold a measurement of the mask against a known size:

- the axial long axis: the longest in-plane diameter, on the axial plane where it is longest,
  and the short axis: the longest chord perpendicular to it on that plane (RECIST, Fleischner);
- the volume and the centroid.

It measures the body (the lobulated sphere), not the spicules: they are thin strands that a
voxel mask catches or misses by chance, and radiologists leave them out of a diameter. A
spiculated nodule's mask therefore measures larger than these sizes.

The body is star-shaped about the nodule's centre: along each direction ``u`` it reaches
``0.5 * diameter * (1 + bump(u))``. Sections are traced by casting rays from the point of the
plane above or below the centre, so they are defined for planes that cut the body's core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from imaging_ai_devkit.phantom.nodules import Nodule

F64 = npt.NDArray[np.float64]
COARSE_MM, FINE_MM = 0.5, 0.05
"""Plane steps of the search for the plane of the longest axis: coarse, then fine around it."""
RAYS_SEARCH, RAYS = 180, 720
SCAN, BISECT = 40, 18
"""Samples along each ray, then bisection steps on the last crossing: under 1e-5 mm."""


@dataclass(frozen=True)
class NoduleSize:
    """What a nodule's body measures (mm, mL, LPS)."""

    long_axis_mm: float
    short_axis_mm: float
    plane_z_mm: float
    volume_ml: float
    centroid_mm: tuple[float, float, float]


def body_radius(nodule: Nodule, ux: Any, uy: Any, uz: Any) -> Any:
    """Distance (mm) from the centre to the body's surface along unit directions (ux, uy, uz).

    The same surface as :meth:`Nodule.sdf` draws (without spicules).
    """
    bump: Any = np.zeros(np.broadcast(ux, uy, uz).shape)
    for (lx, ly, lz), amp, freq, phase in nodule.lobes:
        bump = bump + amp * np.cos(freq * math.pi * (ux * lx + uy * ly + uz * lz) + phase)
    return 0.5 * nodule.diameter * (1.0 + bump)


def _reach(nodule: Nodule) -> float:
    return 0.5 * nodule.diameter * (1.0 + sum(abs(lobe[1]) for lobe in nodule.lobes))


def cuts_core(nodule: Nodule, z: float) -> bool:
    """Whether the axial plane at ``z`` passes through the body above or below its centre."""
    h = z - nodule.centre[2]
    return abs(h) < float(body_radius(nodule, 0.0, 0.0, math.copysign(1.0, h) if h else 1.0))


def section(nodule: Nodule, z: float, rays: int = RAYS) -> F64:
    """Outline of the body on the axial plane at ``z``: (rays, 2) in-plane LPS points, ordered.

    Each ray from the point above (or below) the centre ends where it last leaves the body.
    """
    if not cuts_core(nodule, z):
        raise ValueError(f"the plane z={z:.2f} does not cut the core of the nodule")
    h = z - nodule.centre[2]
    theta = np.linspace(0.0, 2.0 * math.pi, rays, endpoint=False)[:, None]
    cos, sin = np.cos(theta), np.sin(theta)

    def outside(rho: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.bool_]:
        dist = np.sqrt(rho * rho + h * h)
        inv = 1.0 / np.maximum(dist, 1e-9)
        return np.asarray(dist > body_radius(nodule, rho * cos * inv, rho * sin * inv, h * inv))

    step = _reach(nodule) / (SCAN - 1)
    inside = ~outside(np.arange(SCAN)[None, :] * step)
    last = SCAN - 1 - np.argmax(inside[:, ::-1], axis=1)
    lo = (last * step)[:, None]
    hi = lo + step
    for _ in range(BISECT):
        mid = 0.5 * (lo + hi)
        out = outside(mid)
        lo, hi = np.where(out, lo, mid), np.where(out, mid, hi)
    rho = 0.5 * (lo + hi)
    return np.concatenate([nodule.centre[0] + rho * cos, nodule.centre[1] + rho * sin], axis=1)


def diameter(outline: F64) -> tuple[float, F64]:
    """Longest distance between two points of an outline, and its unit direction."""
    diff = outline[:, None, :] - outline[None, :, :]
    dist = np.hypot(diff[..., 0], diff[..., 1])
    i, j = np.unravel_index(int(dist.argmax()), dist.shape)
    length = float(dist[i, j])
    return length, (outline[j] - outline[i]) / length


def perpendicular_chord(outline: F64, direction: F64, samples: int = 1000) -> float:
    """Longest extent of an outline across lines perpendicular to ``direction``.

    For each line ``u = t`` the extent runs from the first to the last edge it crosses, which
    for a convex outline is the chord; ``t`` is sampled ``samples`` times along the outline.
    """
    u = outline @ direction
    v = outline @ np.array([-direction[1], direction[0]])
    u2, v2 = np.roll(u, -1), np.roll(v, -1)
    t = np.linspace(u.min(), u.max(), samples)[:, None]
    span = np.where(u2 == u, 1.0, u2 - u)
    crosses = (np.minimum(u, u2) <= t) & (t <= np.maximum(u, u2)) & (u2 != u)
    at = v + (t - u) * (v2 - v) / span
    high = np.where(crosses, at, -np.inf).max(axis=1)
    low = np.where(crosses, at, np.inf).min(axis=1)
    return float(np.max(np.where(np.isfinite(high), high - low, 0.0)))


def axial_axes(nodule: Nodule, z: float, rays: int = RAYS) -> tuple[float, float]:
    """Long and short axis (mm) of the body's section on the axial plane at ``z``."""
    outline = section(nodule, z, rays)
    long_axis, direction = diameter(outline)
    return long_axis, perpendicular_chord(outline, direction)


def _width(outline: F64) -> float:
    """Largest width over 360 directions: the diameter to within 4e-5 of it, quickly."""
    angles = np.linspace(0.0, math.pi, 360, endpoint=False)
    spans = outline @ np.stack([np.cos(angles), np.sin(angles)])
    return float(np.max(spans.max(axis=0) - spans.min(axis=0)))


def _longest_plane(nodule: Nodule) -> float:
    """z of the axial plane whose section has the longest diameter: coarse search, then fine."""
    c = nodule.centre[2]
    top = float(body_radius(nodule, 0.0, 0.0, 1.0))
    bottom = float(body_radius(nodule, 0.0, 0.0, -1.0))
    best = c
    for step, reach in ((COARSE_MM, (bottom, top)), (FINE_MM, (COARSE_MM, COARSE_MM))):
        planes = best + np.arange(-reach[0], reach[1] + step / 2, step)
        planes = planes[[cuts_core(nodule, float(z)) for z in planes]]
        widths = [_width(section(nodule, float(z), RAYS_SEARCH)) for z in planes]
        best = float(planes[int(np.argmax(widths))])
    return best


def volume_and_centroid(nodule: Nodule, points: int = 40000) -> tuple[float, F64]:
    """Volume (mL) and centroid (LPS mm) of the body, by quadrature over directions.

    A star-shaped body of radius ``R(u)`` holds ``∫ R³/3 dΩ`` and has its centroid at
    ``∫ R⁴/4 u dΩ / volume`` from the centre; a Fibonacci sphere gives even weights.
    """
    k = np.arange(points) + 0.5
    polar = np.arccos(1.0 - 2.0 * k / points)
    azimuth = math.pi * (1.0 + math.sqrt(5.0)) * k
    u = np.stack(
        [np.cos(azimuth) * np.sin(polar), np.sin(azimuth) * np.sin(polar), np.cos(polar)], axis=1
    )
    radius = body_radius(nodule, u[:, 0], u[:, 1], u[:, 2])
    weight = 4.0 * math.pi / points
    volume = float(np.sum(radius**3 / 3.0) * weight)
    offset = np.sum((radius**4 / 4.0)[:, None] * u, axis=0) * weight / volume
    return volume / 1000.0, np.asarray(nodule.centre) + offset


def nodule_size(nodule: Nodule) -> NoduleSize:
    """Axes on the plane of the longest axis, volume and centroid of a nodule's body."""
    z = _longest_plane(nodule)
    long_axis, short_axis = axial_axes(nodule, z)
    volume, centroid = volume_and_centroid(nodule)
    x, y, zc = (float(v) for v in centroid)
    return NoduleSize(long_axis, short_axis, z, volume, (x, y, zc))
