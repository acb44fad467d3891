"""The whole patient: takes a :class:`Patient`, gives every painter in order and the lung trees."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from imaging_ai_devkit.phantom.abdomen import Abdomen, build_abdomen
from imaging_ai_devkit.phantom.atelectasis import draw_atelectasis
from imaging_ai_devkit.phantom.canvas import Canvas, Painter, Planes
from imaging_ai_devkit.phantom.contrast import Enhancement, Streaks, dense_vein, enhancement
from imaging_ai_devkit.phantom.diaphragm import build_dome
from imaging_ai_devkit.phantom.nodules import NodulePainter
from imaging_ai_devkit.phantom.patient import Patient, rng_for
from imaging_ai_devkit.phantom.sdf import Arr
from imaging_ai_devkit.phantom.skeleton import Spine, build_skeleton
from imaging_ai_devkit.phantom.splat import TreePainter
from imaging_ai_devkit.phantom.thorax import Lungs, Mediastinum, build_lungs, build_mediastinum
from imaging_ai_devkit.phantom.trees import (
    AIRWAY_LUMEN,
    AIRWAY_WALL,
    ARTERY,
    VEIN,
    Tree,
    bronchi,
    grow_tree,
    lumen,
    sample_inside,
    to_spheres,
)
from imaging_ai_devkit.phantom.wall import Wall, build_wall, spine_y

TREE_TARGETS = 1600
"""End points per tree; with Murray's law the finest branches come out about 1.1 mm across."""


@dataclass(frozen=True)
class Scene:
    """Every structure of one patient, painted in order onto an axial plane."""

    patient: Patient
    wall: Wall
    abdomen: Abdomen
    lungs: Lungs
    mediastinum: Mediastinum
    spine: Spine
    bones: tuple[Painter, ...]
    trees: TreePainter
    vessels: Tree
    nodules: NodulePainter = field(default_factory=lambda: NodulePainter(()))
    streaks: Streaks | None = None

    def render(self, canvas: Canvas, z: float, planes: Planes, buffer: Arr) -> None:
        """Paint the plane at patient ``z`` onto ``canvas`` (``buffer`` is tree scratch space)."""
        canvas.reset()
        self.wall.paint(canvas, z, planes)
        self.abdomen.paint_fill(canvas, z, planes)
        self.lungs.paint(canvas, z, planes)
        self.abdomen.paint(canvas, z, planes)
        self.mediastinum.paint(canvas, z, planes)
        self.spine.paint(canvas, z, planes)
        for bone in self.bones:
            bone.paint(canvas, z, planes)
        self.trees.paint(canvas, z, planes, buffer)
        self.nodules.paint(canvas, z, planes)
        if self.streaks is not None:
            self.streaks.paint(canvas, z, planes)

    def with_nodules(self, nodules: NodulePainter) -> Scene:
        """The same scene with ``nodules`` in the lungs."""
        return replace(self, nodules=nodules)


def lung_box(lungs: Lungs, p: Patient, side: float) -> tuple[Arr, Arr]:
    """Corners of a box around one lung (``side`` -1 right, +1 left)."""
    b = lungs.cavity.bounds
    mid = p.centre[0]
    x0, x1 = (b[0], mid + 15.0) if side < 0 else (mid - 15.0, b[1])
    z0, z1 = p.z(1.0) - 130.0 * p.frame, p.z(0.0) + 2.0
    return np.array([x0, b[2], z0]), np.array([x1, b[3], z1])


def _trees(
    p: Patient, lungs: Lungs, med: Mediastinum, enh: Enhancement
) -> tuple[TreePainter, Tree]:
    """Arteries, veins and airways of both lungs, as a painter and as vessel segments.

    Airways have walls of 0.6 to 2 mm (thickened in some patients); arteries carry the
    pulmonary and veins the systemic (left heart) enhancement.
    """
    rng = rng_for(p.seed, "trees")
    thickening = float(rng_for(p.seed, "bronchial walls").uniform(0.85, 1.4))
    parts: list[tuple[Tree, int, float]] = []
    vessels = []
    for side, tag in ((-1.0, "R"), (1.0, "L")):

        def inside(x: Arr, y: Arr, z: Arr, side: float = side) -> Arr:
            mid = np.asarray(lungs.band.section(z)[0])
            return np.asarray(np.maximum(lungs.sdf(x, y, z), side * (mid - x)))

        box = lung_box(lungs, p, side)
        arteries, veins = (
            grow_tree(
                np.asarray(med.hilum[f"{kind} {tag}"]),
                radius * p.frame,
                sample_inside(inside, box, TREE_TARGETS, rng, margin=1.0),
                rng,
            )
            for kind, radius in (("artery", 6.5), ("vein", 6.0))
        )
        airways = bronchi(arteries, 1.2, side)
        parts += [(arteries, ARTERY, 1.0), (veins, VEIN, 1.0)]
        parts += [(airways, AIRWAY_WALL, 1.0), (lumen(airways, thickening), AIRWAY_LUMEN, 1.0)]
        vessels += [arteries, veins]
    art = enh.pulmonary if p.contrast else 40.0
    vein = enh.systemic if p.contrast else 40.0
    painter = TreePainter(to_spheres(parts), (art, vein, 20.0, -990.0))
    return painter, Tree.concat(vessels)


def build_scene(p: Patient) -> Scene:
    """Assemble every structure of ``p`` (without nodules, which depend on the scanned slab).

    Parameters
    ----------
    p : Patient
        The synthetic patient.

    Returns
    -------
    Scene
        Ready to render any axial plane.
    """
    wall = build_wall(p)
    spine, bones = build_skeleton(p, wall.cavity)
    dome = build_dome(p)
    enh = enhancement(p)
    extra, streaks = [], None
    if p.dense_contrast:
        _, cy, _, b = (float(v) for v in wall.cavity.section(p.z(0.1)))
        vein, streaks = dense_vein(p, cy - b)
        extra.append(vein)
    med = build_mediastinum(p, wall.cavity, spine.envelope, dome, enh, extra)
    atelectasis = None
    if p.atelectasis:
        atelectasis = draw_atelectasis(p, dome.right[2], p.cavity)
    lungs = build_lungs(p, wall.cavity, med, dome, atelectasis)
    abdomen = build_abdomen(p, wall.cavity, dome, spine_y(p), enh)
    trees, vessels = _trees(p, lungs, med, enh)
    bone_parts = tuple(bones)
    return Scene(p, wall, abdomen, lungs, med, spine, bone_parts, trees, vessels, streaks=streaks)
