"""Ingest under resource exhaustion and dead receivers (issue 18 items 2 and 3): accept() out of
descriptors, a receiver out of descriptors, a receiver SIGKILLed; what /readyz, the status page
and /metrics say meanwhile."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage, Verification  # type: ignore[attr-defined]
from sqlalchemy import func, select
from starlette.testclient import TestClient

from imaging_ai import receive_pool
from imaging_ai.config import Config
from imaging_ai.db.models import Instance
from imaging_ai.db.session import make_engine, session_factory
from imaging_ai.pipeline import Daemon
from imaging_ai.receive_pool import ReceiverPool
from imaging_ai.states import ChildState
from imaging_ai.supervise import Backoff
from imaging_ai.systemd import NotifySettings, Watchdog
from imaging_ai.web.app import WebContext, create_app
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.live import live_panels
from tests.conftest import receiver_config, wait_until
from tests.dicom_factory import ct_series

CALLED = "IMAGING_AI"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return receiver_config(tmp_path, 1)


def _pool(config: Config, first_s: float) -> Iterator[ReceiverPool]:
    pool = ReceiverPool(config, Backoff(first_s=first_s))
    pool.start()
    yield pool
    pool.stop(timeout_s=10)


@pytest.fixture
def pool(config: Config) -> Iterator[ReceiverPool]:
    yield from _pool(config, first_s=0.5)


@pytest.fixture
def slow_restart_pool(config: Config) -> Iterator[ReceiverPool]:
    """A pool whose dead receiver stays dead for the length of a test."""
    yield from _pool(config, first_s=60.0)


def _echo(port: int) -> None:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(Verification)
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED)
    assert assoc.is_established
    assert assoc.send_c_echo().Status == 0x0000
    assoc.release()


def _receiver_pid(pool: ReceiverPool) -> int:
    proc = pool._supervisor.process(0)
    assert proc is not None and proc.pid is not None
    return proc.pid


def _daemon_view(pool: ReceiverPool, config: Config) -> Any:
    """The parts of a Daemon that /readyz, the status page and /metrics read, around ``pool``."""
    engine = make_engine(config.storage.resolved_database_url)
    return SimpleNamespace(
        config=config,
        sessions=session_factory(engine),
        spool=SimpleNamespace(ensure_space=lambda: None),
        receivers=pool,
        processor=None,
        node="test",
        models=SimpleNamespace(last_error=""),
        _engines_ready=lambda: "ok",
    )


def _client(view: Any) -> TestClient:
    ctx = WebContext(
        view.sessions,
        TokenStore(()),
        lambda: Daemon.readiness(view),
        live=lambda: Daemon.live_status(view),
        config=view.config,
    )
    return TestClient(create_app(ctx))


class _Pings:
    """The systemd watchdog fed by the daemon's health check, on a socket of the test's own."""

    def __init__(self, view: Any, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.view = view
        view.assembler = view.processor = SimpleNamespace(alive=lambda: True)
        settings = NotifySettings(str(path), watchdog_s=0.1)
        self.watchdog = Watchdog(settings, lambda: Daemon.health(view))
        self.watchdog.ready()

    def count(self, seconds: float) -> int:
        """WATCHDOG=1 datagrams received within ``seconds``."""
        deadline, pings = time.monotonic() + seconds, 0
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                pings += self.sock.recv(4096) == b"WATCHDOG=1"
            except TimeoutError:
                break
        return pings

    def stop(self) -> None:
        self.watchdog.stopping()
        self.view.processor = None
        self.sock.close()


def _metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def test_accept_out_of_descriptors_is_retried_and_logged_once(
    pool: ReceiverPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """accept() failing with EMFILE 200 times: one line in the log, then the association."""
    monkeypatch.setattr(receive_pool, "_ACCEPT_RETRY_S", (0.001, 0.005))
    listener = pool._listener
    assert listener is not None
    real_accept = socket.socket.accept
    left = {"failures": 200}

    def out_of_descriptors(self: socket.socket) -> tuple[socket.socket, Any]:
        if self is listener and left["failures"] > 0:
            left["failures"] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_accept(self)

    caplog.set_level(logging.INFO, logger="imaging_ai.receive_pool")
    monkeypatch.setattr(socket.socket, "accept", out_of_descriptors)
    wait_until(lambda: left["failures"] < 200)
    assert "EMFILE" in pool.can_accept()
    _echo(pool.port)  # before the fix the acceptor thread had ended: this was refused
    assert left["failures"] == 0
    failing = [r for r in caplog.records if "accept() failing" in r.getMessage()]
    assert len(failing) == 1 and "EMFILE" in failing[0].getMessage()
    # Each attempt calls accept() twice: once more with the spare descriptor given up.
    again = [r for r in caplog.records if "working again after 100 failure(s)" in r.getMessage()]
    assert len(again) == 1
    assert pool.can_accept() == "ok"


def test_accept_with_every_descriptor_taken_uses_the_spare(pool: ReceiverPool) -> None:
    """Every descriptor of the acceptor's process taken (what an HTTP flood does): a PACS still
    gets its association, through the descriptor the acceptor holds in reserve."""
    from tests.reliability.attacks import associate_rq, read_pdu

    client = socket.socket()  # made first: connecting needs no new descriptor
    client.settimeout(10)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        client.connect(("127.0.0.1", pool.port))
        client.sendall(associate_rq(called=CALLED, abstract_syntax=Verification))
        answer = read_pdu(client)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        client.close()
    assert held, "no descriptor was left to take: the test did not exhaust them"
    assert answer is not None and answer[0] == 0x02  # A-ASSOCIATE-AC


def test_a_receiver_out_of_descriptors_closes_the_connection_and_lives(
    pool: ReceiverPool,
) -> None:
    """The descriptor hand-over's RuntimeError (2,200 idle sockets) no longer ends a receiver."""
    pid = _receiver_pid(pool)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{pid}/fd")) + 2, hard))
    idle = [socket.create_connection(("127.0.0.1", pool.port)) for _ in range(8)]
    try:
        for sock in idle:
            sock.settimeout(10)
        # The ones the receiver had no descriptor for are closed (EOF), not left hanging.
        closed = sum(1 for sock in idle if _closed_within(sock, 10.0))
        assert closed >= 1
        assert _receiver_pid(pool) == pid and pool.alive() == 1
        assert pool.restarts() == 0
    finally:
        for sock in idle:
            sock.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    wait_until(lambda: len(os.listdir(f"/proc/{pid}/fd")) < soft)
    _echo(pool.port)
    assert _receiver_pid(pool) == pid


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the peer closed the connection (EOF or reset) before ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        if not data:
            return True
    return False


def test_a_killed_receiver_is_restarted_shown_and_takes_the_next_study(
    pool: ReceiverPool, config: Config, tmp_path: Path
) -> None:
    old_pid = _receiver_pid(pool)
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: pool.restarts() == 1)
    wait_until(lambda: pool.alive() == 1 and pool.readiness() == "ok", timeout_s=60)
    assert _receiver_pid(pool) != old_pid
    view = _daemon_view(pool, config)
    live = Daemon.live_status(view)
    assert live["receivers"]["restarts"] == 1
    (row,) = live["receiver_processes"]
    assert row.state is ChildState.RUNNING and row.last_exit == "was killed by SIGKILL"
    panels, _ = live_panels(lambda: live)
    table = next(p.table for p in panels if p.title == "DICOM receiver processes")
    assert table is not None and "restarts since start" in table.columns
    metrics = _client(view).get("/metrics").text
    assert _metric(metrics, "imaging_ai_receiver_restarts_total") == 1
    assert _metric(metrics, "imaging_ai_receiver_processes") == 1
    assert _metric(metrics, "imaging_ai_dicom_accepting") == 1
    _send_study(pool.port, tmp_path, slices=3)
    with view.sessions() as s:
        assert s.scalar(select(func.count(Instance.id))) == 3


def _send_study(port: int, tmp_path: Path, slices: int) -> None:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED)
    assert assoc.is_established
    for path in ct_series(tmp_path / "study", slices=slices):
        assert assoc.send_c_store(pydicom.dcmread(path)).Status == 0x0000
    assoc.release()


def test_readyz_is_503_while_no_receiver_is_alive(
    slow_restart_pool: ReceiverPool,
    config: Config,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    pool = slow_restart_pool
    view = _daemon_view(pool, config)
    client = _client(view)
    assert client.get("/readyz").status_code == 200
    pings = _Pings(view, tmp_path / "notify.sock")
    assert pings.count(0.5) >= 2
    os.kill(_receiver_pid(pool), signal.SIGKILL)
    wait_until(lambda: pool.alive() == 0)
    response = client.get("/readyz")
    assert response.status_code == 503
    pings.count(0.3)  # one may have been on its way
    assert pings.count(0.6) == 0  # systemd's watchdog is no longer fed
    pings.stop()
    assert response.json()["checks"]["receivers"] == "no DICOM receiver process running"
    (row,) = pool.processes()
    assert row.state is ChildState.RESTARTING and row.restart_in_s is not None
    # Connections meanwhile are closed, and said so once, not once each.
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", pool.port)) as sock:
            sock.settimeout(5)
            assert _closed_within(sock, 5.0)
    assert sum("handing connections" in r.getMessage() for r in caplog.records) == 1
    metrics = client.get("/metrics").text
    assert _metric(metrics, "imaging_ai_dicom_accepting") == 0


def test_a_broken_listener_ends_the_acceptor_and_readiness_says_so(
    pool: ReceiverPool, caplog: pytest.LogCaptureFixture
) -> None:
    assert pool.readiness() == "ok"
    listener = pool._listener
    assert listener is not None
    # Not through stop(): Linux then fails accept() with EINVAL, as for a listener gone bad.
    listener.shutdown(socket.SHUT_RDWR)
    wait_until(lambda: pool.can_accept() != "ok")
    assert pool.can_accept() == "DICOM acceptor thread stopped"
    assert pool.readiness() == "DICOM acceptor thread stopped"
    messages = [r.getMessage() for r in caplog.records]
    assert any("listener broken" in m for m in messages), messages
