"""Intravenous contrast: takes a patient, gives blood and organ HU of its phase, the injected vein
full of undiluted contrast, and the beam-hardening streaks that vein throws across the chest."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from imaging_ai_devkit.phantom.canvas import Canvas, Part, Planes
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import Shape, Union, chain
from imaging_ai_devkit.phantom.structures import NONE, STREAK

STREAK_LABEL_HU = 40.0
"""Lung pixels that streaks shift by at least this much are labelled as streak."""


@dataclass(frozen=True)
class Enhancement:
    """Blood and organ attenuation (HU) of one study.

    Attributes
    ----------
    systemic : float
        Aorta and its branches, left heart and pulmonary veins.
    pulmonary : float
        Right ventricle, pulmonary trunk and arteries.
    venous : float
        Cavae, brachiocephalic and azygos veins, right atrium.
    myocardium : float
    liver, spleen, kidney : float or None
        None leaves the organ at its unenhanced attenuation.
    """

    systemic: float
    pulmonary: float
    venous: float
    myocardium: float
    liver: float | None = None
    spleen: float | None = None
    kidney: float | None = None


UNENHANCED = Enhancement(42.0, 42.0, 42.0, 48.0)
"""Blood at its haematocrit, muscle of the heart: what a non-contrast study shows."""


def enhancement(p: Patient) -> Enhancement:
    """HU of the contrast phase drawn for ``p`` (a pulmonary-arterial, arterial or venous phase).

    Enhanced blood lies between 150 and 400 HU, as on real contrast chest CT (LIDC-IDRI-0001,
    a venous-to-arterial phase, shows aorta and heart at a median of 300 HU).
    """
    if not p.contrast:
        return UNENHANCED
    rng = rng_for(p.seed, "contrast phase")
    phase = rng.choice(["pulmonary", "arterial", "venous"], p=[0.25, 0.35, 0.4])
    u = rng.uniform
    if phase == "pulmonary":
        blood = (u(150, 250), u(300, 400), u(200, 400))
    elif phase == "arterial":
        blood = (u(250, 400), u(200, 320), u(150, 300))
    else:
        level = u(150, 200)
        blood = (level + u(0, 20), level + u(-10, 10), level + u(-10, 10))
    early = phase != "venous"
    return Enhancement(
        systemic=float(blood[0]),
        pulmonary=float(blood[1]),
        venous=float(blood[2]),
        myocardium=float(u(90, 130)),
        liver=float(u(65, 85) if early else u(100, 130)),
        spleen=float(u(110, 150) if early else u(105, 125)),
        kidney=float(u(150, 230)),
    )


@dataclass(frozen=True)
class Streaks:
    """Beam-hardening and photon-starvation streaks radiating from dense contrast in a vein.

    Each ray leaves the dense vessel's section on a plane at a fixed angle with a signed
    amplitude (dark streaks outnumber bright ones) and fades with distance; a dark halo
    surrounds the source. Their strength follows how much dense contrast the plane cuts.

    Attributes
    ----------
    vein : Shape
        The vessel holding dense contrast.
    angles, amplitudes : tuple of float
        Ray directions (rad, in the axial plane) and HU at the source at full strength.
    width : float
        Half-width (mm) of a ray near its source.
    reach : float
        Distance (mm) over which a ray falls to half its amplitude.
    halo : float
        Darkening (HU) around the source at full strength.
    full_area : float
        Dense section (mm²) that gives full strength.
    """

    vein: Shape
    angles: tuple[float, ...]
    amplitudes: tuple[float, ...]
    width: float
    reach: float
    halo: float
    full_area: float

    def source(self, canvas: Canvas, z: float) -> tuple[float, float, float] | None:
        """Centre (x, y) of the dense section on the plane at ``z`` and the streaks' strength."""
        got = canvas.occupancy(self.vein, z)
        if got is None:
            return None
        win, alpha = got
        total = float(alpha.sum())
        area = total * canvas.grid.spacing**2
        if area < 1.0:
            return None
        sx = float((alpha * win.x).sum()) / total
        sy = float((alpha * win.y).sum()) / total
        return sx, sy, min(area / self.full_area, 1.5)

    def field(self, canvas: Canvas, z: float) -> np.ndarray | None:
        """Streak HU on the whole plane at ``z``, or None where the plane misses the vein."""
        got = self.source(canvas, z)
        if got is None:
            return None
        sx, sy, strength = got
        x = canvas.grid.xs[None, :] - np.float32(sx)
        y = canvas.grid.ys[:, None] - np.float32(sy)
        r = np.sqrt(x * x + y * y)
        out = -self.halo * np.exp(-((r / 25.0) ** 2))
        for angle, amp in zip(self.angles, self.amplitudes, strict=True):
            c, s = np.float32(math.cos(angle)), np.float32(math.sin(angle))
            along = x * c + y * s
            perp = y * c - x * s
            width = self.width * (1.0 + np.maximum(along, 0.0) * (1.0 / 120.0))
            ray = np.exp(-((perp / width) ** 2)) * (self.reach / (self.reach + np.abs(along)))
            out = out + np.where(along > 0.0, amp * ray, 0.0)
        return np.asarray(out * strength, dtype=np.float32)

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Add the streaks to the plane; label lung pixels they shift strongly."""
        streak = self.field(canvas, z)
        if streak is None:
            return
        canvas.hu += streak
        strong = (np.abs(streak) >= STREAK_LABEL_HU) & (canvas.lung >= 0.5)
        canvas.label[strong & (canvas.label == NONE)] = STREAK


def dense_vein(p: Patient, front: float) -> tuple[Part, Streaks]:
    """Subclavian vein of the injected arm, under the clavicle, full of undiluted contrast.

    Parameters
    ----------
    p : Patient
        The synthetic patient (its seed draws the side, calibre, density and streaks).
    front : float
        Patient y of the front of the thoracic cavity at the clavicles.

    Returns
    -------
    tuple
        The vein as a part (1000 to 2500 HU) and its streaks.
    """
    rng = rng_for(p.seed, "dense vein")
    side = -1.0 if rng.random() < 0.7 else 1.0  # most injections go into the right arm
    radius = float(rng.uniform(4.0, 6.5))
    drop = float(rng.uniform(-0.03, 0.05))
    path = [
        (p.centre[0] + side * 118.0 * p.frame, front + 46.0, p.z(0.0 + drop)),
        (p.centre[0] + side * 72.0 * p.frame, front + 16.0, p.z(0.1 + drop)),
        (p.centre[0] + side * 40.0 * p.frame, front + 20.0, p.z(0.16 + drop)),
    ]
    vein: Shape = Union(tuple(chain(path, [radius, radius, radius * 1.15])))
    part = Part("subclavian vein", vein, float(rng.uniform(1000.0, 2500.0)))
    return part, _streaks(vein, radius, part.hu, rng)


def _streaks(vein: Shape, radius: float, hu: float, rng: np.random.Generator) -> Streaks:
    """Rays of random direction, mostly across the chest (the longest paths through the body)."""
    count = int(rng.integers(8, 18))
    lateral = rng.random(count) < 0.5
    angles = np.where(
        lateral,
        rng.choice([0.0, math.pi], count) + rng.normal(0.0, 0.25, count),
        rng.uniform(0.0, 2 * math.pi, count),
    )
    dark = rng.random(count) < 0.65
    amplitudes = np.where(dark, -rng.uniform(80.0, 380.0, count), rng.uniform(50.0, 220.0, count))
    density = hu / 1750.0
    return Streaks(
        vein,
        tuple(float(a) for a in angles),
        tuple(float(a * density) for a in amplitudes),
        width=float(rng.uniform(0.7, 1.6)),
        reach=float(rng.uniform(30.0, 70.0)),
        halo=float(rng.uniform(30.0, 120.0) * density),
        full_area=math.pi * radius * radius * 2.5,
    )
