"""Roles, CSRF, confirmation and security headers on the admin pages."""

from __future__ import annotations

import re

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from imaging_ai.db.models import AuditEvent
from tests.web.conftest import ADMIN, RIS, csrf_of
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded

ADMIN_PAGES = ("/admin", "/admin/live", "/admin/search", "/admin/audit")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_ris_token_cannot_see_admin_pages(client: TestClient) -> None:
    for path in ADMIN_PAGES:
        response = client.get(path, headers=bearer(RIS))
        assert response.status_code == 403, path
        assert response.json() == {"error": "role 'ris' may not use the admin pages"}
    assert client.get("/admin", headers=bearer("not-a-token-000000")).status_code == 401


def test_admin_bearer_token_works_for_scripts(client: TestClient, seeded: Seeded) -> None:
    for path in ADMIN_PAGES:
        assert client.get(path, headers=bearer(ADMIN)).status_code == 200, path
    uid = seeded.uids["receiving"]
    response = client.post(
        "/admin/actions",
        data={"action": "force_complete", "target": uid, "confirm": "yes"},
        headers=bearer(ADMIN),
    )  # no CSRF token: a bearer token is not sent by browsers on their own
    assert response.json() == {"action": "force_complete", "target": uid, "changed": True}


def test_posts_without_the_session_csrf_token_are_rejected(
    admin: TestClient, actions: FakeActions, engine: Engine, seeded: Seeded
) -> None:
    form = {"action": "retry_study", "target": seeded.uids["failed"], "confirm": "yes"}
    for csrf in (None, "", "forged-token"):
        data = form if csrf is None else {**form, "csrf": csrf}
        response = admin.post("/admin/actions", data=data)
        assert response.status_code == 403
        assert "did not come from this page" in response.text
    assert actions.calls == []
    with Session(engine) as s:
        rejected = s.scalars(select(AuditEvent).where(AuditEvent.action == "csrf_rejected")).all()
    assert [(e.actor, e.target) for e in rejected] == [("it", "/admin/actions")] * 3
    assert admin.post("/admin/signout").status_code == 403  # sign-out is protected too


def test_actions_need_confirmation(admin: TestClient, actions: FakeActions, seeded: Seeded) -> None:
    form = {"action": "retry_study", "target": seeded.uids["failed"], "csrf": csrf_of(admin)}
    response = admin.post("/admin/actions", data=form)
    assert response.status_code == 400 and "not confirmed" in response.text
    assert admin.get("/admin/actions").status_code == 405  # no action by following a link
    assert actions.calls == []


def test_security_headers(admin: TestClient) -> None:
    page = admin.get("/admin")
    headers = page.headers
    assert headers["cache-control"] == "no-store"
    assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["strict-transport-security"].startswith("max-age=")
    assert admin.get("/api/v1/studies", headers=bearer(RIS)).headers["cache-control"] == "no-store"
    css = admin.get("/static/admin.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "no-store" not in css.headers.get("cache-control", "")


def test_pages_use_no_external_resources(admin: TestClient, seeded: Seeded) -> None:
    paths = [*ADMIN_PAGES, f"/admin/studies/{seeded.uids['done']}", "/admin/signin"]
    for path in paths:
        html = admin.get(path).text
        external = re.findall(r'(?:src|href|action)="((?:https?:)?//[^"]*)"', html)
        assert external == [], path
        assert "<script>" not in html and " style=" not in html  # CSP: no inline code/styles
