"""The FHIR R4 API: metadata, read by id from a search's fullUrl, search by identifier, patient,
date and status, ImagingStudy with the catalogue's series, OperationOutcome errors; every answer
checked against the official R4 JSON schema (tests/fhir_schema.py) and fhirkit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fhirkit
import pytest
from sqlalchemy import Engine, select
from starlette.testclient import TestClient

from imaging_ai.config import Config, FhirConfig, Secret, StorageConfig, Token
from imaging_ai.db.models import AuditEvent, Instance, Job, Report, Series, Study
from imaging_ai.db.session import session_factory
from imaging_ai.outputs.common import (
    ANATOMICAL_STRUCTURE,
    ML,
    RIGHT_LUNG,
    VOLUME,
    Algorithm,
    Finding,
    ModelId,
    Quantity,
    StudyInfo,
)
from imaging_ai.outputs.common import Report as ReportContent
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.uids import output_uids
from imaging_ai.web.app import WebContext, create_app
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.fhir_resources import Publication, StoredReport, published_entries, searchset
from tests.fhir_schema import assert_valid_fhir

RIS = "ris-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
ALGORITHM = Algorithm(ModelId("lung-seg", "0.1.0"), ModelId("nodule-det", "0.2.0"))
MRN = "urn:oid:1.2.840.99.1"
ACSN = "https://ris.hospital.example/accession"
FHIR_JSON = "application/fhir+json"


@dataclass(frozen=True)
class Case:
    """A reported study: accession, Patient ID, study date."""

    accession: str
    patient_id: str
    study_date: str


CASES = (Case("ACC-A", "PID-A", "20260115"), Case("ACC-B", "PID-A", "20260220"))
CASES += (Case("ACC-C", "PID-C", "20251231"),)


def add_report(engine: Engine, data_dir: Path, number: int, case: Case) -> None:
    """A done study with a CT series of 3 instances, a dose SR, a job, and its stored bundle."""
    uid = f"1.2.826.0.1.77.{number}"
    sessions = session_factory(engine)
    with sessions() as s, s.begin():
        study = Study(
            study_instance_uid=uid,
            accession_number=case.accession,
            patient_id=case.patient_id,
            study_date=case.study_date,
            state="done",
            received_at=T0,
            last_instance_at=T0,
        )
        s.add(study)
        s.flush()
        for series_number, modality, count in ((2, "SR", 1), (1, "CT", 3)):
            series = Series(
                study_id=study.id,
                series_instance_uid=f"{uid}.{series_number}",
                modality=modality,
                series_number=series_number,
                last_instance_at=T0,
            )
            s.add(series)
            s.flush()
            for i in range(count):
                s.add(
                    Instance(
                        series_id=series.id,
                        sop_instance_uid=f"{uid}.{series_number}.{i}",
                        sop_class_uid="1.2.840.10008.5.1.4.1.1.2",
                        transfer_syntax_uid="1.2.840.10008.1.2.1",
                        path=f"{uid}/{i}.dcm",
                        size_bytes=10,
                        received_at=T0,
                    )
                )
        job = Job(
            study_id=study.id,
            state="done",
            priority="outpatient",
            rank=1,
            deadline=T0,
            created_at=T0,
        )
        s.add(job)
        s.flush()
        created = T0 + timedelta(minutes=number)
        bundle = diagnostic_report_bundle(content(uid, job.id, case, created))
        folder = data_dir / "results" / uid / str(job.id)
        folder.mkdir(parents=True)
        (folder / "fhir.json").write_text(json.dumps(bundle, indent=1))
        files = {"fhir": str((folder / "fhir.json").relative_to(data_dir))}
        s.add(
            Report(study_id=study.id, job_id=job.id, created_at=created, findings={"files": files})
        )


def content(uid: str, job_id: int, case: Case, created: datetime) -> ReportContent:
    uids = output_uids(uid, job_id)
    study = StudyInfo(
        uid,
        f"{uid}.1",
        case.accession,
        case.patient_id,
        "HOSP",
        "DOE^JANE",
        "19500202",
        "F",
        case.study_date,
        "095100",
        "CT chest",
    )
    lung = Finding(
        "right-lung",
        "Right lung",
        ANATOMICAL_STRUCTURE,
        RIGHT_LUNG,
        RIGHT_LUNG,
        uids.tracking_uid("right-lung"),
        (Quantity(VOLUME, 1988.0, ML, 1),),
    )
    return ReportContent(
        study, (lung,), "No nodule detected. AI-generated.", ALGORITHM, uids, created
    )


def make_client(engine: Engine, data_dir: Path, fhir: FhirConfig | None = None) -> TestClient:
    tokens = TokenStore((Token("ris", Secret(RIS), "ris"), Token("m", Secret(METRICS), "metrics")))
    config = Config(storage=StorageConfig(data_dir=str(data_dir)), fhir=fhir or FhirConfig())
    ctx = WebContext(session_factory(engine), tokens, lambda: {"database": "ok"}, config=config)
    return TestClient(create_app(ctx), base_url="https://testserver")


@pytest.fixture
def data_dir(engine: Engine, tmp_path: Path) -> Path:
    for number, case in enumerate(CASES, 1):
        add_report(engine, tmp_path, number, case)
    return tmp_path


@pytest.fixture
def client(engine: Engine, data_dir: Path) -> TestClient:
    return make_client(engine, data_dir)


def fhir_get(client: TestClient, url: str, status: int = 200, token: str = RIS) -> Any:
    """The answer to ``url``: FHIR JSON, valid against the R4 schema and fhirkit."""
    response = client.get(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0] == FHIR_JSON
    body = response.json()
    assert_valid_fhir(body)
    assert [str(issue) for issue in fhirkit.validate(body)] == []
    return body


def search(client: TestClient, query: str) -> list[str]:
    """The accession numbers of the DiagnosticReports a search matches, in answer order."""
    bundle = fhir_get(client, f"/fhir/DiagnosticReport?{query}")
    entries = bundle.get("entry", [])
    matches = [e["resource"] for e in entries if e["search"]["mode"] == "match"]
    assert bundle["type"] == "searchset" and bundle["total"] == len(matches)
    return [_accession(r) for r in matches]


def _accession(resource: dict[str, Any]) -> str:
    (value,) = [i["value"] for i in resource["identifier"] if i["value"].startswith("ACC")]
    return str(value)


def outcome(client: TestClient, url: str, status: int, token: str = RIS) -> str:
    """The diagnostics of the OperationOutcome that ``url`` answers with ``status``."""
    body = fhir_get(client, url, status, token)
    assert body["resourceType"] == "OperationOutcome"
    (issue,) = body["issue"]
    assert issue["severity"] == "error"
    return str(issue["diagnostics"])


def test_metadata_is_a_capability_statement(client: TestClient) -> None:
    statement = fhir_get(client, "/fhir/metadata", token="")  # open: no patient data
    assert statement["resourceType"] == "CapabilityStatement"
    assert statement["status"] == "active" and statement["kind"] == "instance"
    assert statement["fhirVersion"] == "4.0.1" and "json" in statement["format"]
    (rest,) = statement["rest"]
    assert rest["mode"] == "server"
    by_type = {r["type"]: r for r in rest["resource"]}
    assert set(by_type) == {"DiagnosticReport", "ImagingStudy", "Observation", "Patient", "Device"}
    report = by_type["DiagnosticReport"]
    assert {i["code"] for i in report["interaction"]} == {"read", "search-type"}
    params = {p["name"]: p["type"] for p in report["searchParam"]}
    assert params == {"identifier": "token", "patient": "reference", "date": "date"} | {
        "status": "token"
    }
    assert [i["code"] for i in by_type["Observation"]["interaction"]] == ["read"]
    assert statement["implementation"]["url"] == "https://testserver/fhir"


def test_search_by_accession_then_read_every_entry_by_its_full_url(client: TestClient) -> None:
    bundle = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-A")
    assert bundle["total"] == 1
    kinds = set()
    for entry in bundle["entry"]:
        resource = entry["resource"]
        kinds.add(resource["resourceType"])
        assert entry["fullUrl"] == (
            f"https://testserver/fhir/{resource['resourceType']}/{resource['id']}"
        )
        read = fhir_get(client, urlsplit(entry["fullUrl"]).path)
        assert read == resource
    assert kinds == {"Patient", "Device", "ImagingStudy", "DiagnosticReport", "Observation"}
    (report,) = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "match"]
    assert report["status"] == "preliminary"  # the stored report status
    patient = report["subject"]["reference"]
    assert patient.startswith("Patient/")
    assert fhir_get(client, f"/fhir/{patient}")["identifier"][0]["value"] == "PID-A"


def test_ids_are_stable_and_name_the_report(client: TestClient) -> None:
    first = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-B")
    again = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-B")
    assert [e["fullUrl"] for e in first["entry"]] == [e["fullUrl"] for e in again["entry"]]
    other = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-A")
    assert {e["fullUrl"] for e in first["entry"]}.isdisjoint(e["fullUrl"] for e in other["entry"])


def test_imaging_study_has_the_catalogues_series(client: TestClient) -> None:
    bundle = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-A")
    (report,) = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "match"]
    study = fhir_get(client, f"/fhir/{report['imagingStudy'][0]['reference']}")
    series = [
        (s["modality"]["code"], s.get("number"), s["numberOfInstances"]) for s in study["series"]
    ]
    assert series == [("CT", 1, 3), ("SR", 2, 1), ("SEG", None, 1), ("SR", None, 1)]
    assert study["series"][0]["uid"] == "1.2.826.0.1.77.1.1"
    assert study["numberOfSeries"] == 4 and study["numberOfInstances"] == 6


def test_search_by_patient(client: TestClient) -> None:
    assert search(client, "patient:identifier=PID-A") == ["ACC-A", "ACC-B"]
    assert search(client, "patient.identifier=PID-C") == ["ACC-C"]
    assert search(client, "patient:identifier=PID-A,PID-C") == ["ACC-A", "ACC-B", "ACC-C"]
    assert search(client, "patient:identifier=urn:oid:1.2.3|PID-A") == []  # not our system
    bundle = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-B")
    (report,) = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "match"]
    reference = report["subject"]["reference"]
    assert search(client, f"patient={reference}") == ["ACC-B"]
    assert search(client, f"patient=https://testserver/fhir/{reference}") == ["ACC-B"]
    assert search(client, f"patient={reference.removeprefix('Patient/')}") == ["ACC-B"]
    assert search(client, f"patient={reference[:-1]}0") == []
    assert search(client, "patient=Patient/no-such-id") == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("date=2026-01-15", ["ACC-A"]),
        ("date=eq2026-01", ["ACC-A"]),
        ("date=2026", ["ACC-A", "ACC-B"]),
        ("date=ge2026-01-01", ["ACC-A", "ACC-B"]),
        ("date=gt2026-01-15", ["ACC-B"]),
        ("date=gt2026-01", ["ACC-B"]),
        ("date=lt2026-01-15", ["ACC-C"]),
        ("date=le2026-01-15", ["ACC-A", "ACC-C"]),
        ("date=lt2026", ["ACC-C"]),
        ("date=ne2026-01-15", ["ACC-B", "ACC-C"]),
        ("date=ge2026-01-01&date=le2026-01-31", ["ACC-A"]),
        ("date=2025-12-31,2026-02-20", ["ACC-B", "ACC-C"]),
    ],
)
def test_search_by_date(client: TestClient, query: str, expected: list[str]) -> None:
    assert sorted(search(client, query)) == expected


def test_search_by_status_and_identifier_combined(client: TestClient) -> None:
    assert search(client, "status=preliminary") == ["ACC-A", "ACC-B", "ACC-C"]
    assert search(client, "status=final") == []
    assert search(client, "status=final,preliminary&identifier=ACC-C") == ["ACC-C"]
    assert search(client, "patient:identifier=PID-A&date=ge2026-02-01") == ["ACC-B"]
    assert search(client, "patient:identifier=PID-A&identifier=ACC-C") == []
    assert search(client, "identifier=|ACC-A") == ["ACC-A"]  # published without a system
    assert search(client, "identifier=http://other|ACC-A") == []
    assert search(client, "") == ["ACC-A", "ACC-B", "ACC-C"]


def test_configured_base_url_and_identifier_systems(engine: Engine, data_dir: Path) -> None:
    fhir = FhirConfig("https://ai.hospital.example/fhir", MRN, ACSN)
    client = make_client(engine, data_dir, fhir)
    bundle = fhir_get(client, f"/fhir/DiagnosticReport?identifier={ACSN}|ACC-A")
    assert bundle["total"] == 1
    assert all(
        e["fullUrl"].startswith("https://ai.hospital.example/fhir/") for e in bundle["entry"]
    )
    resources = {e["resource"]["resourceType"]: e["resource"] for e in bundle["entry"]}
    assert resources["Patient"]["identifier"][0]["system"] == MRN
    for kind in ("DiagnosticReport", "ImagingStudy"):
        systems = {i.get("system") for i in resources[kind]["identifier"]}
        assert systems == {"urn:dicom:uid", ACSN}
    assert search(client, f"patient:identifier={MRN}|PID-A") == ["ACC-A", "ACC-B"]
    assert search(client, "identifier=|ACC-A") == []  # it has a system now
    assert search(client, "identifier=ACC-A") == ["ACC-A"]
    metadata = fhir_get(client, "/fhir/metadata")
    assert metadata["implementation"]["url"] == "https://ai.hospital.example/fhir"


@pytest.mark.parametrize(
    ("url", "status", "says"),
    [
        ("/fhir/DiagnosticReport/1-00000000000000000000000000000000", 404, "no DiagnosticReport"),
        ("/fhir/Observation/not-an-id", 404, "no Observation with id 'not-an-id'"),
        ("/fhir/Encounter/1", 404, "Not Found"),
        ("/fhir/DiagnosticReport?subject=Patient/1", 400, "unknown search parameter 'subject'"),
        ("/fhir/DiagnosticReport?status:not=final", 400, "unknown search parameter 'status:not'"),
        ("/fhir/DiagnosticReport?status=done", 400, "status 'done' is not a DiagnosticReport"),
        ("/fhir/DiagnosticReport?date=2026-02-30", 400, "not a calendar date"),
        ("/fhir/DiagnosticReport?date=2026-01-15T10:00", 400, "kept to the day"),
        ("/fhir/DiagnosticReport?date=sa2026", 400, "prefix 'sa' is not supported"),
        ("/fhir/DiagnosticReport?identifier=", 400, "needs a value"),
        ("/fhir/DiagnosticReport?patient=Group/1", 400, "must refer to a Patient"),
        ("/fhir/DiagnosticReport?_format=xml", 400, "JSON only"),
    ],
)
def test_errors_are_operation_outcomes(
    client: TestClient, url: str, status: int, says: str
) -> None:
    assert says in outcome(client, url, status)


def test_a_read_of_an_id_under_another_type_is_not_found(client: TestClient) -> None:
    bundle = fhir_get(client, "/fhir/DiagnosticReport?identifier=ACC-A")
    (report,) = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "match"]
    assert "no Observation" in outcome(client, f"/fhir/Observation/{report['id']}", 404)


def test_tokens_and_roles_as_for_the_ris_api(client: TestClient) -> None:
    for url in ("/fhir/DiagnosticReport?identifier=ACC-A", "/fhir/Patient/1-" + "0" * 32):
        response = client.get(url)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "Bearer token is required" in outcome(client, url, 401, token="")
        assert "role 'metrics' may not" in outcome(client, url, 403, token=METRICS)


def test_reads_and_searches_are_audited_without_patient_identifiers(
    client: TestClient, engine: Engine
) -> None:
    search(client, "patient:identifier=PID-A&identifier=ACC-A")
    fhir_get(client, "/fhir/Observation/1-" + "0" * 32, 404)
    with session_factory(engine)() as s:
        targets = s.scalars(select(AuditEvent.target).order_by(AuditEvent.id)).all()
    assert targets == [
        "fhir DiagnosticReport?identifier,patient:identifier accession ACC-A",
        "fhir Observation/1-" + "0" * 32,
    ]
    assert not any("PID-A" in t for t in targets)


def test_the_report_status_is_the_stored_one() -> None:
    """What a re-analysis will store ("amended") is what the DiagnosticReport says."""
    case = CASES[0]
    bundle = diagnostic_report_bundle(content("1.2.826.0.1.77.9", 9, case, T0))
    report = StoredReport(9, "amended", T0, json.loads(json.dumps(bundle)))
    entries = published_entries(report, Publication("https://h/fhir"))
    (published,) = [
        e["resource"] for e in entries if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    assert published["status"] == "amended"
    assert (
        published["id"].startswith("9-")
        and published["meta"]["lastUpdated"] == "2026-03-01T09:00:00+00:00"
    )
    assert_valid_fhir(searchset([report], Publication("https://h/fhir"), "https://h/fhir/x"))
