"""Takes a Report; gives a FHIR R4 Bundle (collection) with the DiagnosticReport RIS can pull.

Entries: the Patient, one Device per model, the ImagingStudy (with the SEG and SR series), the
DiagnosticReport (status preliminary, accession and SR UID as identifiers, the impression and
any caveat on the input as conclusion) and its results: one Observation per finding (a lesion
or a lung: code, body site, tracking UID; a lesion a classifier judged has its probability as a
component, (111012, DCM, "Certainty of Finding") in UCUM "1" from 0 to 1) whose members are one
Observation per measurement (valueQuantity in UCUM). That grouping follows how DICOM SR
measurement groups map to FHIR. Every report and observation
carries the security label AIAST ("Artificial Intelligence asserted"). Resource ids are UUIDs
derived from the job's UIDs, so a rebuilt bundle is the same bundle.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any, Literal

from imaging_ai.modelcard import CodedConcept
from imaging_ai.outputs.common import (
    ARTIFICIAL_INTELLIGENCE,
    CT_CHEST,
    MANUFACTURER,
    Finding,
    Quantity,
    Report,
    StudyInfo,
)

Json = dict[str, Any]
BundleType = Literal["collection", "searchset"]
SYSTEMS = {
    "SCT": "http://snomed.info/sct",
    "LN": "http://loinc.org",
    "DCM": "http://dicom.nema.org/resources/ontology/DCM",
    "UCUM": "http://unitsofmeasure.org",
}
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"
AI_LABEL = {
    "system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue",
    "code": "AIAST",
    "display": "Artificial Intelligence asserted",
}
IMAGING = {
    "coding": [
        {
            "system": "http://terminology.hl7.org/CodeSystem/observation-category",
            "code": "imaging",
            "display": "Imaging",
        }
    ]
}
RADIOLOGY = {
    "coding": [
        {
            "system": "http://terminology.hl7.org/CodeSystem/v2-0074",
            "code": "RAD",
            "display": "Radiology",
        }
    ]
}
SEG_CLASS, SR_CLASS = "1.2.840.10008.5.1.4.1.1.66", "1.2.840.10008.5.1.4.1.1.88.34"
_GENDER = {"M": "male", "F": "female", "O": "other"}


def diagnostic_report_bundle(report: Report, bundle_type: BundleType = "collection") -> Json:
    """The FHIR R4 Bundle of a report.

    Parameters
    ----------
    report
        Study, findings, impression, algorithm, UIDs and time (see :func:`build_report`).
    bundle_type
        "collection" to store or send it; "searchset" to answer a search such as
        ``GET /fhir/DiagnosticReport?identifier=<accession>``: the report is the match and
        the other resources are included.

    Returns
    -------
    dict
        JSON-ready; ``json.dumps`` gives FHIR R4 JSON.
    """
    ctx = _Context(report)
    groups = [_finding_entries(ctx, finding) for finding in report.findings]
    resources = [
        _patient(ctx, report.study),
        *(_device(ctx, model) for model in ctx.models),
        _imaging_study(ctx),
        _diagnostic_report(ctx, [group[0] for group in groups]),
        *(resource for group in groups for resource in group),
    ]
    entries: list[Json] = [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in resources]
    bundle: Json = {"resourceType": "Bundle", "id": ctx.id(f"bundle:{bundle_type}")}
    bundle |= {"type": bundle_type, "timestamp": _instant(report.created)}
    if bundle_type == "searchset":
        bundle["total"] = 1  # matches only: the DiagnosticReport
        for entry in entries:
            match = entry["resource"]["resourceType"] == "DiagnosticReport"
            entry["search"] = {"mode": "match" if match else "include"}
    return bundle | {"entry": entries}


class _Context:
    """Ids, references and the fields every resource of one report shares."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.models = {"lungs": report.algorithm.lungs, "nodules": report.algorithm.nodules}

    def id(self, name: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_OID, self.report.uids.uid(f"fhir:{name}")))

    def ref(self, name: str) -> Json:
        return {"reference": f"urn:uuid:{self.id(name)}"}

    def common(self, name: str) -> Json:
        """id, the AI label, status, subject, effective and issued times."""
        return _compact(
            {
                "id": self.id(name),
                "meta": {"security": [AI_LABEL]},
                "status": "preliminary",
                "subject": self.ref("patient"),
                "effectiveDateTime": _datetime(self.report.study.study_datetime),
                "issued": _instant(self.report.created),
            }
        )


def _patient(ctx: _Context, study: StudyInfo) -> Json:
    family, given, middle, prefix, suffix = study.name_parts
    identifier = {
        "type": {"coding": [{"system": V2_0203, "code": "MR"}]},
        "value": study.patient_id,
        "assigner": {"display": study.issuer_of_patient_id},
    }
    name = {"family": family, "given": [given, middle], "prefix": [prefix], "suffix": [suffix]}
    birth = study.birth_date
    return _compact(
        {
            "resourceType": "Patient",
            "id": ctx.id("patient"),
            "identifier": [identifier] if study.patient_id else [],
            "name": [name],
            "gender": _GENDER.get(study.sex, "unknown"),
            "birthDate": f"{birth[:4]}-{birth[4:6]}-{birth[6:8]}" if len(birth) == 8 else "",
        }
    )


def _device(ctx: _Context, role: str) -> Json:
    model = ctx.models[role]
    algorithm = ctx.report.algorithm
    return _compact(
        {
            "resourceType": "Device",
            "id": ctx.id(f"device:{role}"),
            "identifier": [{"system": "urn:imaging-ai:onnx-sha256", "value": model.sha256}]
            if model.sha256
            else [],
            "manufacturer": MANUFACTURER,
            "serialNumber": algorithm.device_serial_number,
            "deviceName": [{"name": model.name, "type": "model-name"}],
            "type": _concept(ARTIFICIAL_INTELLIGENCE),
            "version": [{"value": model.version}],
        }
    )


def _imaging_study(ctx: _Context) -> Json:
    study, uids = ctx.report.study, ctx.report.uids
    series = [
        _series(uids.seg_series, "SEG", uids.seg_instance, SEG_CLASS),
        _series(uids.sr_series, "SR", uids.sr_instance, SR_CLASS),
    ]
    return _compact(
        {
            "resourceType": "ImagingStudy",
            "id": ctx.id("imaging-study"),
            "identifier": [_dicom_uid(study.study_uid), _accession(study)],
            "status": "available",
            "subject": ctx.ref("patient"),
            "started": _datetime(study.study_datetime),
            "description": study.study_description,
            "series": series,
        }
    )


def _series(uid: str, modality: str, instance: str, sop_class: str) -> Json:
    return {
        "uid": uid,
        "modality": {"system": SYSTEMS["DCM"], "code": modality},
        "instance": [
            {
                "uid": instance,
                "sopClass": {"system": "urn:ietf:rfc:3986", "code": f"urn:oid:{sop_class}"},
            }
        ],
    }


def _diagnostic_report(ctx: _Context, results: list[Json]) -> Json:
    report = ctx.report
    resource = {
        "resourceType": "DiagnosticReport",
        **ctx.common("diagnostic-report"),
        "identifier": [_dicom_uid(report.uids.sr_instance), _accession(report.study)],
        "category": [RADIOLOGY],
        "code": _concept(CT_CHEST),
        "imagingStudy": [ctx.ref("imaging-study")],
        "result": [{"reference": f"urn:uuid:{r['id']}"} for r in results],
        "conclusion": report.conclusion,
    }
    return _compact(resource)


def _finding_entries(ctx: _Context, finding: Finding) -> list[Json]:
    """The finding's Observation first, then one Observation per measurement."""
    device = ctx.ref("device:lungs" if finding.lesion is None else "device:nodules")
    site = _concept(finding.site)
    members = [_measurement(ctx, finding, q, device, site) for q in finding.quantities]
    group = {
        "resourceType": "Observation",
        **ctx.common(finding.key),
        "identifier": [_dicom_uid(finding.tracking_uid)],
        "category": [IMAGING],
        "code": {**_concept(finding.type), "text": finding.label},
        "bodySite": site,
        "device": device,
        "derivedFrom": [ctx.ref("imaging-study")],
        "hasMember": [{"reference": f"urn:uuid:{m['id']}"} for m in members],
        "component": [_component(finding.probability)] if finding.probability is not None else [],
    }
    return [_compact(group), *members]


def _component(q: Quantity) -> Json:
    return {"code": {**_concept(q.name), "text": q.label}, "valueQuantity": _quantity(q)}


def _quantity(q: Quantity) -> Json:
    return {
        "value": round(q.value, q.digits),
        "unit": q.unit.code,
        "system": SYSTEMS["UCUM"],
        "code": q.unit.code,
    }


def _measurement(ctx: _Context, finding: Finding, q: Quantity, device: Json, site: Json) -> Json:
    return _compact(
        {
            "resourceType": "Observation",
            **ctx.common(f"{finding.key}:{q.name.code}"),
            "category": [IMAGING],
            "code": {**_concept(q.name), "text": f"{finding.label}: {q.label}"},
            "bodySite": site,
            "device": device,
            "method": _concept(q.derivation) if q.derivation else None,
            "valueQuantity": _quantity(q),
        }
    )


def _concept(concept: CodedConcept) -> Json:
    coding = {"system": SYSTEMS[concept.scheme], "code": concept.code, "display": concept.meaning}
    return {"coding": [coding]}


def _dicom_uid(uid: str) -> Json:
    return {"system": "urn:dicom:uid", "value": f"urn:oid:{uid}"}


def _accession(study: StudyInfo) -> Json | None:
    if not study.accession:
        return None
    return {"type": {"coding": [{"system": V2_0203, "code": "ACSN"}]}, "value": study.accession}


def _datetime(when: datetime | date | None) -> str | None:
    """FHIR dateTime; a time needs a zone, and DICOM's times come with the source's offset or
    the site's zone (``StudyInfo.study_datetime``), kept as they are; a date alone where only
    the date is known."""
    if when is None:
        return None
    if not isinstance(when, datetime):
        return when.isoformat()
    return when.isoformat() if when.tzinfo else when.astimezone().isoformat()


def _instant(when: datetime) -> str:
    return when.astimezone().isoformat(timespec="seconds")


def _compact(resource: Json) -> Json:
    """The resource without empty strings, lists, objects or None: FHIR forbids empty elements."""
    compacted: Json = _clean(resource)
    return compacted


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        items = {k: _clean(v) for k, v in value.items()}
        return {k: v for k, v in items.items() if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [v for v in map(_clean, value) if v not in (None, "", [], {})]
    return value
