"""The SEG and SR that write_results writes (frames and source references encoded here, not
by highdicom item by item) are those highdicom builds whole: same bytes, same frames."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset

from imaging_ai.analyse import Analysis
from imaging_ai.outputs import encoding
from imaging_ai.outputs.common import ordered_sources
from imaging_ai.outputs.seg import (
    SEG_SERIES_NUMBER,
    encode_segmentation,
    reference_segmentation,
    segment_label_map,
)
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.uids import OutputUids, output_uids
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Study, dciodvfy
from tests.outputs.scale import large_study


def highdicom_seg(
    analysis: Analysis, headers: list[Dataset], uids: OutputUids
) -> hd.seg.Segmentation:
    """The SEG as highdicom builds it from the whole label map, frame by frame."""
    sources, order = ordered_sources(analysis, headers)
    labels, descriptions = segment_label_map(analysis, ALGORITHM, uids)
    pixels = labels if order is None else labels[order]
    return reference_segmentation(
        sources, pixels, descriptions, ALGORITHM, uids, CREATED, SEG_SERIES_NUMBER, True
    )


def encoded(ds: Dataset) -> bytes:
    out = BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def both(
    analysis: Analysis, headers: list[Dataset], uids: OutputUids
) -> tuple[bytes, bytes, bytes, bytes]:
    """(fast SEG, highdicom SEG, SR on the fast SEG, SR on highdicom's SEG), encoded."""
    fast = encode_segmentation(analysis, headers, ALGORITHM, uids, created=CREATED)
    whole = highdicom_seg(analysis, headers, uids)
    srs = [
        build_measurement_report(
            analysis, headers, seg, ALGORITHM, uids, impression=IMPRESSION, created=CREATED
        )
        for seg in (fast, whole)
    ]
    return encoded(fast.dataset), encoded(whole), encoded(srs[0]), encoded(srs[1])


def test_phantom_seg_and_sr_are_highdicoms_byte_for_byte(study: Study) -> None:
    fast_seg, seg, fast_sr, sr = both(study.analysis, study.headers, study.uids)
    assert fast_seg == seg
    assert fast_sr == sr


def test_frames_match_highdicoms_and_the_label_map_frame_by_frame(study: Study) -> None:
    fast_seg, seg, _, _ = both(study.analysis, study.headers, study.uids)
    fast, whole = pydicom.dcmread(BytesIO(fast_seg)), pydicom.dcmread(BytesIO(seg))
    assert fast.NumberOfFrames == whole.NumberOfFrames > 0
    fast_pixels, whole_pixels = fast.pixel_array, whole.pixel_array
    labels, _ = segment_label_map(study.analysis, ALGORITHM, study.uids)
    slice_of = {uid: k for k, uid in enumerate(study.analysis.volume.sop_instance_uids)}
    groups = fast.PerFrameFunctionalGroupsSequence, whole.PerFrameFunctionalGroupsSequence
    frames = zip(*groups, strict=True)
    for i, (mine, theirs) in enumerate(frames):
        assert mine == theirs, f"functional groups of frame {i + 1}"
        np.testing.assert_array_equal(fast_pixels[i], whole_pixels[i])
        number = mine.SegmentIdentificationSequence[0].ReferencedSegmentNumber
        source = mine.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID
        np.testing.assert_array_equal(fast_pixels[i], labels[slice_of[source]] == number)


@pytest.mark.parametrize("irregular", [False, True], ids=["even", "uneven-spacing"])
def test_generated_series_without_spacing_attribute(irregular: bool) -> None:
    """Headers without Spacing Between Slices: highdicom derives it from every position, or
    leaves it out where slices are unevenly spaced; the fast SEG must do the same."""
    analysis, headers = large_study(slices=40, size=64, lesions=2)
    assert "SpacingBetweenSlices" not in headers[0]
    if irregular:
        z = [float(v) for v in headers[7].ImagePositionPatient]
        headers[7].ImagePositionPatient = [z[0], z[1], z[2] + 0.4]
    uids = output_uids(analysis.volume.study_instance_uid, 3)
    fast_seg, seg, fast_sr, sr = both(analysis, headers, uids)
    measures = pydicom.dcmread(BytesIO(seg)).SharedFunctionalGroupsSequence[0]
    assert ("SpacingBetweenSlices" in measures.PixelMeasuresSequence[0]) is not irregular
    assert fast_seg == seg
    assert fast_sr == sr


def test_frames_not_filling_whole_bytes_take_highdicoms_path() -> None:
    """6x6 pixels: PS3.5 packs 1-bit frames continuously, so a frame starts mid-byte."""
    analysis, headers = large_study(slices=20, size=6, lesions=0)
    uids = output_uids(analysis.volume.study_instance_uid, 4)
    fast = encode_segmentation(analysis, headers, ALGORITHM, uids, created=CREATED)
    assert fast.segments is None
    fast_seg, seg, fast_sr, sr = both(analysis, headers, uids)
    assert fast_seg == seg and fast_sr == sr


def test_300_slices_pass_dciodvfy_as_written(tmp_path: Path) -> None:
    analysis, headers = large_study(slices=300, size=512, lesions=6)
    uids = output_uids(analysis.volume.study_instance_uid, 5)
    seg = encode_segmentation(analysis, headers, ALGORITHM, uids, created=CREATED)
    sr = build_measurement_report(analysis, headers, seg, ALGORITHM, uids, created=CREATED)
    seg.dataset.save_as(tmp_path / "seg.dcm", enforce_file_format=True)
    sr.save_as(tmp_path / "sr.dcm", enforce_file_format=True)
    assert dciodvfy(tmp_path / "seg.dcm")[0] == []
    assert dciodvfy(tmp_path / "sr.dcm")[0] == []
    back = hd.seg.segread(tmp_path / "seg.dcm")
    assert back.NumberOfFrames == seg.dataset.NumberOfFrames
    report = hd.sr.srread(tmp_path / "sr.dcm").content
    assert isinstance(report, hd.sr.MeasurementReport)
    groups = report.get_volumetric_roi_measurement_groups()
    assert len(groups) == 8
    frames = back.PerFrameFunctionalGroupsSequence
    for group in groups:
        segment = group.referenced_segment
        assert isinstance(segment, hd.sr.ReferencedSegment)
        (number,) = segment.referenced_segment_numbers or []
        on = [
            f.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID
            for f in frames
            if f.SegmentIdentificationSequence[0].ReferencedSegmentNumber == number
        ]
        listed = [i.referenced_sop_instance_uid for i in segment.source_images_for_segmentation]
        assert listed == on


@pytest.mark.parametrize("value", ["1.2.3", "1.2.34", ""])
def test_uid_layout_is_pydicoms(value: str) -> None:
    assert encoding.uid(0x00081155, value) == encoding.element(DataElement(0x00081155, "UI", value))
