"""Web fixtures: tokens, a seeded database, the app with a fake daemon, signed-in clients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from imaging_ai.config import Config, Secret, StorageConfig, Token
from imaging_ai.db.session import session_factory
from imaging_ai.web.app import WebContext, create_app
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.session import SignInThrottle, WebSecurity
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded, seed

RIS = "ris-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
BASE = "https://testserver"  # HTTPS, so the client sends the Secure session cookie back
LIVE: dict[str, Any] = {
    "node": "node-a:4242",
    "receivers": {"processes": 2, "stored": 1200, "late": 2, "refused": 1, "active": 1},
    "processing": "1.2.826.0.1.3",
    "workers": [
        {
            "device": "cuda:0",
            "backend": "onnxruntime-cuda",
            "busy_fraction": 0.42,
            "batch_sizes": ((8, 10), (16, 3)),
            "fallbacks": 1,
            "degraded": False,
            "alive": True,
        },
    ],
}


def tokens() -> TokenStore:
    """A RIS token and an admin token named ``it``."""
    return TokenStore((Token("ris", Secret(RIS), "ris"), Token("it", Secret(ADMIN), "admin")))


def make_app(
    engine: Engine,
    actions: FakeActions | None,
    store: TokenStore | None = None,
    live: Callable[[], dict[str, Any]] = lambda: LIVE,
    data_dir: Path | None = None,
    **security: Any,
) -> Any:
    """The app over ``engine``, with no sign-in delays unless asked; result folders under
    ``data_dir`` when given."""
    settings = WebSecurity(**{"signin_delay_s": 0.0, **security})
    config = Config(storage=StorageConfig(data_dir=str(data_dir))) if data_dir else Config()
    ctx = WebContext(
        session_factory(engine),
        store or tokens(),
        lambda: {"database": "ok"},
        live=live,
        actions=actions,
        config=config,
        security=settings,
    )
    return create_app(ctx, SignInThrottle(settings))


@pytest.fixture
def seeded(engine: Engine) -> Seeded:
    """The database with a study in each state."""
    return seed(engine)


@pytest.fixture
def actions(engine: Engine) -> FakeActions:
    """The recording AdminActions fake."""
    return FakeActions(session_factory(engine))


@pytest.fixture
def client(engine: Engine, seeded: Seeded, actions: FakeActions) -> TestClient:
    """An anonymous client of the app over HTTPS."""
    return TestClient(make_app(engine, actions), base_url=BASE)


def sign_in(client: TestClient, name: str = "it", token: str = ADMIN) -> Any:
    """Post the sign-in form; returns the response (not followed)."""
    return client.post(
        "/admin/signin", data={"name": name, "token": token, "next": ""}, follow_redirects=False
    )


@pytest.fixture
def admin(client: TestClient) -> TestClient:
    """The client, signed in as the administrator ``it``."""
    assert sign_in(client).status_code == 303
    return client


def csrf_of(client: TestClient, path: str = "/admin") -> str:
    """The CSRF token from a page's forms."""
    html: str = client.get(path).text
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]
