"""Signing in: the session cookie's flags, audited failures, slowing, expiry, sign-out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from itsdangerous import TimestampSigner
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from imaging_ai.config import Secret, Token
from imaging_ai.db.models import AuditEvent
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.session import COOKIE, SignInThrottle, WebSecurity
from tests.web.conftest import ADMIN, BASE, RIS, make_app, sign_in
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded


def events(engine: Engine, action: str) -> list[AuditEvent]:
    with Session(engine) as s:
        return list(s.scalars(select(AuditEvent).where(AuditEvent.action == action)))


def test_anonymous_browser_is_sent_to_sign_in(client: TestClient) -> None:
    response = client.get("/admin/search?accession=A1", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/admin/signin?next=/admin/search%3Faccession%3DA1"
    form = client.get(response.headers["location"])
    assert 'name="next" value="/admin/search?accession=A1"' in form.text


def test_sign_in_sets_a_secure_http_only_strict_cookie_and_is_audited(
    client: TestClient, engine: Engine
) -> None:
    response = client.post(
        "/admin/signin",
        data={"name": "it", "token": ADMIN, "next": "/admin/audit"},
        follow_redirects=False,
    )
    assert response.status_code == 303 and response.headers["location"] == "/admin/audit"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    for flag in ("HttpOnly", "Secure", "SameSite=strict", "Path=/", "Max-Age=28800"):
        assert flag in cookie
    assert ADMIN not in cookie
    assert client.get("/admin").status_code == 200
    (event,) = events(engine, "sign_in")
    assert (event.actor, event.source) == ("it", "testclient")


def test_failed_sign_ins_are_audited_without_the_secret(client: TestClient, engine: Engine) -> None:
    wrong = sign_in(client, "it", "not-the-admin-token-at-all")
    assert wrong.status_code == 401
    assert "check the token name and token" in wrong.text
    assert COOKIE not in wrong.headers.get("set-cookie", "")
    assert sign_in(client, ADMIN, ADMIN).status_code == 401  # the token typed as a name
    assert sign_in(client, "ris", RIS).status_code == 401  # not an admin token
    failed = events(engine, "sign_in_failed")
    assert [(e.actor, e.source) for e in failed] == [
        ("it", "testclient"),
        ("(unknown name)", "testclient"),
        ("ris", "testclient"),
    ]
    assert failed[2].detail == "ris token: not an admin"
    assert all(ADMIN not in e.actor + e.detail and RIS not in e.detail for e in failed)
    assert client.get("/admin", follow_redirects=False).status_code == 303


def test_failures_are_slowed_then_refused_per_address() -> None:
    now = [1000.0]
    throttle = SignInThrottle(WebSecurity(signin_max_failures=3), clock=lambda: now[0])
    assert [throttle.failed("10.0.0.9") for _ in range(3)] == [1.0, 2.0, 3.0]
    assert throttle.wait_s("10.0.0.9") == 900.0
    assert throttle.wait_s("10.0.0.8") == 0.0  # other addresses are not affected
    now[0] += 901
    assert throttle.wait_s("10.0.0.9") == 0.0
    throttle.failed("10.0.0.9")
    throttle.succeeded("10.0.0.9")
    assert throttle.failed("10.0.0.9") == 1.0


def test_too_many_failures_refuse_even_the_right_token(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    client = TestClient(make_app(engine, actions, signin_max_failures=2), base_url=BASE)
    for _ in range(2):
        assert sign_in(client, "it", "wrong-wrong-wrong-wrong").status_code == 401
    refused = sign_in(client)
    assert refused.status_code == 429
    assert "Too many failed sign-ins" in refused.text
    assert not events(engine, "sign_in")


class CountingTokens(TokenStore):
    """The admin token ``it``; counts the sign-in checks."""

    def __init__(self) -> None:
        super().__init__((Token("it", Secret(ADMIN), "admin"),))
        self.checked = 0

    def verify(self, name: str, token: str) -> Any:
        self.checked += 1
        return super().verify(name, token)


def test_simultaneous_guesses_are_counted_before_they_are_checked(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    """60 wrong guesses at once against a limit of 10: only 10 reach the token check."""
    store = CountingTokens()
    app = make_app(engine, actions, store, signin_max_failures=10)

    async def guess(client: httpx.AsyncClient) -> int:
        data = {"name": "it", "token": "wrong-wrong-wrong-wrong", "next": ""}
        return (await client.post("/admin/signin", data=data)).status_code

    async def guesses() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            return await asyncio.gather(*(guess(client) for _ in range(60)))

    statuses = asyncio.run(guesses())
    assert sorted(statuses) == [401] * 10 + [429] * 50
    assert store.checked == 10
    assert len(events(engine, "sign_in_failed")) == 10


def test_failed_sign_in_waits(engine: Engine, seeded: Seeded, actions: FakeActions) -> None:
    client = TestClient(make_app(engine, actions, signin_delay_s=0.3), base_url=BASE)
    started = time.monotonic()
    assert sign_in(client, "it", "wrong-wrong-wrong-wrong").status_code == 401
    assert time.monotonic() - started >= 0.3


def test_sign_out_ends_the_session(admin: TestClient, engine: Engine) -> None:
    cookie = admin.cookies[COOKIE]
    html = admin.get("/admin").text
    csrf = html.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    response = admin.post("/admin/signout", data={"csrf": csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/admin/signin"
    assert (
        "Max-Age=0" in response.headers["set-cookie"]
        or "expires=" in response.headers["set-cookie"].lower()
    )
    admin.cookies.set(COOKIE, cookie)  # a copy of the old cookie is no longer accepted
    assert admin.get("/admin", follow_redirects=False).status_code == 303
    assert [e.actor for e in events(engine, "sign_out")] == ["it"]


def test_sessions_expire(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TimestampSigner, "get_timestamp", lambda self: int(time.time()) - 9 * 3600)
    assert sign_in(client).status_code == 303
    monkeypatch.undo()
    assert client.get("/admin", follow_redirects=False).status_code == 303


def test_sessions_survive_restarts_only_with_the_same_secret_and_token(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    secret = "s" * 40
    before = TestClient(make_app(engine, actions, session_secret=secret), base_url=BASE)
    assert sign_in(before).status_code == 303
    cookie = before.cookies[COOKIE]

    def accepted(app: Any) -> bool:
        client = TestClient(app, base_url=BASE)
        client.cookies.set(COOKIE, cookie)
        return bool(client.get("/admin", follow_redirects=False).status_code == 200)

    assert accepted(make_app(engine, actions, session_secret=secret))
    assert not accepted(make_app(engine, actions, session_secret="t" * 40))
    rotated = TokenStore((Token("it", Secret("a-brand-new-admin-token-0000"), "admin"),))
    assert not accepted(make_app(engine, actions, rotated, session_secret=secret))


def test_no_open_redirect_after_sign_in(client: TestClient) -> None:
    for target in ("//evil.example/admin", "https://evil.example", "/admin\\@evil", "/api/v1"):
        response = client.post(
            "/admin/signin",
            data={"name": "it", "token": ADMIN, "next": target},
            follow_redirects=False,
        )
        assert response.headers["location"] == "/admin"


def test_plain_http_from_another_host_is_refused(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    remote = TestClient(make_app(engine, actions), base_url="http://imaging-ai.hospital.lan")
    assert "plain HTTP" in remote.get("/admin/signin").text
    assert sign_in(remote).status_code == 400
    loopback = TestClient(make_app(engine, actions), base_url="http://127.0.0.1:8080")
    assert sign_in(loopback).status_code == 303  # browsers keep Secure cookies on loopback
    relaxed = TestClient(
        make_app(engine, actions, cookie_secure=False), base_url="http://imaging-ai.hospital.lan"
    )
    response = sign_in(relaxed)
    assert response.status_code == 303 and "Secure" not in response.headers["set-cookie"]
