"""The phantom's negatives: what fired as false lesions on real CT is drawn where and as it should
be, with its structure label (issue 17, item 4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from imaging_ai_devkit.phantom import PhantomVolume, generate
from imaging_ai_devkit.phantom.canvas import Canvas, Planes
from imaging_ai_devkit.phantom.dicom import write_truth
from imaging_ai_devkit.phantom.structures import (
    AIRWAY,
    ATELECTASIS,
    BONE,
    BOWEL,
    STREAK,
    STRUCTURE_NAMES,
    VESSEL,
)

from tests.phantom.conftest import FEATURES, Built, vein_slices


def _interior(mask: np.ndarray) -> np.ndarray:
    """Voxels of ``mask`` whose four in-plane neighbours are in it too."""
    inner = mask.copy()
    inner[:, 1:-1, 1:-1] &= mask[:, :-2, 1:-1] & mask[:, 2:, 1:-1]
    inner[:, 1:-1, 1:-1] &= mask[:, 1:-1, :-2] & mask[:, 1:-1, 2:]
    return inner


def _near(mask: np.ndarray, steps: int) -> np.ndarray:
    """``mask`` grown by ``steps`` pixels in-plane (4-connected)."""
    out = mask.copy()
    for _ in range(steps):
        grown = out.copy()
        grown[:, 1:] |= out[:, :-1]
        grown[:, :-1] |= out[:, 1:]
        grown[:, :, 1:] |= out[:, :, :-1]
        grown[:, :, :-1] |= out[:, :, 1:]
        out = grown
    return out


def test_structures_cover_every_class(volume: PhantomVolume) -> None:
    s = volume.structures
    assert s.shape == volume.hu.shape and s.dtype == np.uint8
    present = set(np.unique(s).tolist())
    assert present == set(STRUCTURE_NAMES), {
        STRUCTURE_NAMES[v] for v in set(STRUCTURE_NAMES) - present
    }
    assert not np.any(s[volume.nodule_mask > 0]), "nodule voxels belong to the nodule truth"


def test_enhanced_vessels_lie_between_150_and_400_hu(volume: PhantomVolume) -> None:
    vessel = _interior(volume.structures == VESSEL) & (volume.hu < 1000)
    assert vessel.sum() > 2000
    assert 150 <= np.median(volume.hu[vessel]) <= 400


def test_gas_under_the_dome_is_bowel_not_lung(volume: PhantomVolume) -> None:
    gas = (volume.structures == BOWEL) & (volume.hu < -900)
    assert gas.sum() > 200
    assert not np.any(volume.lung_labels[gas])
    # Just below the lung base: the same column holds lung within 40 mm above the gas.
    lung = volume.lung_labels > 0
    step = int(np.median(np.diff(volume.indices)))
    reach = max(1, round(40.0 / (volume.spacing_mm[2] * step)))
    k, r, c = np.nonzero(gas)
    above = [
        lung[max(ki - reach, 0) : ki, ri, ci].any() for ki, ri, ci in zip(k, r, c, strict=True)
    ]
    assert np.mean(above) > 0.05


def test_atelectasis_is_posterior_basal_dense_lung(volume: PhantomVolume) -> None:
    atel = volume.structures == ATELECTASIS
    lung = volume.lung_labels > 0
    assert atel.sum() > 100
    assert -330 <= np.median(volume.hu[atel]) <= 60
    k, rows, _ = np.nonzero(atel)
    lk, lrows, _ = np.nonzero(lung)
    assert rows.mean() > lrows.mean() + 20  # behind (rows run towards the back)
    assert k.mean() > lk.mean()  # below (slices run towards the feet)
    assert np.mean(lung[atel]) > 0.9 and not np.any(volume.nodule_mask[atel])


def test_cortical_bone_abuts_the_lungs_at_700_to_1200_hu(volume: PhantomVolume) -> None:
    bone = volume.structures == BONE
    beside = bone & _near(volume.lung_labels > 0, 6)
    assert beside.sum() > 500
    assert 650 <= np.percentile(volume.hu[beside], 97) <= 1350


def test_bronchi_have_air_lumens_and_soft_tissue_walls(volume: PhantomVolume) -> None:
    airway = (volume.structures == AIRWAY) & (volume.lung_labels > 0)
    hu = volume.hu[airway]
    assert np.sum(hu < -850) > 50 and np.sum(hu > -400) > 50


def test_streaks_radiate_from_the_dense_vein(built: Built) -> None:
    scene = built.scene
    assert scene.streaks is not None
    z = float(built.geometry.z[vein_slices(built)[len(vein_slices(built)) // 2]])
    canvas = Canvas(built.geometry.grid)
    n = canvas.grid.n
    planes = Planes(np.zeros((n, n), np.float32), np.zeros((n, n), np.float32))
    buffer = np.zeros((4, n, n), dtype=np.float32)
    scene.render(canvas, z, planes, buffer)
    with_streaks, labels = canvas.hu.copy(), canvas.label.copy()
    replace(scene, streaks=None).render(canvas, z, planes, buffer)
    diff = with_streaks - canvas.hu
    source = scene.streaks.source(canvas, z)
    assert source is not None
    sx, sy, _ = source
    lung = canvas.lung >= 0.5
    strong = (np.abs(diff) >= 40) & lung
    assert strong.sum() > 100
    assert np.array_equal(strong & (labels != STREAK), strong & (canvas.label != 0))
    # Every strongly shifted pixel away from the vein lies on a ray from it.
    x = canvas.grid.xs[None, :] - sx
    y = canvas.grid.ys[:, None] - sy
    far = strong & (np.hypot(x, y) > 40.0)
    xs, ys = np.broadcast_to(x, diff.shape)[far], np.broadcast_to(y, diff.shape)[far]
    perp = np.full(xs.shape, np.inf)
    for angle in scene.streaks.angles:
        along = xs * np.cos(angle) + ys * np.sin(angle)
        off = np.abs(ys * np.cos(angle) - xs * np.sin(angle))
        perp = np.where(along > 0, np.minimum(perp, off), perp)
    width = 3 * scene.streaks.width * (1 + np.hypot(xs, ys) / 120)
    assert np.mean(perp <= width) > 0.97


def test_thick_slices_average_the_thin_slices() -> None:
    common = dict(
        seed=4, nodules=0, noise_hu=0.0, pixel_spacing_mm=0.8, contrast=True, kernel="soft"
    )
    thick = generate(replace(FEATURES, slices=16, slice_thickness_mm=5.0, **common), [8], 1)
    thin = generate(
        replace(FEATURES, slices=80, slice_thickness_mm=1.0, **common), range(40, 45), 1
    )
    assert np.allclose(thick.positions_mm[0, 2], thin.positions_mm[:, 2].mean())
    inside = thick.hu[0] > -3000
    mean = thin.hu.mean(axis=0)
    assert np.max(np.abs(thick.hu[0][inside] - mean[inside])) <= 1.0
    # The thin slices differ, so the average is not trivial: 5 mm blurs what 1 mm resolves.
    assert np.mean(np.abs(thin.hu[0] - thin.hu[4])[inside] > 50) > 0.01


def test_same_seed_same_voxels_and_structures(volume: PhantomVolume) -> None:
    k = int(volume.indices[5])
    again = generate(FEATURES, slices=[k], workers=1)
    assert np.array_equal(again.hu[0], volume.hu[5])
    assert np.array_equal(again.structures[0], volume.structures[5])
    assert np.array_equal(again.nodule_mask[0], volume.nodule_mask[5])


def test_truth_npz_holds_structures_and_their_names(volume: PhantomVolume, tmp_path: Path) -> None:
    write_truth(volume, tmp_path / "truth.npz")
    with np.load(tmp_path / "truth.npz") as npz:
        assert np.array_equal(npz["structures"], volume.structures)
        names = npz["structure_names"]
    assert {i: str(name) for i, name in enumerate(names)} == STRUCTURE_NAMES
    assert int(np.asarray(volume.structures).max()) < len(names)
