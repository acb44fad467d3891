"""A study's deliveries as the RIS API and the status page show them: a refused one with its
reason and time, counted, beside the delivered ones."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker
from starlette.testclient import TestClient

from imaging_ai.db.models import Delivery, Study
from imaging_ai.db.session import utcnow
from imaging_ai.states import DeliveryState
from tests.web.conftest import RIS
from tests.web.seed import Seeded

REASON = (
    "refused by PACS PACS: it accepted the association but no presentation context for "
    "Comprehensive 3D SR Storage (1.2.840.10008.5.1.4.1.1.88.34) in Explicit VR Little Endian "
    "(abstract syntax not supported); not sent again"
)


def refuse_an_sr(engine: Engine, uid: str) -> int:
    """The done study's SR refused by its PACS after one attempt."""
    now = utcnow()
    with sessionmaker(engine)() as s, s.begin():
        study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).one()
        row = Delivery(
            study_id=study.id,
            kind="sr",
            destination="pacs:PACS@10.0.0.5:104",
            payload="out/sr.dcm",
            state=DeliveryState.REFUSED,
            attempts=1,
            next_try_at=now,
            last_error=REASON,
            created_at=now - timedelta(seconds=5),
            last_attempt_at=now,
        )
        s.add(row)
        s.flush()
        return row.id


def test_the_api_lists_a_studys_deliveries(
    client: TestClient, engine: Engine, seeded: Seeded
) -> None:
    uid = seeded.uids["done"]
    refuse_an_sr(engine, uid)
    body = client.get(f"/api/v1/studies/{uid}", headers={"Authorization": f"Bearer {RIS}"}).json()
    assert body["state"] == "done"
    seg, sr = body["deliveries"]
    assert (seg["result"], seg["state"], seg["attempts"], seg["last_error"]) == (
        "seg",
        "done",
        1,
        None,
    )
    assert seg["delivered_at"] is not None and seg["next_try_at"] is None
    assert sr == {
        "result": "sr",
        "destination": "pacs:PACS@10.0.0.5:104",
        "state": "refused",
        "attempts": 1,
        "last_error": REASON,
        "created_at": sr["created_at"],
        "last_attempt_at": sr["last_attempt_at"],
        "next_try_at": None,
        "delivered_at": None,
    }
    assert sr["last_attempt_at"].endswith("Z")
    pending = client.get(
        f"/api/v1/studies/{seeded.uids['delivering']}", headers={"Authorization": f"Bearer {RIS}"}
    ).json()["deliveries"]
    assert [d["state"] for d in pending] == ["pending", "cancelled"]
    assert pending[0]["next_try_at"] is not None


def test_the_status_page_shows_and_counts_a_refusal(
    admin: TestClient, engine: Engine, seeded: Seeded
) -> None:
    uid = seeded.uids["done"]
    delivery = refuse_an_sr(engine, uid)
    page = admin.get("/admin").text
    problems = page[page.index('id="problems"') :]
    assert '<span class="badge bad">1 refused</span>' in problems
    assert REASON in problems
    assert f"action=retry_delivery&amp;target={delivery}" in problems  # its Retry action
    recent = page[page.index('id="recent"') : page.index('id="problems"')]
    assert "1 refused" in recent  # the done study's row says so
    study = admin.get(f"/admin/studies/{uid}").text
    assert "1 refused</span> by the destination" in study
    assert REASON in study and "refused" in study


def test_metrics_count_refusals(client: TestClient, engine: Engine, seeded: Seeded) -> None:
    before = client.get("/metrics").text
    assert 'imaging_ai_deliveries{state="refused"} 0.0' in before  # the series exists at 0
    refuse_an_sr(engine, seeded.uids["done"])
    after = client.get("/metrics").text
    assert 'imaging_ai_deliveries{state="refused"} 1.0' in after
    assert 'imaging_ai_deliveries_refused{destination="pacs:PACS@10.0.0.5:104"} 1.0' in after
