"""The HTTP server's connection limits (issue 18 item 2): a silent socket is closed after the
header timeout, past limit_concurrency a request gets 503, past twice that a connection is closed
unread. Real uvicorn on loopback, as the daemon runs it."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from imaging_ai_devkit.bench.harness import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from imaging_ai.config import HttpConfig, load_config
from imaging_ai.errors import ConfigError
from imaging_ai.web.server import _LoopErrors, server_config

REQUEST = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


async def _ping(request: Request) -> Response:
    return PlainTextResponse("pong")


def _serve(http: HttpConfig) -> Iterator[uvicorn.Server]:
    app = Starlette(routes=[Route("/ping", _ping)])
    server = uvicorn.Server(server_config(app, http, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield server
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def server() -> Iterator[uvicorn.Server]:
    yield from _serve(HttpConfig(port=free_port(), limit_concurrency=4, header_timeout_s=1.0))


def _connect(server: uvicorn.Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.config.port), timeout=10)
    return sock


def _response(sock: socket.socket) -> bytes:
    """One whole response to /ping (head and its four-byte body)."""
    data = b""
    while not data.endswith(b"pong"):
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return data


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (raises on the 10 s socket timeout)."""
    start = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_a_socket_that_sends_nothing_is_closed_after_the_header_timeout(
    server: uvicorn.Server,
) -> None:
    with _connect(server) as silent:
        assert 0.8 <= _closed_after(silent) <= 3.0


def test_a_trickled_request_head_is_closed_after_the_header_timeout(
    server: uvicorn.Server,
) -> None:
    with _connect(server) as slow:
        start = time.monotonic()
        slow.settimeout(0.3)
        for byte in REQUEST[:10]:  # one byte every 0.3 s: a slowloris
            try:
                slow.send(bytes([byte]))
                if slow.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        assert time.monotonic() - start <= 3.0


def test_a_kept_alive_connection_is_served_and_then_closed_when_idle(
    server: uvicorn.Server,
) -> None:
    with _connect(server) as sock:
        sock.sendall(REQUEST)
        assert _response(sock).endswith(b"pong")
        sock.sendall(REQUEST)  # the header timer does not cut a connection in use
        assert _response(sock).endswith(b"pong")
        assert _closed_after(sock) <= 3.0


def test_past_limit_concurrency_a_request_gets_503_not_a_hang(server: uvicorn.Server) -> None:
    with ExitStack() as stack:
        idle = [stack.enter_context(_connect(server)) for _ in range(4)]
        time.sleep(0.2)  # let the server take them
        late = stack.enter_context(_connect(server))
        late.sendall(REQUEST)
        assert late.recv(4096).startswith(b"HTTP/1.1 503")
        assert len(idle) == 4


def test_past_twice_the_limit_a_connection_is_closed_unread(server: uvicorn.Server) -> None:
    with ExitStack() as stack:
        for _ in range(8):
            stack.enter_context(_connect(server))
        time.sleep(0.2)
        extra = stack.enter_context(_connect(server))
        assert _closed_after(extra) < 0.8  # at once, not after the 1 s header timeout


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("limit_concurrency = 0", "http.limit_concurrency must be >= 1, got 0"),
        ("header_timeout_s = 0", "http.header_timeout_s must be > 0, got 0"),
    ],
)
def test_the_limits_are_validated_at_start(tmp_path: Path, setting: str, message: str) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(f"[http]\n{setting}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, environ={})


def test_the_limits_come_from_the_environment_too() -> None:
    env = {"IMAGING_AI_HTTP__LIMIT_CONCURRENCY": "32", "IMAGING_AI_HTTP__HEADER_TIMEOUT_S": "2.5"}
    http = load_config(None, environ=env).http
    assert (http.limit_concurrency, http.header_timeout_s) == (32, 2.5)
    config = server_config(Starlette(), http)
    assert config.limit_concurrency == 32


def test_asyncio_accept_errors_are_logged_once_not_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio logs a traceback per accept() attempt out of descriptors (100 a second)."""
    handler = _LoopErrors()
    loop = asyncio.new_event_loop()
    others: list[dict[str, Any]] = []
    loop.default_exception_handler = others.append  # type: ignore[method-assign]
    error = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    try:
        for _ in range(1000):
            handler(loop, {"message": "socket.accept() out of system resource", "exception": error})
        handler(loop, {"message": "something else"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records if "accept() failing" in r.getMessage()]
    assert len(lines) == 1 and "Too many open files" in lines[0]
    assert others == [{"message": "something else"}]
