"""DICOM SEG: valid per dciodvfy, read back with highdicom and pydicom, frames on their images."""

from __future__ import annotations

import dataclasses
from copy import deepcopy
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest

from imaging_ai.errors import InvalidDataset, UnsupportedInput
from imaging_ai.outputs.seg import build_segmentation
from imaging_ai.outputs.uids import output_uids
from imaging_ai.postprocess import LEFT_LUNG, RIGHT_LUNG
from imaging_ai.volume import load_series
from tests.outputs.conftest import ALGORITHM, CREATED, Built, Study, dciodvfy


def expected_masks(study: Study) -> dict[str, np.ndarray]:
    """Each segment's voxels in volume order, by label."""
    labels = study.analysis.labels
    masks = {"Right lung": labels == RIGHT_LUNG, "Left lung": labels == LEFT_LUNG}
    for lesion in study.analysis.lesions:
        mask = np.zeros(labels.shape, bool)
        mask[tuple(lesion.voxel_index.T)] = True
        masks[f"Nodule {lesion.number}"] = mask
    return masks


def test_seg_passes_dciodvfy(built: Built) -> None:
    errors, warnings = dciodvfy(built.seg_path)
    assert errors == [], errors
    print("dciodvfy SEG warnings:", warnings)


def test_segments_have_labels_codes_algorithm_and_tracking(study: Study, built: Built) -> None:
    seg = hd.seg.segread(built.seg_path)
    assert seg.segmentation_type == hd.seg.SegmentationTypeValues.BINARY
    assert seg.segment_numbers == [1, 2, 3, 4]
    described = [seg.get_segment_description(n) for n in seg.segment_numbers]
    assert [d.segment_label for d in described] == [
        "Right lung",
        "Left lung",
        "Nodule 1",
        "Nodule 2",
    ]
    assert [d.segmented_property_type.value for d in described] == [
        "3341006",
        "44029006",
        "27925004",
        "27925004",
    ]
    categories = [d.segmented_property_category.value for d in described]
    assert categories == ["91723000", "91723000", "49755003", "49755003"]
    for d, model in zip(
        described, ["lung-seg", "lung-seg", "nodule-det", "nodule-det"], strict=True
    ):
        assert d.algorithm_type == hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC
        algorithm = d.algorithm_identification[0]
        assert (algorithm.AlgorithmName, algorithm.AlgorithmFamilyCodeSequence[0].CodeValue) == (
            model,
            "123110",
        )
        assert algorithm.AlgorithmVersion == ("0.1.0" if model == "lung-seg" else "0.2.0")
    nodule = described[2]
    assert [c.value for c in nodule.anatomic_regions] == ["39607008"]
    assert [c.value for c in nodule.primary_anatomic_structures] == ["3341006"]  # right lung
    assert nodule.tracking_uid == study.uids.tracking_uid("nodule-1")
    assert nodule.tracking_id == "Nodule 1"


def test_identity_device_and_ai_marking(study: Study, built: Built) -> None:
    ds = pydicom.dcmread(built.seg_path)
    assert ds.SOPInstanceUID == study.uids.seg_instance
    assert ds.SeriesInstanceUID == study.uids.seg_series
    assert ds.StudyInstanceUID == study.analysis.volume.study_instance_uid
    assert ds.FrameOfReferenceUID == study.analysis.volume.frame_of_reference_uid
    assert (ds.Manufacturer, ds.ManufacturerModelName, ds.DeviceSerialNumber) == (
        "imaging-ai",
        "imaging-ai",
        "node-1",
    )
    assert ds.SoftwareVersions == ALGORITHM.software_version
    assert ds.ContentLabel == "AI_LUNG_NODULES"
    assert "AI-generated" in ds.ContentDescription
    assert ds.PatientID == study.headers[0].PatientID
    assert (
        ds.ReferencedSeriesSequence[0].SeriesInstanceUID
        == study.analysis.volume.series_instance_uid
    )


def test_frames_reference_their_source_images_in_volume_order(study: Study, built: Built) -> None:
    """Each kept frame names the source image at its position; only empty frames are left out."""
    ds = pydicom.dcmread(built.seg_path)
    headers = {h.SOPInstanceUID: h for h in study.headers}
    masks = list(expected_masks(study).values())
    frames = ds.PerFrameFunctionalGroupsSequence
    expected_count = sum(int(np.any(m[k])) for m in masks for k in range(m.shape[0]))
    assert len(frames) == ds.NumberOfFrames == expected_count
    volume_index = {uid: k for k, uid in enumerate(study.analysis.volume.sop_instance_uids)}
    seen = set()
    for frame in frames:
        segment = frame.SegmentIdentificationSequence[0].ReferencedSegmentNumber
        source = frame.DerivationImageSequence[0].SourceImageSequence[0]
        position = frame.PlanePositionSequence[0].ImagePositionPatient
        assert source.ReferencedSOPClassUID == pydicom.uid.CTImageStorage
        assert np.allclose(position, headers[source.ReferencedSOPInstanceUID].ImagePositionPatient)
        assert masks[segment - 1][volume_index[source.ReferencedSOPInstanceUID]].any()
        seen.add((segment, source.ReferencedSOPInstanceUID))
    assert len(seen) == len(frames)


def test_pixels_read_back_per_source_image(study: Study, built: Built) -> None:
    seg = hd.seg.segread(built.seg_path)
    uids = list(study.analysis.volume.sop_instance_uids)
    pixels = seg.get_pixels_by_source_instance(uids, segment_numbers=[1, 2, 3, 4])
    for index, mask in enumerate(expected_masks(study).values()):
        np.testing.assert_array_equal(pixels[..., index].astype(bool), mask)


def test_same_job_same_bytes(study: Study, built: Built, tmp_path: Path) -> None:
    again = build_segmentation(
        study.analysis, study.headers, ALGORITHM, study.uids, created=CREATED
    )
    again.save_as(tmp_path / "again.dcm")
    assert (tmp_path / "again.dcm").read_bytes() == built.seg_path.read_bytes()


def test_another_job_gives_another_seg(study: Study, built: Built) -> None:
    other = build_segmentation(
        study.analysis, study.headers, ALGORITHM, output_uids(study.uids.study_uid, 42)
    )
    assert other.SOPInstanceUID != built.seg.SOPInstanceUID
    assert other.SeriesInstanceUID != built.seg.SeriesInstanceUID
    tracking = {other.get_segment_description(n).tracking_uid for n in other.segment_numbers}
    ours = {built.seg.get_segment_description(n).tracking_uid for n in built.seg.segment_numbers}
    assert tracking.isdisjoint(ours)


def test_all_frames_kept_when_asked(study: Study, tmp_path: Path) -> None:
    seg = build_segmentation(
        study.analysis, study.headers, ALGORITHM, study.uids, omit_empty_frames=False
    )
    assert seg.NumberOfFrames == 4 * study.analysis.labels.shape[0]
    seg.save_as(tmp_path / "full.dcm")
    assert dciodvfy(tmp_path / "full.dcm")[0] == []


def test_a_missing_lung_is_left_out_and_segments_renumbered(study: Study) -> None:
    labels = study.analysis.labels.copy()
    labels[labels == LEFT_LUNG] = 0
    analysis = dataclasses.replace(study.analysis, labels=labels)
    seg = build_segmentation(analysis, study.headers, ALGORITHM, study.uids)
    described = [seg.get_segment_description(n) for n in seg.segment_numbers]
    assert [d.segment_label for d in described] == ["Right lung", "Nodule 1", "Nodule 2"]


def test_nothing_found_is_refused(study: Study) -> None:
    analysis = dataclasses.replace(
        study.analysis, labels=np.zeros_like(study.analysis.labels), lesions=()
    )
    with pytest.raises(UnsupportedInput, match="nothing to segment"):
        build_segmentation(analysis, study.headers, ALGORITHM, study.uids)


def test_missing_source_header_is_named(study: Study) -> None:
    with pytest.raises(InvalidDataset, match="not among the 11 headers"):
        build_segmentation(study.analysis, study.headers[1:], ALGORITHM, study.uids)


def test_sparse_source_headers_still_build(study: Study) -> None:
    """Type 2 patient/study attributes may be absent from a source; the SEG has them empty."""
    sparse = []
    for header in study.headers:
        copy = deepcopy(header)
        for keyword in ("PatientBirthDate", "PatientSex", "StudyID", "ReferringPhysicianName"):
            if keyword in copy:
                delattr(copy, keyword)
        sparse.append(copy)
    seg = build_segmentation(study.analysis, sparse, ALGORITHM, study.uids)
    assert seg.PatientBirthDate == "" and seg.PatientSex == ""
    assert "PatientBirthDate" not in sparse[0]


def test_multiframe_source_frames_follow_the_instance(study: Study, tmp_path: Path) -> None:
    """A Legacy Converted Enhanced CT source: frames reference (instance, frame number)."""
    full = [pydicom.dcmread(p) for p in study.paths]
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        full,
        series_instance_uid=hd.UID(),
        series_number=3,
        sop_instance_uid=hd.UID(),
        instance_number=1,
    )
    enhanced.save_as(tmp_path / "enhanced.dcm")
    volume = load_series([tmp_path / "enhanced.dcm"])
    assert np.array_equal(volume.hu, study.analysis.volume.hu)
    analysis = dataclasses.replace(study.analysis, volume=volume)
    header = pydicom.dcmread(tmp_path / "enhanced.dcm", stop_before_pixels=True)
    seg = build_segmentation(analysis, [header], ALGORITHM, study.uids)
    seg.save_as(tmp_path / "seg.dcm")
    assert dciodvfy(tmp_path / "seg.dcm")[0] == []
    frame_of = dict(zip(range(len(volume.frame_numbers)), volume.frame_numbers, strict=True))
    lesion = study.analysis.lesions[0]
    lesion_frames = {frame_of[k] for k in np.unique(lesion.voxel_index[:, 0])}
    referenced = {
        f.DerivationImageSequence[0].SourceImageSequence[0].ReferencedFrameNumber
        for f in seg.PerFrameFunctionalGroupsSequence
        if f.SegmentIdentificationSequence[0].ReferencedSegmentNumber == 3
    }
    assert referenced == lesion_frames
    numbers = list(range(1, len(volume.frame_numbers) + 1))
    pixels = seg.get_pixels_by_source_frame(header.SOPInstanceUID, numbers, segment_numbers=[3])
    in_volume_order = pixels[np.asarray(volume.frame_numbers) - 1, ..., 0]
    np.testing.assert_array_equal(in_volume_order.astype(bool), expected_masks(study)["Nodule 1"])
