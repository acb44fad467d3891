"""evaluate.contours: a tiny synthetic RTSTRUCT (written with pydicom) rasterised on a volume."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from imaging_ai.errors import InvalidDataset
from imaging_ai.evaluate.cases import load_lesions
from imaging_ai.evaluate.contours import rtstruct_lesions
from tests.evaluate.helpers import make_volume

# 0.5 mm pixels, 2 mm slices, origin (-10, -10, -4): x = -5 mm is column 10, z = 0 is slice 2.
VOLUME = make_volume((5, 40, 40), spacing=(0.5, 0.5, 2.0), origin=(-10.0, -10.0, -4.0))


def contour(x0: float, y0: float, x1: float, y1: float, z: float) -> Dataset:
    item = Dataset()
    item.ContourGeometricType = "CLOSED_PLANAR"
    points = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    item.NumberOfContourPoints = len(points)
    item.ContourData = [v for x, y in points for v in (x, y, z)]
    return item


def rtstruct() -> Dataset:
    ds = Dataset()
    ds.Modality = "RTSTRUCT"
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.481.3"
    ds.SOPInstanceUID = generate_uid()
    rois = []
    for number, name in ((1, "GTV"), (2, "Heart")):
        roi = Dataset()
        roi.ROINumber = number
        roi.ROIName = name
        rois.append(roi)
    ds.StructureSetROISequence = Sequence(rois)
    gtv = Dataset()
    gtv.ReferencedROINumber = 1
    gtv.ContourSequence = Sequence(
        [
            contour(-5, -5, 0, 0, 0.0),  # columns/rows 10..20 on slice 2
            contour(-3, -3, -2, -2, 0.0),  # a hole: columns/rows 14..16
            contour(-5, -5, 0, 0, 2.1),  # slice 3 (z 2.1 is nearest 2)
        ]
    )
    heart = Dataset()
    heart.ReferencedROINumber = 2
    heart.ContourSequence = Sequence([contour(5, 5, 8, 8, -4.0)])
    ds.ROIContourSequence = Sequence([gtv, heart])
    return ds


def test_named_roi_rasterised_slice_by_slice_with_holes() -> None:
    (gtv,) = rtstruct_lesions(rtstruct(), VOLUME, ["GTV"])
    voxels = {tuple(v) for v in gtv.voxels.tolist()}
    assert {v[0] for v in voxels} == {2, 3}
    assert len([v for v in voxels if v[0] == 2]) == 121 - 9
    assert len([v for v in voxels if v[0] == 3]) == 121
    assert (2, 15, 15) not in voxels and (3, 15, 15) in voxels
    assert (2, 10, 20) in voxels and (2, 21, 20) not in voxels
    assert gtv.name == "GTV" and gtv.relevant


def test_roi_must_be_named_when_there_are_several() -> None:
    with pytest.raises(InvalidDataset, match="lesion_roi"):
        rtstruct_lesions(rtstruct(), VOLUME, None)
    with pytest.raises(InvalidDataset, match="Lung"):
        rtstruct_lesions(rtstruct(), VOLUME, ["Lung"])


def test_case_toml_names_the_file_and_roi(tmp_path: Path) -> None:
    ds = rtstruct()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.save_as(tmp_path / "structures.dcm", enforce_file_format=True)
    (tmp_path / "case.toml").write_text('lesion_file = "structures.dcm"\nlesion_roi = "Heart"\n')
    lesions = load_lesions(tmp_path, VOLUME)
    assert lesions is not None
    assert [lesion.name for lesion in lesions] == ["Heart"]
    assert {tuple(v) for v in lesions[0].voxels.tolist()} >= {(0, 30, 30), (0, 36, 36)}
