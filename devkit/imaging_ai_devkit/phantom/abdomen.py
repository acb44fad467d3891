"""Upper abdomen: takes a patient, cavity and diaphragm, gives liver, spleen, stomach, bowel."""

from __future__ import annotations

from dataclasses import dataclass

from imaging_ai_devkit.phantom.canvas import Canvas, Part, Planes
from imaging_ai_devkit.phantom.contrast import Enhancement
from imaging_ai_devkit.phantom.diaphragm import Dome
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import (
    Capsule,
    Ellipsoid,
    Front,
    Intersect,
    Loft,
    Offset,
    Shape,
    Union,
    chain,
    loft,
    rotation_z,
)


@dataclass(frozen=True)
class Abdomen:
    """Organs under the diaphragm; ``fill`` goes down before the lungs, ``organs`` after."""

    fill: tuple[Part, ...]
    organs: tuple[Part, ...]

    def paint_fill(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Diaphragm muscle and the fat and bowel around the organs."""
        for part in self.fill:
            part.paint(canvas, z, planes)

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """The solid and hollow organs."""
        for part in self.organs:
            part.paint(canvas, z, planes)


def _below(shape: Shape, dome: Dome, cav: Loft, gap: float = 4.0) -> Shape:
    """``shape`` kept under the diaphragm (``gap`` mm of muscle) and inside the cavity."""
    return Intersect(Intersect(shape, Offset(dome, -gap), k=4.0), Offset(cav, -2.0))


def _liver(p: Patient, dome: Dome, cav: Loft) -> Shape:
    """Right lobe under the right dome, left lobe reaching across under the heart."""
    a0, b0 = p.cavity
    right = loft(
        [
            (p.z(0.85), p.centre[0] - 0.3 * a0, p.centre[1] + 0.02 * b0, 0.75 * a0, 0.95 * b0),
            (p.z(1.35), p.centre[0] - 0.35 * a0, p.centre[1] + 0.05 * b0, 0.7 * a0, 0.9 * b0),
            (p.z(1.75), p.centre[0] - 0.5 * a0, p.centre[1] + 0.1 * b0, 0.45 * a0, 0.7 * b0),
            (p.z(2.05), p.centre[0] - 0.6 * a0, p.centre[1] + 0.15 * b0, 0.15 * a0, 0.3 * b0),
        ]
    )
    left = loft(
        [
            (p.z(0.95), p.centre[0] + 0.15 * a0, p.centre[1] - 0.45 * b0, 0.5 * a0, 0.42 * b0),
            (p.z(1.45), p.centre[0] + 0.1 * a0, p.centre[1] - 0.5 * b0, 0.35 * a0, 0.3 * b0),
        ]
    )
    return _below(Union((right, left), k=25.0), dome, cav)


def _stomach(p: Patient, dome: Dome, cav: Loft) -> list[Part]:
    """Stomach under the left dome: wall, fluid and a gas cap in front (the patient is supine).

    Its fundus sits a few mm under the dome, so its gas lies just below the lung base.
    """
    rng = rng_for(p.seed, "stomach")
    s = p.frame * float(rng.uniform(0.7, 1.3))
    centre = p.at(float(rng.uniform(48.0, 66.0)), -18.0, float(rng.uniform(1.15, 1.33)))
    gap = float(rng.uniform(4.0, 8.0))
    sac = _below(Ellipsoid(centre, (42 * s, 38 * s, 52 * s), rotation_z(-30.0)), dome, cav, gap)
    wall = float(rng.uniform(2.0, 4.0))
    gas_level = centre[1] - float(rng.uniform(-0.3, 0.8)) * 38 * s
    gas = Intersect(Offset(sac, -wall), Front(gas_level))
    return [
        Part("stomach wall", sac, 42.0, fine=5.0),
        Part("stomach contents", Offset(sac, -wall), float(rng.uniform(5.0, 30.0)), coarse=12.0),
        Part("stomach gas", gas, float(rng.uniform(-1000.0, -900.0))),
    ]


def _colon(p: Patient, dome: Dome, cav: Loft) -> list[Part]:
    """Splenic flexure and transverse colon: gas pockets and stool in a thin wall.

    The flexure rises under the left dome in some patients; gas fills the colon or sits in
    pockets in front of the stool.
    """
    rng = rng_for(p.seed, "colon")
    high = float(rng.uniform(1.12, 1.45))
    pts = [p.at(92, 10, high), p.at(85, -40, high + 0.1), p.at(40, -62, 1.62), p.at(-30, -60, 1.7)]
    radius = 16.0 * p.frame * float(rng.uniform(0.8, 1.2))
    tube = _below(
        Union(tuple(chain(pts, [radius] * 4)), k=6.0), dome, cav, float(rng.uniform(5, 9))
    )
    lumen = Offset(tube, -2.0)
    gas_hu = float(rng.uniform(-1000.0, -900.0))
    parts = [Part("colon wall", tube, 35.0)]
    if rng.random() < 0.6:
        return [*parts, Part("colon gas", lumen, gas_hu)]
    parts.append(Part("colon contents", lumen, float(rng.uniform(-140.0, 10.0)), fine=40.0))
    for _ in range(int(rng.integers(1, 5))):
        at = pts[int(rng.integers(0, 3))]
        r = float(rng.uniform(4.0, 12.0))
        pocket = Ellipsoid((at[0] + rng.normal(0, 8), at[1] - 6.0, at[2]), (1.6 * r, r, 1.3 * r))
        parts.append(Part("colon gas", Intersect(pocket, lumen), gas_hu))
    return parts


def _kidneys(p: Patient, dome: Dome, cav: Loft, y_spine: float, enh: Enhancement) -> list[Part]:
    """Upper poles of both kidneys beside the spine; cortex enhances with contrast."""
    out = []
    for side, f in ((-1.0, 1.85), (1.0, 1.78)):
        centre = (p.centre[0] + side * 68.0 * p.frame, y_spine + 12.0, p.z(f))
        shape = _below(Ellipsoid(centre, (26.0, 22.0, 55.0), rotation_z(side * 30.0)), dome, cav)
        out.append(Part("kidney", shape, enh.kidney or 32.0, fine=5.0))
    return out


def build_abdomen(p: Patient, cav: Loft, dome: Dome, y_spine: float, enh: Enhancement) -> Abdomen:
    """Upper abdominal organs of ``p``.

    Parameters
    ----------
    p : Patient
        The synthetic patient.
    cav : Loft
        Cavity the organs stay inside.
    dome : Dome
        Diaphragm the organs stay under.
    y_spine : float
        Patient y of the vertebral bodies.
    enh : Enhancement
        Organ and vessel attenuation of the contrast phase.

    Returns
    -------
    Abdomen
        Fill and organs in painting order.
    """
    rng = rng_for(p.seed, "abdomen")
    liver = _liver(p, dome, cav)
    liver_hu = float(rng.uniform(48.0, 64.0))
    liver_hu = enh.liver or liver_hu
    spleen = _below(
        Ellipsoid(p.at(95, 42, 1.3), (24.0 * p.frame, 52.0 * p.frame, 48.0 * p.frame),
                  rotation_z(40.0)), dome, cav, 5.0,
    )  # fmt: skip
    hepatic = [
        Capsule(p.at(-22, 0, 1.0), p.at(-22 + dx, dy, 1.15), 5.0, 2.5)
        for dx, dy in ((-70, -10), (-25, -60), (30, -55))
    ]
    fill = (
        Part("diaphragm", Intersect(cav, dome), 45.0, fine=6.0),
        Part("abdominal fat", Intersect(Offset(cav, -3.0), Offset(dome, -4.0)), -70.0,
             fine=15.0, coarse=45.0),
    )  # fmt: skip
    organs = [
        Part("liver", liver, liver_hu, fine=5.0, coarse=4.0),
        *(Part("hepatic vein", Intersect(h, liver), enh.venous if p.contrast else 35.0)
          for h in hepatic),
        Part("spleen", spleen, enh.spleen or 47.0, fine=5.0),
        *_stomach(p, dome, cav),
        *_colon(p, dome, cav),
        *_kidneys(p, dome, cav, y_spine, enh),
    ]  # fmt: skip
    if rng.random() < 0.7:
        gb = _below(Ellipsoid(p.at(-55, -55, 1.45), (14.0, 16.0, 30.0)), dome, cav)
        organs.append(Part("gallbladder", Intersect(gb, Offset(liver, 4.0)), 8.0))
    return Abdomen(fill, tuple(organs))
