"""A sign-out holds on every node and after a restart: revocations live in the database
(issue 18 item 11). ``/metrics`` can require a token."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, func, select
from starlette.testclient import TestClient

from imaging_ai.config import Config, HttpConfig, Secret, Token
from imaging_ai.db.models import SessionRevocation
from imaging_ai.db.session import session_factory
from imaging_ai.web.app import WebContext, create_app
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.session import COOKIE, SignInThrottle, WebSecurity
from tests.web.conftest import ADMIN, BASE, RIS, csrf_of, make_app, sign_in
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded

SECRET = "a-session-secret-shared-by-both-nodes"
METRICS = "metrics-token-0123456789abcdef"


def node(engine: Engine, actions: FakeActions) -> TestClient:
    """One node's app over the shared database, with the shared session secret."""
    return TestClient(make_app(engine, actions, session_secret=SECRET), base_url=BASE)


def signed_out_cookie(a: TestClient) -> str:
    assert sign_in(a).status_code == 303
    cookie = a.cookies[COOKIE]
    response = a.post("/admin/signout", data={"csrf": csrf_of(a)}, follow_redirects=False)
    assert response.status_code == 303
    return cookie


def test_a_sign_out_on_one_node_holds_on_another(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    a, b = node(engine, actions), node(engine, actions)
    assert sign_in(a).status_code == 303
    cookie = a.cookies[COOKIE]
    b.cookies.set(COOKIE, cookie)
    assert b.get("/admin", follow_redirects=False).status_code == 200  # shared secret: valid
    a.post("/admin/signout", data={"csrf": csrf_of(a)}, follow_redirects=False)
    assert b.get("/admin", follow_redirects=False).status_code == 303  # sent to sign in


def test_a_sign_out_survives_a_restart(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    cookie = signed_out_cookie(node(engine, actions))
    restarted = node(engine, actions)  # a new process: nothing in memory
    restarted.cookies.set(COOKIE, cookie)
    assert restarted.get("/admin", follow_redirects=False).status_code == 303
    with session_factory(engine)() as s:
        assert s.scalar(select(func.count()).select_from(SessionRevocation)) == 1


def test_other_sessions_stay_signed_in(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    signed_out_cookie(node(engine, actions))
    other = node(engine, actions)
    assert sign_in(other).status_code == 303
    assert other.get("/admin", follow_redirects=False).status_code == 200


def test_a_session_is_refused_when_sign_outs_cannot_be_read(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    a = node(engine, actions)
    assert sign_in(a).status_code == 303
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE session_revocations")
    assert a.get("/admin", follow_redirects=False).status_code == 303


def metrics_client(engine: Engine, require: bool) -> TestClient:
    store = TokenStore(
        (
            Token("ris", Secret(RIS), "ris"),
            Token("it", Secret(ADMIN), "admin"),
            Token("prometheus", Secret(METRICS), "metrics"),
        )
    )
    settings = WebSecurity(signin_delay_s=0.0)
    ctx = WebContext(
        session_factory(engine),
        store,
        lambda: {"database": "ok"},
        config=Config(http=HttpConfig(metrics_require_token=require)),
        security=settings,
    )
    return TestClient(create_app(ctx, SignInThrottle(settings)), base_url=BASE)


def bearer(token: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {token}"}


def test_metrics_can_require_a_token(engine: Engine, seeded: Seeded) -> None:
    client = metrics_client(engine, require=True)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer("not-a-token")).status_code == 401
    assert client.get("/metrics", headers=bearer(RIS)).status_code == 403
    for token in (METRICS, ADMIN):
        response = client.get("/metrics", headers=bearer(token))
        assert response.status_code == 200 and "imaging_ai_" in response.text


def test_a_metrics_token_opens_nothing_else(engine: Engine, seeded: Seeded) -> None:
    client = metrics_client(engine, require=True)
    assert client.get("/api/v1/studies", headers=bearer(METRICS)).status_code == 403
    assert client.get("/admin", headers=bearer(METRICS)).status_code == 403


def test_metrics_are_open_by_default(engine: Engine, seeded: Seeded) -> None:
    assert metrics_client(engine, require=False).get("/metrics").status_code == 200
