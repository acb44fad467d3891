"""Which series of a study is analysed (pick_series), and the slice thickness a Volume carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid

from imaging_ai.inputcheck import input_caveats
from imaging_ai.volume import Volume, group_series, load_series, pick_series
from tests.dicom_factory import ct_dataset
from tests.test_preprocess import write_enhanced


def series(
    folder: Path,
    *,
    slices: int,
    step_mm: float,
    thickness_mm: float | None,
    number: int = 1,
    image_type: tuple[str, ...] = ("ORIGINAL", "PRIMARY", "AXIAL"),
    study_uid: str = "1.2.826.0.1.3680043.8.498.1",
) -> list[Path]:
    """A small axial series from z = 0 downwards; files in reverse order of position."""
    folder.mkdir(parents=True)
    uid = generate_uid()
    paths = []
    for k in reversed(range(slices)):
        ds = ct_dataset(study_uid, uid, k, size=8)
        ds.ImagePositionPatient = [-100.0, -100.0, -step_mm * k]
        ds.SeriesNumber, ds.ImageType = number, list(image_type)
        if thickness_mm is None:
            del ds.SliceThickness
        else:
            ds.SliceThickness = thickness_mm
        paths.append(folder / f"{k:04d}.dcm")
        ds.save_as(paths[-1], enforce_file_format=True)
    return paths


def test_thinnest_covering_series_wins_over_more_slices(tmp_path: Path) -> None:
    # A 5 mm series reconstructed every 2 mm has more slices than the 2 mm series every
    # 2.5 mm over the same chest; the old rule (most slices) took the thick one.
    thick = series(tmp_path / "thick", slices=73, step_mm=2.0, thickness_mm=5.0, number=2)
    thin = series(tmp_path / "thin", slices=59, step_mm=2.5, thickness_mm=2.0, number=3)
    groups = group_series(thick + thin)
    assert groups[pick_series(groups)] == thin


def test_a_thin_slab_does_not_win_over_the_whole_chest(tmp_path: Path) -> None:
    whole = series(tmp_path / "whole", slices=30, step_mm=5.0, thickness_mm=5.0, number=2)
    # 1 mm, 60 slices, but 59 mm of a 145 mm chest: below 60 % of the longest extent.
    slab = series(tmp_path / "slab", slices=60, step_mm=1.0, thickness_mm=1.0, number=3)
    groups = group_series(whole + slab)
    assert groups[pick_series(groups)] == whole


@pytest.mark.parametrize(
    "image_type",
    [("DERIVED", "SECONDARY", "REFORMATTED"), ("MPR",)],  # a single value is read as text
)
def test_reformats_are_not_suitable(tmp_path: Path, image_type: tuple[str, ...]) -> None:
    original = series(tmp_path / "orig", slices=30, step_mm=5.0, thickness_mm=5.0)
    mpr = series(tmp_path / "mpr", slices=150, step_mm=1.0, thickness_mm=1.0, image_type=image_type)
    groups = group_series(original + mpr)
    assert groups[pick_series(groups)] == original


def test_spacing_stands_for_a_missing_thickness(tmp_path: Path) -> None:
    # Without SliceThickness, 2 mm spacing is thinner than a stated 2.5 mm (which has more
    # slices, overlapping).
    stated = series(tmp_path / "stated", slices=118, step_mm=1.25, thickness_mm=2.5, number=1)
    unstated = series(tmp_path / "unstated", slices=74, step_mm=2.0, thickness_mm=None)
    groups = group_series(stated + unstated)
    assert groups[pick_series(groups)] == unstated


def test_equal_thickness_goes_to_more_slices_then_series_number(tmp_path: Path) -> None:
    short = series(tmp_path / "short", slices=40, step_mm=2.5, thickness_mm=2.5, number=1)
    long = series(tmp_path / "long", slices=50, step_mm=2.5, thickness_mm=2.5, number=4)
    same = series(tmp_path / "same", slices=50, step_mm=2.5, thickness_mm=2.5, number=3)
    groups = group_series(short + long + same)
    assert groups[pick_series(groups)] == same


def test_an_enhanced_ct_series_is_measured_by_its_frames(tmp_path: Path) -> None:
    # 20 frames every 2.5 mm (47.5 mm, no SliceThickness) against 24 slices 5 mm thick every
    # 2 mm (46 mm): the multi-frame file's extent comes from its per-frame positions.
    (tmp_path / "enhanced").mkdir()
    enhanced = tmp_path / "enhanced" / "ct.dcm"
    write_enhanced(enhanced)
    thick = series(tmp_path / "thick", slices=24, step_mm=2.0, thickness_mm=5.0)
    groups = group_series([*thick, enhanced])
    assert groups[pick_series(groups)] == [enhanced]


def test_volume_carries_slice_thickness(tmp_path: Path) -> None:
    paths = series(tmp_path / "s", slices=5, step_mm=5.0, thickness_mm=5.0)
    assert load_series(paths).slice_thickness_mm == pytest.approx(5.0)
    bare = series(tmp_path / "bare", slices=5, step_mm=5.0, thickness_mm=None)
    assert load_series(bare).slice_thickness_mm is None


def test_slice_thickness_of_enhanced_ct_from_its_functional_group(tmp_path: Path) -> None:
    path = tmp_path / "enhanced.dcm"
    write_enhanced(path, slices=6)
    assert load_series([path]).slice_thickness_mm is None  # the factory writes none
    ds = pydicom.dcmread(path)
    ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].SliceThickness = 3.0
    ds.save_as(path)
    assert load_series([path]).slice_thickness_mm == pytest.approx(3.0)


# --- caveats ---------------------------------------------------------------------------------


def volume(step_mm: float, thickness_mm: float | None) -> Volume:
    return Volume(
        hu=np.zeros((4, 2, 2), np.float32),
        origin_mm=(0.0, 0.0, 0.0),
        spacing_mm=(0.7, 0.7, step_mm),
        direction=np.eye(3),
        sop_instance_uids=tuple("1234"),
        series_instance_uid="1.2",
        study_instance_uid="1.3",
        frame_of_reference_uid="1.4",
        slice_thickness_mm=thickness_mm,
    )


@pytest.mark.parametrize(
    ("step", "thickness", "expected"),
    [
        (1.25, 1.25, ()),
        (2.5, 2.5, ()),  # the limit itself is allowed
        (2.5, 2.50001, ()),  # decimal rounding of 2.5
        (5.0, 5.0, ("5.0 mm thick",)),
        (5.0, None, ("5.0 mm thick",)),  # the spacing stands for the thickness
        (1.0, 3.0, ("3.0 mm thick",)),  # overlapping thick slices
        (2.0, 1.0, ("2.0 mm apart and 1.0 mm thick",)),  # gaps between thin slices
        (2.8, 2.0, ("2.8 mm apart",)),  # sparser than 2.5 mm
        (10.0, 5.0, ("5.0 mm thick", "10.0 mm apart")),
    ],
)
def test_input_caveats(step: float, thickness: float | None, expected: tuple[str, ...]) -> None:
    caveats = input_caveats(volume(step, thickness))
    assert len(caveats) == len(expected)
    for caveat, words in zip(caveats, expected, strict=True):
        assert words in caveat
    if expected and expected[0].endswith("thick") and "apart" not in expected[0]:
        assert "nodule detection is limited" in caveats[0]


def test_explicit_thickness_wins_over_the_volumes(tmp_path: Path) -> None:
    assert input_caveats(volume(1.0, 1.0), 5.0)[0].startswith("Slices are 5.0 mm thick")
