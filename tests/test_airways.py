"""Tests for imaging_ai.airways and its use in imaging_ai.lungs: the trachea and main bronchi
found on phantoms, taken off the lung labels, and nothing else taken with them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate
from imaging_ai_devkit.phantom.structures import AIRWAY
from numpy.typing import NDArray

from imaging_ai import airways as airways_module
from imaging_ai.airways import central_airways
from imaging_ai.lungs import largest_per_side, lungs_only
from imaging_ai.postprocess import RIGHT_LUNG
from imaging_ai.volume import Volume

# 2.5 mm slices of a whole chest: the trachea runs from slice 0 to the carina near slice 38.
SPEC = PhantomSpec(slices=120, seed=4, nodules=1, slice_thickness_mm=2.5)


def _volume(phantom: PhantomVolume) -> Volume:
    """The phantom as a Volume, slices head to feet (the normal points to the feet)."""
    first = phantom.positions_mm[0]
    return Volume(
        hu=np.rint(phantom.hu).astype(np.float32),
        origin_mm=(float(first[0]), float(first[1]), float(first[2])),
        spacing_mm=phantom.spacing_mm,
        direction=np.diag([1.0, 1.0, -1.0]),
        sop_instance_uids=tuple(f"2.25.{k}" for k in range(len(phantom.indices))),
        series_instance_uid="2.25.1",
        study_instance_uid="2.25.2",
        frame_of_reference_uid="2.25.3",
    )


@pytest.fixture(scope="module")
def upper() -> PhantomVolume:
    """The neck and upper chest down past the carina (125 mm)."""
    return generate(SPEC, slices=range(0, 50), workers=2)


def _airway_lumen(phantom: PhantomVolume) -> NDArray[np.bool_]:
    """The air of the phantom's trachea and main bronchi: airway voxels outside its lungs."""
    airway = phantom.structures == AIRWAY
    return airway & (phantom.lung_labels == 0) & (phantom.hu < -600)


def _as_lung_model_gives(phantom: PhantomVolume) -> NDArray[np.uint8]:
    """The true lungs with the central airways' lumen labelled right lung, as `lung-seg`
    labels some of it on real CT."""
    labels = phantom.lung_labels.copy()
    labels[_airway_lumen(phantom)] = RIGHT_LUNG
    return labels


def test_trachea_is_found_and_taken_off_the_lungs(upper: PhantomVolume) -> None:
    volume, lumen = _volume(upper), _airway_lumen(upper)
    labels = _as_lung_model_gives(upper)
    airways = central_airways(volume, labels)
    assert airways is not None and airways.carina_slice is not None
    assert 30 <= airways.carina_slice <= 45
    covered = airways.full(labels.shape) & lumen
    assert covered.sum() >= 0.9 * lumen.sum()
    out = lungs_only(labels, volume)
    truth = upper.lung_labels > 0
    assert (lumen & (out > 0)).sum() <= 0.05 * lumen.sum()
    assert np.count_nonzero(truth & (out == 0)) <= 10  # no parenchyma taken with it


def test_slices_stored_feet_first_give_the_same_airways(upper: PhantomVolume) -> None:
    volume, labels = _volume(upper), _as_lung_model_gives(upper)
    n = volume.hu.shape[0]
    last = volume.index_to_lps([0.0, 0.0, float(n - 1)])
    flipped = replace(
        volume,
        hu=volume.hu[::-1].copy(),
        origin_mm=(float(last[0]), float(last[1]), float(last[2])),
        direction=np.eye(3),
    )
    head_first = central_airways(volume, labels)
    feet_first = central_airways(flipped, labels[::-1].copy())
    assert head_first is not None and feet_first is not None
    shape = labels.shape
    assert np.array_equal(head_first.full(shape), feet_first.full(shape)[::-1])


def test_no_trachea_in_view_takes_nothing() -> None:
    lower = generate(SPEC, slices=range(70, 120), workers=2)  # lower chest and upper abdomen
    volume, labels = _volume(lower), lower.lung_labels.copy()
    assert central_airways(volume, labels) is None
    assert np.array_equal(lungs_only(labels.copy(), volume), largest_per_side(labels))


def test_lung_reached_through_the_bronchial_wall_is_not_taken(
    upper: PhantomVolume, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the carina the right main bronchus is opened into an emphysematous right lung
    (no wall, the parenchyma as dark as the lumen): that branch ends, the lung stays. Without
    the leak control the same volume loses tens of thousands of lung voxels."""
    volume, labels = _volume(upper), upper.lung_labels.copy()
    found = central_airways(volume, labels)
    assert found is not None and found.carina_slice is not None
    hu = _opened_into_lung(volume.hu, labels, found.full(labels.shape), found.carina_slice)
    leaky = replace(volume, hu=hu)
    airways = central_airways(leaky, labels)
    assert airways is not None
    assert np.count_nonzero(airways.full(labels.shape) & (labels > 0)) == 0
    out = lungs_only(labels.copy(), leaky)
    assert np.array_equal(out > 0, labels > 0)
    monkeypatch.setattr(airways_module, "MAX_AREA_MM2", 1e9)
    monkeypatch.setattr(airways_module, "MAX_GROWTH", 1e9)
    uncontrolled = central_airways(leaky, labels)
    assert uncontrolled is not None
    assert np.count_nonzero(uncontrolled.full(labels.shape) & (labels > 0)) > 10_000


def _opened_into_lung(
    hu: NDArray[np.float32], lungs: NDArray[np.uint8], airways: NDArray[np.bool_], carina: int
) -> NDArray[np.float32]:
    """``hu`` with six slices below the carina joining the right main bronchus to the right
    lung through an air channel, and the right lung there at -985 HU."""
    out, rng = hu.copy(), np.random.default_rng(0)
    for k in range(carina + 1, carina + 7):
        cols = np.nonzero(airways[k].any(axis=0))[0]
        middle = (int(cols.min()) + int(cols.max())) // 2
        rows, columns = np.nonzero(airways[k][:, :middle])  # the patient's right: low columns
        row, inner = int(rows.mean()), int(columns.min())
        lung_cols = np.nonzero(lungs[k, row] == RIGHT_LUNG)[0]
        edge = int(lung_cols[lung_cols < inner].max())
        out[k, row - 4 : row + 5, edge - 2 : inner + 3] = -990.0
        emphysema = lungs[k] == RIGHT_LUNG
        out[k][emphysema] = -985.0 + rng.normal(0.0, 8.0, int(emphysema.sum())).astype(np.float32)
    return out
