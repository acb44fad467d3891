"""Body wall: takes a patient, gives skin, fat, muscles, breasts, the cavity outline and table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from imaging_ai_devkit.phantom.canvas import Canvas, Painter, Part, Planes
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import (
    FAR,
    Arr,
    Bounds,
    Coord,
    Ellipsoid,
    Loft,
    ellipse_sdf,
    loft,
    occupancy,
    smax,
)
from imaging_ai_devkit.phantom.structures import CHEST_WALL, MEDIASTINUM

# Key frames in lung lengths below the apex; the cavity narrows to the apex (multipliers of the
# widest cavity) and its narrow top sits further back, as the first ribs slope down forwards.
F_KEYS = (-0.45, -0.15, 0.0, 0.12, 0.3, 0.55, 0.85, 1.05, 1.3, 1.6, 2.1)
CAVITY_A = (0.30, 0.33, 0.45, 0.68, 0.86, 0.97, 1.0, 1.0, 0.98, 0.95, 0.92)
CAVITY_B = (0.42, 0.48, 0.58, 0.76, 0.90, 0.98, 1.0, 1.0, 1.0, 0.98, 0.96)
CAVITY_DY = (20.0, 20.0, 16.0, 9.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
# Shoulder girdle and its muscles widen the body above the mid chest (lateral, in cavity widths).
SHOULDER = (0.62, 0.62, 0.52, 0.32, 0.14, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0)
PECTORAL = (1.0, 1.6, 1.8, 1.8, 1.6, 1.2, 0.7, 0.5, 0.4, 0.4, 0.4)
BELLY = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.7, 1.0, 1.0)
NECK_F = 0.02
"""Above this depth the cavity holds neck tissue, below it mediastinal fat."""
SKIN_MM = 2.0
RIB_DEPTH = 8.0
"""Ribs plus intercostal muscle between the cavity and the chest-wall muscles, mm."""


def spine_y(p: Patient) -> float:
    """Patient y of the vertebral-body centres (they sit in the back of the cavity)."""
    return p.centre[1] + 0.42 * p.cavity[1]


@dataclass(frozen=True)
class Breasts:
    """Supine breasts as a smooth bulge of the body outline on either side of the sternum.

    ``height`` mm at the top of the bulge, centred at ``z`` with a Gaussian profile of ``spread``
    mm along z; around the body the bulge covers the angles of :data:`BREAST_ANGLE`.
    """

    height: float
    z: float
    spread: float

    def bulge(self, phi: Arr, z: Coord) -> Arr:
        """Outward displacement of the skin, mm."""
        centre, half = BREAST_ANGLE
        along = np.exp(-(((np.asarray(z) - self.z) / self.spread) ** 2))
        return np.asarray(self.height * along * _bump(phi, centre, half))


BREAST_ANGLE = (2.68, 0.34)
"""Angle (rad from the back midline) and half-width of the breasts around the body."""


@dataclass(frozen=True)
class Torso:
    """Body outline: an ellipse flattened where the back lies on the table, plus breasts."""

    outer: Loft
    back: float
    breasts: Breasts | None = None
    bounds: Bounds = field(init=False)

    def __post_init__(self) -> None:
        b = self.outer.bounds
        grow = self.breasts.height if self.breasts else 0.0
        box = (b[0] - grow, b[1] + grow, b[2] - grow, min(b[3], self.back), -FAR, FAR)
        object.__setattr__(self, "bounds", box)

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm."""
        d = smax(self.outer.sdf(x, y, z), np.asarray(y - self.back), 15.0)
        if self.breasts is None:
            return d
        cx, cy, a, b = self.outer.section(z)
        phi = np.arctan2(np.abs(x - cx) / a, (y - cy) / b)
        return np.asarray(d - self.breasts.bulge(phi, z))


@dataclass(frozen=True)
class TableBand:
    """A layer of the patient table: curved up at the sides, ``offset`` mm below its top."""

    top: float
    offset: float
    thickness: float
    half_width: float = 215.0
    radius: float = 1400.0

    @property
    def bounds(self) -> Bounds:
        """Bounds of the layer."""
        rise = self.half_width**2 / (2 * self.radius)
        y0 = self.top + self.offset - rise
        return (-self.half_width, self.half_width, y0, y0 + rise + self.thickness, -FAR, FAR)

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm (vertical distance; the curve is gentle)."""
        mid = self.top + self.offset + self.thickness / 2 - np.asarray(x) ** 2 / (2 * self.radius)
        return np.maximum(np.abs(y - mid) - self.thickness / 2, np.abs(x) - self.half_width)


@dataclass(frozen=True)
class Wall:
    """The body wall of one patient and the outlines other parts build on."""

    cavity: Loft
    body: Torso
    body_ellipse: Loft
    parts: tuple[Painter, ...]
    table: tuple[Part, ...]

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint skin, fat, muscle and the table; record the normalised body radius."""
        cx, cy, a, b = self.body_ellipse.section(z)
        win = canvas.window(self.body.bounds, margin=30.0)
        if win is not None:
            q = np.sqrt(((win.x - cx) / a) ** 2 + ((win.y - cy) / b) ** 2)
            canvas.body_q[win.index] = q
        self._paint_skin(canvas, z, planes)
        for part in (*self.parts, *self.table):
            part.paint(canvas, z, planes)

    def _paint_skin(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Skin and the fat under it, from one evaluation of the body outline."""
        win = canvas.shape_window(self.body, z)
        if win is None:
            return
        d = self.body.sdf(win.x, win.y, z)
        alpha = occupancy(d, canvas.grid.spacing)
        canvas.blend(win, alpha, 25.0 + planes.texture(win, 6.0, 0.0))
        fat = occupancy(d + SKIN_MM, canvas.grid.spacing)
        canvas.blend(win, fat, -102.0 + planes.texture(win, 10.0, 6.0))
        canvas.mark(win, alpha, CHEST_WALL)


@dataclass(frozen=True)
class CavityFat:
    """Fat filling the cavity before the lungs and organs go in.

    What the lungs leave of it is the extrapleural layer along the chest wall and the fat
    between the mediastinal organs: it is labelled mediastinum more than ``wall_mm`` inside the
    cavity's outline and within ``central`` of its half-width from its centre, chest wall
    elsewhere.
    """

    cavity: Loft
    wall_mm: float = 8.0
    central: float = 0.4

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint the fat and label it by where it lies in the cavity."""
        win = canvas.shape_window(self.cavity, z)
        if win is None:
            return
        d = self.cavity.sdf(win.x, win.y, z)
        alpha = occupancy(d, canvas.grid.spacing)
        canvas.blend(win, alpha, -92.0 + planes.texture(win, 10.0, 8.0))
        cx, _, a, _ = (float(v) for v in self.cavity.section(z))
        deep = d < -self.wall_mm
        middle = np.abs(win.x - cx) < self.central * a
        canvas.mark(win, alpha, CHEST_WALL)
        canvas.mark(win, alpha * (deep & middle), MEDIASTINUM)


def _cavity(p: Patient, f_range: tuple[float, float] | None = None) -> Loft:
    """Thoracic and upper abdominal cavity inside the ribs (capped to ``f_range`` if given)."""
    a0, b0 = p.cavity
    # Every patient's rib cage differs a little level by level.
    jitter = 1.0 + 0.03 * rng_for(p.seed, "cavity").standard_normal((2, len(F_KEYS)))
    rows = [
        (p.z(f), p.centre[0], p.centre[1] + dy * p.frame, a0 * ma * ja, b0 * mb * jb)
        for f, ma, mb, dy, ja, jb in zip(
            F_KEYS, CAVITY_A, CAVITY_B, CAVITY_DY, *jitter, strict=True
        )
    ]
    full = loft(rows, capped=False)
    if f_range is None:
        return full
    fs = sorted({*f_range, *(f for f in F_KEYS if f_range[0] < f < f_range[1])})
    rows = []
    for f in fs:
        cx, cy, a, b = (float(v) for v in full.section(p.z(f)))
        rows.append((p.z(f), cx, cy, a, b))
    return loft(rows)


def _outlines(p: Patient, cav: Loft) -> tuple[Loft, float]:
    """Body ellipse and the y of the flat back."""
    back = spine_y(p) + 80.0 * p.frame + 0.7 * p.fat
    rng = rng_for(p.seed, "outline")
    flat, side_fat, front_fat = rng.uniform(0.52, 0.6), rng.uniform(0.8, 1.3), rng.uniform(0.6, 1.1)
    body = []
    for f, shoulder, pectoral, belly in zip(F_KEYS, SHOULDER, PECTORAL, BELLY, strict=True):
        z = p.z(f)
        cx, cy, a, b = (float(v) for v in cav.section(z))
        lateral = a + RIB_DEPTH * p.frame + p.muscle + shoulder * p.cavity[0]
        front_muscle = cy - b - 10.0 * p.frame - pectoral * p.muscle
        belly_fat = p.fat * (front_fat + belly * (0.4 + 2.0 * max(p.scale - 0.95, 0.0)))
        front = front_muscle - belly_fat
        half = flat * (back - front)
        body.append((z, cx, front + half, lateral + p.fat * (side_fat + 0.3 * belly), half))
    return loft(body, capped=False), back


def _breasts(p: Patient) -> Breasts | None:
    """Breasts of a woman, sized by habitus, over the 4th to 6th ribs."""
    if not p.breasts:
        return None
    rng = rng_for(p.seed, "breasts")
    size = float(rng.uniform(0.7, 1.3)) * (0.7 + 0.5 * p.scale)
    z = p.z(float(rng.uniform(0.5, 0.62)))
    return Breasts(height=(18.0 + 0.6 * p.fat) * size, z=z, spread=45.0 * size)


def _glands(p: Patient, body: Loft, breasts: Breasts | None) -> tuple[Part, ...]:
    """Fibroglandular tissue under each nipple: mottled, between fat and water."""
    if breasts is None:
        return ()
    cx, cy, a, b = (float(v) for v in body.section(breasts.z))
    phi = BREAST_ANGLE[0]
    depth = 0.45 * breasts.height
    axes = (0.3 * a, 0.35 * breasts.height + 2.0, 0.6 * breasts.spread)
    return tuple(
        Part(
            "glandular",
            Ellipsoid(
                (cx + side * (a - depth) * np.sin(phi), cy + (b - depth) * np.cos(phi), breasts.z),
                axes,
            ),
            -55.0,
            fine=30.0,
            coarse=35.0,
        )
        for side in (-1.0, 1.0)
    )


def _table(back: float) -> tuple[Part, ...]:
    """Carbon-fibre shells around a foam core, just behind the patient's back."""
    top = back + 3.0
    return (
        Part("table core", TableBand(top, 0.0, 36.0), -880.0),
        Part("table top shell", TableBand(top, 0.0, 2.0), 180.0),
        Part("table bottom shell", TableBand(top, 34.0, 2.0), 180.0),
    )


# Chest-wall muscles as bulges of the layer around the ribs: (angle from the back midline and
# half-width in rad, thickness at the F_KEYS levels in units of the patient's muscle size).
MUSCLES = {
    "trapezius": (0.55, 0.45, (2.2, 2.2, 2.0, 1.6, 1.0, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0)),
    "latissimus": (1.05, 0.4, (0.3, 0.4, 0.5, 0.7, 1.0, 1.2, 1.2, 1.0, 0.8, 0.6, 0.5)),
    "serratus": (1.6, 0.45, (0.0, 0.0, 0.2, 0.5, 0.6, 0.6, 0.5, 0.4, 0.3, 0.3, 0.3)),
    "pectoralis": (2.45, 0.55, PECTORAL),
}


@dataclass(frozen=True)
class MuscleLayer:
    """Muscle over the ribs: thin between the named muscles, thick where they lie.

    Thickness varies with the angle round the cavity and with depth; the shoulder girdle adds
    bulk at the sides of the upper chest.
    """

    cavity: Loft
    p: Patient

    @property
    def bounds(self) -> Bounds:
        """The cavity's bounds grown by the thickest muscle and the shoulders."""
        b = self.cavity.bounds
        grow = RIB_DEPTH * self.p.frame + 3.0 + 2.5 * self.p.muscle + max(SHOULDER) * b[1]
        return (b[0] - grow, b[1] + grow, b[2] - grow, b[3] + grow, -FAR, FAR)

    def sdf(self, x: Coord, y: Coord, z: Coord) -> Arr:
        """Signed distance in mm (outward from the cavity wall, minus the local thickness)."""
        cx, cy, a, b = self.cavity.section(z)
        d = ellipse_sdf(x, y, cx, cy, a, b)
        phi = np.arctan2(np.abs(x - cx) / a, (y - cy) / b)
        f = (self.p.z_apex - np.asarray(z)) / self.p.lung_length
        thick: Arr | float = RIB_DEPTH * self.p.frame + 3.0
        for centre, half, amps in MUSCLES.values():
            amp = np.interp(f, F_KEYS, amps) * self.p.muscle
            thick = thick + amp * _bump(phi, centre, half)
        shoulder = np.interp(f, F_KEYS, SHOULDER) * self.p.cavity[0]
        return np.asarray(d - (thick + shoulder * _bump(phi, 1.7, 0.7)), dtype=float)


def _bump(phi: Arr, centre: float, half: float) -> Arr:
    """Smooth window: 1 at ``centre``, falling to 0 at ``half`` rad either side."""
    t = np.minimum(((phi - centre) / half) ** 2, 1.0)
    return np.asarray((1.0 - t) ** 2)


def _muscles(p: Patient, cav: Loft) -> list[Part]:
    """Chest-wall muscle layer and the erector spinae beside the spine."""
    y = spine_y(p) + 46.0 * p.frame
    para = [
        loft([(p.z(f), p.centre[0] + side * 30.0 * p.frame, y, 27.0 * p.frame,
               21.0 * p.frame) for f in (F_KEYS[0], F_KEYS[-1])], capped=False)
        for side in (-1.0, 1.0)
    ]  # fmt: skip
    parts = [Part("chest wall muscle", MuscleLayer(cav, p), 48.0, fine=7.0, coarse=4.0)]
    return parts + [Part("erector spinae", s, 50.0, fine=7.0, coarse=4.0) for s in para]


def build_wall(p: Patient) -> Wall:
    """Body wall of ``p``: the cavity, the outline and tissue layers in painting order.

    Parameters
    ----------
    p : Patient
        The synthetic patient.

    Returns
    -------
    Wall
        Parts are painted in order, later ones over earlier ones.
    """
    cav = _cavity(p)
    body_ellipse, back = _outlines(p, cav)
    breasts = _breasts(p)
    body = Torso(body_ellipse, back, breasts)
    parts: tuple[Painter, ...] = (
        *_glands(p, body_ellipse, breasts),
        *_muscles(p, cav),
        Part("neck", _cavity(p, (F_KEYS[0], NECK_F)), 15.0, fine=12.0, coarse=45.0),
        CavityFat(_cavity(p, (NECK_F, F_KEYS[-1]))),
    )
    return Wall(cav, body, body_ellipse, parts, _table(back))


def body_extent(wall: Wall, z_lo: float, z_hi: float) -> tuple[float, float, float, float]:
    """x and y extents of the body (with table top) over ``[z_lo, z_hi]``."""
    zs = np.linspace(z_lo, z_hi, 9)
    cx, _cy, a, _b = (np.asarray(v) for v in wall.body_ellipse.section(zs))
    width = max(float(np.max(np.abs(cx - a))), float(np.max(np.abs(cx + a))))
    front = wall.body.bounds[2]
    return -width, width, front, wall.body.back + 3.0
