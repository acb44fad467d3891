"""Takes the ASGI app and the [http] settings; gives the HTTP server, with bounded connections.

uvicorn answers a request 503 once ``limit_concurrency`` connections are open, but only when a
request arrives: a socket that never sends one is kept open for ever (its ``timeout_keep_alive``
is armed only after a first response, and any byte received disarms it), so 1,100 idle sockets
used up the process's descriptors and with them the DICOM port's accept(). The h11 protocol
below adds the missing header timeout, and closes at once connections beyond twice the limit.
When descriptors run out all the same, asyncio logs a traceback for each of up to 100 accept()
attempts a second (34,723 tracebacks, 15 MB, in 20 s of tests/reliability/test_ingest_floods):
the server's exception handler logs that once every 10 s instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from imaging_ai.config import HttpConfig

log = logging.getLogger(__name__)

# Connections closed for the limit are logged at most this often (a flood must not flood the log).
_LOG_EVERY_S = 10.0


class HttpServer(uvicorn.Server):
    """uvicorn without its own signal handling (the daemon owns the shutdown order).

    ``on_started`` is called once the port serves (systemd's READY=1).
    """

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(_LoopErrors())
        await super().startup(sockets)
        if self.started:
            self.on_started()


def server_config(app: Any, http: HttpConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for ``app``: [http] bind, port, connection limits, proxies; ``options``.

    Proxy headers are read only from ``trusted_proxies``: uvicorn's own default believes
    X-Forwarded-For from 127.0.0.1 (or $FORWARDED_ALLOW_IPS), which let a local client choose
    the address the sign-in throttle and the audit log see.
    """
    return uvicorn.Config(
        app,
        host=http.bind,
        port=http.port,
        http=guarded_h11(http.header_timeout_s, 2 * http.limit_concurrency),
        limit_concurrency=http.limit_concurrency,
        proxy_headers=bool(http.trusted_proxies),
        forwarded_allow_ips=list(http.trusted_proxies),
        **options,
    )


def guarded_h11(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header timeout and a hard connection cap.

    Parameters
    ----------
    header_timeout_s : float
        A connection that has not sent a whole request head this long after it opened (or after
        its last response) is closed: a silent or trickling socket does not hold a descriptor.
    max_connections : int
        A connection opened while this many are open is closed at once, before reading anything
        (up to it, uvicorn's ``limit_concurrency`` answers 503).
    """
    refused = _Every(_LOG_EVERY_S)

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _armed_for: object = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                if refused.due():
                    log.warning(
                        "HTTP: %d connection(s) closed unread: %d open (2 x limit_concurrency)",
                        refused.take(),
                        max_connections,
                    )
                transport.close()
                return
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            # A request that begins replaces self.cycle: the timer then leaves it alone.
            self._armed_for = self.cycle
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _header_timeout(self) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete
            if self.cycle is self._armed_for and idle and not self.transport.is_closing():
                log.debug("HTTP connection closed: no request within %.0f s", header_timeout_s)
                self.transport.close()

    return GuardedH11Protocol


class _Every:
    """Counts events and says when one is due to be logged: at most every ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.count, self.logged_at = seconds, 0, -seconds

    def due(self) -> bool:
        """Count one; True (and the count restarts after it is read) if it is time to log."""
        self.count += 1
        now = time.monotonic()
        if now - self.logged_at < self.seconds:
            return False
        self.logged_at = now
        return True

    def take(self) -> int:
        """The count since the last log line, reset."""
        count, self.count = self.count, 0
        return count


class _LoopErrors:
    """The event loop's exception handler: accept() out of resources at most every 10 s."""

    def __init__(self) -> None:
        self.accept_errors = _Every(_LOG_EVERY_S)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system"):
            loop.default_exception_handler(context)
            return
        if self.accept_errors.due():
            log.error(
                "HTTP port: accept() failing %d time(s) in %.0f s: %s; asyncio retries each second",
                self.accept_errors.take(),
                _LOG_EVERY_S,
                context.get("exception"),
            )
