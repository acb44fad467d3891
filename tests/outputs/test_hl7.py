"""ORU^R01: valid v2.5.1 structure (hl7apy, strict); parses back with the values of the report."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import hl7
import pytest
from hl7apy.consts import VALIDATION_LEVEL
from hl7apy.exceptions import HL7apyException
from hl7apy.parser import parse_message

from imaging_ai.outputs.common import AXIS_DIGITS, LESION_VOLUME_DIGITS, Report, build_report
from imaging_ai.outputs.hl7 import build_oru
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Study


@pytest.fixture(scope="module")
def report(study: Study) -> Report:
    return build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)


def obx_rows(message: hl7.Message) -> list[hl7.Segment]:
    return list(message.segments("OBX"))


def test_valid_oru_r01_structure(report: Report) -> None:
    text = build_oru(report)
    parsed = parse_message(text, validation_level=VALIDATION_LEVEL.STRICT, find_groups=True)
    assert parsed.validate()
    assert parsed.name == "ORU_R01"
    assert [s.name for s in parsed.children] == ["MSH", "ORU_R01_PATIENT_RESULT"]


def test_header_patient_and_order(study: Study, report: Report) -> None:
    text = build_oru(report, receiving_application="RADIS", receiving_facility="GENERAL")
    assert "\n" not in text and text.endswith("\r")
    m = hl7.parse(text)
    header = study.headers[0]
    assert (m["MSH.F3"], m["MSH.F5"], m["MSH.F6"]) == ("IMAGING_AI", "RADIS", "GENERAL")
    assert str(m.segment("MSH")(9)) == "ORU^R01^ORU_R01"
    assert m["MSH.F10"] == study.uids.message_control_id("RADIS|GENERAL")
    assert (m["MSH.F11"], m["MSH.F12"], m["MSH.F18"]) == ("P", "2.5.1", "UNICODE UTF-8")
    assert m["PID.F3.R1.C1"] == header.PatientID and m["PID.F3.R1.C5"] == "MR"
    family, given = str(header.PatientName).split("^")[:2]
    assert (m["PID.F5.R1.C1"], m["PID.F5.R1.C2"]) == (family, given)
    assert (m["PID.F7"], m["PID.F8"]) == (header.PatientBirthDate, header.PatientSex)
    accession = header.AccessionNumber
    assert (m["ORC.F1"], m["ORC.F2"], m["ORC.F3"]) == ("RE", accession, accession)
    assert (m["OBR.F2"], m["OBR.F3"], m["OBR.F18"]) == (accession, accession, accession)
    assert m["OBR.F4.R1.C1"] == "24627-2"
    scanned = header.StudyDate + header.StudyTime[:6]
    # No [site] time_zone and no TimezoneOffsetFromUTC: the host's offset on that day.
    offset = datetime.strptime(scanned, "%Y%m%d%H%M%S").astimezone().strftime("%z")
    assert m["OBR.F7"] == scanned + offset
    assert m["OBR.F25"] == "P"
    assert "AI-generated" in m["NTE.F3"] and "nodule-det 0.2.0" in m["NTE.F3"]


def test_observations_carry_impression_and_measurements(study: Study, report: Report) -> None:
    m = hl7.parse(build_oru(report))
    rows = obx_rows(m)
    assert [str(r(1)) for r in rows] == [str(n) for n in range(1, len(rows) + 1)]
    assert all(str(r(11)) == "P" for r in rows)
    assert all(str(r(17)).startswith("123110^Artificial Intelligence^DCM") for r in rows)
    assert (str(rows[0](2)), m.unescape(str(rows[0](5)))) == ("FT", IMPRESSION)
    assert str(rows[1](5)) == study.analysis.volume.study_instance_uid
    numbers = {
        (str(r(4)), str(r(3)(0)(0)), str(r(6)(0)(0))): float(str(r(5)))
        for r in rows
        if str(r(2)) == "NM"
    }
    for lesion in study.analysis.lesions:
        sub = f"nodule-{lesion.number}"
        assert numbers[(sub, "103339001", "mm")] == round(lesion.long_axis_mm, AXIS_DIGITS)
        assert numbers[(sub, "103340004", "mm")] == round(lesion.short_axis_mm, AXIS_DIGITS)
        assert numbers[(sub, "118565006", "mL")] == round(lesion.volume_ml, LESION_VOLUME_DIGITS)
        assert numbers[(sub, "112031", "[hnsf'U]")] == round(lesion.mean_hu, 1)
    for side in ("right", "left"):
        volume = study.analysis.organ_volumes_ml[f"{side} lung"]
        assert numbers[(f"{side}-lung", "118565006", "mL")] == round(volume, 1)
    sites = {str(r(4)): str(r(5)(0)(0)) for r in rows if str(r(3)(0)(0)) == "363698007"}
    assert sites["nodule-1"] == "3341006" and sites["nodule-2"] == "44029006"


def test_text_is_escaped_and_unicode_survives(report: Report) -> None:
    study = dataclasses.replace(report.study, patient_name="Müller|X^Zoë~&")
    tricky = "Line one | with ^ and & and ~ and \\ \nline two"
    text = build_oru(dataclasses.replace(report, study=study, impression=tricky))
    assert len(text.split("\r")) == len(build_oru(report).split("\r"))
    m = hl7.parse(text.encode("utf-8").decode("utf-8"))
    assert (m["PID.F5.R1.C1"], m["PID.F5.R1.C2"]) == ("Müller|X", "Zoë~&")
    escaped = r"Line one \F\ with \S\ and \T\ and \R\ and \E\ \.br\line two"
    assert obx_rows(m)[0](5)[0] == escaped
    assert m.unescape(escaped) == tricky.replace("\n", "\r")
    assert parse_message(
        text, validation_level=VALIDATION_LEVEL.STRICT, find_groups=True
    ).validate()


def test_the_same_report_gives_the_same_message(report: Report) -> None:
    assert build_oru(report) == build_oru(report)
    assert build_oru(report) != build_oru(report, receiving_application="OTHER")


def test_missing_patient_attributes_are_left_empty(report: Report) -> None:
    study = dataclasses.replace(report.study, birth_date="", sex="", patient_name="", patient_id="")
    text = build_oru(dataclasses.replace(report, study=study))
    m = hl7.parse(text)
    assert (m["PID.F3"], m["PID.F5"], m["PID.F7"], m["PID.F8"]) == ('""', '""', "", "U")
    strict = parse_message(text, validation_level=VALIDATION_LEVEL.STRICT, find_groups=True)
    assert strict.validate()


def test_text_that_looks_escaped_is_escaped_again(report: Report) -> None:
    """hl7apy keeps a backslash that already looks like an escape; FT text escapes them all."""
    text = build_oru(dataclasses.replace(report, impression=r"a \F\ b"))
    assert hl7.parse(text).unescape(str(obx_rows(hl7.parse(text))[0](5))) == r"a \F\ b"


def test_a_message_that_breaks_the_structure_is_not_built(report: Report) -> None:
    study = dataclasses.replace(report.study, patient_id="9" * 250)  # CX.1 is at most 199
    with pytest.raises(HL7apyException):
        build_oru(dataclasses.replace(report, study=study))
