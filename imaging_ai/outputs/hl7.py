"""Takes a Report; gives an HL7 v2.5.1 ORU^R01 message (ER7 text, segments ended by CR) for RIS.

Layout: MSH (sender and receiver as configured), PID, ORC and OBR (placer and filler order
numbers from the DICOM request attributes, the accession number where the images carry none;
the accession number and Requested Procedure ID in OBR-18/19 as IHE radiology does; result
status P),
an NTE saying the result is AI-generated and unverified, one NTE per caveat on the input (thick
or sparse slices), then OBX: the impression (FT), the Study Instance UID, and per finding a
group of OBX sharing a sub-ID ("nodule-1", "right-lung"): the finding, its site, its tracking
UID, its measurements (NM, UCUM units) and, for a lesion a classifier judged, its probability
(NM, 111012 "Certainty of Finding", unit "1"). Every OBX has result status P, observation
method "Artificial Intelligence" and the model in OBX-18.

The message is built with hl7apy as elements of the v2.5.1 ORU_R01 structure (groups,
segments, fields, components) holding hl7apy datatypes, which escape the delimiters; hl7apy
validates it against that structure (required segments and fields, groups, repetitions,
datatypes, lengths) before it is returned, so an invalid message never leaves. Two things
hl7apy does not do are done here: OBX-5, whose datatype "varies" with OBX-2, gets its
components one by one, and formatted text (FT) writes line breaks as HL7's ``\\.br\\`` and
escapes every backslash (hl7apy keeps one that already looks like an escape sequence; the
other texts come from DICOM, whose names, IDs and accession numbers cannot hold a backslash).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from hl7apy import load_library  # type: ignore[import-untyped]
from hl7apy.base_datatypes import FT  # type: ignore[import-untyped]
from hl7apy.consts import VALIDATION_LEVEL  # type: ignore[import-untyped]
from hl7apy.core import Component, Message, Segment, SubComponent  # type: ignore[import-untyped]
from hl7apy.factories import datatype_factory  # type: ignore[import-untyped]

from imaging_ai.config import Hl7Config
from imaging_ai.dicom.times import local
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
STRICT = VALIDATION_LEVEL.STRICT
CHARSET = "UNICODE UTF-8"
IMPRESSION = CodedConcept("19005-8", "LN", "Radiology Imaging study [Impression] (narrative)")
STUDY_UID = CodedConcept("110180", "DCM", "Study Instance UID")
TRACKING_UID = CodedConcept("112040", "DCM", "Tracking Unique Identifier")
_BASE = frozenset(load_library(VERSION).get_base_datatypes())
NULL = '""'  # HL7's explicit null: a required field whose value is unknown
_SEX = {"M": "M", "F": "F", "O": "O"}  # DICOM (0010,0040) to HL7 table 0001; else U

# A field repetition is text, or components (each text, or a tuple of subcomponents).
Value = str | Sequence[str | tuple[str, ...]]


class FormattedText(FT):  # type: ignore[misc]
    """hl7apy's FT, escaping every backslash and writing line breaks as ``\\.br\\``."""

    def _escape_value(self, value: str, encoding_chars: dict[str, str]) -> str:
        esc = encoding_chars["ESCAPE"]
        lines = re.split(r"\r\n|\r|\n", value.replace(esc, f"{esc}E{esc}"))
        escape = super()._escape_value  # hl7apy's: the four delimiters
        return f"{esc}.br{esc}".join(escape(line, encoding_chars) for line in lines)

    @property
    def classname(self) -> str:
        """The datatype hl7apy checks against the structure: FT."""
        return "FT"


@dataclass(frozen=True)
class _Obx:
    value_type: str
    code: CodedConcept
    value: Value
    sub_id: str = ""
    unit: Unit | None = None
    method: tuple[CodedConcept, ...] = ()
    model: ModelId | None = None


def build_oru(
    report: Report,
    *,
    receiving_application: str = "RIS",
    receiving_facility: str = "HOSPITAL",
    sender: Hl7Config | None = None,
    control_id: str | None = None,
) -> str:
    """The ORU^R01 of a report, for one receiving application.

    Parameters
    ----------
    report
        Study, findings, impression, algorithm and time (see :func:`build_report`).
    receiving_application, receiving_facility
        MSH-5 and MSH-6, as the RIS expects them (``[[outputs.ris]]`` in the config).
    sender
        MSH-3 (sending application), MSH-4 (sending facility) and MSH-11 (processing ID:
        P production, T training, D debugging): ``[hl7]`` in the config; default its defaults.
    control_id
        MSH-10; default derived from the job and the receiver, the same on every rebuild.

    Returns
    -------
    str
        ER7 text, segments separated and ended by ``\\r``, UTF-8 when encoded (MSH-18).

    Raises
    ------
    hl7apy.exceptions.HL7apyException
        The message does not fit the v2.5.1 ORU^R01 structure (a bug, not bad input).
    """
    sender = sender or Hl7Config()
    receiver = f"{receiving_application}|{receiving_facility}"
    message = Message("ORU_R01", version=VERSION, validation_level=STRICT)
    _msh(
        message.msh,
        (
            sender.sending_application,
            sender.sending_facility,
            receiving_application,
            receiving_facility,
        ),
        when=local(report.created, report.study.time_zone),
        control_id=control_id or report.uids.message_control_id(receiver),
        processing_id=sender.processing_id,
    )
    result = message.add_group("ORU_R01_PATIENT_RESULT")
    _pid(result.add_group("ORU_R01_PATIENT").add_segment("PID"), report.study)
    order = result.add_group("ORU_R01_ORDER_OBSERVATION")
    study = report.study
    # ORC-2/3 say what OBR-2/3 say: HL7 v2 chapter 4 wants them equal where both are sent.
    orc: dict[int, Value] = {1: "RE", 2: study.placer_order_number, 3: study.filler_order_number}
    set_fields(order.add_segment("ORC"), orc)
    _obr(order.add_segment("OBR"), report, sender.sending_application)
    notes = [f"{AI_STATEMENT} Made by {report.algorithm.summary}.", *report.caveats]
    for n, note in enumerate(notes, start=1):  # source L: the filler (this daemon)
        set_fields(order.add_segment("NTE"), {1: str(n), 2: "L", 3: note})
    for n, obx in enumerate(_observations(report), start=1):
        segment = order.add_group("ORU_R01_OBSERVATION").add_segment("OBX")
        _obx(segment, n, obx, report, sender.sending_application)
    message.validate()  # raises on anything that breaks the v2.5.1 structure
    return str(message.to_er7()) + "\r"


def set_field(segment: Segment, number: int, *repetitions: Value) -> None:
    """Set field ``number`` of an hl7apy segment to the repetitions given, each text or
    components; empty ones are left out, and whatever hl7apy had put there is replaced."""
    name = f"{segment.name}_{number}"
    while segment.children.get(name):
        segment.children.remove_by_name(name)
    for value in repetitions:
        if not value:
            continue
        field = segment.add_field(name)
        if isinstance(value, str) and _is_leaf(field):
            _leaf(field, value)
            continue
        for i, component in enumerate((value,) if isinstance(value, str) else value, start=1):
            if component:
                _component(field.add_component(f"{field.datatype}_{i}"), component)


def set_fields(segment: Segment, values: dict[int, Value]) -> None:
    """:func:`set_field` for each ``{number: value}``."""
    for number, value in values.items():
        set_field(segment, number, value)


def _component(component: Component, value: str | tuple[str, ...]) -> None:
    if isinstance(value, str) and _is_leaf(component):
        _leaf(component, value)
        return
    parts = (value,) if isinstance(value, str) else value
    for i, part in enumerate(parts, start=1):
        if part:
            _leaf(component.add_subcomponent(f"{component.datatype}_{i}"), part)


def _is_leaf(element: Any) -> bool:
    return bool(element.datatype in _BASE)


def _leaf(element: Any, text: str) -> None:
    """A base-datatype element's value; hl7apy checks it against the datatype (a DTM must
    be a date and time, an NM a number) and escapes it when written."""
    if element.datatype == "FT":
        element.value = FormattedText(text)
    else:
        element.value = datatype_factory(element.datatype, text, VERSION, STRICT)


def _varies(segment: Segment, number: int, value_type: str, value: Value) -> None:
    """OBX-5, whose datatype is OBX-2's: one VARIES component per component of the value."""
    field = segment.add_field(f"{segment.name}_{number}")
    parts = [value] if isinstance(value, str) else list(value)
    leaf_type = value_type if value_type in ("NM", "FT") else "ST"
    for i, part in enumerate(parts, start=1):
        component = Component(f"VARIES_{i}", version=VERSION, validation_level=STRICT)
        if part:
            sub = SubComponent(datatype=leaf_type, version=VERSION, validation_level=STRICT)
            _leaf(sub, str(part))
            component.add(sub)
        field.add(component)


def _dtm(when: datetime | date | None) -> str:
    """HL7 DTM with its UTC offset (every time here is aware: DICOM's are read in the site's
    zone); the date alone where only the date is known."""
    if when is None:
        return ""
    if not isinstance(when, datetime):
        return when.strftime("%Y%m%d")
    return when.strftime("%Y%m%d%H%M%S%z")


def _ce(concept: CodedConcept) -> tuple[str, str, str]:
    # HL7 table 0396 uses the same designators as DICOM for these: SCT, LN, DCM, UCUM.
    return (concept.code, concept.meaning, concept.scheme)


def _msh(
    msh: Segment,
    parties: tuple[str, str, str, str],
    *,
    when: datetime,
    control_id: str,
    processing_id: str,
) -> None:
    sender, sending_facility, receiver, receiving_facility = parties
    values: dict[int, Value] = {
        3: sender,
        4: sending_facility,
        5: receiver,
        6: receiving_facility,
        7: _dtm(when),
        9: ("ORU", "R01", "ORU_R01"),
        10: control_id,
        11: processing_id,
        12: VERSION,
        18: CHARSET,
    }
    set_fields(msh, values)


def _pid(pid: Segment, study: StudyInfo) -> None:
    parts = study.name_parts
    family, given, middle, prefix, suffix = parts
    # HL7 XPN puts the suffix before the prefix; PID-3 and PID-5 are required, so an unknown
    # identifier or name is sent as HL7's explicit null "".
    name: Value = ((family,), given, middle, suffix, prefix) if any(parts) else NULL
    identifier = (study.patient_id, "", "", (study.issuer_of_patient_id,), "MR")
    values: dict[int, Value] = {
        1: "1",
        3: identifier if study.patient_id else NULL,
        5: name,
        7: study.birth_date,
        8: _SEX.get(study.sex, "U"),
    }
    set_fields(pid, values)


def _obr(obr: Segment, report: Report, application: str) -> None:
    study = report.study
    values: dict[int, Value] = {
        1: "1",
        2: study.placer_order_number,
        3: study.filler_order_number,
        4: _ce(CT_CHEST),
        7: _dtm(study.study_datetime),  # observation date/time: when scanned
        18: study.accession,  # placer field 1: where IHE radiology puts it
        19: study.requested_procedure_id,  # placer field 2: IHE radiology's likewise
        22: _dtm(local(report.created, study.time_zone)),  # results reported
        24: "CT",  # diagnostic service section
        25: "P",  # result status: preliminary
    }
    set_fields(obr, values)


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
    if finding.probability is not None:  # the candidate classifier's, where it is named apart
        p = finding.probability
        judge = report.algorithm.candidates or model
        yield _Obx("NM", p.name, p.text, sub, p.unit, (), judge)


def _obx(obx: Segment, set_id: int, o: _Obx, report: Report, application: str) -> None:
    set_fields(obx, {1: str(set_id), 2: o.value_type, 3: _ce(o.code), 4: o.sub_id})
    _varies(obx, 5, o.value_type, o.value)
    if o.unit:
        set_field(obx, 6, (o.unit.code, o.unit.meaning, "UCUM"))
    set_field(obx, 11, "P")  # observation result status: preliminary
    set_field(obx, 14, _dtm(report.study.study_datetime))  # when the images were taken
    # observation method (repeats): AI, and Mean where derived
    set_field(obx, 17, *(_ce(m) for m in (ARTIFICIAL_INTELLIGENCE, *o.method)))
    if o.model:  # equipment instance identifier: the model, in our namespace
        set_field(obx, 18, (f"{o.model.name} {o.model.version}", application))
