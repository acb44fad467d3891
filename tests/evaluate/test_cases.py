"""evaluate.cases: NIfTI / MetaImage volumes, label maps resampled, mask lesions, finding cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from imaging_ai.errors import UnsupportedInput
from imaging_ai.evaluate.cases import find_cases, load_case, load_image

SPACING = (0.8, 0.7, 2.5)
ORIGIN = (-100.0, 50.0, -300.0)
# Rows run towards the patient's anterior (-y in LPS), as in a NIfTI stored RAS-wise.
DIRECTION = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0)


def image(array: np.ndarray) -> sitk.Image:
    out = sitk.GetImageFromArray(array)
    out.SetSpacing(SPACING)
    out.SetOrigin(ORIGIN)
    out.SetDirection(DIRECTION)
    return out


def hu() -> np.ndarray:
    return np.arange(6 * 10 * 12, dtype=np.int16).reshape(6, 10, 12) - 1000


@pytest.mark.parametrize("name", ["image.nii.gz", "image.mha"])
def test_volume_file_keeps_voxels_and_lps_geometry(tmp_path: Path, name: str) -> None:
    written = image(hu())
    sitk.WriteImage(written, str(tmp_path / name))
    volume = load_image(tmp_path)
    assert volume.hu.shape == (6, 10, 12)
    assert volume.hu.dtype == np.float32
    assert np.array_equal(volume.hu, hu().astype(np.float32))
    assert volume.spacing_mm == pytest.approx(SPACING)
    assert volume.origin_mm == pytest.approx(ORIGIN)
    for ijk in [(0, 0, 0), (11, 9, 5), (3, 7, 2)]:
        want = written.TransformIndexToPhysicalPoint(ijk)
        assert volume.index_to_lps(ijk) == pytest.approx(want)
    assert len(set(volume.sop_instance_uids)) == 6


def test_lungs_and_lesions_resampled_onto_the_image(tmp_path: Path) -> None:
    sitk.WriteImage(image(hu()), str(tmp_path / "image.nii.gz"))
    lungs = np.zeros((6, 10, 12), np.uint8)
    lungs[:, :, :6] = 1
    lungs[:, :, 6:] = 2
    # The lungs on a grid twice as fine in x: nearest-neighbour brings them back exactly.
    fine = sitk.GetImageFromArray(np.repeat(lungs, 2, axis=2))
    fine.SetSpacing((SPACING[0] / 2, SPACING[1], SPACING[2]))
    fine.SetOrigin((ORIGIN[0] - SPACING[0] / 4, ORIGIN[1], ORIGIN[2]))
    fine.SetDirection(DIRECTION)
    sitk.WriteImage(fine, str(tmp_path / "lungs.nii.gz"))
    lesions = np.zeros((6, 10, 12), np.uint8)
    lesions[1:3, 2:4, 2:4] = 1  # 8 voxels
    lesions[4, 7, 9] = 1  # one voxel, not touching
    lesions[5, 8, 10] = 1  # touches the previous one diagonally: 26-connected
    sitk.WriteImage(image(lesions), str(tmp_path / "lesions.nii.gz"))
    case = load_case(tmp_path)
    assert case.lungs is not None and np.array_equal(case.lungs, lungs)
    assert case.lesions is not None
    assert sorted(len(x.voxels) for x in case.lesions) == [2, 8]


def test_find_cases_lists_folders_with_an_image(tmp_path: Path) -> None:
    (tmp_path / "b" / "image").mkdir(parents=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "image.mha").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    assert [p.name for p in find_cases(tmp_path)] == ["a", "b"]
    with pytest.raises(UnsupportedInput, match="no case"):
        find_cases(tmp_path / "notes")
