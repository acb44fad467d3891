"""Phantom generation: takes a :class:`PhantomSpec`, gives a :class:`PhantomVolume` in memory."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from imaging_ai_devkit.phantom.canvas import Canvas, Grid, Planes
from imaging_ai_devkit.phantom.nodules import Nodule, NodulePainter, place_nodules
from imaging_ai_devkit.phantom.parallel import Done, for_spans, shared_array, worker_count
from imaging_ai_devkit.phantom.patient import Patient, draw_patient, drawn_spec, rng_for
from imaging_ai_devkit.phantom.scanner import Scanner, default_noise, subslice_offsets, tuned
from imaging_ai_devkit.phantom.scene import Scene, build_scene, lung_box
from imaging_ai_devkit.phantom.sizes import NoduleSize, nodule_size
from imaging_ai_devkit.phantom.spec import STANDARD_THICKNESSES_MM, Kernel, PhantomSpec
from imaging_ai_devkit.phantom.structures import combine
from imaging_ai_devkit.phantom.texture import TextureField
from imaging_ai_devkit.phantom.trees import CLASSES
from imaging_ai_devkit.phantom.wall import body_extent

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
RIGHT_LUNG, LEFT_LUNG = 1, 2


@dataclass(frozen=True)
class Geometry:
    """Where the slices of the whole study lie.

    Attributes
    ----------
    grid : Grid
        In-plane sampling (identity orientation: rows along +y, columns along +x).
    thickness : float
        Slice thickness and spacing, mm.
    z : ndarray
        Patient z of every slice of the study, first (most superior) to last.
    """

    grid: Grid
    thickness: float
    z: npt.NDArray[np.float64]

    def positions(self, indices: npt.NDArray[np.int_]) -> npt.NDArray[np.float64]:
        """ImagePositionPatient of the given slices, ``(len(indices), 3)``."""
        out = np.empty((len(indices), 3))
        out[:, 0], out[:, 1], out[:, 2] = self.grid.x0, self.grid.y0, self.z[indices]
        return out


@dataclass(frozen=True, eq=False)
class PhantomVolume:
    """A generated study: HU voxels, ground truth and geometry, slices superior to inferior.

    Attributes
    ----------
    spec : PhantomSpec
        What was asked for, with every option left to chance drawn (contrast, kernel, ...).
    patient : Patient
        Who was drawn.
    hu : ndarray
        float32 ``(slices, rows, columns)``; -3024 outside the reconstruction circle.
    lung_labels : ndarray
        uint8, 0 background, 1 right lung, 2 left lung (nodules and vessels inside count).
    nodule_mask : ndarray
        uint8 0/1: voxels where some plane within the slice is at least half nodule.
    structures : ndarray
        uint8 structure labels (:data:`imaging_ai_devkit.phantom.structures.STRUCTURE_NAMES`): what
        each voxel is when not lung parenchyma or nodule; a class wins a thick slice where it
        covers a third of its planes. Nodule voxels are 0.
    nodules : tuple of Nodule
        Every nodule of the study (also those outside a partial set of slices).
    indices : ndarray
        Index of each slice in the whole study (``arange(spec.slices)`` unless a subset).
    geometry : Geometry
        Slice positions of the whole study.
    noise_hu : float
        Noise SD the scanner model used.
    """

    spec: PhantomSpec
    patient: Patient
    hu: F32
    lung_labels: U8
    nodule_mask: U8
    nodules: tuple[Nodule, ...]
    indices: npt.NDArray[np.int_]
    geometry: Geometry
    noise_hu: float
    structures: U8

    @property
    def positions_mm(self) -> npt.NDArray[np.float64]:
        """ImagePositionPatient of each slice, ``(slices, 3)``."""
        return self.geometry.positions(self.indices)

    @property
    def spacing_mm(self) -> tuple[float, float, float]:
        """Voxel size (x, y, z) in mm; slices step by ``-z`` (towards the feet)."""
        d = self.geometry.grid.spacing
        return d, d, self.geometry.thickness

    @property
    def nodule_centres_mm(self) -> npt.NDArray[np.float64]:
        """Nodule centres, ``(K, 3)`` LPS mm."""
        return np.asarray([n.centre for n in self.nodules], dtype=float).reshape(-1, 3)

    @property
    def nodule_diameters_mm(self) -> npt.NDArray[np.float64]:
        """Nominal nodule diameters, ``(K,)`` mm."""
        return np.asarray([n.diameter for n in self.nodules], dtype=float)

    @cached_property
    def nodule_sizes(self) -> tuple[NoduleSize, ...]:
        """What each nodule's body measures: axial long and short axis, volume, centroid.

        Lobulation makes the long axis longer than the nominal diameter (2 to 13 % in tests);
        spicules are not part of these sizes (see :mod:`imaging_ai_devkit.phantom.sizes`).
        """
        return tuple(nodule_size(n) for n in self.nodules)


def _thickness(spec: PhantomSpec, span: float) -> float:
    """The spec's thickness, or the standard one whose stack best covers ``span`` mm."""
    if spec.slice_thickness_mm is not None:
        return spec.slice_thickness_mm
    return min(STANDARD_THICKNESSES_MM, key=lambda t: abs(t * spec.slices - span))


def plan_geometry(spec: PhantomSpec, p: Patient, scene: Scene) -> Geometry:
    """Slices centred on the chest and a field of view fitted to the body, as a technologist would.

    Parameters
    ----------
    spec : PhantomSpec
        Slices, thickness and pixel spacing (either may be left to this function).
    p : Patient
        Where the chest lies.
    scene : Scene
        The body outline, for the field of view.
    """
    top, bottom = p.z_apex + 25.0, p.z(1.0) - 95.0 * p.frame
    thickness = _thickness(spec, top - bottom)
    first = 0.5 * (top + bottom) + 0.5 * thickness * (spec.slices - 1)
    z = np.asarray(first - thickness * np.arange(spec.slices), dtype=np.float64)
    x0, x1, y0, y1 = body_extent(scene.wall, float(z[-1]), float(z[0]))
    rng = rng_for(p.seed, "geometry")
    centre = (0.0, round(0.5 * (y0 + y1) + float(rng.normal(0.0, 8.0)), 1))
    if spec.pixel_spacing_mm is not None:
        spacing = spec.pixel_spacing_mm
    else:
        half = max(abs(x0), abs(x1), centre[1] - y0, y1 - centre[1])
        fov = np.clip(10 * math.ceil((2 * half + rng.uniform(10.0, 45.0)) / 10), 300.0, 460.0)
        spacing = float(fov) / spec.matrix
    origin = [c - 0.5 * (spec.matrix - 1) * spacing for c in centre]
    return Geometry(Grid(spec.matrix, spacing, origin[0], origin[1]), thickness, z)


def _scanner(spec: PhantomSpec, p: Patient, scene: Scene, geo: Geometry) -> Scanner:
    """Scanner model: noise from the water-equivalent diameter unless the spec sets it."""
    _, _, a, b = (float(v) for v in scene.wall.body_ellipse.section(p.z(0.6)))
    diameter = 0.85 * 2.0 * math.sqrt(a * b)
    kernel = spec_kernel(spec)
    noise = spec.noise_hu
    if noise is None:
        noise = default_noise(kernel, geo.thickness, diameter)
    sharpness, boost, grain = tuned(kernel, rng_for(p.seed, "kernel tuning"))
    cupping = 3.0 + 10.0 * max(p.scale - 0.8, 0.0)
    return Scanner(geo.grid, kernel, noise, cupping, sharpness, boost, grain)


def spec_kernel(spec: PhantomSpec) -> Kernel:
    """The kernel of a drawn spec (see :func:`imaging_ai_devkit.phantom.patient.drawn_spec`)."""
    if spec.kernel is None:
        raise ValueError("the spec's kernel has not been drawn")
    return spec.kernel


class Renderer:
    """Buffers for rendering slices one at a time (one renderer per worker)."""

    def __init__(self, scene: Scene, geo: Geometry, scanner: Scanner, seed: int) -> None:
        self.scene, self.geo, self.scanner, self.seed = scene, geo, scanner, seed
        self.fine = TextureField(seed, 2.0, geo.grid)
        self.coarse = TextureField(seed, 12.0, geo.grid)
        self.canvas = Canvas(geo.grid)
        self.buffer = np.zeros((CLASSES, geo.grid.n, geo.grid.n), dtype=np.float32)
        self.offsets = subslice_offsets(geo.thickness)
        self.sub_labels = np.zeros((len(self.offsets), geo.grid.n, geo.grid.n), dtype=np.uint8)

    def render(self, k: int, hu: F32, labels: U8, nodule: U8, structures: U8) -> None:
        """Render slice ``k`` of the study into the given output planes."""
        lung = np.zeros_like(hu)
        nod = np.zeros_like(hu)
        hu.fill(0.0)
        for i, off in enumerate(self.offsets):
            z = float(self.geo.z[k] + off)
            planes = Planes(self.fine.plane(z), self.coarse.plane(z))
            self.scene.render(self.canvas, z, planes, self.buffer)
            hu += self.canvas.hu
            lung += self.canvas.lung
            np.maximum(nod, self.canvas.nodule, out=nod)
            self.sub_labels[i] = self.canvas.label
        hu *= 1.0 / len(self.offsets)
        nodule[...] = nod >= 0.5
        structures[...] = combine(self.sub_labels)
        structures[nodule > 0] = 0
        inside = (lung >= 0.5 * len(self.offsets)) | (nodule > 0)
        midline = self.scene.lungs.midline(float(self.geo.z[k]))
        side = np.where(self.geo.grid.xs < midline, RIGHT_LUNG, LEFT_LUNG).astype(np.uint8)
        labels[...] = inside * side[None, :]
        rng = np.random.default_rng([self.seed, 0x5CA7, k])
        self.scanner.reconstruct(hu, self.canvas.body_q, rng)


def generate(
    spec: PhantomSpec,
    slices: Sequence[int] | None = None,
    workers: int | None = None,
    done: Done | None = None,
) -> PhantomVolume:
    """Generate the phantom study of ``spec`` in memory.

    Parameters
    ----------
    spec : PhantomSpec
        What to generate.
    slices : sequence of int, optional
        Indices (0 = most superior) of the study's slices to render; the others are skipped,
        which makes training crops cheap. Each slice is identical to the one in the full study.
    workers : int, optional
        Processes to render with; default one per available CPU (at most 8). Output does not
        depend on it.
    done : callable, optional
        Told the number of slices each time some are rendered (a progress bar's ``update``).

    Returns
    -------
    PhantomVolume
        HU voxels, ground truth and geometry.
    """
    spec = drawn_spec(spec)
    p = draw_patient(spec)
    scene = build_scene(p)
    geo = plan_geometry(spec, p, scene)
    scene = scene.with_nodules(NodulePainter(_nodules(spec, p, scene, geo)))
    scanner = _scanner(spec, p, scene, geo)
    indices = np.arange(spec.slices) if slices is None else np.asarray(slices, dtype=int)
    if indices.size and (indices.min() < 0 or indices.max() >= spec.slices):
        raise ValueError(f"slices must lie in 0..{spec.slices - 1}")
    renderer = Renderer(scene, geo, scanner, spec.seed)
    shape = (len(indices), geo.grid.n, geo.grid.n)
    forked = worker_count(len(indices), workers) > 1
    new = shared_array if forked else np.zeros
    hu, labels, nodule = new(shape, np.float32), new(shape, np.uint8), new(shape, np.uint8)
    structures = new(shape, np.uint8)

    def render(start: int, stop: int) -> None:
        for i in range(start, stop):
            renderer.render(int(indices[i]), hu[i], labels[i], nodule[i], structures[i])

    for_spans(render, len(indices), workers, done)
    nodules = scene.nodules.nodules
    return PhantomVolume(
        spec, p, hu, labels, nodule, nodules, indices, geo, scanner.noise_hu, structures
    )


def _nodules(spec: PhantomSpec, p: Patient, scene: Scene, geo: Geometry) -> tuple[Nodule, ...]:
    """Nodules inside the lungs and inside the scanned slab."""
    rng = rng_for(spec.seed, "nodules")
    z_lo, z_hi = float(geo.z[-1]), float(geo.z[0])
    boxes = [lung_box(scene.lungs, p, side) for side in (-1.0, 1.0)]
    lo = np.minimum(boxes[0][0], boxes[1][0])
    hi = np.maximum(boxes[0][1], boxes[1][1])
    lo[2], hi[2] = max(lo[2], z_lo), min(hi[2], z_hi)
    return place_nodules(spec, scene.lungs.sdf, (lo, hi), scene.vessels, rng)
