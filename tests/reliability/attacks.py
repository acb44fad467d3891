"""Attacks an intranet neighbour can make on the daemon's ports, each with what a correct
daemon answers (issue 18's acceptance: a bounded, loopback-only attack suite).

Three kinds: raw-socket upper layer (PS3.8 PDUs built by hand, lengths that lie, states out of
order, floods of silent or trickling sockets), real DICOM senders (pynetdicom) with data sets
the pipeline could not use, and HTTP (idle floods under a lowered descriptor limit, slow and
huge headers, unauthenticated and hostile requests). An attack returns a :class:`Verdict`:
whether the daemon refused it as it should, and what it saw. ``tests/reliability/
test_attack_suite.py`` follows every attack with a good study that must arrive complete.

Every attack is bounded (sockets, bytes, seconds) and talks only to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import select
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
from imaging_ai_devkit.bench.harness import ADMIN_TOKEN, CALLED_AE
from pydicom import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.uid import ExplicitVRLittleEndian, generate_uid
from pynetdicom import AE
from pynetdicom.pdu import A_ASSOCIATE_RQ
from pynetdicom.pdu_primitives import (
    A_ASSOCIATE,
    ImplementationClassUIDNotification,
    MaximumLengthNotification,
)
from pynetdicom.presentation import build_context
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    CTImageStorage,
    MRImageStorage,
    Verification,
)

from tests.dicom_factory import ct_dataset

A_ASSOCIATE_RQ_TYPE, A_ASSOCIATE_AC_TYPE, A_ASSOCIATE_RJ_TYPE = 0x01, 0x02, 0x03
P_DATA_TF_TYPE, A_RELEASE_RQ_TYPE, A_ABORT_TYPE = 0x04, 0x05, 0x07
SUCCESS = 0x0000
HUGE = 0xFFFFFFFF
CALLING_AE = "PACS"


@dataclass
class Target:
    """The daemon under attack: its ports and what the suite lowered for it."""

    dicom_port: int
    http_port: int
    pid: int
    negotiation_timeout_s: float
    max_pending_connections: int
    header_timeout_s: float
    scratch: Path
    scale: int = 1
    """1 in make test; larger in the soak (more sockets, more bytes)."""


@dataclass
class Verdict:
    """Whether the daemon refused an attack as it should, and what it did."""

    refused: bool
    saw: str


@dataclass(frozen=True)
class Attack:
    name: str
    kind: str
    run: Callable[[Target], Verdict] = field(repr=False)
    soak_only: bool = False


# ---- the upper layer, by hand ------------------------------------------------------------------


def associate_rq(
    called: str = CALLED_AE,
    calling: str = CALLING_AE,
    abstract_syntax: str = CTImageStorage,
    transfer_syntaxes: tuple[str, ...] = (ExplicitVRLittleEndian,),
) -> bytes:
    """An A-ASSOCIATE-RQ proposing one presentation context (ID 1)."""
    primitive = A_ASSOCIATE()
    primitive.application_context_name = "1.2.840.10008.3.1.1.1"
    primitive.calling_ae_title = calling
    primitive.called_ae_title = called
    context = build_context(abstract_syntax, list(transfer_syntaxes))
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


def pdu(pdu_type: int, body: bytes) -> bytes:
    return struct.pack(">BBL", pdu_type, 0, len(body)) + body


def p_data(context_id: int, control: int, value: bytes) -> bytes:
    """A P-DATA-TF with one PDV (control: bit 0 command, bit 1 last)."""
    return pdu(P_DATA_TF_TYPE, struct.pack(">LBB", len(value) + 2, context_id, control) + value)


@contextlib.contextmanager
def connected(target: Target, timeout_s: float = 5.0) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", target.dicom_port), timeout=timeout_s)
    try:
        yield sock
    finally:
        sock.close()


def read_pdu(sock: socket.socket) -> tuple[int, bytes] | None:
    """The next PDU, or None when the daemon closed (or reset) the connection first."""
    header = read_exactly(sock, 6)
    if header is None:
        return None
    pdu_type, _, length = struct.unpack(">BBL", header)
    body = read_exactly(sock, length)
    return None if body is None else (pdu_type, body)


def read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except (ConnectionResetError, BrokenPipeError):
            return None
        if not chunk:
            return None
        data += chunk
    return data


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def answered_with(sock: socket.socket, expected: int, close_within_s: float) -> Verdict:
    """The daemon's next PDU is ``expected``; after an A-ABORT or A-ASSOCIATE-RJ it closes the
    connection within ``close_within_s`` (PS3.8 Sta13: it may wait for the peer to close
    first, for its ARTIM timer)."""
    got = read_pdu(sock)
    if got is None:
        return Verdict(False, "closed without a PDU")
    name = PDU_NAMES.get(got[0], f"PDU type 0x{got[0]:02x}")
    if got[0] != expected:
        return Verdict(False, name)
    detail = name
    if expected in (A_ABORT_TYPE, A_ASSOCIATE_RJ_TYPE):
        detail += f" ({', '.join(str(b) for b in got[1][1:4])})"
        sock.settimeout(close_within_s)
        if not closed(sock):
            return Verdict(False, f"{detail}, then open for {close_within_s} s")
    return Verdict(True, detail)


PDU_NAMES = {
    A_ASSOCIATE_AC_TYPE: "A-ASSOCIATE-AC",
    A_ASSOCIATE_RJ_TYPE: "A-ASSOCIATE-RJ",
    P_DATA_TF_TYPE: "P-DATA-TF",
    0x06: "A-RELEASE-RP",
    A_ABORT_TYPE: "A-ABORT",
}


def associated(target: Target, sock: socket.socket) -> None:
    sock.sendall(associate_rq())
    got = read_pdu(sock)
    assert got is not None and got[0] == A_ASSOCIATE_AC_TYPE, f"not associated: {got}"


def raw(
    name: str, send: Callable[[socket.socket], None], expected: int, after_association: bool
) -> Attack:
    def run(target: Target) -> Verdict:
        with connected(target) as sock:
            if after_association:
                associated(target, sock)
            try:
                send(sock)
            except (ConnectionResetError, BrokenPipeError):
                return Verdict(False, "reset while sending")
            return answered_with(sock, expected, target.negotiation_timeout_s + 3)

    return Attack(name, "upper layer (raw socket)", run)


def _garbage(sock: socket.socket) -> None:
    rng = random.Random(18)
    data = bytes(rng.randrange(256) for _ in range(4096))
    sock.sendall(b"\x00" + data[1:])  # type 0x00: no PDU has it


def _huge_command(sock: socket.socket) -> None:
    fragment = b"\x00" * 16384
    for _ in range(64):  # 1 MiB of command fragments, never the last
        if select.select([sock], [], [], 0)[0]:
            return
        sock.sendall(p_data(1, 0x01, fragment))


def trickle(target: Target) -> Verdict:
    """One byte of an A-ASSOCIATE-RQ every 0.25 s: closed at the negotiation deadline."""
    start = time.monotonic()
    with connected(target, timeout_s=0.25) as sock:
        for byte in associate_rq():
            try:
                sock.sendall(bytes([byte]))
            except (ConnectionResetError, BrokenPipeError):
                break
            if select.select([sock], [], [], 0.25)[0] and closed(sock):
                break
            if time.monotonic() - start > target.negotiation_timeout_s + 5:
                return Verdict(False, "still open past the negotiation deadline")
    took = time.monotonic() - start
    ok = target.negotiation_timeout_s - 0.5 < took < target.negotiation_timeout_s + 3
    return Verdict(ok, f"closed after {took:.1f} s")


def truncated_request(target: Target) -> Verdict:
    """An A-ASSOCIATE-RQ cut short: the daemon waits no longer than its deadline."""
    request = associate_rq()
    with connected(target, timeout_s=target.negotiation_timeout_s + 5) as sock:
        start = time.monotonic()
        sock.sendall(request[: len(request) // 2])
        got = read_pdu(sock)
        took = time.monotonic() - start
    ok = took < target.negotiation_timeout_s + 3 and (got is None or got[0] == A_ABORT_TYPE)
    shown = "closed" if got is None else PDU_NAMES.get(got[0], hex(got[0]))
    return Verdict(ok, f"{shown} after {took:.1f} s")


def silent_flood(target: Target) -> Verdict:
    """Three times as many silent sockets as may wait: a real sender still gets in."""
    count = 3 * target.max_pending_connections * target.scale
    socks = []
    try:
        with low_descriptors_held() as release:
            for _ in range(count):
                socks.append(socket.create_connection(("127.0.0.1", target.dicom_port), timeout=5))
            release()
            status = echo(target)
        shut = sum(closed_soon(s) for s in socks)
    finally:
        for s in socks:
            s.close()
    return Verdict(
        status == SUCCESS and shut > 0,
        f"{count} silent sockets; C-ECHO 0x{status:04x}; {shut} closed by the daemon",
    )


@contextlib.contextmanager
def low_descriptors_held(count: int = 8) -> Iterator[Callable[[], None]]:
    """Hold the lowest free descriptor numbers while a flood's sockets are made; the callable
    frees them for the client that follows. pynetdicom waits on its socket with select(),
    which fails for descriptors past 1023 (FD_SETSIZE): at the soak's scale the client itself
    aborted."""
    low = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]

    def release() -> None:
        while low:
            os.close(low.pop())

    try:
        yield release
    finally:
        release()


def closed_soon(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    return closed(sock)


def echo(target: Target) -> int:
    ae = AE(ae_title=CALLING_AE)
    ae.acse_timeout = ae.network_timeout = 10
    ae.add_requested_context(Verification)
    assoc = ae.associate("127.0.0.1", target.dicom_port, ae_title=CALLED_AE)
    if not assoc.is_established:
        return -1
    status = int(assoc.send_c_echo().Status)
    assoc.release()
    return status


def abort_mid_dataset(target: Target) -> Verdict:
    """Half a data set, then A-ABORT: nothing of that instance is kept (checked by the suite
    through ``target.scratch / 'aborted-uid'``)."""
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    uid = str(ds.SOPInstanceUID)
    (target.scratch / "aborted-uid").write_text(uid)
    command = _store_command(uid)
    data = _dataset_bytes(ds)
    with connected(target) as sock:
        associated(target, sock)
        sock.sendall(p_data(1, 0x03, command))
        sock.sendall(p_data(1, 0x00, data[: len(data) // 2]))
        sock.sendall(pdu(A_ABORT_TYPE, b"\x00\x00\x00\x00"))
        got = read_pdu(sock)  # PS3.8 AA-3: the daemon only closes
    return Verdict(got is None, "closed" if got is None else f"answered {PDU_NAMES.get(got[0])}")


def _dataset_bytes(ds: Dataset) -> bytes:
    buffer = DicomBytesIO()
    buffer.is_little_endian, buffer.is_implicit_VR = True, False
    pydicom.filewriter.write_dataset(buffer, ds)
    return buffer.getvalue()


def _store_command(sop_instance_uid: str) -> bytes:
    """A C-STORE-RQ command set (implicit VR little endian, with its group length)."""
    command = Dataset()
    command.AffectedSOPClassUID = CTImageStorage
    command.CommandField = 0x0001
    command.MessageID = 1
    command.Priority = 0
    command.CommandDataSetType = 0x0000
    command.AffectedSOPInstanceUID = sop_instance_uid
    buffer = DicomBytesIO()
    buffer.is_little_endian, buffer.is_implicit_VR = True, True
    pydicom.filewriter.write_dataset(buffer, command)
    body = buffer.getvalue()
    return struct.pack("<HHLL", 0x0000, 0x0000, 4, len(body)) + body


def pdv_on_unknown_context(sock: socket.socket) -> None:
    sock.sendall(p_data(99, 0x03, _store_command(generate_uid())))


# ---- real senders, data sets the pipeline could not use ----------------------------------------


def store(target: Target, ds: Dataset, contexts: tuple[str, ...] = (CTImageStorage,)) -> int:
    """C-STORE ``ds`` as a PACS would; the status, or -1 if no context was accepted."""
    ae = AE(ae_title=CALLING_AE)
    ae.acse_timeout = ae.network_timeout = 10
    for sop_class in contexts:
        ae.add_requested_context(sop_class, ExplicitVRLittleEndian)
    assoc = ae.associate("127.0.0.1", target.dicom_port, ae_title=CALLED_AE)
    if not assoc.is_established:
        return -2
    try:
        return int(assoc.send_c_store(ds).Status)
    except ValueError:  # no accepted presentation context for it
        return -1
    finally:
        assoc.release()


def failed_store(name: str, make: Callable[[], Dataset], refused: Callable[[int], bool]) -> Attack:
    def run(target: Target) -> Verdict:
        status = store(target, make())
        return Verdict(refused(status), f"status 0x{status:04x}" if status >= 0 else "no context")

    return Attack(name, "C-STORE (pynetdicom)", run)


def _failure(status: int) -> bool:
    return status >= 0xA000  # A7xx, A9xx, Cxxx: a failure, never Success or a warning


def _no_study_uid() -> Dataset:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    del ds.StudyInstanceUID
    return ds


def _sop_uid_not_a_uid() -> Dataset:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = "1.2.840.abc/../x"
    return ds


def _short_pixels() -> Dataset:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    ds.PixelData = ds.PixelData[: len(ds.PixelData) // 3]
    return ds


def mr_context(target: Target) -> Verdict:
    """MR Image Storage, offered as every Storage SOP class is (issue 20: a PACS pushes whole
    studies): stored with Success and kept "not analysed"; the good study after it must still
    complete (`_attack_then_study`)."""
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = MRImageStorage
    ds.Modality = "MR"
    status = store(target, ds, contexts=(MRImageStorage,))
    return Verdict(status == 0x0000, "no context accepted" if status < 0 else f"0x{status:04x}")


def bad_transfer_syntax(target: Target) -> Verdict:
    """A transfer syntax that does not exist: the context is refused in the A-ASSOCIATE-AC."""
    with connected(target) as sock:
        sock.sendall(associate_rq(transfer_syntaxes=("1.2.3.4.5.6.7",)))
        got = read_pdu(sock)
    if got is None:
        return Verdict(False, "closed without a PDU")
    if got[0] == A_ASSOCIATE_RJ_TYPE:
        return Verdict(True, "A-ASSOCIATE-RJ")
    # Presentation context item (0x21): its result byte at offset 4 of the item's body.
    index = got[1].find(b"\x21\x00", 68)
    result = got[1][index + 6] if index >= 0 else -1
    return Verdict(got[0] == A_ASSOCIATE_AC_TYPE and result == 4, f"context result {result}")


def reused_sop_instance(target: Target) -> Verdict:
    """Another study's instance under a catalogued SOP Instance UID: refused 0x0111."""
    first = ct_dataset(generate_uid(), generate_uid(), 0)
    if store(target, first) != SUCCESS:
        return Verdict(False, "the first instance was not stored")
    second = ct_dataset(generate_uid(), generate_uid(), 1)
    second.SOPInstanceUID = second.file_meta.MediaStorageSOPInstanceUID = first.SOPInstanceUID
    status = store(target, second)
    return Verdict(status == 0x0111, f"status 0x{status:04x}")


# ---- HTTP ---------------------------------------------------------------------------------------


def http(target: Target, path: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{target.http_port}{path}", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def http_flood(target: Target) -> Verdict:
    """Idle HTTP sockets with the daemon's descriptor limit lowered to what it has open plus
    40: DICOM still accepts (a C-ECHO during the flood), and once the header timeout has closed
    them the HTTP side answers again."""
    soft, hard = resource.prlimit(target.pid, resource.RLIMIT_NOFILE)
    fds = [int(fd) for fd in os.listdir(f"/proc/{target.pid}/fd")]
    resource.prlimit(target.pid, resource.RLIMIT_NOFILE, (max(fds) + 1 + 40, hard))
    socks = []
    try:
        with low_descriptors_held() as release:
            for _ in range(150 * target.scale):
                socks.append(socket.create_connection(("127.0.0.1", target.http_port), timeout=5))
            release()
            status = echo(target)
    finally:
        resource.prlimit(target.pid, resource.RLIMIT_NOFILE, (soft, hard))
        for s in socks:
            s.close()
    deadline = time.monotonic() + target.header_timeout_s + 10
    healthy = -1
    while time.monotonic() < deadline and healthy != 200:
        with contextlib.suppress(OSError):
            healthy = http(target, "/healthz")
        time.sleep(0.2)
    return Verdict(
        status == SUCCESS and healthy == 200,
        f"{len(socks)} idle; C-ECHO 0x{status:04x} during it; /healthz {healthy} after",
    )


def slow_headers(target: Target) -> Verdict:
    """A request head sent one byte a second: closed at the header timeout."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=1) as sock:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60:
            try:
                sock.sendall(bytes([byte]))
            except (ConnectionResetError, BrokenPipeError):
                break
            if select.select([sock], [], [], 1.0)[0] and closed(sock):
                break
            if time.monotonic() - start > target.header_timeout_s + 10:
                return Verdict(False, "still open past the header timeout")
    took = time.monotonic() - start
    return Verdict(took < target.header_timeout_s + 3, f"closed after {took:.1f} s")


def huge_header(target: Target) -> Verdict:
    """A 1 MiB header: refused (4xx) or closed, never read into memory whole."""
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=10) as sock:
        try:
            sock.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
            )
        except (ConnectionResetError, BrokenPipeError):
            return Verdict(True, "reset while sending")
        try:
            answer = sock.recv(64)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    ok = answer == b"" or answer.split(b" ")[1][:1] == b"4"
    return Verdict(ok, answer.split(b"\r\n")[0].decode(errors="replace") or "closed")


def http_status(
    name: str, path: str, expected: set[int], headers: dict[str, str] | None = None
) -> Attack:
    def run(target: Target) -> Verdict:
        status = http(target, path, headers)
        return Verdict(status in expected, f"HTTP {status}")

    return Attack(name, "HTTP", run)


def spoofed_forwarded_for(target: Target) -> Verdict:
    """A sign-in guess claiming another address: audited under the real one (the suite reads
    the audit log through ``target.scratch / 'spoofed'``)."""
    (target.scratch / "spoofed").write_text("10.66.66.66")
    data = b"name=it&token=wrong-wrong-wrong-wrong&next="
    request = urllib.request.Request(
        f"http://127.0.0.1:{target.http_port}/admin/signin",
        data=data,
        headers={
            "X-Forwarded-For": "10.66.66.66",
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=20)
        return Verdict(False, "signed in with a wrong token")
    except urllib.error.HTTPError as exc:
        return Verdict(exc.code in (401, 403, 429), f"HTTP {exc.code}")


ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def catalogue() -> list[Attack]:
    """Every attack; the soak runs them all, make test those not ``soak_only``."""
    return [
        raw(
            "A-ASSOCIATE-RQ claiming 4 GiB",
            lambda s: s.sendall(struct.pack(">BBL", 1, 0, HUGE)),
            A_ABORT_TYPE,
            False,
        ),
        raw("unknown PDU type", lambda s: s.sendall(pdu(0x55, b"\x00" * 8)), A_ABORT_TYPE, False),
        raw("random bytes", _garbage, A_ABORT_TYPE, False),
        raw(
            "P-DATA-TF before association",
            lambda s: s.sendall(p_data(1, 0x03, b"\x00" * 8)),
            A_ABORT_TYPE,
            False,
        ),
        raw(
            "A-RELEASE-RQ before association",
            lambda s: s.sendall(pdu(A_RELEASE_RQ_TYPE, b"\x00" * 4)),
            A_ABORT_TYPE,
            False,
        ),
        raw(
            "wrong called AE title",
            lambda s: s.sendall(associate_rq(called="NOT_US")),
            A_ASSOCIATE_RJ_TYPE,
            False,
        ),
        raw(
            "unknown calling AE title",
            lambda s: s.sendall(associate_rq(calling="INTRUDER")),
            A_ASSOCIATE_RJ_TYPE,
            False,
        ),
        raw(
            "A-RELEASE-RQ claiming 4 GiB in an association",
            lambda s: s.sendall(struct.pack(">BBL", 5, 0, HUGE)),
            A_ABORT_TYPE,
            True,
        ),
        raw(
            "A-ABORT claiming 4 GiB in an association",
            lambda s: s.sendall(struct.pack(">BBL", 7, 0, HUGE)),
            A_ABORT_TYPE,
            True,
        ),
        raw("1 MiB of command fragments never last", _huge_command, A_ABORT_TYPE, True),
        raw("PDV on a context never negotiated", pdv_on_unknown_context, A_ABORT_TYPE, True),
        raw(
            "a second A-ASSOCIATE-RQ in an association",
            lambda s: s.sendall(associate_rq()),
            A_ABORT_TYPE,
            True,
        ),
        Attack(
            "A-ABORT in the middle of a data set", "upper layer (raw socket)", abort_mid_dataset
        ),
        Attack("A-ASSOCIATE-RQ cut short", "upper layer (raw socket)", truncated_request),
        Attack("one byte every 0.25 s", "upper layer (raw socket)", trickle),
        Attack("silent DICOM sockets, 3x the waiting cap", "flood", silent_flood),
        Attack(
            "a transfer syntax that does not exist", "upper layer (raw socket)", bad_transfer_syntax
        ),
        Attack("MR Image Storage", "C-STORE (pynetdicom)", mr_context),
        failed_store("no Study Instance UID", _no_study_uid, _failure),
        failed_store("a SOP Instance UID with a path in it", _sop_uid_not_a_uid, _failure),
        failed_store("Pixel Data a third of its size", _short_pixels, _failure),
        Attack("another study's SOP Instance UID", "C-STORE (pynetdicom)", reused_sop_instance),
        Attack("idle HTTP sockets at a lowered descriptor limit", "flood", http_flood),
        Attack("HTTP head one byte a second", "HTTP", slow_headers),
        Attack("1 MiB HTTP header", "HTTP", huge_header),
        http_status("RIS API without a token", "/api/v1/studies", {401}),
        http_status(
            "admin page with a wrong token", "/admin", {401}, {"Authorization": "Bearer x" * 3}
        ),
        http_status(
            "path traversal in a key image name",
            "/admin/studies/1.2.3/images/..%2f..%2fimaging-ai.sqlite3",
            {404},
            ADMIN,
        ),
        http_status(
            "SQL in a query parameter",
            "/api/v1/studies?accession=%27%20OR%201%3D1%20--",
            {200},
            ADMIN,
        ),
        Attack("X-Forwarded-For from an untrusted peer", "HTTP", spoofed_forwarded_for),
    ]
