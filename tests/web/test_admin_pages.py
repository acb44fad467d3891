"""The admin pages: sections, actions through confirmation, search, study, audit log."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from imaging_ai.db.models import AuditEvent, Study
from tests.web.conftest import BASE, RIS, csrf_of, make_app, sign_in
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded


def test_status_page_shows_now_recent_and_problems(admin: TestClient) -> None:
    html = admin.get("/admin").text
    for words in (
        "Now",
        "Recent",
        "Problems",
        "Queue",
        "Studies in flight",
        "ACC-RECEIVING",
        "ACC-QUEUED",
        "ACC-PROCESSING",
        "ACC-DELIVERING",  # in flight
        "ACC-DONE",
        "ACC-MISSED",
        "missed",  # recent, with the deadline miss
        "The CT series has no axial slices the lung model can use.",  # failure, in words
        "connection refused by 10.0.0.5:104",
        "ACK AE: unknown patient",  # deliveries
        "Late instances",
        "node-a:4242",
        "associations refused since start",
        "cuda:0",
        "42%",
        "8×10, 16×3",
        "<svg",
    ):
        assert words in html, words
    assert "DOE" not in html  # patient names only where an administrator looks a study up
    assert '<meta http-equiv="refresh"' in html and "/static/admin.js" in html
    live = admin.get("/admin/live").text
    assert "ACC-QUEUED" in live and "<html" not in live


ACTIONS: list[tuple[str, str, dict[str, str], tuple[str, ...], str]] = [
    ("force_complete", "receiving", {}, ("force_complete",), "completed and queued"),
    ("retry_study", "failed", {}, ("retry_study",), "queued again"),
    (
        "raise_priority",
        "queued",
        {"priority": "urgent"},
        ("raise_priority", "urgent"),
        "more urgent",
    ),
    ("pause_class", "outpatient", {}, ("set_paused", "outpatient", "True"), "paused"),
    ("resume_class", "inpatient", {}, ("set_paused", "inpatient", "False"), "resumed"),
    ("retry_delivery", "failing", {}, ("retry_delivery",), "will be tried now"),
    ("cancel_delivery", "failing", {}, ("cancel_delivery",), "cancelled"),
    ("reload_models", "engines", {}, ("reload_models",), "Model reload started"),
]


def target_of(seeded: Seeded, name: str) -> str:
    if name == "failing":
        return str(seeded.failing_delivery)
    return seeded.uids.get(name, name)


@pytest.mark.parametrize(("action", "which", "extra", "call", "notice"), ACTIONS)
def test_each_action_is_confirmed_then_done_and_audited(
    admin: TestClient,
    actions: FakeActions,
    engine: Engine,
    seeded: Seeded,
    action: str,
    which: str,
    extra: dict[str, str],
    call: tuple[str, ...],
    notice: str,
) -> None:
    target = target_of(seeded, which)
    confirm = admin.get("/admin/confirm", params={"action": action, "target": target})
    assert confirm.status_code == 200 and "?</h1>" in confirm.text
    assert actions.calls == []  # asking is not doing
    form = {"action": action, "target": target, "confirm": "yes", "csrf": csrf_of(admin), **extra}
    done = admin.post("/admin/actions", data=form, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"].startswith("/admin?done=")
    assert notice in admin.get(done.headers["location"]).text
    name, *args = call
    expected = (name, *(args or [target]), "it") if name != "set_paused" else (*call, "it")
    if name == "raise_priority":
        expected = ("raise_priority", target, "urgent", "it")
    assert actions.calls == [expected]
    with Session(engine) as s:
        (request,) = s.scalars(select(AuditEvent).where(AuditEvent.action == "admin_request"))
    assert (request.actor, request.target, request.source) == ("it", target, "testclient")
    assert request.detail.startswith(action) and request.detail.endswith("changed")


def test_the_status_page_offers_a_model_reload(admin: TestClient, seeded: Seeded) -> None:
    assert "action=reload_models&amp;target=engines" in admin.get("/admin").text
    assert admin.get("/admin/confirm?action=reload_models&target=x").status_code == 404


def test_bad_action_requests(admin: TestClient, seeded: Seeded) -> None:
    assert admin.get("/admin/confirm?action=drop_tables&target=x").status_code == 400
    missing = admin.get("/admin/confirm?action=retry_study&target=9.9.9")
    assert missing.status_code == 404 and "9.9.9" in missing.text
    assert admin.get("/admin/confirm?action=pause_class&target=vip").status_code == 404
    urgent = admin.get(f"/admin/confirm?action=raise_priority&target={seeded.uids['processing']}")
    assert "already in the most urgent class" in urgent.text
    form = {
        "action": "raise_priority",
        "target": seeded.uids["queued"],
        "confirm": "yes",
        "csrf": csrf_of(admin),
        "priority": "outpatient",
    }
    assert admin.post("/admin/actions", data=form).status_code == 400


def test_no_actions_without_a_daemon(engine: Engine, seeded: Seeded) -> None:
    client = TestClient(make_app(engine, None), base_url=BASE)
    sign_in(client)
    assert "Force complete" not in client.get("/admin").text
    page = client.get(f"/admin/confirm?action=retry_study&target={seeded.uids['failed']}")
    assert page.status_code == 503 and "without the daemon" in page.text


def test_search_shows_patient_names_to_admins_and_is_audited(
    admin: TestClient, engine: Engine, seeded: Seeded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    found = admin.get("/admin/search", params={"accession": "ACC-DONE"})
    assert "DOE JANE" in found.text and seeded.uids["done"] in found.text
    assert "ACC-FAILED" not in found.text
    with Session(engine) as s:
        date = s.scalar(select(Study.study_date).where(Study.accession_number == "ACC-DONE"))
    assert date is not None
    by_date = admin.get("/admin/search", params={"date": f"{date[:4]}-{date[4:6]}-{date[6:]}"})
    assert all(acc in by_date.text for acc in ("ACC-DONE", "ACC-FAILED", "ACC-RECEIVING"))
    assert admin.get("/admin/search", params={"date": "30/11/2026"}).status_code == 400
    assert "No study found" in admin.get("/admin/search?accession=NOPE").text
    with Session(engine) as s:
        searches = s.scalars(select(AuditEvent).where(AuditEvent.action == "search")).all()
    assert [e.target for e in searches][:1] == ["accession ACC-DONE"]
    assert all("DOE" not in e.detail + e.target for e in searches)
    assert "DOE" not in caplog.text  # never in logs


def test_patient_names_are_hidden_from_every_non_admin_view(
    client: TestClient, admin: TestClient, seeded: Seeded
) -> None:
    ris = {"Authorization": f"Bearer {RIS}"}
    for path in ("/api/v1/studies", f"/api/v1/studies/{seeded.uids['done']}", "/metrics"):
        response = client.get(path, headers=ris)
        assert response.status_code == 200 and "DOE" not in response.text, path
    assert client.get("/admin/search?accession=ACC-DONE", headers=ris).status_code == 403
    for path in ("/admin", "/admin/live", "/admin/audit"):
        assert "DOE" not in admin.get(path).text, path


def test_study_page(admin: TestClient, engine: Engine, seeded: Seeded) -> None:
    uid = seeded.uids["delivering"]
    html = admin.get(f"/admin/studies/{uid}").text
    for words in ("ACC-DELIVERING", "DOE JANE", "pacs:PACS@10.0.0.5:104", "cancelled", "deliver"):
        assert words in html, words
    assert admin.get("/admin/studies/9.9.9").status_code == 404
    with Session(engine) as s:
        views = s.scalars(select(AuditEvent.target).where(AuditEvent.action == "view_study"))
        assert list(views) == [uid]


def test_audit_log_page(admin: TestClient) -> None:
    everything = admin.get("/admin/audit").text
    assert "read report" in everything and "10.0.0.7" in everything  # who, what, from where
    assert "sign in" in everything and "testclient" in everything
    sign_ins = admin.get("/admin/audit", params={"category": "sign-ins"}).text
    assert "sign in" in sign_ins and "read report" not in sign_ins
    by_actor = admin.get("/admin/audit", params={"actor": "ris"}).text
    assert "read report" in by_actor and "sign in" not in by_actor


def odd_live() -> dict[str, Any]:
    return {
        "node": None,
        "workers": [{"device": "cuda:1", "memory_used_bytes": 3 * 2**30, "batch_sizes": {"32": 4}}],
        "notes": ["a", "b"],
        "nested": {"x": {"y": 1.23456}},
    }


def broken_live() -> dict[str, Any]:
    raise RuntimeError("worker pipe closed")


@pytest.mark.parametrize(("live", "shown"), [(odd_live, "3,072 MiB"), (broken_live, "unavailable")])
def test_live_status_is_shown_whatever_its_shape(
    engine: Engine, seeded: Seeded, live: Any, shown: str
) -> None:
    client = TestClient(make_app(engine, None, live=live), base_url=BASE)
    sign_in(client)
    response = client.get("/admin")
    assert response.status_code == 200 and shown in response.text
    assert "ACC-QUEUED" in response.text  # the database's view is there either way
