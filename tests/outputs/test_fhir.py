"""FHIR Bundle: valid FHIR R4 (4.0.1) per fhirkit, per the fhir.resources R4B models, and with
the R4 codes of every required binding it uses; what the RIS API answers is checked as well."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import fhirkit
import pydantic
import pytest
from fhir.resources.R4B.bundle import Bundle

from imaging_ai.outputs.common import Report, build_report
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.uids import output_uids
from imaging_ai.web.fhir_resources import Publication, StoredReport, searchset
from tests.fhir_schema import assert_valid_fhir
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Study


@pytest.fixture(scope="module")
def report(study: Study) -> Report:
    return build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)


@pytest.fixture(scope="module")
def bundle(report: Report) -> dict[str, Any]:
    return diagnostic_report_bundle(report)


@pytest.fixture(scope="module")
def ris_answer(bundle: dict[str, Any]) -> dict[str, Any]:
    """What ``GET /fhir/DiagnosticReport?identifier=A`` answers: the stored bundle, merged."""
    stored = json.loads(json.dumps(bundle, indent=1))  # as written to fhir.json and read back
    url = "https://imaging-ai.local/fhir/DiagnosticReport?identifier=ACC-1"
    report = StoredReport(7, "preliminary", CREATED, stored)
    publication = Publication("https://imaging-ai.local/fhir")
    answer: dict[str, Any] = json.loads(json.dumps(searchset([report], publication, url)))
    return answer


def r4_issues(resource: dict[str, Any]) -> list[str]:
    """Every problem fhirkit finds against the R4 4.0.1 definitions (errors and warnings)."""
    return [str(issue) for issue in fhirkit.validate(resource)]


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


def test_bundle_and_ris_answer_are_valid_fhir_r4(
    bundle: dict[str, Any], ris_answer: dict[str, Any]
) -> None:
    assert fhirkit.FHIR_VERSION == "4.0.1"
    assert r4_issues(bundle) == []
    assert r4_issues(ris_answer) == []
    assert_valid_fhir(bundle)
    assert_valid_fhir(ris_answer)
    for entry in ris_answer["entry"]:
        assert r4_issues(entry["resource"]) == [], entry["fullUrl"]
    assert ris_answer["type"] == "searchset" and ris_answer["total"] == 1
    assert len(ris_answer["entry"]) == len(bundle["entry"])


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("status", None, "status: required element missing"),  # None: removed
        ("code", "24627-2", "code: expected an object, found a string"),
        ("result", {"reference": "urn:uuid:x"}, "result: expected an array, found an object"),
        ("issued", "2026-01-01T10:00", 'issued: "2026-01-01T10:00" is not a valid instant'),
        ("composition", {"reference": "urn:uuid:x"}, "composition: unknown element"),  # R5 only
    ],
)
def test_the_r4_validator_catches_a_broken_report(
    ris_answer: dict[str, Any], field: str, value: object, expected: str
) -> None:
    broken = json.loads(json.dumps(ris_answer))
    kinds = [e["resource"]["resourceType"] for e in broken["entry"]]
    index = kinds.index("DiagnosticReport")
    report = broken["entry"][index]["resource"]
    if value is None:
        del report[field]
    else:
        report[field] = value
    assert f"error at DiagnosticReport.{expected}" in r4_issues(report)
    assert f"error at Bundle.entry[{index}].resource.{expected}" in r4_issues(broken)


# Neither fhirkit nor fhir.resources checks codes against required bindings; the R4 JSON schema
# does, so they are checked here against the R4 value sets of the elements the bundle uses.
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
SEARCH_MODES = {"match", "include", "outcome"}
NAME_TYPES = {"udi-label-name", "user-friendly-name", "patient-reported-name"} | {
    "manufacturer-name",
    "model-name",
    "other",
}


def unbound_codes(bundle: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(resource type, element, code) for each code outside its required R4 value set."""
    every = [bundle, *(e["resource"] for e in bundle["entry"])]
    found = [
        (kind, field, resource[field])
        for resource in every
        for (kind, field), allowed in REQUIRED_BINDINGS.items()
        if resource["resourceType"] == kind and resource[field] not in allowed
    ]
    found += [
        ("Bundle", "entry.search.mode", entry["search"]["mode"])
        for entry in bundle["entry"]
        if "search" in entry and entry["search"]["mode"] not in SEARCH_MODES
    ]
    for device in resources(bundle, "Device"):
        found += [
            ("Device", "deviceName.type", name["type"])
            for name in device["deviceName"]
            if name["type"] not in NAME_TYPES
        ]
    return found


def test_codes_of_required_bindings(bundle: dict[str, Any], ris_answer: dict[str, Any]) -> None:
    assert unbound_codes(bundle) == []
    assert unbound_codes(ris_answer) == []
    broken = json.loads(json.dumps(bundle))
    resources(broken, "DiagnosticReport")[0]["status"] = "done"  # fhirkit lets this through
    assert unbound_codes(broken) == [("DiagnosticReport", "status", "done")]


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
            ("103339001", "mm"): round(lesion.long_axis_mm, 1),
            ("103340004", "mm"): round(lesion.short_axis_mm, 1),
            ("118565006", "mL"): round(lesion.volume_ml, 3),
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
    assert r4_issues(sparse) == []
    assert_valid_fhir(sparse)
    assert resources(sparse, "Patient")[0]["gender"] == "unknown"
    for entry in sparse["entry"]:
        assert all(i.get("value") for i in entry["resource"].get("identifier", []))


def test_searchset_for_the_ris_api(report: Report) -> None:
    searchset = diagnostic_report_bundle(report, "searchset")
    parsed = Bundle.model_validate(searchset)
    assert_valid_fhir(searchset)
    assert parsed.type == "searchset" and parsed.total == 1
    modes = {e["resource"]["resourceType"]: e["search"]["mode"] for e in searchset["entry"]}
    assert modes["DiagnosticReport"] == "match" and modes["Patient"] == "include"
