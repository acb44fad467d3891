"""Signed-distance shapes: take LPS coordinates in mm, give signed distances in mm (< 0 inside)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Arr = npt.NDArray[np.floating[Any]]
Index = npt.NDArray[np.intp]
Mask = npt.NDArray[np.bool_]
Coord = Arr | float
Bounds = tuple[float, float, float, float, float, float]
"""Axis-aligned box ``(x0, x1, y0, y1, z0, z1)`` in mm."""

FAR = 1.0e4
"""Distance used for "nowhere near"; larger than any body."""
SKIP_MM = 20.0
"""Parts of a union further than this from a plane cannot change what is painted on it."""


class Shape(Protocol):
    """Anything with a signed distance and a bounding box."""

    @property
    def bounds(self) -> Bounds:
        """Box that holds the whole shape."""
        ...

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm at broadcastable coordinates."""
        ...


def occupancy(d: Arr, width: float) -> Arr:
    """Fraction of a pixel of size ``width`` inside a surface at signed distance ``d``.

    Parameters
    ----------
    d : ndarray
        Signed distance in mm, negative inside.
    width : float
        Pixel size in mm; the ramp from 0 to 1 spans one pixel (a box partial-volume model).

    Returns
    -------
    ndarray
        Values in [0, 1], float32.
    """
    return np.asarray(np.clip(0.5 - d * (1.0 / width), 0.0, 1.0), dtype=np.float32)


def smin(a: Arr, b: Arr, k: float) -> Arr:
    """Smooth union of two distances; ``k`` mm of fillet where they meet (polynomial smin)."""
    h = np.maximum(k - np.abs(a - b), 0.0) * (1.0 / k)
    return np.minimum(a, b) - h * h * (k * 0.25)


def smax(a: Arr, b: Arr, k: float) -> Arr:
    """Smooth intersection of two distances, the dual of :func:`smin`."""
    return -smin(-a, -b, k)


def ellipse_sdf(x: Coord, y: Coord, cx: Coord, cy: Coord, a: Coord, b: Coord) -> Arr:
    """Approximate signed distance to an axis-aligned ellipse (first-order, exact on the axes).

    Parameters
    ----------
    x, y : ndarray or float
        Coordinates in mm.
    cx, cy, a, b : ndarray or float
        Centre and semi-axes in mm; broadcastable with ``x`` and ``y``.

    Returns
    -------
    ndarray
        Signed distance in mm.
    """
    u = (x - cx) / a
    v = (y - cy) / b
    q = np.sqrt(u * u + v * v)
    g = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    # q / g lies between the semi-axes; clipping also covers the centre, where both are zero.
    scale = np.clip(q / np.maximum(g, 1e-9), np.minimum(a, b), np.maximum(a, b))
    return np.asarray((q - 1.0) * scale)


@dataclass(frozen=True)
class Loft:
    """Elliptic cylinder whose centre and semi-axes are interpolated between z key frames.

    ``zs`` must increase; outside ``[zs[0], zs[-1]]`` the shape is capped flat, or, when not
    ``capped``, continues with the end sections.
    """

    zs: tuple[float, ...]
    cx: tuple[float, ...]
    cy: tuple[float, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]
    capped: bool = True
    bounds: Bounds = field(init=False)

    def __post_init__(self) -> None:
        cx, cy, a, b = (np.asarray(v) for v in (self.cx, self.cy, self.a, self.b))
        box = (
            float(np.min(cx - a)),
            float(np.max(cx + a)),
            float(np.min(cy - b)),
            float(np.max(cy + b)),
            self.zs[0] if self.capped else -FAR,
            self.zs[-1] if self.capped else FAR,
        )
        object.__setattr__(self, "bounds", box)

    def section(self, z: Coord) -> tuple[Coord, Coord, Coord, Coord]:
        """Centre and semi-axes ``(cx, cy, a, b)`` of the cross-section at ``z``."""
        return (
            np.interp(z, self.zs, self.cx),
            np.interp(z, self.zs, self.cy),
            np.interp(z, self.zs, self.a),
            np.interp(z, self.zs, self.b),
        )

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm (in-plane distance, capped in z)."""
        cx, cy, a, b = self.section(z)
        d = ellipse_sdf(x, y, cx, cy, a, b)
        if not self.capped:
            return d
        cap = np.maximum(self.zs[0] - np.asarray(z), np.asarray(z) - self.zs[-1])
        return np.maximum(d, cap)


def loft(keys: Sequence[tuple[float, float, float, float, float]], capped: bool = True) -> Loft:
    """Build a :class:`Loft` from ``(z, cx, cy, a, b)`` rows given in any z order."""
    rows = sorted(keys)
    zs, cx, cy, a, b = (tuple(float(v) for v in c) for c in zip(*rows, strict=True))
    return Loft(zs, cx, cy, a, b, capped)


@dataclass(frozen=True)
class Ellipsoid:
    """Ellipsoid with centre, semi-axes and a rotation whose columns are its local axes."""

    centre: tuple[float, float, float]
    axes: tuple[float, float, float]
    rotation: tuple[tuple[float, float, float], ...] = ((1, 0, 0), (0, 1, 0), (0, 0, 1))
    bounds: Bounds = field(init=False)

    def __post_init__(self) -> None:
        r = np.asarray(self.rotation, dtype=float)
        # Half-extent of a rotated ellipsoid along each world axis.
        half = np.sqrt(((r * np.asarray(self.axes)) ** 2).sum(axis=1))
        c = self.centre
        box = (c[0] - half[0], c[0] + half[0], c[1] - half[1], c[1] + half[1])
        object.__setattr__(self, "bounds", (*box, c[2] - half[2], c[2] + half[2]))

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Approximate signed distance in mm (first-order, exact on the axes)."""
        r = self.rotation
        px, py, pz = x - self.centre[0], y - self.centre[1], z - self.centre[2]
        local = [px * r[0][i] + py * r[1][i] + pz * r[2][i] for i in range(3)]
        q2 = sum((p / a) ** 2 for p, a in zip(local, self.axes, strict=True))
        g2 = sum((p / (a * a)) ** 2 for p, a in zip(local, self.axes, strict=True))
        q = np.sqrt(q2)
        scale = np.clip(q / np.maximum(np.sqrt(g2), 1e-9), min(self.axes), max(self.axes))
        return np.asarray((q - 1.0) * scale)


@dataclass(frozen=True)
class Capsule:
    """Tube between two points whose radius tapers linearly from ``ra`` to ``rb``."""

    a: tuple[float, float, float]
    b: tuple[float, float, float]
    ra: float
    rb: float
    bounds: Bounds = field(init=False)

    def __post_init__(self) -> None:
        r = max(self.ra, self.rb)
        lo = [min(p, q) - r for p, q in zip(self.a, self.b, strict=True)]
        hi = [max(p, q) + r for p, q in zip(self.a, self.b, strict=True)]
        object.__setattr__(self, "bounds", (lo[0], hi[0], lo[1], hi[1], lo[2], hi[2]))

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm (exact for equal radii)."""
        ax, ay, az = self.a
        ux, uy, uz = (q - p for p, q in zip(self.a, self.b, strict=True))
        length2 = max(ux * ux + uy * uy + uz * uz, 1e-9)
        px, py, pz = x - ax, y - ay, z - az
        t = np.clip((px * ux + py * uy + pz * uz) / length2, 0.0, 1.0)
        dist = np.sqrt((px - t * ux) ** 2 + (py - t * uy) ** 2 + (pz - t * uz) ** 2)
        return np.asarray(dist - (self.ra + t * (self.rb - self.ra)))


def chain(points: Sequence[tuple[float, float, float]], radii: Sequence[float]) -> list[Capsule]:
    """Capsules joining consecutive points of a path, radius interpolated along it."""
    return [
        Capsule(points[i], points[i + 1], radii[i], radii[i + 1]) for i in range(len(points) - 1)
    ]


def rotation_z(angle_deg: float) -> tuple[tuple[float, float, float], ...]:
    """Rotation about the z axis, as the nested tuple :class:`Ellipsoid` takes."""
    c, s = np.cos(np.radians(angle_deg)), np.sin(np.radians(angle_deg))
    return ((float(c), float(-s), 0.0), (float(s), float(c), 0.0), (0.0, 0.0, 1.0))


def rotation_zx(angle_z_deg: float, tilt_x_deg: float) -> tuple[tuple[float, float, float], ...]:
    """Rotation about z then a tilt about x (the heart's long axis points down and forward)."""
    rz = np.asarray(rotation_z(angle_z_deg))
    c, s = np.cos(np.radians(tilt_x_deg)), np.sin(np.radians(tilt_x_deg))
    rx = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])
    m = rx @ rz
    return tuple((float(r[0]), float(r[1]), float(r[2])) for r in m)


def _grow(b: Bounds, by: float) -> Bounds:
    """Bounds enlarged by ``by`` mm on every side."""
    return (b[0] - by, b[1] + by, b[2] - by, b[3] + by, b[4] - by, b[5] + by)


@dataclass(frozen=True)
class Union:
    """Union of shapes, filleted by ``k`` mm where they meet (0 for a sharp union)."""

    parts: tuple[Shape, ...]
    k: float = 0.0
    bounds: Bounds = field(init=False)

    def __post_init__(self) -> None:
        boxes = np.asarray([p.bounds for p in self.parts])
        lo, hi = boxes.min(axis=0), boxes.max(axis=0)
        box = (lo[0], hi[1], lo[2], hi[3], lo[4], hi[5])
        object.__setattr__(self, "bounds", tuple(float(v) for v in box))

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm; on a plane, parts far above or below it are skipped."""
        parts = self.parts
        if np.ndim(z) == 0:
            zf = float(z)
            near = [p for p in parts if p.bounds[4] - SKIP_MM <= zf <= p.bounds[5] + SKIP_MM]
            parts = tuple(near) if near else parts[:1]
        d = parts[0].sdf(x, y, z)
        for part in parts[1:]:
            e = part.sdf(x, y, z)
            d = smin(d, e, self.k) if self.k > 0 else np.minimum(d, e)
        return d


@dataclass(frozen=True)
class Intersect:
    """``shape`` kept only inside ``clip``; bounds are those of ``shape``."""

    shape: Shape
    clip: Shape
    k: float = 0.0

    @property
    def bounds(self) -> Bounds:
        """Overlap of the bounds of both shapes."""
        a, b = self.shape.bounds, self.clip.bounds
        return (
            max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]),
            min(a[3], b[3]), max(a[4], b[4]), min(a[5], b[5]),
        )  # fmt: skip

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm."""
        a, b = self.shape.sdf(x, y, z), self.clip.sdf(x, y, z)
        return smax(a, b, self.k) if self.k > 0 else np.maximum(a, b)


@dataclass(frozen=True)
class Offset:
    """``shape`` grown by ``by`` mm (shrunk when negative)."""

    shape: Shape
    by: float

    @property
    def bounds(self) -> Bounds:
        """Bounds of the grown shape."""
        return _grow(self.shape.bounds, max(self.by, 0.0))

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm."""
        return self.shape.sdf(x, y, z) - self.by


@dataclass(frozen=True)
class Complement:
    """Everything outside ``shape`` (unbounded)."""

    shape: Shape
    bounds: Bounds = (-FAR, FAR, -FAR, FAR, -FAR, FAR)

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm."""
        return -self.shape.sdf(x, y, z)


@dataclass(frozen=True)
class Front:
    """Everything in front of (smaller y than) ``level``: where gas rises in a supine patient."""

    level: float
    bounds: Bounds = (-FAR, FAR, -FAR, FAR, -FAR, FAR)

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm."""
        return np.asarray(y - self.level)
