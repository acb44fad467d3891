"""Lungs and mediastinum: take a patient and its cavity, give lung outlines and the organs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from imaging_ai_devkit.phantom.atelectasis import Atelectasis
from imaging_ai_devkit.phantom.canvas import Canvas, Part, Planes
from imaging_ai_devkit.phantom.contrast import Enhancement
from imaging_ai_devkit.phantom.diaphragm import Dome
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import (
    FAR,
    Arr,
    Complement,
    Coord,
    Ellipsoid,
    Intersect,
    Loft,
    Offset,
    Shape,
    Union,
    chain,
    loft,
    occupancy,
    smin,
)
from imaging_ai_devkit.phantom.structures import NONE

ENVELOPE_FILLET = 9.0
"""Fillet (mm) of the mediastinal outline: fat fills the gaps between its organs."""
PLEURA = 1.5
"""Gap (mm) between lung and mediastinal organs or the chest wall."""


@dataclass(frozen=True)
class Apices:
    """Tops of both lungs: each a saturating dome hanging from its apex point."""

    right: tuple[float, float, float]
    left: tuple[float, float, float]
    depth: float
    width: float
    midline: float

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Positive above the lung tops (distance approximately normal to the surface)."""
        top = np.where(np.asarray(x) < self.midline, 0.0, 1.0)
        ax = self.right[0] + top * (self.left[0] - self.right[0])
        ay = self.right[1] + top * (self.left[1] - self.right[1])
        az = self.right[2] + top * (self.left[2] - self.right[2])
        r2 = ((x - ax) ** 2 + (y - ay) ** 2) / self.width**2
        e = self.depth * np.exp(-r2)
        zs = az - self.depth + e
        slope = 2 * e * np.sqrt(r2) / self.width
        return np.asarray((z - zs) / np.sqrt(1.0 + slope * slope))


@dataclass(frozen=True)
class Lungs:
    """Both lungs: the cavity minus the mediastinum, under the apices and above the diaphragm."""

    cavity: Loft
    envelope: tuple[Shape, ...]
    dome: Dome
    apices: Apices
    band: Loft
    hu: float
    dependent_hu: float
    atelectasis: Atelectasis | None = None

    def midline(self, z: float) -> float:
        """x that separates the right lung (smaller x) from the left at ``z``."""
        return float(self.band.section(z)[0])

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance to the lung surface at arbitrary points (slow path, all organs)."""
        env = self.envelope[0].sdf(x, y, z)
        for shape in self.envelope[1:]:
            env = smin(env, shape.sdf(x, y, z), ENVELOPE_FILLET)
        return self._combine(x, y, z, env)

    def _combine(self, x: Coord, y: Coord, z: Coord, env: Arr, plane: bool = False) -> Arr:
        """Lung distance from the mediastinal distance and the other boundaries.

        On a ``plane`` (scalar z), boundaries that cannot be within a few mm are skipped: that
        only changes distances deep inside the lung, which are fully occupied either way.
        """
        d = np.maximum(self.cavity.sdf(x, y, z) + PLEURA, PLEURA - env)
        if not plane or float(z) > min(self.apices.right[2], self.apices.left[2]) - (
            self.apices.depth + 5.0
        ):
            d = np.maximum(d, self.apices.sdf(x, y, z))
        if not plane or float(z) < self.dome.top + 8.0:
            d = np.maximum(d, -self.dome.sdf(x, y, z))
        return np.asarray(d)

    def extent(self) -> tuple[float, float]:
        """Lowest and highest z any lung tissue can reach."""
        top = max(self.apices.right[2], self.apices.left[2])
        bottom = min(self.dome.right[2], self.dome.left[2]) - self.dome.depth
        return bottom - 2.0, top + 2.0

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint parenchyma (denser towards the back) and record lung occupancy."""
        bottom, top = self.extent()
        win = canvas.shape_window(self.cavity, z)
        if win is None or not bottom <= z <= top:
            return
        env = np.full(canvas.hu.shape, FAR, dtype=np.float32)
        for shape in self.envelope:
            sub = canvas.shape_window(shape, z)
            if sub is not None:
                env[sub.index] = smin(env[sub.index], shape.sdf(sub.x, sub.y, z), ENVELOPE_FILLET)
        d = self._combine(win.x, win.y, z, env[win.index], plane=True)
        alpha = occupancy(d, canvas.grid.spacing)
        canvas.lung[win.index] = alpha
        _, cy, _, b = (float(v) for v in self.cavity.section(z))
        depth = np.clip((win.y - cy) / b, 0.0, 1.0)
        value = self.hu + self.dependent_hu * depth**2 + planes.texture(win, 6.0, 16.0)
        canvas.blend(win, alpha, value)
        canvas.mark(win, alpha, NONE)
        if self.atelectasis is not None:
            section = (self.midline(z), cy, b)
            self.atelectasis.paint(canvas, win, -d, alpha, z, section, planes)


@dataclass(frozen=True)
class Mediastinum:
    """Organs between the lungs, painted after them; ``envelope`` bounds the lungs."""

    parts: tuple[Part, ...]
    envelope: tuple[Shape, ...]
    hilum: dict[str, tuple[float, float, float]]
    """Roots of the lung trees: ``{"artery R", "artery L", "vein R", "vein L", ...}``."""

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint every part in order."""
        for part in self.parts:
            part.paint(canvas, z, planes)


def _path(p: Patient, rows: Sequence[tuple[float, float, float]], radii: Sequence[float]) -> Shape:
    """A tube through frame-scaled points ``(x, y, f)``."""
    pts = [p.at(*row) for row in rows]
    return Union(tuple(chain(pts, [r * p.frame for r in radii])))


def _heart(p: Patient, dome: Dome, enh: Enhancement) -> tuple[Shape, list[Part]]:
    """Pericardial fat, myocardium and (with contrast) chambers, resting on the diaphragm."""
    rng = rng_for(p.seed, "heart")
    turn, tilt = np.radians(rng.normal(0.0, 8.0)), rng.normal(0.0, 0.06)
    c, s = np.cos(turn), np.sin(turn)
    u = np.array([0.62 * c + 0.52 * s, 0.62 * s - 0.52 * c, -0.58 + tilt])
    u /= np.linalg.norm(u)
    v = np.cross(u, [0.0, 0.0, 1.0])
    v /= np.linalg.norm(v)
    w = np.cross(u, v)
    rot = tuple((float(u[i]), float(v[i]), float(w[i])) for i in range(3))
    size = p.heart_scale * p.frame
    above = Offset(Complement(dome), -1.0)
    shift = (float(rng.normal(0.0, 5.0)), float(rng.normal(0.0, 3.0)))

    def ellipsoid(x: float, y: float, f: float, axes: tuple[float, float, float]) -> Shape:
        at = p.at(x + shift[0], y + shift[1], f)
        return Intersect(
            Ellipsoid(at, (axes[0] * size, axes[1] * size, axes[2] * size), rot), above
        )

    sac = ellipsoid(22.0, -33.0, 0.75, (64.0, 50.0, 44.0))
    epicardial = float(rng.uniform(3.0, 6.0)) + 4.0 * max(p.scale - 0.9, 0.0)
    parts = [
        Part("pericardial fat", sac, -95.0, fine=8.0),
        Part("myocardium", Offset(sac, -epicardial), enh.myocardium, fine=5.0),
        Part("left atrium", ellipsoid(4.0, 4.0, 0.62, (30.0, 18.0, 20.0)), enh.systemic),
    ]
    if p.contrast:
        parts += [
            Part("left ventricle", ellipsoid(38.0, -30.0, 0.8, (32.0, 22.0, 20.0)), enh.systemic),
            Part(
                "right ventricle", ellipsoid(-2.0, -48.0, 0.78, (30.0, 13.0, 20.0)), enh.pulmonary
            ),
            Part("right atrium", ellipsoid(-34.0, -16.0, 0.74, (22.0, 20.0, 26.0)), enh.venous),
        ]
    return sac, parts


def _vessels(p: Patient, enh: Enhancement) -> list[Part]:
    """Great vessels, with arch branches, pulmonary arteries and veins, cavae and azygos."""
    age = 0.88 + 0.004 * (p.age - 30)
    aorta = _path(
        p,
        [(-3, -22, 0.63), (-9, -32, 0.47), (-5, -28, 0.34), (5, -17, 0.285), (18, 2, 0.29),
         (25, 20, 0.34), (27, 24, 0.5), (24, 26, 0.8), (14, 22, 1.1), (6, 18, 1.5), (4, 16, 2.2)],
        [r * age for r in (15.5, 16, 15, 14, 13, 12.5, 12, 12, 11.5, 11, 10.5)],
    )  # fmt: skip
    art, vein, pa = enh.systemic, enh.venous, enh.pulmonary
    return [
        Part("aorta", aorta, art, fine=3.0),
        Part("pulmonary trunk", _path(p, [(16, -42, 0.6), (13, -26, 0.47), (8, -14, 0.42)],
                                      [14, 14, 13]), pa),
        Part("right pulmonary artery", _path(p, [(8, -14, 0.42), (-14, -10, 0.44), (-38, -2, 0.48)],
                                             [11, 10.5, 9.5]), pa),
        Part("left pulmonary artery", _path(p, [(8, -14, 0.42), (28, -8, 0.405), (42, 6, 0.45)],
                                            [10.5, 10, 9]), pa),
        Part("superior vena cava", _path(p, [(-32, -26, -0.45), (-30, -24, 0.2), (-27, -20, 0.54)],
                                         [10, 10, 11]), vein),
        Part("brachiocephalic vein", _path(p, [(55, -40, 0.0), (10, -38, 0.12), (-28, -26, 0.22)],
                                           [6.5, 6.5, 7.5]), vein),
        Part("brachiocephalic artery", _path(p, [(-2, -22, 0.29), (-12, -18, 0.05),
                                                 (-20, -12, -0.45)], [6.5, 6, 5.5]), art),
        Part("left carotid artery", _path(p, [(7, -14, 0.285), (10, -12, 0.0), (12, -6, -0.45)],
                                          [4.5, 4.2, 4.0]), art),
        Part("left subclavian artery", _path(p, [(15, -4, 0.29), (26, 2, 0.05), (40, 2, -0.2),
                                                 (70, -5, -0.45)], [5.5, 5.5, 5, 5]), art),
        Part("azygos vein", _path(p, [(6, 30, 1.0), (4, 28, 0.5), (-6, 22, 0.37),
                                      (-26, -18, 0.34)], [4.5, 4.5, 5, 5.5]), vein),
        Part("inferior vena cava", _path(p, [(-22, -5, 0.82), (-24, 8, 1.1), (-22, 14, 1.5),
                                             (-18, 14, 2.2)], [12, 12, 11.5, 11]), vein),
        *(Part("pulmonary vein", _path(p, [(4, yl, fl), end], [7.5, 7.0]), art)
          for yl, fl, end in ((2, 0.62, (-38, -6, 0.56)), (6, 0.66, (-38, 10, 0.64)),
                              (2, 0.62, (38, -4, 0.54)), (6, 0.66, (36, 14, 0.62)))),
    ]  # fmt: skip


def _airways(p: Patient) -> tuple[Shape, list[Part]]:
    """Trachea and main bronchi: soft-tissue wall around air."""
    r = (10.0 if p.sex == "M" else 8.5) * (0.9 + 0.003 * (p.age - 30))
    trachea = [(-1, -6, -0.45), (-1, -3, 0.1), (0, 5, 0.36)]
    right = [(0, 5, 0.36), (-18, 10, 0.42), (-36, 14, 0.47)]
    left = [(0, 5, 0.36), (20, 10, 0.42), (40, 16, 0.5)]
    tubes = [(trachea, [r, r, r * 0.95]), (right, [7.5, 7, 6]), (left, [6.5, 6, 5.5])]
    outer = Union(tuple(_path(p, pts, rs) for pts, rs in tubes), k=3.0)
    lumen = Union(tuple(_path(p, pts, [x - 1.8 for x in rs]) for pts, rs in tubes), k=3.0)
    return outer, [Part("airway wall", outer, 30.0), Part("airway lumen", lumen, -995.0)]


def _nodes(p: Patient) -> list[Part]:
    """A few normal mediastinal and hilar lymph nodes (soft-tissue ovals in the fat)."""
    rng = rng_for(p.seed, "lymph nodes")
    spots = [(0, 12, 0.45), (-14, -8, 0.28), (14, -8, 0.34), (-40, 8, 0.52), (40, 12, 0.5),
             (0, -40, 0.3), (10, 26, 0.7)]  # fmt: skip
    out = []
    for x, y, f in spots:
        if rng.random() < 0.55:
            r = float(rng.uniform(2.5, 5.5))
            shape = Ellipsoid(p.at(x, y, f), (r * 1.2, r, r * 1.4))
            out.append(Part("lymph node", shape, 38.0, fine=5.0))
    return out


def build_mediastinum(
    p: Patient,
    cav: Loft,
    spine: Shape,
    dome: Dome,
    enh: Enhancement,
    extra: Sequence[Part] = (),
) -> Mediastinum:
    """Mediastinal organs of ``p`` and the outline the lungs must keep clear of.

    Parameters
    ----------
    p : Patient
        The synthetic patient.
    cav : Loft
        Thoracic cavity.
    spine : Shape
        Outline of the vertebral column.
    dome : Dome
        Diaphragm, which the heart rests on.
    enh : Enhancement
        Blood and heart attenuation.
    extra : sequence of Part
        More vessels for the envelope, painted after the others (a vein full of contrast).

    Returns
    -------
    Mediastinum
        Parts in painting order, the envelope and the hilar tree roots.
    """
    sac, heart = _heart(p, dome, enh)
    airway, air_parts = _airways(p)
    esophagus = _path(p, [(3, 14, -0.45), (5, 14, 0.3), (6, 16, 0.6), (10, 14, 0.95),
                          (30, 0, 1.12), (48, -10, 1.2)], [7.5, 7.5, 7.5, 8, 8, 9])  # fmt: skip
    vessels = [*_vessels(p, enh), *extra]
    nodes = _nodes(p)
    parts = [*heart, *vessels, Part("esophagus", esophagus, 38.0, fine=5.0), *air_parts, *nodes]
    envelope = (
        band_of(p, cav), sac, airway, esophagus, spine,
        *(v.shape for v in vessels), *(n.shape for n in nodes),
    )  # fmt: skip
    hilum = {
        "artery R": p.at(-38, -2, 0.48), "artery L": p.at(42, 6, 0.45),
        "vein R": p.at(-38, 4, 0.6), "vein L": p.at(37, 6, 0.58),
        "bronchus R": p.at(-36, 14, 0.47), "bronchus L": p.at(40, 16, 0.5),
    }  # fmt: skip
    return Mediastinum(tuple(parts), envelope, hilum)


def band_of(p: Patient, cav: Loft) -> Loft:
    """Thin midline septum from sternum to spine: keeps the lungs apart everywhere."""
    rows = []
    for f, dx, half in ((-0.45, 0.0, 12.0), (0.3, 0.0, 6.0), (0.6, 4.0, 2.5), (2.1, 6.0, 1.5)):
        z = p.z(f)
        cx, cy, _, b = (float(v) for v in cav.section(z))
        rows.append((z, cx + dx * p.frame, cy, half * p.frame, b))
    return loft(rows, capped=False)


def build_lungs(
    p: Patient, cav: Loft, med: Mediastinum, dome: Dome, atelectasis: Atelectasis | None = None
) -> Lungs:
    """Both lungs of ``p``, bounded by the cavity, mediastinum, apices and diaphragm."""
    band = band_of(p, cav)
    a0, b0 = p.cavity
    apices = Apices(
        right=p.at(-0.3 * a0 / p.frame, 0.3 * b0 / p.frame, 0.0),
        left=p.at(0.3 * a0 / p.frame, 0.3 * b0 / p.frame, 0.02),
        depth=60.0 * p.frame,
        width=42.0 * p.frame,
        midline=p.centre[0],
    )
    return Lungs(cav, med.envelope, dome, apices, band, p.lung_hu, p.dependent_hu, atelectasis)
