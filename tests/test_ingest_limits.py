"""Hostile peers on the DICOM port of running receivers (issue 18 items 1 and 4), raw sockets.

Two receiver processes behind one listener, as the daemon runs them, with a small
max_associations, a short negotiation deadline and a small cap on waiting connections, so
that each attack shows in seconds. Each test fails without its fix.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom import Dataset
from pynetdicom import AE
from pynetdicom.pdu import A_ASSOCIATE_RQ
from pynetdicom.pdu_primitives import (
    A_ASSOCIATE,
    ImplementationClassUIDNotification,
    MaximumLengthNotification,
)
from pynetdicom.presentation import build_context
from pynetdicom.sop_class import CTImageStorage, Verification  # type: ignore[attr-defined]

from imaging_ai.config import Config
from imaging_ai.dicom import dimse, dul
from imaging_ai.receive_pool import ReceiverPool
from tests.conftest import receiver_config, wait_until
from tests.dicom_factory import ct_series

CALLED = "IMAGING_AI"
DEADLINE_S = 2.0
MAX_ASSOCIATIONS = 2
MAX_WAITING = 8
# A receiver's resident memory may grow this much while it fends off an attack (it was
# gigabytes: a zero-filled buffer of the claimed length).
RSS_SLACK_KIB = 48 * 1024
HUGE = 0xFFFFFFFF


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReceiverPool]:
    tmp_path = tmp_path_factory.mktemp("limits")
    pool = ReceiverPool(_config(tmp_path))
    pool.start()
    yield pool
    pool.stop(timeout_s=10)


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return pydicom.dcmread(ct_series(tmp_path_factory.mktemp("src"), slices=1)[0])


@pytest.fixture(autouse=True)
def idle_then_a_good_store(pool: ReceiverPool, instance: Dataset) -> Iterator[None]:
    """Each attack starts with no connection waiting or admitted; after it, a real sender's
    C-STORE is answered Success (the attack cost nothing but its own connection)."""
    wait_until(lambda: pool.places.counts() == (0, 0), timeout_s=DEADLINE_S + 5)
    yield
    wait_until(lambda: pool.places.counts() == (0, 0), timeout_s=DEADLINE_S + 5)
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", pool.port, ae_title=CALLED)
    assert assoc.is_established
    assert assoc.send_c_store(instance).Status == 0x0000
    assoc.release()


def _config(tmp_path: Path) -> Config:
    return receiver_config(
        tmp_path,
        2,
        f"max_associations = {MAX_ASSOCIATIONS}\nmax_pending_connections = {MAX_WAITING}\n"
        f"negotiation_timeout_s = {DEADLINE_S}\n",
    )


def _associate_rq() -> bytes:
    """An A-ASSOCIATE-RQ from PACS proposing Verification as presentation context 1."""
    primitive = A_ASSOCIATE()
    primitive.application_context_name = "1.2.840.10008.3.1.1.1"
    primitive.calling_ae_title = "PACS"
    primitive.called_ae_title = CALLED
    context = build_context(Verification)
    context.context_id = 1
    primitive.presentation_context_definition_list = [context]
    max_length = MaximumLengthNotification()
    max_length.maximum_length_received = 16384
    class_uid = ImplementationClassUIDNotification()
    class_uid.implementation_class_uid = "1.2.826.0.1.3680043.9.9999.1"
    primitive.user_information = [max_length, class_uid]
    pdu = A_ASSOCIATE_RQ()
    pdu.from_primitive(primitive)
    return bytes(pdu.encode())


def _connect(pool: ReceiverPool) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", pool.port), timeout=5)
    sock.settimeout(5)
    return sock


def _read_pdu(sock: socket.socket) -> tuple[int, bytes]:
    header = _read_exactly(sock, 6)
    pdu_type, _, length = struct.unpack(">BBL", header)
    return pdu_type, _read_exactly(sock, length)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"connection closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def _associated(pool: ReceiverPool) -> socket.socket:
    sock = _connect(pool)
    sock.sendall(_associate_rq())
    pdu_type, _ = _read_pdu(sock)
    assert pdu_type == dul.A_ASSOCIATE_AC_TYPE
    return sock


def _assert_aborted(sock: socket.socket, reason: int) -> None:
    """An A-ABORT from the service provider with ``reason`` comes at once, then the close."""
    pdu_type, body = _read_pdu(sock)
    assert (pdu_type, body[2], body[3]) == (dul.A_ABORT_TYPE, 0x02, reason)
    assert sock.recv(1) == b""


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _rss_kib(pool: ReceiverPool) -> int:
    """Resident memory of the receiver processes together (VmRSS)."""
    pids = _receiver_pids()
    assert len(pids) == pool.alive() == 2
    total = 0
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        total += next(int(line.split()[1]) for line in status.splitlines() if "VmRSS" in line)
    return total


def _receiver_pids() -> list[int]:
    """This process's children started by multiprocessing's spawn: the receivers."""
    children = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that has just ended
            children += [int(pid) for pid in (task / "children").read_text().split()]
    return [p for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_an_associate_rq_claiming_4_gib_is_aborted_without_taking_memory(
    pool: ReceiverPool,
) -> None:
    before = _rss_kib(pool)
    with _connect(pool) as sock:
        sock.sendall(struct.pack(">BBL", dul.A_ASSOCIATE_RQ_TYPE, 0, HUGE))
        _assert_aborted(sock, dul.REASON_INVALID_PARAMETER)
    assert _rss_kib(pool) - before < RSS_SLACK_KIB


@pytest.mark.parametrize("pdu_type", [dul.A_RELEASE_RQ_TYPE, dul.A_ABORT_TYPE])
def test_a_release_or_abort_claiming_4_gib_inside_an_association_is_aborted(
    pool: ReceiverPool, pdu_type: int
) -> None:
    before = _rss_kib(pool)
    with _associated(pool) as sock:
        sock.sendall(struct.pack(">BBL", pdu_type, 0, HUGE))
        _assert_aborted(sock, dul.REASON_INVALID_PARAMETER)
    assert _rss_kib(pool) - before < RSS_SLACK_KIB


def test_command_fragments_never_marked_last_are_aborted(pool: ReceiverPool) -> None:
    fragment = b"\x00" * 16384
    pdv = struct.pack(">LBB", len(fragment) + 2, 1, 0x01) + fragment  # command, not last
    pdu = struct.pack(">BBL", dul.P_DATA_TF_TYPE, 0, len(pdv)) + pdv
    with _associated(pool) as sock:
        sent = 0
        while not select.select([sock], [], [], 0.05)[0]:
            assert sent < 64 * len(pdu), "1 MiB of command fragments taken"
            sock.sendall(pdu)
            sent += len(pdu)
        _assert_aborted(sock, dul.REASON_INVALID_PARAMETER)
    # The fragment past the limit, and those sent before its abort arrived here.
    assert sent <= dimse.MAX_COMMAND_LENGTH + 4 * len(pdu)


def test_silent_sockets_do_not_keep_pacs_out(pool: ReceiverPool) -> None:
    silent = [_connect(pool) for _ in range(40)]
    try:
        wait_until(lambda: pool.places.counts()[0] == MAX_WAITING)
        ae = AE(ae_title="PACS")
        ae.add_requested_context(Verification)
        assoc = ae.associate("127.0.0.1", pool.port, ae_title=CALLED)
        assert assoc.is_established
        assert assoc.send_c_echo().Status == 0x0000
        assoc.release()
        # The longest-waiting silent ones made room; never more than the limit waited.
        assert sum(_closed(s) for s in silent[:MAX_WAITING]) == MAX_WAITING
        assert pool.places.counts()[0] <= MAX_WAITING
    finally:
        for sock in silent:
            sock.close()


def test_a_trickled_request_is_closed_at_the_negotiation_deadline(pool: ReceiverPool) -> None:
    request = _associate_rq()
    with _connect(pool) as sock:
        start = time.monotonic()
        for byte in request:  # one byte every 0.2 s: each read is well inside any timeout
            try:
                sock.sendall(bytes([byte]))
            except (ConnectionResetError, BrokenPipeError):
                break
            if select.select([sock], [], [], 0.2)[0] and _closed(sock):
                break
            assert time.monotonic() - start < DEADLINE_S + 2, "still open past the deadline"
        assert DEADLINE_S - 0.5 < time.monotonic() - start < DEADLINE_S + 2


def test_max_associations_holds_across_receiver_processes(pool: ReceiverPool) -> None:
    first, second = _associated(pool), _associated(pool)  # one in each receiver
    with first, second, _connect(pool) as third:
        third.sendall(_associate_rq())
        assert _read_pdu(third) == (dul.A_ASSOCIATE_RJ_TYPE, bytes((0, 0x02, 0x03, 0x02)))
        first.sendall(struct.pack(">BBL", dul.A_RELEASE_RQ_TYPE, 0, 4) + bytes(4))
        assert _read_pdu(first)[0] == dul.A_RELEASE_RP_TYPE
    wait_until(lambda: pool.places.counts()[1] == 0)
    with _associated(pool):  # the places were given back
        pass
