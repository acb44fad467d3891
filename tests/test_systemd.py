"""sd_notify (issue 18 item 3): READY=1 once serving, WATCHDOG=1 only while ingest and the queue
are alive, on a NOTIFY_SOCKET of the test's own (AF_UNIX datagrams, as systemd listens)."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from imaging_ai import systemd
from imaging_ai.pipeline import Daemon
from imaging_ai.systemd import NotifySettings, Watchdog, notify


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        yield sock, path


def _messages(sock: socket.socket, seconds: float) -> list[str]:
    """Every datagram that arrives within ``seconds``."""
    deadline = time.monotonic() + seconds
    out = []
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            out.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return out


def test_settings_come_from_systemds_environment() -> None:
    pid = str(os.getpid())
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}
    assert NotifySettings.from_environ(env) == NotifySettings("/run/x", 30.0)
    assert NotifySettings.from_environ({**env, "WATCHDOG_PID": "1"}) == NotifySettings("/run/x")
    assert NotifySettings.from_environ({"WATCHDOG_USEC": "30000000"}) is None


def test_notify_reaches_an_abstract_socket() -> None:
    name = f"imaging-ai-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify("@" + name, "READY=1")
        assert sock.recv(100) == b"READY=1"


def test_ready_then_pings_only_while_healthy(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    state = {"health": "ok"}
    watchdog = Watchdog(NotifySettings(path, watchdog_s=0.2), lambda: state["health"])
    watchdog.ready()
    try:
        first = _messages(sock, 0.5)
        assert first[0] == "READY=1\nSTATUS=serving"
        assert first[1:].count("WATCHDOG=1") >= 3  # every 0.1 s
        state["health"] = "no DICOM receiver process running"
        down = _messages(sock, 0.8)
        said = down.index("STATUS=no DICOM receiver process running")
        assert down[said + 1 :] == []  # said once, and no ping after it (one may precede it)
        assert set(down[:said]) <= {"WATCHDOG=1"} and len(down[:said]) <= 1
        state["health"] = "ok"
        back = _messages(sock, 0.5)
        assert back[0] == "STATUS=serving" and "WATCHDOG=1" in back
    finally:
        watchdog.stopping()
    assert _messages(sock, 0.3)[-1] == "STOPPING=1"


def test_without_a_watchdog_only_ready_is_sent(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    watchdog = Watchdog(NotifySettings(path), lambda: "ok")
    watchdog.ready()
    assert _messages(sock, 0.3) == ["READY=1\nSTATUS=serving"]
    watchdog.stopping()


def _daemon(ingest: str, assembler: bool = True, processor: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        receivers=SimpleNamespace(can_accept=lambda: ingest),
        assembler=SimpleNamespace(alive=lambda: assembler),
        processor=SimpleNamespace(alive=lambda: processor),
    )


def test_the_daemon_is_healthy_only_while_ingest_and_the_queue_run() -> None:
    assert Daemon.health(_daemon("ok")) == "ok"  # type: ignore[arg-type]
    down = _daemon("DICOM acceptor thread stopped")
    assert Daemon.health(down) == "DICOM acceptor thread stopped"  # type: ignore[arg-type]
    no_assembler = _daemon("ok", assembler=False)
    assert Daemon.health(no_assembler) == "assembler thread stopped"  # type: ignore[arg-type]
    no_processor = _daemon("ok", processor=False)
    assert Daemon.health(no_processor) == "processing threads stopped"  # type: ignore[arg-type]


def test_a_failing_health_check_stops_the_pings(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    calls = threading.Event()

    def broken() -> str:
        calls.set()
        raise RuntimeError("bug")

    watchdog = Watchdog(NotifySettings(path, watchdog_s=10.0), broken)
    assert not watchdog.ping_once()
    assert calls.is_set()
    assert _messages(sock, 0.2) == ["STATUS=health check failed: RuntimeError"]


def test_pings_need_no_new_descriptor(
    listener: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors (an HTTP flood) while healthy: the pings still go out."""
    sock, path = listener
    watchdog = Watchdog(NotifySettings(path, watchdog_s=10.0), lambda: "ok")

    def out_of_descriptors() -> socket.socket:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(systemd, "_datagram_socket", out_of_descriptors)
    assert watchdog.ping_once()
    assert _messages(sock, 0.2) == ["WATCHDOG=1"]
