"""Bones: takes a patient and its cavity, gives spine, ribs, sternum, clavicles and scapulae."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from imaging_ai_devkit.phantom.canvas import Canvas, Painter, Planes, Window
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import (
    FAR,
    Arr,
    Capsule,
    Index,
    Loft,
    Mask,
    Shape,
    Union,
    chain,
    ellipse_sdf,
    loft,
    occupancy,
)
from imaging_ai_devkit.phantom.structures import BONE
from imaging_ai_devkit.phantom.wall import F_KEYS, spine_y

RIB_COUNT = 12
RIB_START = 0.34
"""Angle (rad from the back midline) where a rib leaves its neck and follows the cavity."""
RIB_ANGLE = 1.1
"""Angle of the posterior rib angle, where ribs turn from running level to falling forwards."""
RIB_END = (2.62, 2.78, 2.8, 2.8, 2.8, 2.78, 2.75, 2.55, 2.4, 2.2, 1.75, 1.25)
CARTILAGE = (2.2, 2.3, 2.3, 2.25, 2.2, 2.1, 2.0, 1.95, 1.95, 1.95, 9.0, 9.0)
"""Angle where each rib turns to costal cartilage (floating ribs have none)."""


@dataclass(frozen=True)
class Bone:
    """A bone painted as a cortical shell around cancellous marrow."""

    shape: Shape
    cortex_hu: float
    marrow_hu: float
    cortex_mm: float = 1.5

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Cortex first, then the marrow inside it, with trabecular texture."""
        got = canvas.occupancy(self.shape, z)
        if got is None:
            return
        win, alpha = got
        canvas.blend(win, alpha, self.cortex_hu)
        inner = occupancy(self.shape.sdf(win.x, win.y, z) + self.cortex_mm, canvas.grid.spacing)
        canvas.blend(win, inner, self.marrow_hu + planes.texture(win, 35.0, 15.0))
        canvas.mark(win, alpha, BONE)


@dataclass(frozen=True)
class Spine:
    """Vertebral bodies with discs and end plates, the posterior arch and the spinal canal."""

    body: Loft
    canal: Loft
    arch: Loft
    z_top: float
    pitch: float
    cancellous_hu: float
    cortex_hu: float = 620.0
    disc_mm: float = 6.0

    @property
    def envelope(self) -> Shape:
        """What the lungs must stay clear of."""
        return Union((self.body, self.arch), k=6.0)

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint the level of the column that ``z`` cuts."""
        from_disc = abs(((self.z_top - z) / self.pitch) % 1.0 - 0.5) * self.pitch
        arch_phase = ((self.z_top - z) / self.pitch + 0.3) % 1.0
        arch = 0.85 * self.cortex_hu
        Bone(self.arch, arch, 260.0).paint(canvas, z, planes)
        for process in self._processes(z, arch_phase):
            Bone(process, arch, 240.0, 1.2).paint(canvas, z, planes)
        got = canvas.occupancy(self.canal, z)
        if got is not None:
            canvas.blend(got[0], got[1], 22.0 + planes.texture(got[0], 5.0, 0.0))
            canvas.mark(got[0], got[1], BONE)
        if from_disc < self.disc_mm / 2:
            got = canvas.occupancy(self.body, z)
            if got is not None:
                canvas.blend(got[0], got[1], 85.0 + planes.texture(got[0], 8.0, 0.0))
                canvas.mark(got[0], got[1], BONE)
            return
        end_plate = from_disc < self.disc_mm / 2 + 1.0
        marrow = 480.0 if end_plate else self.cancellous_hu
        Bone(self.body, self.cortex_hu, marrow, 1.4).paint(canvas, z, planes)

    def _processes(self, z: float, phase: float) -> list[Shape]:
        """Spinous and transverse processes, which show on part of each level."""
        cx, cy, _, b = (float(v) for v in self.canal.section(z))
        out: list[Shape] = []
        if 0.1 < phase < 0.85:
            out.append(Capsule((cx, cy + b + 4, z - 3), (cx, cy + b + 30, z + 3), 4.5, 3.5))
        if 0.3 < phase < 0.7:
            out += [
                Capsule((cx + s * 10, cy - 2, z), (cx + s * 36, cy + 8, z), 5.5, 4.5)
                for s in (-1.0, 1.0)
            ]
        return out


@dataclass(frozen=True)
class Ribs:
    """Twelve pairs of ribs following the cavity wall and sloping down towards the front."""

    cavity: Loft
    offset: float
    thickness: float
    height: float
    z_first: float
    pitch: float
    slope: tuple[float, float]
    """Drop of the rib per mm along it, behind and at the side."""
    cortex_hu: float = 650.0

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint every rib section the plane at ``z`` cuts."""
        cx, cy, a, b = (float(v) for v in self.cavity.section(z))
        ar, br = a + self.offset, b + self.offset
        reach = self.thickness
        win = canvas.window((cx - ar - reach, cx + ar + reach, cy - br - reach, cy + br + reach))
        if win is None:
            return
        d_ring = ellipse_sdf(win.x, win.y, cx, cy, ar, br)
        rows, cols = np.nonzero(np.abs(d_ring) < self.thickness / 2 + canvas.grid.spacing)
        if rows.size == 0:
            return
        x = win.x[0, cols] - cx
        y = win.y[rows, 0] - cy
        phi = np.arctan2(np.abs(x) / ar, y / br)
        d, cartilage = self._distance(d_ring[rows, cols], phi, z, 0.5 * (ar + br))
        self._blend(canvas, win, (rows, cols), d, cartilage, planes)

    def _distance(self, radial: Arr, phi: Arr, z: float, radius: float) -> tuple[Arr, Mask]:
        """Signed distance to the nearest rib, and whether that point is cartilage.

        Ribs run almost level behind and fall steeply at the side: the slope ramps from
        ``slope[0]`` to ``slope[1]`` around the posterior angle, and the drop is its integral.
        """
        s0, s1 = self.slope
        w = 0.2

        def softplus(v: Arr) -> Arr:
            return np.logaddexp(0.0, v)

        ramp = (phi - RIB_ANGLE) / w
        drop = radius * (
            s0 * (phi - RIB_START)
            + (s1 - s0) * w * (softplus(ramp) - softplus(np.asarray((RIB_START - RIB_ANGLE) / w)))
        )
        local = s0 + (s1 - s0) / (1.0 + np.exp(-ramp))
        kf = (self.z_first - z - drop) / self.pitch + 1.0
        k = np.rint(kf).astype(int)
        valid = (k >= 1) & (k <= RIB_COUNT)
        kc = np.clip(k, 1, RIB_COUNT) - 1
        along = (kf - k) * self.pitch / local
        d = ellipse_sdf(radial, along, 0.0, 0.0, self.thickness / 2, self.height / (2 * local))
        end = np.asarray(RIB_END)[kc]
        d = np.maximum(d, np.maximum(RIB_START - phi, phi - end) * radius)
        return np.where(valid, d, FAR), phi > np.asarray(CARTILAGE)[kc]

    def _blend(
        self,
        canvas: Canvas,
        win: Window,
        idx: tuple[Index, Index],
        d: Arr,
        cartilage: Mask,
        planes: Planes,
    ) -> None:
        """Cortex and marrow for bone, plain cartilage towards the sternum."""
        plane = canvas.hu[win.index]
        tex = planes.fine[win.index][idx]
        hu = plane[idx]
        alpha = occupancy(d, canvas.grid.spacing)
        hu += alpha * (np.where(cartilage, 115.0 + 10.0 * tex, self.cortex_hu) - hu)
        inner = occupancy(d + 1.2, canvas.grid.spacing) * ~cartilage
        hu += inner * (210.0 + 35.0 * tex - hu)
        plane[idx] = hu
        labels = canvas.label[win.index]
        labels[idx[0][alpha >= 0.5], idx[1][alpha >= 0.5]] = BONE


@dataclass(frozen=True)
class Scapulae:
    """Shoulder blades: thin plates behind the ribs, from above the apex to mid chest."""

    cavity: Loft
    offset: float
    z_top: float
    z_bottom: float

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint both blades where ``z`` cuts them."""
        if not self.z_bottom <= z <= self.z_top:
            return
        s = (self.z_top - z) / (self.z_top - self.z_bottom)
        cx, cy, a, b = (float(v) for v in self.cavity.section(z))
        ar, br = a + self.offset, b + self.offset
        win = canvas.window((cx - ar - 10, cx + ar + 10, cy, cy + br + 10))
        if win is None:
            return
        x, y = win.x - cx, win.y - cy
        phi = np.arctan2(np.abs(x) / ar, y / br)
        lo, hi = 0.5 + 0.3 * s, 1.3 - 0.45 * s
        width = 3.0 + 6.0 * np.clip((phi - hi + 0.12) / 0.12, 0.0, 1.0)
        radial = np.abs(ellipse_sdf(x, y, 0.0, 0.0, ar, br)) - width / 2
        d = np.maximum(radial, np.maximum(lo - phi, phi - hi) * 0.5 * (ar + br))
        alpha = occupancy(d, canvas.grid.spacing)
        canvas.blend(win, alpha, 420.0)
        canvas.mark(win, alpha, BONE)


def _spine(p: Patient, cortex_hu: float) -> Spine:
    """Vertebral column in the back of the cavity, growing slightly downwards."""
    y0 = spine_y(p)
    body, canal, arch = [], [], []
    for f in (F_KEYS[0], 0.5, F_KEYS[-1]):
        grow = 1.0 + 0.18 * max(f, 0.0)
        a, b = 19.0 * p.frame * grow, 14.5 * p.frame * grow
        yc = y0 + b + 9.5 * p.frame
        body.append((p.z(f), p.centre[0], y0, a, b))
        canal.append((p.z(f), p.centre[0], yc, 9.0 * p.frame, 8.0 * p.frame))
        arch.append((p.z(f), p.centre[0], yc + 1.0, 15.5 * p.frame, 14.5 * p.frame))
    cancellous = float(np.clip(300.0 - 2.2 * (p.age - 30), 140.0, 300.0))
    return Spine(
        loft(body, capped=False),
        loft(canal, capped=False),
        loft(arch, capped=False),
        z_top=p.z(0.02) + 0.5 * rib_pitch(p),
        pitch=rib_pitch(p),
        cancellous_hu=cancellous,
        cortex_hu=cortex_hu,
    )


def rib_pitch(p: Patient) -> float:
    """Height of one thoracic level (vertebra plus disc), mm."""
    return (p.lung_length + 45.0 * p.frame) / 11.5


def _rib_necks(p: Patient, z_first: float, cortex_hu: float) -> list[Bone]:
    """Rib heads and necks, from the vertebral bodies out to where the ribs meet the cavity."""
    y0, out = spine_y(p), []
    for k in range(RIB_COUNT):
        z = z_first - k * rib_pitch(p)
        for side in (-1.0, 1.0):
            head = (p.centre[0] + side * 19.0 * p.frame, y0 + 6.0 * p.frame, z + 2.0)
            tubercle = (p.centre[0] + side * 40.0 * p.frame, y0 + 30.0 * p.frame, z - 1.0)
            out.append(Bone(Capsule(head, tubercle, 4.0, 4.5), cortex_hu, 220.0, 1.2))
    return out


def _clavicles(p: Patient, front: float, cortex_hu: float) -> list[Bone]:
    """Collar bones across the top of the chest, from the manubrium out to the shoulders."""
    out = []
    for side in (-1.0, 1.0):
        pts = [
            (p.centre[0] + side * 24.0, front + 6.0, p.z(0.14)),
            (p.centre[0] + side * 70.0, front + 2.0, p.z(0.06)),
            (p.centre[0] + side * 125.0 * p.frame, front + 38.0, p.z(-0.06)),
        ]
        out += [Bone(c, cortex_hu, 250.0) for c in chain(pts, (9.0, 7.0, 7.5))]
    return out


def _sternum(p: Patient, cav: Loft, cortex_hu: float) -> Bone:
    """Manubrium, body and xiphoid just in front of the cavity."""
    rows = []
    for f, half_width in ((0.15, 26.0), (0.3, 22.0), (0.36, 15.0), (0.8, 14.0), (0.9, 7.0)):
        z = p.z(f)
        cx, cy, _, b = (float(v) for v in cav.section(z))
        rows.append((z, cx, cy - b - 7.0 * p.frame, half_width * p.frame, 7.0 * p.frame))
    return Bone(loft(rows), cortex_hu, 200.0)


def build_skeleton(p: Patient, cav: Loft) -> tuple[Spine, list[Painter]]:
    """All bones of ``p`` around the cavity ``cav``.

    Parameters
    ----------
    p : Patient
        The synthetic patient.
    cav : Loft
        Thoracic cavity the ribs follow.

    Returns
    -------
    tuple
        The spine (its outline also bounds the lungs) and the other bone painters.
    """
    rng = rng_for(p.seed, "skeleton")
    z_first = p.z(0.02)
    thickness = float(rng.uniform(7.0, 9.0)) * p.frame
    ribs = Ribs(
        cav,
        offset=5.0 * p.frame,
        thickness=thickness,
        height=float(rng.uniform(8.0, 11.0)) * p.frame,
        z_first=z_first,
        pitch=rib_pitch(p),
        slope=(float(rng.uniform(0.18, 0.26)), float(rng.uniform(0.38, 0.48))),
    )
    # Cortical bone is 1000 to 1900 HU; the thin cortex of ribs and vertebrae images at about
    # 700 to 1200 HU on real chest CT. Its own stream keeps the other draws as they were.
    density = rng_for(p.seed, "bone density")
    cortex = float(density.uniform(800.0, 1250.0)) * (1.25 - p.age / 200)
    cortex = float(np.clip(cortex, 700.0, 1200.0))
    # The ribs' inner cortex lies 1 to 2.5 mm from the lung: pleura, fascia, intercostal muscle.
    gap = float(density.uniform(-0.5, 1.0)) * p.frame
    ribs = replace(ribs, offset=thickness / 2 + gap, cortex_hu=cortex)
    _, cy, _, b = (float(v) for v in cav.section(p.z(0.1)))
    scap = Scapulae(cav, offset=22.0 * p.frame, z_top=p.z(-0.3), z_bottom=p.z(0.5))
    others: list[Painter] = [
        ribs,
        *_rib_necks(p, z_first, cortex),
        _sternum(p, cav, cortex),
        *_clavicles(p, cy - b - 10.0 * p.frame, cortex),
        scap,
    ]
    return _spine(p, cortex), others
