"""Takes the daemon's health check; gives systemd READY=1 and watchdog pings (sd_notify).

With ``Type=notify`` and ``WatchdogSec=`` (deploy/imaging-ai.service) systemd restarts the
daemon when the pings stop. They are sent only while the health check says "ok" (ingest can
accept and the queue's threads run), so a daemon that is up but cannot take studies is
restarted instead of looking alive. The protocol is one datagram of ``KEY=VALUE`` lines to the
AF_UNIX socket named in $NOTIFY_SOCKET (sd_notify(3)); written here with the socket module, as
the few lines it takes do not justify a dependency on libsystemd or a wrapper package.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotifySettings:
    """Where systemd listens and how often it wants a ping (None: no watchdog)."""

    socket_path: str
    watchdog_s: float | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> NotifySettings | None:
        """From $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID; None outside systemd."""
        path = environ.get("NOTIFY_SOCKET", "")
        if not path:
            return None
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        ours = not pid or pid == str(os.getpid())  # the watchdog may be meant for another
        watchdog = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and ours else None
        return cls(path, watchdog)


def notify(socket_path: str, message: str, sock: socket.socket | None = None) -> bool:
    """Send one sd_notify datagram (through ``sock`` if given); False (logged) if it failed."""
    # A leading "@" names a socket in Linux's abstract namespace.
    address = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path
    try:
        if sock is not None:
            sock.sendto(message.encode(), address)
            return True
        with _datagram_socket() as own:
            own.sendto(message.encode(), address)
        return True
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", socket_path, exc)
        return False


def _datagram_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)


class Watchdog:
    """Tells systemd the daemon is ready, then pings its watchdog while ``healthy`` is "ok".

    Parameters
    ----------
    settings : NotifySettings
        From the environment systemd gave the daemon.
    healthy : callable
        "ok", or why the daemon cannot do its work (sent as STATUS= and logged once).
    """

    def __init__(self, settings: NotifySettings, healthy: Callable[[], str]) -> None:
        self.settings, self.healthy = settings, healthy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._problem = ""
        # Opened once: when descriptors run out, the pings must not need a new one.
        self._sock = _datagram_socket()

    def ready(self) -> None:
        """Send READY=1; start pinging at half the watchdog interval if systemd wants pings."""
        self._send("READY=1\nSTATUS=serving")
        if self.settings.watchdog_s is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="systemd-watchdog", daemon=True)
        self._thread.start()

    def stopping(self) -> None:
        """Send STOPPING=1 and stop pinging (a shutdown is not a hang)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._send("STOPPING=1")
        self._sock.close()

    def _run(self) -> None:
        assert self.settings.watchdog_s is not None
        interval = self.settings.watchdog_s / 2
        while not self._stop.is_set():
            self.ping_once()
            self._stop.wait(interval)

    def ping_once(self) -> bool:
        """Ping if healthy; otherwise say why once per episode. True if a ping was sent."""
        try:
            problem = self.healthy()
        except Exception as exc:  # a broken check is a problem to report, not a reason to ping
            log.exception("health check for the systemd watchdog failed")
            problem = f"health check failed: {exc.__class__.__name__}"
        if problem == "ok":
            if self._problem:
                log.warning("healthy again: feeding the systemd watchdog")
                self._send("STATUS=serving")
            self._problem = ""
            return self._send("WATCHDOG=1")
        if problem != self._problem:
            log.error("not feeding the systemd watchdog: %s", problem)
            self._send(f"STATUS={problem}")
        self._problem = problem
        return False

    def _send(self, message: str) -> bool:
        return notify(self.settings.socket_path, message, self._sock)
