"""Takes the ASGI app and the [http] settings; gives the uvicorn settings that bound connections.

uvicorn answers a request 503 once ``limit_concurrency`` connections are open, but only when a
request arrives: a socket that never sends one is kept open for ever (its ``timeout_keep_alive``
is armed only after a first response, and any byte received disarms it), so 1,100 idle sockets
used up the process's descriptors and with them the DICOM port's accept(). The h11 protocol
below adds the missing header timeout, and closes at once connections beyond twice the limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from imaging_ai.config import HttpConfig

log = logging.getLogger(__name__)

# Connections closed for the limit are logged at most this often (a flood must not flood the log).
_LOG_EVERY_S = 10.0


def server_config(app: Any, http: HttpConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for ``app``: [http] bind, port and connection limits, then ``options``."""
    return uvicorn.Config(
        app,
        host=http.bind,
        port=http.port,
        http=guarded_h11(http.header_timeout_s, 2 * http.limit_concurrency),
        limit_concurrency=http.limit_concurrency,
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
    refused = _Refusals()

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _armed_for: object = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                refused.note(max_connections)
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


class _Refusals:
    """Counts connections closed for the cap and logs them at most every _LOG_EVERY_S."""

    def __init__(self) -> None:
        self.count, self.logged_at = 0, 0.0

    def note(self, limit: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged_at >= _LOG_EVERY_S:
            log.warning(
                "HTTP: %d connection(s) closed unread: %d open (2 x http.limit_concurrency)",
                self.count,
                limit,
            )
            self.count, self.logged_at = 0, now
