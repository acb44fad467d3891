"""Shared pieces: the algorithm from an analysis, study facts from headers, findings in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from imaging_ai.errors import InvalidDataset
from imaging_ai.outputs.common import Algorithm, ModelId, findings, read_headers, study_info
from tests.outputs.conftest import ALGORITHM, Study


def test_algorithm_from_analysis_takes_the_lung_model_first(study: Study) -> None:
    algorithm = Algorithm.from_analysis(study.analysis, device_serial_number="node-1")
    assert algorithm.lungs == ModelId("lung-seg", "0.1.0", "ab" * 32)
    assert algorithm.nodules == ModelId("nodule-det", "0.2.0", "cd" * 32)
    assert algorithm.device_serial_number == "node-1"
    assert algorithm.summary == "imaging-ai 0.1.0 (lung-seg 0.1.0, nodule-det 0.2.0)"


def test_study_info_from_a_header(study: Study) -> None:
    info = study_info(study.headers[0])
    header = study.headers[0]
    assert (info.patient_id, info.accession, info.sex) == (
        header.PatientID,
        header.AccessionNumber,
        header.PatientSex,
    )
    assert info.name_parts[:2] == tuple(str(header.PatientName).split("^")[:2])
    assert info.study_datetime is not None
    assert info.study_datetime.strftime("%Y%m%d%H%M%S") == header.StudyDate + header.StudyTime[:6]


def test_findings_lesions_then_lungs_with_tracking_uids(study: Study) -> None:
    found = findings(study.analysis, study.uids)
    assert [f.key for f in found] == ["nodule-1", "nodule-2", "right-lung", "left-lung"]
    assert len({f.tracking_uid for f in found}) == 4
    first = found[0]
    assert first.site.meaning == "Right lung" and first.lesion is study.analysis.lesions[0]
    assert [q.unit.code for q in first.quantities] == ["mm", "mm", "mL", "[hnsf'U]"]
    assert first.quantities[3].label == "Mean Attenuation Coefficient"
    assert ALGORITHM.lungs.name == "lung-seg"


def test_unreadable_source_is_named(tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("not DICOM")
    with pytest.raises(InvalidDataset, match=r"note\.txt is not a readable DICOM file"):
        read_headers([tmp_path / "note.txt"])
