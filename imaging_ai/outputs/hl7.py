"""Takes a Report; gives an HL7 v2.5.1 ORU^R01 message (ER7 text, segments ended by CR) for RIS.

Layout: MSH, PID, ORC, OBR (accession as placer and filler order number, result status P),
an NTE saying the result is AI-generated and unverified, then OBX: the impression (FT), the
Study Instance UID, and per finding a group of OBX sharing a sub-ID ("nodule-1", "right-lung"):
the finding, its site, its tracking UID and its measurements (NM, UCUM units). Every OBX has
result status P, observation method "Artificial Intelligence" and the model in OBX-18.

The ER7 text is written here (HL7's escaping of its five delimiters and of line breaks) and
parsed back with python-hl7 before it is returned, so an unparseable message never leaves.
python-hl7's own ``escape`` is not used: it hex-escapes non-ASCII characters one code point at
a time, which garbles names in a UTF-8 message (MSH-18).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import hl7  # type: ignore[import-untyped]

from imaging_ai.modelcard import CodedConcept
from imaging_ai.outputs.common import (
    AI_STATEMENT,
    ARTIFICIAL_INTELLIGENCE,
    CT_CHEST,
    FINDING,
    FINDING_SITE,
    Finding,
    ModelId,
    Report,
    StudyInfo,
    Unit,
)

VERSION = "2.5.1"
SENDING_APPLICATION = "IMAGING_AI"
CHARSET = "UNICODE UTF-8"
IMPRESSION = CodedConcept("19005-8", "LN", "Radiology Imaging study [Impression] (narrative)")
STUDY_UID = CodedConcept("110180", "DCM", "Study Instance UID")
TRACKING_UID = CodedConcept("112040", "DCM", "Tracking Unique Identifier")
_SEX = {"M": "M", "F": "F", "O": "O"}  # DICOM (0010,0040) to HL7 table 0001; else U


class Raw(str):
    """Text already in ER7 (e.g. repetitions joined with ``~``); written as it is."""


NULL = Raw('""')  # HL7's explicit null: a required field whose value is unknown


# A field is text, or components (each text, or a tuple of subcomponents); None is empty.
Component = str | tuple[str, ...]
FieldValue = str | Sequence[Component] | None


@dataclass(frozen=True)
class _Obx:
    value_type: str
    code: CodedConcept
    value: FieldValue
    sub_id: str = ""
    unit: Unit | None = None
    method: tuple[CodedConcept, ...] = ()
    model: ModelId | None = None


def escape(text: str) -> str:
    """HL7 escape sequences for the delimiters; line breaks become ``\\.br\\`` (FT)."""
    out = text.replace("\\", "\\E\\")
    for char, code in (("|", "F"), ("^", "S"), ("&", "T"), ("~", "R")):
        out = out.replace(char, f"\\{code}\\")
    return re.sub(r"\r\n|\r|\n", r"\\.br\\", out)


def build_oru(
    report: Report,
    *,
    receiving_application: str = "RIS",
    receiving_facility: str = "HOSPITAL",
    sending_facility: str = "",
    processing_id: str = "P",
    control_id: str | None = None,
) -> str:
    """The ORU^R01 of a report, for one receiving application.

    Parameters
    ----------
    report
        Study, findings, impression, algorithm and time (see :func:`build_report`).
    receiving_application, receiving_facility
        MSH-5 and MSH-6, as the RIS expects them (``[[outputs.ris]]`` in the config).
    sending_facility
        MSH-4; often the institution.
    processing_id
        MSH-11: P production, T training, D debugging.
    control_id
        MSH-10; default derived from the job and the receiver, the same on every rebuild.

    Returns
    -------
    str
        ER7 text, segments separated and ended by ``\\r``, UTF-8 when encoded (MSH-18).
    """
    receiver = f"{receiving_application}|{receiving_facility}"
    control_id = control_id or report.uids.message_control_id(receiver)
    msh = (SENDING_APPLICATION, sending_facility, receiving_application, receiving_facility)
    segments = [
        _msh(*msh, when=report.created, control_id=control_id, processing_id=processing_id),
        _pid(report.study),
        _segment("ORC", "RE", report.study.accession, report.study.accession),
        _obr(report),
        _segment("NTE", "1", "L", f"{AI_STATEMENT} Made by {report.algorithm.summary}."),
        *(_obx(n, obx, report) for n, obx in enumerate(_observations(report), start=1)),
    ]
    text = "\r".join(segments) + "\r"
    hl7.parse(text)  # raises on a message that does not parse
    return text


def _segment(name: str, *fields: FieldValue) -> str:
    return "|".join([name, *(_field(f) for f in fields)]).rstrip("|")


def _field(value: FieldValue) -> str:
    if value is None:
        return ""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, str):
        return escape(value)
    parts = [
        escape(c) if isinstance(c, str) else "&".join(map(escape, c)).rstrip("&") for c in value
    ]
    return "^".join(parts).rstrip("^")


def _dtm(when: datetime | None) -> str:
    """HL7 DTM; with the UTC offset where the time has a zone (DICOM times have none)."""
    if when is None:
        return ""
    return when.strftime("%Y%m%d%H%M%S%z")


def _ce(concept: CodedConcept) -> tuple[str, str, str]:
    # HL7 table 0396 uses the same designators as DICOM for these: SCT, LN, DCM, UCUM.
    return (concept.code, concept.meaning, concept.scheme)


def _msh(
    sender: str,
    sending_facility: str,
    receiver: str,
    receiving_facility: str,
    *,
    when: datetime,
    control_id: str,
    processing_id: str,
) -> str:
    # MSH-1 is the field separator itself and MSH-2 the other delimiters, written as they are.
    fields: list[FieldValue] = [
        *(sender, sending_facility, receiver, receiving_facility, _dtm(when.astimezone()), ""),
        *(("ORU", "R01", "ORU_R01"), control_id, processing_id, VERSION),
        *("", "", "", "", "", CHARSET),
    ]
    return "MSH|^~\\&|" + "|".join(_field(f) for f in fields)


def _pid(study: StudyInfo) -> str:
    parts = study.name_parts
    family, given, middle, prefix, suffix = parts
    # HL7 XPN puts the suffix before the prefix; PID-3 and PID-5 are required, so an unknown
    # identifier or name is sent as HL7's explicit null "".
    name: FieldValue = ((family,), given, middle, suffix, prefix) if any(parts) else NULL
    identifier = (study.patient_id, "", "", (study.issuer_of_patient_id,), "MR")
    return _segment(
        "PID",
        "1",
        None,
        identifier if study.patient_id else NULL,
        None,
        name,
        None,
        study.birth_date,
        _SEX.get(study.sex, "U"),
    )


def _obr(report: Report) -> str:
    study = report.study
    fields: list[FieldValue] = [""] * 25
    fields[0:4] = ["1", study.accession, study.accession, _ce(CT_CHEST)]
    fields[6] = _dtm(study.study_datetime)  # OBR-7 observation date/time: when scanned
    fields[17] = study.accession  # OBR-18 placer field 1: where IHE radiology puts it
    fields[21] = _dtm(report.created.astimezone())  # OBR-22 results reported
    fields[23] = "CT"  # OBR-24 diagnostic service section
    fields[24] = "P"  # OBR-25 result status: preliminary
    return _segment("OBR", *fields)


def _observations(report: Report) -> Iterator[_Obx]:
    yield _Obx("FT", IMPRESSION, report.impression)
    yield _Obx("ST", STUDY_UID, report.study.study_uid)
    for finding in report.findings:
        yield from _finding(finding, report)


def _finding(finding: Finding, report: Report) -> Iterator[_Obx]:
    model = report.algorithm.lungs if finding.lesion is None else report.algorithm.nodules
    sub = finding.key
    yield _Obx("CWE", FINDING, _ce(finding.type), sub, model=model)
    yield _Obx("CWE", FINDING_SITE, _ce(finding.site), sub, model=model)
    yield _Obx("ST", TRACKING_UID, finding.tracking_uid, sub, model=model)
    for q in finding.quantities:
        method = (q.derivation,) if q.derivation else ()
        yield _Obx("NM", q.name, q.text, sub, q.unit, method, model)


def _obx(set_id: int, obx: _Obx, report: Report) -> str:
    unit = (obx.unit.code, obx.unit.meaning, "UCUM") if obx.unit else None
    methods = Raw("~".join(_field(_ce(m)) for m in (ARTIFICIAL_INTELLIGENCE, *obx.method)))
    model = (f"{obx.model.name} {obx.model.version}", SENDING_APPLICATION) if obx.model else None
    fields: list[FieldValue] = [""] * 18
    fields[0:6] = [str(set_id), obx.value_type, _ce(obx.code), obx.sub_id, obx.value, unit]
    fields[10] = "P"  # OBX-11 observation result status: preliminary
    fields[13] = _dtm(report.study.study_datetime)  # OBX-14 when the images were taken
    fields[16] = methods  # OBX-17 observation method (repeats): AI, and Mean where derived
    fields[17] = model  # OBX-18 equipment instance identifier: the model
    return _segment("OBX", *fields)
