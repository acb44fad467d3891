"""TID 1500 SR: valid per dciodvfy, opens in DCMTK, reads back with highdicom to the same values."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import highdicom as hd
import pydicom
import pytest

from imaging_ai.outputs.common import AXIS_DIGITS, LESION_VOLUME_DIGITS, LUNG_VOLUME_DIGITS
from imaging_ai.outputs.seg import build_segmentation
from imaging_ai.outputs.sr import build_measurement_report, device_uid
from imaging_ai.postprocess import LEFT_LUNG
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Built, Study, dciodvfy


def groups(path: Path) -> dict[str, hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations]:
    report = hd.sr.srread(path).content
    assert isinstance(report, hd.sr.MeasurementReport)
    return {str(g.tracking_identifier): g for g in report.get_volumetric_roi_measurement_groups()}


def test_sr_passes_dciodvfy(built: Built) -> None:
    errors, warnings = dciodvfy(built.sr_path)
    assert errors == [], errors
    print("dciodvfy SR warnings:", warnings)


def test_dsrdump_opens_it(built: Built) -> None:
    if shutil.which("dsrdump") is None:
        pytest.skip("needs DCMTK's dsrdump (make deps-system)")
    run = subprocess.run(
        ["dsrdump", str(built.sr_path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    for expected in ("Imaging Measurement Report", "PARTIAL", "UNVERIFIED", "PRELIMINARY"):
        assert expected in run.stdout


def test_flags_identity_and_evidence(study: Study, built: Built) -> None:
    ds = pydicom.dcmread(built.sr_path)
    assert ds.SOPClassUID == pydicom.uid.Comprehensive3DSRStorage
    assert (ds.SOPInstanceUID, ds.SeriesInstanceUID) == (
        study.uids.sr_instance,
        study.uids.sr_series,
    )
    assert (ds.CompletionFlag, ds.VerificationFlag, ds.PreliminaryFlag) == (
        "PARTIAL",
        "UNVERIFIED",
        "PRELIMINARY",
    )
    assert ds.Manufacturer == "imaging-ai"
    assert ds.AccessionNumber == study.headers[0].AccessionNumber
    evidence = {
        item.ReferencedSOPInstanceUID
        for study_item in ds.CurrentRequestedProcedureEvidenceSequence
        for series in study_item.ReferencedSeriesSequence
        for item in series.ReferencedSOPSequence
    }
    assert evidence == {*study.analysis.volume.sop_instance_uids, study.uids.seg_instance}


def test_one_group_per_lesion_and_lung_with_the_measured_values(study: Study, built: Built) -> None:
    found = groups(built.sr_path)
    assert list(found) == ["Nodule 1", "Nodule 2", "Right lung", "Left lung"]
    for lesion in study.analysis.lesions:
        group = found[f"Nodule {lesion.number}"]
        assert group.tracking_uid == study.uids.tracking_uid(f"nodule-{lesion.number}")
        assert group.finding_type.value == "27925004"
        site = {"right": "3341006", "left": "44029006"}[lesion.side]
        assert [s.value.value for s in group.finding_sites] == [site]
        values = {(m.name.value, m.unit.value): m for m in group.get_measurements()}
        # Rounded as HL7 and FHIR write them (DS holds 16 characters; the voxels do not).
        assert values[("103339001", "mm")].value == round(lesion.long_axis_mm, AXIS_DIGITS)
        assert values[("103340004", "mm")].value == round(lesion.short_axis_mm, AXIS_DIGITS)
        volume_ml = round(lesion.volume_ml, LESION_VOLUME_DIGITS)
        assert values[("118565006", "mL")].value == volume_ml  # UCUM's mL, as HL7 and FHIR
        mean = values[("112031", "[hnsf'U]")]
        assert mean.value == round(lesion.mean_hu, 1)
        assert mean.derivation is not None and mean.derivation.value == "373098007"
    for side in ("right", "left"):
        volume = found[f"{side.capitalize()} lung"].get_measurements()[0]
        expected = round(study.analysis.organ_volumes_ml[f"{side} lung"], LUNG_VOLUME_DIGITS)
        assert (volume.value, volume.unit.value) == (expected, "mL")


def test_groups_reference_their_segment_and_its_source_images(study: Study, built: Built) -> None:
    seg = built.seg
    for label, group in groups(built.sr_path).items():
        segment = group.referenced_segment
        assert segment.referenced_sop_instance_uid == study.uids.seg_instance
        (number,) = segment.referenced_segment_numbers
        assert seg.get_segment_description(number).segment_label == label
        images = {
            item.ReferencedSOPSequence[0].ReferencedSOPInstanceUID
            for item in segment
            if item.ConceptNameCodeSequence[0].CodeValue == "121233"  # source image
        }
        frames = [
            f.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID
            for f in seg.PerFrameFunctionalGroupsSequence
            if f.SegmentIdentificationSequence[0].ReferencedSegmentNumber == number
        ]
        assert images == set(frames)


def test_observer_is_the_device_and_the_algorithm_is_named(built: Built) -> None:
    ds = pydicom.dcmread(built.sr_path)
    items = {item.ConceptNameCodeSequence[0].CodeMeaning: item for item in ds.ContentSequence}
    assert items["Observer Type"].ConceptCodeSequence[0].CodeValue == "121007"  # Device
    assert device_uid(ALGORITHM) == items["Device Observer UID"].UID
    assert items["Device Observer Serial Number"].TextValue == "node-1"
    text = pydicom.dcmread(built.sr_path).to_json()
    assert "nodule-det" in text and "0.2.0" in text and "lung-seg" in text


def test_says_it_is_ai_generated_and_unverified(built: Built) -> None:
    ds = pydicom.dcmread(built.sr_path)
    (evaluations,) = [
        item
        for item in ds.ContentSequence
        if item.ConceptNameCodeSequence[0].CodeMeaning == "Qualitative Evaluations"
    ]
    texts = {
        i.ConceptNameCodeSequence[0].CodeMeaning: i.TextValue for i in evaluations.ContentSequence
    }
    assert texts["Comment"].startswith("AI-generated preliminary result; not verified")
    assert "nodule-det 0.2.0" in texts["Comment"]
    assert texts["Impression"] == IMPRESSION


def test_same_job_same_bytes(study: Study, built: Built, tmp_path: Path) -> None:
    again = build_measurement_report(
        study.analysis,
        study.headers,
        built.seg,
        ALGORITHM,
        study.uids,
        impression=IMPRESSION,
        created=CREATED,
    )
    again.save_as(tmp_path / "again.dcm")
    assert (tmp_path / "again.dcm").read_bytes() == built.sr_path.read_bytes()


def test_a_lung_without_a_segment_gets_no_group(study: Study, tmp_path: Path) -> None:
    labels = study.analysis.labels.copy()
    labels[labels == LEFT_LUNG] = 0
    analysis = dataclasses.replace(study.analysis, labels=labels)
    seg = build_segmentation(analysis, study.headers, ALGORITHM, study.uids)
    sr = build_measurement_report(analysis, study.headers, seg, ALGORITHM, study.uids)
    sr.save_as(tmp_path / "sr.dcm")
    assert list(groups(tmp_path / "sr.dcm")) == ["Nodule 1", "Nodule 2", "Right lung"]
    assert dciodvfy(tmp_path / "sr.dcm")[0] == []
