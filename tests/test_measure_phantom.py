"""Lesion measurements against phantom nodules of known size, within one voxel.

The phantoms are written as DICOM and read back with the daemon's loader; their truth masks
stand in for a perfect segmentation and go through the daemon's lesion grouping and measurement
(without the segmentation from HU, which the thick-slice tests below hold to the known sizes).
The known sizes are those of each nodule's continuous body (:mod:`imaging_ai_devkit.phantom.sizes`),
not its nominal diameter: lobulation makes a nodule's long axis 2 to 13 % longer than that.

Slices are 1.25 mm, so each image is one plane of the phantom and its mask holds the voxels
whose centres lie inside the body; in-plane pixels are about 0.74 mm (the field of view fits the
body). "One voxel" is one pixel (0.74 mm) in-plane and 1.25 mm along z. Nodules with spicules
are left out: their masks catch the thin strands by chance and the known sizes leave them out.

On 2.5 and 3 mm slices (the generator averages 1 mm planes over each slice's thickness) the
detection handed in is what the detection model's heat map gives on such slices, the middle
of each nodule only; the lesion is segmented from the HU around it
(:mod:`imaging_ai.lesion_mask`), and its long axis must come within one pixel of the body's
and its volume within 20 % (issue 17: nodules of 6 mm and more on slices up to 3 mm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate, write_study
from imaging_ai_devkit.phantom.nodules import PART_SOLID, Nodule
from imaging_ai_devkit.phantom.sizes import (
    NoduleSize,
    axial_axes,
    cuts_core,
    nodule_size,
    perpendicular_chord,
    section,
)

from imaging_ai.postprocess import Lesion, detect_lesions, measure, slice_axes
from imaging_ai.volume import Volume, load_series
from tests.outputs.conftest import DETECTION_CARD

THICKNESS_MM = 1.25
VOLUME_TOLERANCE = 0.10  # nodules of 5 mm and more; observed at most 5.4 % (a 5.1 mm nodule)
SEEDS = (3, 8)


def test_known_sizes_of_a_sphere_are_exact() -> None:
    sphere = Nodule((10.0, -20.0, 30.0), 8.0, "solid", 30.0, 0.5, (), ())
    size = nodule_size(sphere)
    assert (size.long_axis_mm, size.short_axis_mm) == pytest.approx((8.0, 8.0), abs=1e-3)
    assert size.plane_z_mm == pytest.approx(30.0, abs=0.05)
    assert size.volume_ml == pytest.approx(math.pi / 6 * 8.0**3 / 1000, rel=1e-4)
    assert size.centroid_mm == pytest.approx(sphere.centre, abs=1e-3)
    # 3 mm above the centre the section is a circle of radius sqrt(4² - 3²).
    assert axial_axes(sphere, 33.0) == pytest.approx((2 * math.sqrt(7), 2 * math.sqrt(7)), abs=1e-3)
    assert not cuts_core(sphere, 34.5)


@dataclass(frozen=True)
class Measured:
    """A nodule, its known size and what the daemon measured of its mask."""

    nodule: Nodule
    size: NoduleSize
    lesion: Lesion
    volume: Volume
    truth: Path


def _slab_holds(phantom: PhantomVolume, nodule: Nodule) -> bool:
    z = phantom.positions_mm[:, 2]
    return bool(z.min() < nodule.bounds[4] and nodule.bounds[5] < z.max())


def _measure(seed: int, folder: Path) -> list[Measured]:
    spec = PhantomSpec(
        slices=24,
        seed=seed,
        nodules=4,
        slice_thickness_mm=THICKNESS_MM,
        nodule_diameter_range_mm=(5.0, 15.0),
        juxtapleural_fraction=0.0,  # the lungs do not clip them
    )
    phantom = generate(spec, workers=1)
    write_study(phantom, folder, workers=1)
    volume = load_series(sorted((folder / "dicom").glob("*.dcm")))
    assert volume.spacing_mm[0] < 0.8 and volume.spacing_mm[2] == THICKNESS_MM
    # The volume runs along its slice normal; the phantom from head to feet: match by z.
    z = [volume.index_to_lps([0, 0, k])[2] for k in range(volume.hu.shape[0])]
    order = [int(np.argmin(np.abs(phantom.positions_mm[:, 2] - zk))) for zk in z]
    probabilities = phantom.nodule_mask[order].astype(np.float32)[:, None]
    # The truth masks measured as they are: these tests hold the measuring (centre, axes,
    # volume of a mask) to the known sizes; the thick-slice tests below hold the segmentation.
    lungs = phantom.lung_labels[order]
    lesions = detect_lesions(probabilities, DETECTION_CARD, volume, lungs, refine=False)
    assert len(lesions) == len(phantom.nodules)
    out = []
    for nodule, size in zip(phantom.nodules, phantom.nodule_sizes, strict=True):
        if nodule.spicules or not _slab_holds(phantom, nodule):
            continue
        lesion = min(lesions, key=lambda les: math.dist(les.centre_mm, size.centroid_mm))
        out.append(Measured(nodule, size, lesion, volume, folder / "truth.npz"))
    return out


THICK_SLICES_MM = (2.5, 3.0)
THICK_SEEDS = (3, 8, 11)
THICK_VOLUME_TOLERANCE = 0.20
THICK_MIN_DIAMETER_MM = 6.0


def _middle(mask: np.ndarray, volume: Volume, size: NoduleSize) -> np.ndarray:
    """The voxels of ``mask`` within a third of the body's long axis of its centroid: a heat
    map's component, which on 3 mm slices held 37 to 86 % of a nodule's volume."""
    centre = volume.lps_to_index(size.centroid_mm)[::-1]
    idx = np.argwhere(mask)
    step = np.asarray(volume.spacing_mm[::-1])
    near = np.linalg.norm((idx - centre) * step, axis=1) <= size.long_axis_mm / 3
    return idx[near]


def _in_memory(phantom: PhantomVolume) -> Volume:
    """The phantom as a Volume without writing DICOM: its slices in its order (head to feet,
    so the slice normal points to the feet), HU rounded as stored."""
    first = phantom.positions_mm[0]
    direction = np.diag([1.0, 1.0, -1.0])
    n = len(phantom.indices)
    return Volume(
        hu=np.rint(phantom.hu).astype(np.float32),
        origin_mm=(float(first[0]), float(first[1]), float(first[2])),
        spacing_mm=phantom.spacing_mm,
        direction=direction,
        sop_instance_uids=tuple(f"2.25.{k}" for k in range(n)),
        series_instance_uid="2.25.1",
        study_instance_uid="2.25.2",
        frame_of_reference_uid="2.25.3",
    )


Thick = tuple[Nodule, NoduleSize, Lesion, Lesion, float]


def _measure_thick(seed: int, thickness: float) -> list[Thick]:
    """Each nodule of 6 mm or more that the slab holds: its known size, and its lesion as the
    heat map's middle gives it (not refined) and as segmented from the HU."""
    spec = PhantomSpec(
        slices=round(36 / thickness),
        seed=seed,
        nodules=4,
        slice_thickness_mm=thickness,
        nodule_diameter_range_mm=(5.0, 15.0),
        juxtapleural_fraction=0.0,
    )
    phantom = generate(spec, workers=1)
    volume = _in_memory(phantom)
    lungs, labelled = phantom.lung_labels, phantom.nodule_mask.astype(bool)
    out = []
    for nodule, size in zip(phantom.nodules, phantom.nodule_sizes, strict=True):
        # A part-solid nodule's middle is its solid core, and the lesion then comes out as the
        # core: its level is the core's (docs/models.md, "Measurements by slice thickness").
        if nodule.spicules or nodule.kind == PART_SOLID or nodule.diameter < THICK_MIN_DIAMETER_MM:
            continue
        if not _slab_holds(phantom, nodule):
            continue
        middle = _middle(labelled, volume, size)
        ones = np.ones(len(middle), np.float32)
        before = measure(1, middle, ones, volume, lungs, refine=False)
        after = measure(1, middle, ones, volume, lungs)
        out.append((nodule, size, before, after, volume.spacing_mm[0]))
    return out


@pytest.fixture(scope="module", params=THICK_SLICES_MM, ids=lambda t: f"{t}mm")
def thick(request: pytest.FixtureRequest) -> list[Thick]:
    out = [m for seed in THICK_SEEDS for m in _measure_thick(seed, float(request.param))]
    assert len(out) >= 5, "the seeds should give at least five nodules of 6 mm or more"
    return out


def test_thick_slices_long_axis_within_one_pixel(thick: list[Thick]) -> None:
    for nodule, size, _, after, pixel in thick:
        assert after.long_axis_mm == pytest.approx(size.long_axis_mm, abs=pixel), nodule
    # The heat map's middle alone falls short by more than that.
    assert all(
        size.long_axis_mm - before.long_axis_mm > pixel for _, size, before, _, pixel in thick
    )


def test_thick_slices_volume_within_20_percent(thick: list[Thick]) -> None:
    for nodule, size, _, after, _ in thick:
        assert after.volume_ml == pytest.approx(size.volume_ml, rel=THICK_VOLUME_TOLERANCE), nodule
    assert all(b.volume_ml < (1 - THICK_VOLUME_TOLERANCE) * s.volume_ml for _, s, b, _, _ in thick)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> list[Measured]:
    out = [m for seed in SEEDS for m in _measure(seed, tmp_path_factory.mktemp(f"s{seed}"))]
    assert len(out) >= 6, "the seeds should give at least six nodules to measure"
    return out


def test_centre_within_one_voxel(measured: list[Measured]) -> None:
    for m in measured:
        dx, dy, dz = m.volume.spacing_mm
        error = np.abs(np.subtract(m.lesion.centre_mm, m.size.centroid_mm))
        assert np.all(error <= [dx, dy, dz]), (m.nodule, error)
        # The centroid of a lobulated body sits near, not at, the centre it was drawn around.
        assert math.dist(m.size.centroid_mm, m.nodule.centre) < 0.5


def test_long_axis_within_one_voxel(measured: list[Measured]) -> None:
    for m in measured:
        pixel = m.volume.spacing_mm[0]
        assert m.lesion.long_axis_mm == pytest.approx(m.size.long_axis_mm, abs=pixel)
        assert m.size.long_axis_mm >= m.nodule.diameter * 0.99  # lobes only add length


def test_axes_on_every_slice_within_one_voxel(measured: list[Measured]) -> None:
    """On each slice through the body's core: the long axis against the section's diameter,
    and the short axis against the section's chord across the direction the long axis was
    measured in; that direction is a longest one to within a voxel.

    On a near-round lobulated section two directions can be within a voxel of the longest, and
    the chord perpendicular to each differs by more than a voxel: the short axis is only
    defined once the long axis is chosen, so it is checked across the chosen one.
    """
    checked = 0
    for m in measured:
        pixel, idx = m.volume.spacing_mm[0], m.lesion.voxel_index
        for k in np.unique(idx[:, 0]):
            z = float(m.volume.index_to_lps([0, 0, k])[2])
            if not cuts_core(m.nodule, z):
                continue
            outline = section(m.nodule, z)
            true_long, _ = axial_axes(m.nodule, z)
            axes = slice_axes(idx[idx[:, 0] == k], m.volume)
            direction = (m.volume.direction[:, :2] @ np.asarray(axes.direction))[:2]
            spread = outline @ direction
            assert axes.long_mm == pytest.approx(true_long, abs=pixel), (m.nodule, z)
            assert spread.max() - spread.min() >= true_long - pixel
            chord = perpendicular_chord(outline, direction)
            assert axes.short_mm == pytest.approx(chord, abs=pixel), (m.nodule, z)
            checked += 1
    assert checked >= 30


def test_short_axis_is_the_one_on_the_long_axis_slice(measured: list[Measured]) -> None:
    for m in measured:
        idx = m.lesion.voxel_index
        per_slice = [slice_axes(idx[idx[:, 0] == k], m.volume) for k in np.unique(idx[:, 0])]
        best = max(per_slice, key=lambda axes: axes.long_mm)
        assert (m.lesion.long_axis_mm, m.lesion.short_axis_mm) == (best.long_mm, best.short_mm)


def test_volume_within_tolerance(measured: list[Measured]) -> None:
    for m in measured:
        assert m.lesion.volume_ml == pytest.approx(m.size.volume_ml, rel=VOLUME_TOLERANCE)


def test_truth_records_the_known_sizes(measured: list[Measured]) -> None:
    for m in measured:
        with np.load(m.truth) as truth:
            [n] = np.flatnonzero(np.all(truth["nodule_centres_mm"] == m.nodule.centre, axis=1))
            assert truth["nodule_long_axes_mm"][n] == m.size.long_axis_mm
            assert truth["nodule_short_axes_mm"][n] == m.size.short_axis_mm
            assert truth["nodule_axes_z_mm"][n] == m.size.plane_z_mm
            assert truth["nodule_volumes_ml"][n] == m.size.volume_ml
            assert tuple(truth["nodule_centroids_mm"][n]) == m.size.centroid_mm
            assert not truth["nodule_spiculated"][n]
