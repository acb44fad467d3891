"""The negotiation deadline covers the TLS handshake: a silent TLS client is closed in time."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import free_port

from imaging_ai.catalog import Catalog
from imaging_ai.config import AllowedCaller, DicomConfig
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.receive import Receiver
from imaging_ai.spool import Spool
from tests.conftest import wait_until
from tests.test_tls import make_ca_and_cert, pytestmark  # noqa: F401 (needs openssl)

DEADLINE_S = 1.0


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[Receiver]:
    ca = make_ca_and_cert(tmp_path, "ca")
    key, cert = make_ca_and_cert(tmp_path, "server", ca)
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    upgrade(engine)
    config = DicomConfig(
        port=free_port(),
        allowed_callers=(AllowedCaller("STORESCU", "127.0.0.1"),),
        negotiation_timeout_s=DEADLINE_S,
        tls_cert=str(cert),
        tls_key=str(key),
    )
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    receiver = Receiver(config, spool, Catalog(engine, spool), ())
    receiver.start()
    yield receiver
    receiver.stop()
    engine.dispose()


def test_a_client_that_never_finishes_its_tls_handshake_is_closed_at_the_deadline(
    tls_receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with socket.create_connection(("127.0.0.1", tls_receiver.port)) as sock:
        sock.settimeout(DEADLINE_S + 5)
        start = time.monotonic()
        sock.sendall(b"\x16\x03\x01")  # the start of a TLS record, never finished
        with contextlib.suppress(ConnectionResetError):  # closed either way
            assert sock.recv(1) == b""
        assert DEADLINE_S - 0.2 < time.monotonic() - start < DEADLINE_S + 1.5
    wait_until(lambda: tls_receiver.places.counts() == (0, 0) and caplog.records)
    time.sleep(0.2)  # a line about the handshake would come now
    # One line, the gate's, not one more per socket for the handshake it cut off.
    assert [r.name for r in caplog.records] == ["imaging_ai.admission"]
