"""The studies API: bearer tokens, roles, JSON fields; health and readiness."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from imaging_ai.assemble import Assembler
from imaging_ai.catalog import Catalog, InstanceMeta
from imaging_ai.config import AssembleConfig, PriorityConfig, Secret, Token
from imaging_ai.db.models import AuditEvent, Job, Report, Study
from imaging_ai.db.session import session_factory
from imaging_ai.spool import Spool
from imaging_ai.web.app import WebContext, create_app
from imaging_ai.web.auth import TokenStore

RIS = "ris-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@pytest.fixture
def client(engine: Engine, tmp_path: Path) -> TestClient:
    tokens = TokenStore((Token("ris", Secret(RIS), "ris"), Token("it", Secret(ADMIN), "admin")))
    ctx = WebContext(session_factory(engine), tokens, lambda: {"database": "ok"})
    catalog = Catalog(engine, Spool(tmp_path, 0))
    for i, study in enumerate(("1.2.1", "1.2.2")):
        for j in range(3):
            m = InstanceMeta(
                study,
                f"{study}.{j % 2}",
                f"{study}.9.{j}",
                "1.2.840.10008.5.1.4.1.1.2",
                "1.2.840.10008.1.2.1",
                accession_number=f"ACC{i}",
                patient_name="DOE^JANE",
            )
            catalog.record(m, f"{study}/{j}", 10, T0)
    Assembler(session_factory(engine), AssembleConfig(), PriorityConfig()).force_complete(
        "1.2.1", T0
    )
    return TestClient(create_app(ctx))


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_token_required(client: TestClient) -> None:
    response = client.get("/api/v1/studies")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/v1/studies", headers=auth("wrong-token-xxxxxxxx")).status_code == 401


def test_list_and_get_study(client: TestClient) -> None:
    response = client.get("/api/v1/studies", headers=auth(RIS))
    assert response.status_code == 200
    studies = {s["study_uid"]: s for s in response.json()["studies"]}
    assert set(studies) == {"1.2.1", "1.2.2"}
    done = client.get("/api/v1/studies/1.2.1", headers=auth(ADMIN)).json()
    for field in (
        "study_uid",
        "accession",
        "state",
        "priority",
        "deadline",
        "instance_count",
        "series_count",
        "received_at",
        "completed_at",
    ):
        assert field in done
    assert done["state"] == "queued"
    assert done["priority"] == "outpatient"
    assert done["instance_count"] == 3
    assert done["series_count"] == 2
    assert done["received_at"] == "2026-11-30T09:00:00.000Z"
    assert done["deadline"] == "2026-11-30T09:30:00.000Z"
    receiving = studies["1.2.2"]
    assert receiving["state"] == "receiving"
    assert receiving["completed_at"] is None
    assert "DOE" not in response.text  # no patient identifiers in this view


def test_filters_and_errors(client: TestClient) -> None:
    by_accession = client.get("/api/v1/studies?accession=ACC1", headers=auth(RIS)).json()
    assert [s["study_uid"] for s in by_accession["studies"]] == ["1.2.2"]
    by_state = client.get("/api/v1/studies?state=queued", headers=auth(RIS)).json()
    assert [s["study_uid"] for s in by_state["studies"]] == ["1.2.1"]
    missing = client.get("/api/v1/studies/9.9.9", headers=auth(RIS))
    assert missing.status_code == 404
    assert "9.9.9" in missing.json()["error"]
    assert client.get("/api/v1/studies?limit=0", headers=auth(RIS)).status_code == 400


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "alive"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok"}


def add_report(engine: Engine) -> None:
    with Session(engine) as s, s.begin():
        study = s.scalars(select(Study).where(Study.study_instance_uid == "1.2.1")).one()
        job = s.scalars(select(Job).where(Job.study_id == study.id)).one()
        job.timings = {"lung-seg": 1.5}
        s.add(
            Report(
                study_id=study.id,
                job_id=job.id,
                created_at=T0,
                impression="1 lung nodule(s) detected",
                findings={
                    "lesions": [{"number": 1, "long_axis_mm": 8.2}],
                    "organ_volumes_ml": {"right lung": 2500.0},
                    "models": {"lung-seg": {"version": "0.1.0"}},
                },
            )
        )


def test_report_by_study_and_accession_is_audited(client: TestClient, engine: Engine) -> None:
    add_report(engine)
    report = client.get("/api/v1/reports/1.2.1", headers=auth(RIS)).json()
    assert report["impression"] == "1 lung nodule(s) detected"
    assert report["lesions"][0]["long_axis_mm"] == 8.2
    assert report["status"] == "preliminary" and report["ai_generated"] is True
    assert report["timings_s"] == {"lung-seg": 1.5}
    assert report["models"]["lung-seg"]["version"] == "0.1.0"
    listed = client.get("/api/v1/reports?accession=ACC0", headers=auth(RIS)).json()
    assert [r["study_uid"] for r in listed["reports"]] == ["1.2.1"]
    assert client.get("/api/v1/reports/1.2.2", headers=auth(RIS)).status_code == 404
    assert client.get("/api/v1/reports", headers=auth(RIS)).status_code == 400
    assert client.get("/api/v1/reports/1.2.1").status_code == 401
    with Session(engine) as s:
        events = s.scalars(select(AuditEvent).where(AuditEvent.action == "read_report")).all()
    assert [(e.actor, e.target) for e in events] == [("ris", "1.2.1"), ("ris", "accession ACC0")]
