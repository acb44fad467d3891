"""FHIR Bundle: validates against the FHIR models (fhir.resources, R4B = R4 for these resources)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic
import pytest
from fhir.resources.R4B.bundle import Bundle

from imaging_ai.outputs.common import Report, build_report
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.uids import output_uids
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Study


@pytest.fixture(scope="module")
def report(study: Study) -> Report:
    return build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)


@pytest.fixture(scope="module")
def bundle(report: Report) -> dict[str, Any]:
    return diagnostic_report_bundle(report)


def resources(bundle: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == kind]


def resolve(bundle: dict[str, Any], reference: dict[str, str]) -> dict[str, Any]:
    (found,) = [e["resource"] for e in bundle["entry"] if e["fullUrl"] == reference["reference"]]
    return found


def test_bundle_validates(bundle: dict[str, Any]) -> None:
    parsed = Bundle.model_validate(json.loads(json.dumps(bundle)))
    assert parsed.type == "collection"
    kinds = [e["resource"]["resourceType"] for e in bundle["entry"]]
    assert kinds.count("Observation") == 4 * 2 + 2 + 4  # measurements, lung volumes, groups
    assert {"Patient", "Device", "ImagingStudy", "DiagnosticReport"} <= set(kinds)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conclusion", ""),
        ("effectiveDateTime", "2025-13-01"),
        ("issued", "2026-01-01T10:00"),
        ("x", 1),
    ],
)
def test_the_validator_catches_what_the_schema_forbids(
    bundle: dict[str, Any], field: str, value: object
) -> None:
    broken = json.loads(json.dumps(bundle))
    resources(broken, "DiagnosticReport")[0][field] = value
    with pytest.raises(pydantic.ValidationError):
        Bundle.model_validate(broken)


# fhir.resources does not check codes against required bindings; the R4 JSON schema does, so
# they are checked here against the R4 value sets of the elements the bundle uses.
REQUIRED_BINDINGS = {
    ("Bundle", "type"): {"document", "message", "transaction", "transaction-response", "batch"}
    | {"batch-response", "history", "searchset", "collection"},
    ("DiagnosticReport", "status"): {"registered", "partial", "preliminary", "final", "amended"}
    | {"corrected", "appended", "cancelled", "entered-in-error", "unknown"},
    ("Observation", "status"): {"registered", "preliminary", "final", "amended", "corrected"}
    | {"cancelled", "entered-in-error", "unknown"},
    ("Patient", "gender"): {"male", "female", "other", "unknown"},
    ("ImagingStudy", "status"): {"registered", "available", "cancelled", "entered-in-error"}
    | {"unknown"},
}
NAME_TYPES = {"udi-label-name", "user-friendly-name", "patient-reported-name"} | {
    "manufacturer-name",
    "model-name",
    "other",
}


def test_codes_of_required_bindings(bundle: dict[str, Any]) -> None:
    every = [bundle, *(e["resource"] for e in bundle["entry"])]
    for resource in every:
        for (kind, field), allowed in REQUIRED_BINDINGS.items():
            if resource["resourceType"] == kind:
                assert resource[field] in allowed, (kind, field, resource[field])
    for device in resources(bundle, "Device"):
        assert {name["type"] for name in device["deviceName"]} <= NAME_TYPES


def test_diagnostic_report(study: Study, bundle: dict[str, Any]) -> None:
    (report,) = resources(bundle, "DiagnosticReport")
    header = study.headers[0]
    assert report["status"] == "preliminary"
    assert report["code"]["coding"][0] == {
        "system": "http://loinc.org",
        "code": "24627-2",
        "display": "CT Chest",
    }
    identifiers = {i.get("system", "accession"): i["value"] for i in report["identifier"]}
    assert identifiers["accession"] == header.AccessionNumber
    assert identifiers["urn:dicom:uid"] == f"urn:oid:{study.uids.sr_instance}"
    assert report["conclusion"] == IMPRESSION
    assert report["meta"]["security"][0]["code"] == "AIAST"
    patient = resolve(bundle, report["subject"])
    assert patient["identifier"][0]["value"] == header.PatientID
    assert patient["birthDate"] == "1950-02-02" and patient["gender"] == "male"
    imaging = resolve(bundle, report["imagingStudy"][0])
    assert imaging["identifier"][0]["value"] == f"urn:oid:{header.StudyInstanceUID}"
    series = {s["modality"]["code"]: s["uid"] for s in imaging["series"]}
    assert series == {"SEG": study.uids.seg_series, "SR": study.uids.sr_series}


def test_results_hold_every_measurement(study: Study, bundle: dict[str, Any]) -> None:
    (report,) = resources(bundle, "DiagnosticReport")
    groups = {resolve(bundle, r)["code"]["text"]: resolve(bundle, r) for r in report["result"]}
    assert list(groups) == ["Nodule 1", "Nodule 2", "Right lung", "Left lung"]
    for lesion in study.analysis.lesions:
        group = groups[f"Nodule {lesion.number}"]
        assert group["identifier"][0]["value"] == (
            f"urn:oid:{study.uids.tracking_uid(f'nodule-{lesion.number}')}"
        )
        site = {"right": "3341006", "left": "44029006"}[lesion.side]
        assert group["bodySite"]["coding"][0]["code"] == site
        assert resolve(bundle, group["device"])["deviceName"][0]["name"] == "nodule-det"
        values = {}
        for member in group["hasMember"]:
            obs = resolve(bundle, member)
            quantity = obs["valueQuantity"]
            assert quantity["system"] == "http://unitsofmeasure.org"
            assert obs["status"] == "preliminary"
            values[(obs["code"]["coding"][0]["code"], quantity["code"])] = quantity["value"]
        assert values == {
            ("103339001", "mm"): round(lesion.long_axis_mm, 2),
            ("103340004", "mm"): round(lesion.short_axis_mm, 2),
            ("118565006", "mL"): round(lesion.volume_ml, 4),
            ("112031", "[hnsf'U]"): round(lesion.mean_hu, 1),
        }
    for side in ("right", "left"):
        (member,) = groups[f"{side.capitalize()} lung"]["hasMember"]
        volume = resolve(bundle, member)["valueQuantity"]
        assert volume["value"] == round(study.analysis.organ_volumes_ml[f"{side} lung"], 1)


def test_every_reference_resolves(bundle: dict[str, Any]) -> None:
    urls = {e["fullUrl"] for e in bundle["entry"]}
    text = json.dumps(bundle)
    references = [part.split('"')[0] for part in text.split('"reference": "')[1:]]
    assert references and set(references) <= urls


def test_same_job_same_bundle_other_job_other_ids(report: Report, bundle: dict[str, Any]) -> None:
    assert diagnostic_report_bundle(report) == bundle
    other_job = output_uids(report.uids.study_uid, 99)
    other = diagnostic_report_bundle(dataclasses.replace(report, uids=other_job))
    assert {e["fullUrl"] for e in other["entry"]}.isdisjoint(e["fullUrl"] for e in bundle["entry"])


def test_sparse_patient_still_validates(report: Report) -> None:
    study = dataclasses.replace(
        report.study, patient_name="", patient_id="", birth_date="", sex="", accession=""
    )
    sparse = diagnostic_report_bundle(dataclasses.replace(report, study=study))
    Bundle.model_validate(sparse)
    assert resources(sparse, "Patient")[0]["gender"] == "unknown"
    for entry in sparse["entry"]:
        assert all(i.get("value") for i in entry["resource"].get("identifier", []))


def test_searchset_for_the_ris_api(report: Report) -> None:
    searchset = diagnostic_report_bundle(report, "searchset")
    parsed = Bundle.model_validate(searchset)
    assert parsed.type == "searchset" and parsed.total == 1
    modes = {e["resource"]["resourceType"]: e["search"]["mode"] for e in searchset["entry"]}
    assert modes["DiagnosticReport"] == "match" and modes["Patient"] == "include"
