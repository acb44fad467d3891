"""Lesion measurements against phantom nodules of known size, within one voxel.

The phantoms are written as DICOM and read back with the daemon's loader; their truth masks
stand in for a perfect detector and go through the daemon's lesion grouping and measurement.
The known sizes are those of each nodule's continuous body (:mod:`imaging_ai.phantom.sizes`),
not its nominal diameter: lobulation makes a nodule's long axis 2 to 13 % longer than that.

Slices are 1.25 mm, so each image is one plane of the phantom and its mask holds the voxels
whose centres lie inside the body; in-plane pixels are about 0.74 mm (the field of view fits the
body). "One voxel" is one pixel (0.74 mm) in-plane and 1.25 mm along z. Nodules with spicules
are left out: their masks catch the thin strands by chance and the known sizes leave them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from imaging_ai.phantom import PhantomSpec, PhantomVolume, generate, write_study
from imaging_ai.phantom.nodules import Nodule
from imaging_ai.phantom.sizes import (
    NoduleSize,
    axial_axes,
    cuts_core,
    nodule_size,
    perpendicular_chord,
    section,
)
from imaging_ai.postprocess import Lesion, detect_lesions, slice_axes
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
    lesions = detect_lesions(probabilities, DETECTION_CARD, volume, phantom.lung_labels[order])
    assert len(lesions) == len(phantom.nodules)
    out = []
    for nodule, size in zip(phantom.nodules, phantom.nodule_sizes, strict=True):
        if nodule.spicules or not _slab_holds(phantom, nodule):
            continue
        lesion = min(lesions, key=lambda les: math.dist(les.centre_mm, size.centroid_mm))
        out.append(Measured(nodule, size, lesion, volume, folder / "truth.npz"))
    return out


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
