"""A malformed demographic never blocks a result (issue 18, item 10): invalid dates, times and
names are emptied before encoding, with a note, and an encoding error is never retried."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fhirkit
import highdicom as hd
import pydicom
import pytest
from hl7apy.parser import parse_message  # type: ignore[import-untyped]
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset

from imaging_ai.config import Config, OutputsConfig, RisDestination, StorageConfig
from imaging_ai.dicom.file_headers import clean_demographics
from imaging_ai.errors import OutputError
from imaging_ai.outputs.common import source_headers
from imaging_ai.outputs.files import encode_results
from imaging_ai.process import PERMANENT, encoded
from tests.fhir_schema import assert_valid_fhir
from tests.outputs.conftest import CREATED, IMPRESSION, Study

BAD = {"PatientBirthDate": "19AB0304", "StudyTime": "25xx"}


def _bad(ds: Dataset, values: dict[str, str]) -> None:
    """Put values in as a sender's bytes would carry them (pydicom would warn on assignment)."""
    for keyword, value in values.items():
        tag = pydicom.datadict.tag_for_keyword(keyword)
        vr = pydicom.datadict.dictionary_VR(tag)
        ds[tag] = DataElement(tag, vr, value, validation_mode=pydicom.config.IGNORE)


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("PatientBirthDate", "19AB0304"),
        ("PatientBirthDate", "20261345"),  # no 13th month
        ("PatientBirthDate", "1980.03.04"),  # ACR-NEMA form, not DA
        ("StudyDate", "20260230"),  # no 30th of February
        ("StudyTime", "25xx"),
        ("StudyTime", "250000"),
        ("PatientBirthTime", "12:00:00"),
        ("PatientName", "X" * 70),  # a component over 64 characters
        ("ReferringPhysicianName", "A=B=C=D"),  # four groups
    ],
)
def test_invalid_values_are_emptied_with_a_note(keyword: str, value: str) -> None:
    ds = Dataset()
    ds.PatientName, ds.PatientBirthDate, ds.StudyDate, ds.StudyTime = "Doe^J", "19800304", "", ""
    _bad(ds, {keyword: value})
    notes = clean_demographics([ds])
    assert ds[keyword].value in ("", None)
    assert len(notes) == 1 and keyword in notes[0]
    assert value not in notes[0]


def test_valid_values_are_kept() -> None:
    ds = Dataset()
    ds.PatientName, ds.PatientBirthDate = "Doe^Jane=^=", "19800304"
    ds.StudyDate, ds.StudyTime, ds.PatientBirthTime = "20261130", "101500.123", "0930"
    before = {e.keyword: str(e.value) for e in ds}
    assert clean_demographics([ds]) == ()
    assert {e.keyword: str(e.value) for e in ds} == before


def test_one_note_per_attribute_over_all_headers() -> None:
    headers = [Dataset() for _ in range(3)]
    for ds in headers:
        _bad(ds, BAD)
    notes = clean_demographics(headers)
    assert [n.split()[0] for n in notes] == ["PatientBirthDate", "StudyTime"]
    assert all(ds.PatientBirthDate == "" and ds.StudyTime == "" for ds in headers)


@pytest.fixture
def bad_study(study: Study, tmp_path: Path) -> list[Path]:
    """The phantom study's files with PatientBirthDate 19AB0304 and StudyTime 25xx."""
    paths = []
    for source in study.paths:
        ds = pydicom.dcmread(source)
        _bad(ds, BAD)
        paths.append(tmp_path / source.name)
        ds.save_as(paths[-1], enforce_file_format=True)
    return paths


def test_bad_demographics_reach_every_output_emptied(
    study: Study, bad_study: list[Path], tmp_path: Path
) -> None:
    sources = source_headers(bad_study)
    assert [n.split()[0] for n in sources.notes] == ["PatientBirthDate", "StudyTime"]
    ris = RisDestination(host="127.0.0.1", port=2575)
    config = Config(
        storage=StorageConfig(data_dir=str(tmp_path)), outputs=OutputsConfig(ris=(ris,))
    )
    results = encode_results(study.analysis, sources.datasets, 41, CREATED, IMPRESSION, config)
    seg = hd.seg.segread(io.BytesIO(bytes(results.seg)))
    sr = hd.sr.srread(io.BytesIO(bytes(results.sr)))
    for dataset in (seg, sr):
        assert dataset.PatientBirthDate == "" and dataset.StudyTime == ""
        assert dataset.PatientID == study.headers[0].PatientID  # the rest is kept
    oru = parse_message(results.messages[0].data.decode().replace("\n", "\r"))
    result = oru.ORU_R01_PATIENT_RESULT
    assert result.ORU_R01_PATIENT.PID.PID_7.to_er7() == ""
    # Without a time, the scan is dated, not put at midnight.
    study_date = str(study.headers[0].StudyDate)
    assert result.ORU_R01_ORDER_OBSERVATION.OBR.OBR_7.to_er7() == study_date
    bundle = json.loads(results.fhir)
    entries = [e["resource"] for e in bundle["entry"]]
    [patient] = [r for r in entries if r["resourceType"] == "Patient"]
    assert "birthDate" not in patient
    [diagnostic] = [r for r in entries if r["resourceType"] == "DiagnosticReport"]
    iso = f"{study_date[:4]}-{study_date[4:6]}-{study_date[6:]}"
    assert diagnostic["effectiveDateTime"] == iso
    assert [str(issue) for issue in fhirkit.validate(bundle)] == []
    assert_valid_fhir(bundle)


def test_an_encoding_error_is_permanent_and_quotes_no_value() -> None:
    def build() -> None:
        raise ValueError("19AB0304 is not an HL7 valid date value")

    with pytest.raises(OutputError) as raised:
        encoded(build)  # type: ignore[arg-type]
    assert isinstance(raised.value, PERMANENT)
    assert "19AB0304" not in str(raised.value)
    assert "ValueError in test_demographics.py" in str(raised.value)


def test_a_disk_error_is_still_retried() -> None:
    def build() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        encoded(build)  # type: ignore[arg-type]
    assert not issubclass(OSError, PERMANENT)
