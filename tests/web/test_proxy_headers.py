"""Proxy headers (issue 18 item 11): X-Forwarded-For is believed only from ``[http]
trusted_proxies``. uvicorn's own default trusts it from 127.0.0.1, so a local client could rotate
the address, escape the sign-in throttle and put any address into the audit log. Real uvicorn on
loopback, configured by ``server_config`` as the daemon configures it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from imaging_ai_devkit.bench.harness import free_port
from sqlalchemy import Engine

from imaging_ai.config import HttpConfig, load_config
from imaging_ai.errors import ConfigError
from imaging_ai.web.server import server_config
from tests.web.conftest import make_app
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded
from tests.web.test_signin import events

MAX_FAILURES = 3
GUESSES = 8


@contextmanager
def _serve(app: object, http: HttpConfig) -> Iterator[str]:
    server = uvicorn.Server(
        server_config(app, http, log_level="warning", access_log=False, lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield f"http://127.0.0.1:{http.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _guesses(url: str) -> list[int]:
    """Wrong sign-ins, each claiming to be forwarded for another address."""
    with httpx.Client(base_url=url, timeout=10) as client:
        return [
            client.post(
                "/admin/signin",
                data={"name": "it", "token": "wrong-wrong-wrong-wrong", "next": ""},
                headers={"X-Forwarded-For": f"10.9.8.{i}"},
            ).status_code
            for i in range(GUESSES)
        ]


def test_forwarded_for_is_ignored_without_a_trusted_proxy(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    app = make_app(engine, actions, signin_max_failures=MAX_FAILURES)
    with _serve(app, HttpConfig(port=free_port())) as url:
        statuses = _guesses(url)
    assert statuses == [401] * MAX_FAILURES + [429] * (GUESSES - MAX_FAILURES)
    failed = events(engine, "sign_in_failed")
    assert [e.source for e in failed] == ["127.0.0.1"] * MAX_FAILURES


def test_forwarded_for_is_used_from_a_trusted_proxy(
    engine: Engine, seeded: Seeded, actions: FakeActions
) -> None:
    app = make_app(engine, actions, signin_max_failures=MAX_FAILURES)
    http = HttpConfig(port=free_port(), trusted_proxies=("127.0.0.1",))
    with _serve(app, http) as url:
        statuses = _guesses(url)
    assert statuses == [401] * GUESSES  # each forwarded address has its own count
    failed = events(engine, "sign_in_failed")
    assert sorted(e.source for e in failed) == sorted(f"10.9.8.{i}" for i in range(GUESSES))


def test_trusted_proxies_come_from_the_environment_and_are_checked() -> None:
    env = {"IMAGING_AI_HTTP__TRUSTED_PROXIES": "127.0.0.1, 10.1.0.0/16"}
    http = load_config(None, environ=env).http
    assert http.trusted_proxies == ("127.0.0.1", "10.1.0.0/16")
    config = server_config(object(), http)
    assert config.proxy_headers and config.forwarded_allow_ips == ["127.0.0.1", "10.1.0.0/16"]
    assert not server_config(object(), HttpConfig()).proxy_headers
    array = {"IMAGING_AI_HTTP__TRUSTED_PROXIES": '["::1"]'}
    assert load_config(None, environ=array).http.trusted_proxies == ("::1",)
    for bad in ("*", "proxy.example", "10.0.0.300", "10.1.0.5/16", "[1]"):
        with pytest.raises(ConfigError, match=r"http\.trusted_proxies"):
            load_config(None, environ={"IMAGING_AI_HTTP__TRUSTED_PROXIES": bad})
