"""The upper layer as PS3.8 says (issue 18 item 8): the acceptor's state machine, raw sockets.

Each row of ``association.TRANSITIONS`` is driven over loopback TCP against an Association
with a small fake acceptor, and each legal-but-unusual sender case of the issue has a test
that failed before the state machine was written.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
import pytest
from pydicom import Dataset
from pydicom.uid import ImplicitVRLittleEndian
from pynetdicom.dsutils import encode
from pynetdicom.fsm import TRANSITION_TABLE
from pynetdicom.pdu import A_ASSOCIATE_RQ
from pynetdicom.pdu_primitives import A_ASSOCIATE, MaximumLengthNotification
from pynetdicom.presentation import PresentationContext, build_context
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    CTImageStorage,
    MRImageStorage,
    Verification,
)
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Instance
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.dicom import association, dimse, dul
from imaging_ai.dicom.association import TRANSITIONS, Association, Event, Incoming, Peer, State
from imaging_ai.dicom.negotiation import (
    REJECT_CALLED_AE,
    REJECT_CALLING_AE,
    REJECT_PROTOCOL_VERSION,
)
from imaging_ai.receive import Receiver
from tests.dicom_factory import ct_series
from tests.test_receive import start_receiver

CALLED = "IMAGING_AI"
CT, ECHO = 1, 3  # the presentation context IDs proposed for CT Image Storage and Verification
ARTIM_S = 1.0
IDLE_S = 0.5  # the association's socket receive timeout (the daemon's network_timeout_s)
AT_ONCE = (0.0, 0.4)
AFTER_ARTIM = (0.8 * ARTIM_S, ARTIM_S + 2)


@pytest.fixture(autouse=True)
def short_artim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(association, "ARTIM_S", ARTIM_S)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[Receiver, Engine]]:
    """The daemon's storage SCP in this process, PACS allowed from loopback."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    upgrade(engine)
    receiver = start_receiver(engine, tmp_path)
    yield receiver, engine
    receiver.stop()
    engine.dispose()


class _Stored:
    """An Incoming that records what became of its data set."""

    def __init__(self, acceptor: _Acceptor) -> None:
        self.acceptor = acceptor
        self.data = b""

    def write(self, data: memoryview) -> None:
        self.data += data

    def finish(self) -> Dataset:
        self.acceptor.stored.append(self.data)
        status = Dataset()
        status.Status = 0x0000
        return status

    def discard(self) -> None:
        self.acceptor.discarded += 1


@dataclass
class _Acceptor:
    ae_title: str = CALLED
    max_pdu: int = 16384
    contexts: list[PresentationContext] = field(
        default_factory=lambda: [build_context(CTImageStorage), build_context(Verification)]
    )
    stored: list[bytes] = field(default_factory=list)
    discarded: int = 0
    begun: int = 0

    def admit(self, peer: Peer) -> tuple[int, int, int] | None:
        return None if peer.calling_ae == "PACS" else REJECT_CALLING_AE

    def begin_store(self, command: dimse.Command, syntax: str, peer: Peer) -> Incoming:
        self.begun += 1
        return _Stored(self)


@contextmanager
def _served(acceptor: _Acceptor | None = None) -> Iterator[tuple[socket.socket, Association]]:
    """A peer's socket to an Association run on loopback, closed as the daemon closes it."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname(), timeout=10)
        ours, _ = listener.accept()
    interval = struct.pack("@ll", 0, int(IDLE_S * 1_000_000))
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)
    assoc = Association(ours, "127.0.0.1", acceptor or _Acceptor())
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            assoc.run()
        except BaseException as exc:  # the test reads it: the state machine let it escape
            errors.append(exc)
        finally:
            ours.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with peer:
            yield peer, assoc
    finally:
        thread.join(10)
    assert not thread.is_alive()
    assert errors == []


# PDUs a peer sends


def _pdu(pdu_type: int, body: bytes) -> bytes:
    return struct.pack(">BBL", pdu_type, 0, len(body)) + body


def _request(
    calling: str = "PACS",
    called: str = CALLED,
    contexts: tuple[tuple[int, str], ...] = ((CT, CTImageStorage), (ECHO, Verification)),
) -> bytearray:
    """An A-ASSOCIATE-RQ PDU, to be patched byte by byte where pynetdicom would refuse."""
    primitive = A_ASSOCIATE()
    primitive.application_context_name = dul.APPLICATION_CONTEXT
    primitive.calling_ae_title = calling
    primitive.called_ae_title = called
    proposed = []
    for context_id, sop_class in contexts:
        context = build_context(sop_class, [ImplicitVRLittleEndian])
        context.context_id = context_id
        proposed.append(context)
    primitive.presentation_context_definition_list = proposed
    max_length = MaximumLengthNotification()
    max_length.maximum_length_received = 16384
    primitive.user_information = [max_length]
    pdu = A_ASSOCIATE_RQ()
    pdu.from_primitive(primitive)
    return bytearray(pdu.encode())


def _with_item(request: bytearray, item: bytes, into_user_information: bool = False) -> bytes:
    """``request`` with one more variable item, at its end or in its user information item."""
    if into_user_information:
        start = request.rindex(b"\x50\x00")  # the user information item comes last
        (length,) = struct.unpack_from(">H", request, start + 2)
        struct.pack_into(">H", request, start + 2, length + len(item))
    grown = request + item
    struct.pack_into(">L", grown, 2, len(grown) - 6)
    return bytes(grown)


def _command(
    field_: int,
    sop_class: str,
    with_dataset: bool,
    instance: str = "1.2.826.0.1.3680043.9.9999.8.1",
) -> bytes:
    command = Dataset()
    command.AffectedSOPClassUID = sop_class
    command.CommandField = field_
    command.MessageID = 7
    command.CommandDataSetType = 0x0000 if with_dataset else dimse.NO_DATASET
    if field_ == dimse.C_STORE_RQ:
        command.Priority = 0
        command.AffectedSOPInstanceUID = instance
    raw = encode(command, True, True)
    assert raw is not None
    return raw


def _p_data(context_id: int, control: int, payload: bytes) -> bytes:
    return _pdu(
        dul.P_DATA_TF_TYPE, struct.pack(">LBB", len(payload) + 2, context_id, control) + payload
    )


def _echo(context_id: int = ECHO) -> bytes:
    return _p_data(context_id, 0x03, _command(dimse.C_ECHO_RQ, Verification, with_dataset=False))


def _store(context_id: int, sop_class: str, data: bytes = b"\x08\x00\x16\x00" + bytes(4)) -> bytes:
    """A C-STORE-RQ and its whole data set, each in one PDV."""
    return _p_data(context_id, 0x03, _command(dimse.C_STORE_RQ, sop_class, True)) + _p_data(
        context_id, 0x02, data
    )


AC = _pdu(dul.A_ASSOCIATE_AC_TYPE, bytes(68))
RJ = _pdu(dul.A_ASSOCIATE_RJ_TYPE, bytes((0, 1, 1, 3)))
RELEASE_RQ = _pdu(dul.A_RELEASE_RQ_TYPE, bytes(4))
RELEASE_RP = _pdu(dul.A_RELEASE_RP_TYPE, bytes(4))
ABORT = _pdu(dul.A_ABORT_TYPE, bytes(4))
UNKNOWN = _pdu(0x08, bytes(4))
SHUT = None  # not a PDU: the peer shuts its side of the connection down


# What comes back


def _answers(
    peer: socket.socket, send: bytes | None = b""
) -> tuple[list[tuple[int, bytes]], float]:
    """Send ``send`` (None: shut down); the PDUs that come back until our side closes, and
    how long after it closed."""
    if send is SHUT:
        peer.shutdown(socket.SHUT_WR)
    else:
        peer.sendall(send)
    start = time.monotonic()
    data = b""
    while chunk := _recv(peer):
        data += chunk
    elapsed = time.monotonic() - start
    pdus = []
    while data:
        pdu_type, _, length = struct.unpack_from(">BBL", data)
        pdus.append((pdu_type, data[6 : 6 + length]))
        data = data[6 + length :]
    return pdus, elapsed


def _recv(peer: socket.socket) -> bytes:
    try:
        return peer.recv(65536)
    except ConnectionResetError:
        return b""


def _read_pdu(peer: socket.socket) -> tuple[int, bytes]:
    header = _exactly(peer, 6)
    pdu_type, _, length = struct.unpack(">BBL", header)
    return pdu_type, _exactly(peer, length)


def _exactly(peer: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = peer.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes, expecting a PDU"
        data += chunk
    return data


def _status(pdu: tuple[int, bytes]) -> int:
    """The Status of the DIMSE response a P-DATA-TF carries."""
    assert pdu[0] == dul.P_DATA_TF_TYPE
    return int(dimse.decode_command(pdu[1][6:]).Status)


def _abort(source: int, reason: int) -> tuple[int, bytes]:
    return dul.A_ABORT_TYPE, bytes((0, 0, source, reason))


def _rejected(result: tuple[int, int, int]) -> tuple[int, bytes]:
    return dul.A_ASSOCIATE_RJ_TYPE, bytes((0, *result))


def _associated(peer: socket.socket, request: bytes | None = None) -> None:
    peer.sendall(bytes(request or _request()))
    assert _read_pdu(peer)[0] == dul.A_ASSOCIATE_AC_TYPE


# Every transition of the table


@dataclass(frozen=True)
class _Case:
    """How to bring the association to a state, what to send, what must come back."""

    setup: str  # "": Sta2; "associated": Sta6; "rejected": Sta13
    send: bytes | None
    answers: tuple[int | tuple[int, bytes], ...]  # PDU types, or types and bodies
    closes: tuple[float, float]  # seconds after sending, from..to


_UNEXPECTED = _abort(2, dul.REASON_UNEXPECTED_PDU)
_S, _E = State, Event
CASES: dict[tuple[State, Event], _Case] = {
    (_S.STA2, _E.EVT3): _Case("", AC, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA2, _E.EVT4): _Case("", RJ, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA2, _E.EVT6): _Case("", bytes(_request()) + RELEASE_RQ, (2, 6), AFTER_ARTIM),
    (_S.STA2, _E.EVT10): _Case("", _echo(), (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA2, _E.EVT12): _Case("", RELEASE_RQ, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA2, _E.EVT13): _Case("", RELEASE_RP, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA2, _E.EVT16): _Case("", ABORT, (), AT_ONCE),
    (_S.STA2, _E.EVT17): _Case("", SHUT, (), AT_ONCE),
    (_S.STA2, _E.EVT18): _Case("", b"", (), (IDLE_S - 0.1, IDLE_S + 2)),
    (_S.STA2, _E.EVT19): _Case("", UNKNOWN, (_abort(2, dul.REASON_UNRECOGNIZED_PDU),), AFTER_ARTIM),
    (_S.STA3, _E.EVT7): _Case("", bytes(_request()) + RELEASE_RQ, (2, 6), AFTER_ARTIM),
    (_S.STA3, _E.EVT8): _Case(
        "", bytes(_request("OTHER")), (_rejected(REJECT_CALLING_AE),), AFTER_ARTIM
    ),
    (_S.STA6, _E.EVT3): _Case("associated", AC, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA6, _E.EVT4): _Case("associated", RJ, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA6, _E.EVT6): _Case("associated", bytes(_request()), (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA6, _E.EVT10): _Case("associated", _echo() + RELEASE_RQ, (4, 6), AFTER_ARTIM),
    (_S.STA6, _E.EVT12): _Case("associated", RELEASE_RQ, ((6, bytes(4)),), AFTER_ARTIM),
    (_S.STA6, _E.EVT13): _Case("associated", RELEASE_RP, (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA6, _E.EVT16): _Case("associated", ABORT, (), AT_ONCE),
    (_S.STA6, _E.EVT17): _Case("associated", SHUT, (), AT_ONCE),
    (_S.STA6, _E.EVT19): _Case(
        "associated", UNKNOWN, (_abort(2, dul.REASON_UNRECOGNIZED_PDU),), AFTER_ARTIM
    ),
    (_S.STA6, _E.IDLE): _Case(
        "associated", b"", (_abort(2, dul.REASON_NOT_SPECIFIED),), (IDLE_S + 0.8, IDLE_S + 4)
    ),
    (_S.STA8, _E.EVT14): _Case("associated", RELEASE_RQ, ((6, bytes(4)),), AFTER_ARTIM),
    (_S.STA8, _E.EVT15): _Case(
        "associated",
        _p_data(CT, 0x03, _command(dimse.C_STORE_RQ, CTImageStorage, True))
        + _p_data(CT, 0x00, bytes(64))
        + RELEASE_RQ,
        (_abort(0, 0),),
        AFTER_ARTIM,
    ),
    (_S.STA13, _E.EVT3): _Case("rejected", AC, (), AFTER_ARTIM),
    (_S.STA13, _E.EVT4): _Case("rejected", RJ, (), AFTER_ARTIM),
    (_S.STA13, _E.EVT6): _Case("rejected", bytes(_request()), (_UNEXPECTED,), AFTER_ARTIM),
    (_S.STA13, _E.EVT10): _Case("rejected", _echo(), (), AFTER_ARTIM),
    (_S.STA13, _E.EVT12): _Case("rejected", RELEASE_RQ, (), AFTER_ARTIM),
    (_S.STA13, _E.EVT13): _Case("rejected", RELEASE_RP, (), AFTER_ARTIM),
    (_S.STA13, _E.EVT16): _Case("rejected", ABORT, (), AT_ONCE),
    (_S.STA13, _E.EVT17): _Case("rejected", SHUT, (), AT_ONCE),
    (_S.STA13, _E.EVT18): _Case("rejected", b"", (), AFTER_ARTIM),
    (_S.STA13, _E.EVT19): _Case(
        "rejected", UNKNOWN, (_abort(2, dul.REASON_UNRECOGNIZED_PDU),), AFTER_ARTIM
    ),
}


def test_every_transition_has_a_case() -> None:
    assert CASES.keys() == TRANSITIONS.keys()


def test_the_table_is_ps3_8_s() -> None:
    """Each row but the idle timer's is the standard's, as pynetdicom also writes it down."""
    for (state, event), action in TRANSITIONS.items():
        if event is not Event.IDLE:
            assert TRANSITION_TABLE[event.value, state.value] == action.value, (state, event)


@pytest.mark.parametrize(("state", "event"), list(CASES), ids=[f"{s}-{e}" for s, e in CASES])
def test_transition(state: State, event: Event) -> None:
    case = CASES[state, event]
    with _served() as (peer, assoc):
        if case.setup == "associated":
            _associated(peer)
        elif case.setup == "rejected":
            peer.sendall(bytes(_request("OTHER")))
            assert _read_pdu(peer)[0] == dul.A_ASSOCIATE_RJ_TYPE
        answers, elapsed = _answers(peer, case.send)
    # Where the case names a PDU type alone, only the type is compared.
    seen = [
        a if isinstance(e, tuple) else a[0] for a, e in zip(answers, case.answers, strict=False)
    ]
    assert (seen, len(answers)) == (list(case.answers), len(case.answers)), answers
    low, high = case.closes
    assert low <= elapsed <= high, f"closed {elapsed:.2f} s after, not in {case.closes}"
    assert assoc.state is State.STA1


# The cases


def test_a_release_in_the_middle_of_a_data_set_drops_the_instance_and_aborts() -> None:
    acceptor = _Acceptor()
    with _served(acceptor) as (peer, assoc):
        _associated(peer)
        peer.sendall(_store(CT, CTImageStorage))  # one whole instance
        assert _status(_read_pdu(peer)) == 0x0000
        command = _p_data(CT, 0x03, _command(dimse.C_STORE_RQ, CTImageStorage, True))
        answers, _ = _answers(peer, command + _p_data(CT, 0x00, bytes(64)) + RELEASE_RQ)
    assert answers == [_abort(dul.SOURCE_SERVICE_USER, 0)]  # not an A-RELEASE-RP
    assert len(acceptor.stored) == 1 and acceptor.discarded == 1
    assert not assoc.released  # its studies wait for their idle timers, not this sender


def test_a_release_in_the_middle_of_a_command_aborts() -> None:
    acceptor = _Acceptor()
    with _served(acceptor) as (peer, assoc):
        _associated(peer)
        command = _command(dimse.C_STORE_RQ, CTImageStorage, True)
        answers, _ = _answers(peer, _p_data(CT, 0x01, command[:20]) + RELEASE_RQ)
    assert answers == [_abort(dul.SOURCE_SERVICE_USER, 0)]
    assert acceptor.begun == 0 and not assoc.released


def test_a_release_in_the_middle_of_a_data_set_completes_no_study(
    receiver: tuple[Receiver, Engine], tmp_path: Path
) -> None:
    scp, engine = receiver
    released: list[bool] = []
    scp.release_observers.append(lambda: released.append(True))
    command, data = _ct_store(tmp_path)
    with socket.create_connection(("127.0.0.1", scp.port), timeout=10) as peer:
        _associated(peer)
        answers, _ = _answers(
            peer, _p_data(CT, 0x03, command) + _p_data(CT, 0x00, data[:4096]) + RELEASE_RQ
        )
    assert answers == [_abort(dul.SOURCE_SERVICE_USER, 0)]
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Instance)) == 0
    assert released == []
    assert list(scp.spool.walk()) == []


def _ct_store(tmp_path: Path) -> tuple[bytes, bytes]:
    """A C-STORE-RQ command set for a CT image and its data set (implicit VR little endian)."""
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    data = encode(ds, True, True)
    assert data is not None
    return _command(dimse.C_STORE_RQ, CTImageStorage, True, str(ds.SOPInstanceUID)), data


@pytest.mark.parametrize(
    ("version", "answer"),
    [
        (0x0000, _rejected(REJECT_PROTOCOL_VERSION)),
        (0x0002, _rejected(REJECT_PROTOCOL_VERSION)),
        (0x8000, _rejected(REJECT_PROTOCOL_VERSION)),
        (0x0003, None),  # version 1 among others: PS3.8 9.3.2 tests bit 0 only
    ],
)
def test_protocol_versions_without_version_1_are_rejected(
    version: int, answer: tuple[int, bytes] | None
) -> None:
    request = _request()
    struct.pack_into(">H", request, 6, version)
    with _served() as (peer, _):
        peer.sendall(bytes(request))
        got = _read_pdu(peer)
    if answer is None:
        assert got[0] == dul.A_ASSOCIATE_AC_TYPE
    else:
        assert got == answer


@pytest.mark.parametrize(
    ("field_", "title", "rejection"),
    [
        ("called", b"IMAGING_AI" + b"\x00" * 6, REJECT_CALLED_AE),
        ("called", b" " * 16, REJECT_CALLED_AE),
        ("called", b"IMAGING\\AI      ", REJECT_CALLED_AE),
        ("calling", b"PACS" + b"\x00" * 12, REJECT_CALLING_AE),
        ("calling", b" " * 16, REJECT_CALLING_AE),
        ("calling", b"PA\\CS           ", REJECT_CALLING_AE),
        ("calling", b"PACS\t           ", REJECT_CALLING_AE),
    ],
)
def test_ae_titles_that_are_not_ae_titles_are_rejected_with_a_reason(
    field_: str, title: bytes, rejection: tuple[int, int, int]
) -> None:
    request = _request()
    offset = 6 + (4 if field_ == "called" else 20)
    request[offset : offset + 16] = title
    with _served() as (peer, _):
        answers, _ = _answers(peer, bytes(request))
    assert answers == [_rejected(rejection)]


def test_leading_and_trailing_spaces_of_an_ae_title_are_not_significant() -> None:
    request = _request()
    request[6 + 20 : 6 + 36] = b"   PACS         "
    with _served() as (peer, assoc):
        _associated(peer, bytes(request))
        assert assoc.peer.calling_ae == "PACS"


def test_an_even_presentation_context_id_is_aborted_as_an_invalid_parameter() -> None:
    request = _request(contexts=((1, CTImageStorage),))
    (application_context,) = struct.unpack_from(">H", request, 6 + 68 + 2)
    context_id = 6 + 68 + 4 + application_context + 4
    assert (request[context_id - 4], request[context_id]) == (0x20, 1)
    request[context_id] = 2
    with _served() as (peer, _):
        answers, _ = _answers(peer, bytes(request))
    assert answers == [_abort(2, dul.REASON_INVALID_PARAMETER)]


@pytest.mark.parametrize("into_user_information", [True, False], ids=["sub-item", "item"])
def test_items_of_unknown_types_are_skipped(into_user_information: bool) -> None:
    item = struct.pack(">BBH", 0x5F if into_user_information else 0x6E, 0, 3) + b"abc"
    with _served() as (peer, _):
        _associated(peer, _with_item(_request(), item, into_user_information))
        peer.sendall(_echo())
        assert _status(_read_pdu(peer)) == 0x0000


@pytest.mark.parametrize(
    ("send", "reason"),
    [
        (_echo(context_id=5), dul.REASON_INVALID_PARAMETER),  # context 5 was not accepted
        (_p_data(CT, 0x02, bytes(8)), dul.REASON_UNEXPECTED_PARAMETER),  # data, no command
        (
            _p_data(CT, 0x03, _command(dimse.C_STORE_RQ, CTImageStorage, True)) + _echo(CT),
            dul.REASON_UNEXPECTED_PARAMETER,  # a command where the data set was due
        ),
        (_p_data(CT, 0x03, b"\x08\x00\x16\x00\x02\x00\x00\x00ab"), dul.REASON_INVALID_PARAMETER),
        (_pdu(dul.P_DATA_TF_TYPE, b"\x00\x00"), dul.REASON_INVALID_PARAMETER),
    ],
    ids=["unaccepted-context", "data-first", "command-in-data", "bad-command", "short-pdv"],
)
def test_a_provider_abort_carries_the_ps3_8_reason(send: bytes, reason: int) -> None:
    with _served() as (peer, _):
        _associated(peer)
        answers, _ = _answers(peer, send)
    assert answers == [_abort(dul.SOURCE_SERVICE_PROVIDER, reason)]


def test_an_a_abort_is_never_answered_with_another() -> None:
    for setup in (b"", bytes(_request())):
        with _served() as (peer, _):
            answers, elapsed = _answers(peer, setup + ABORT)
        assert [a[0] for a in answers] == ([dul.A_ASSOCIATE_AC_TYPE] if setup else [])
        assert elapsed < AT_ONCE[1]


@pytest.mark.parametrize(
    ("send", "served_by"),
    [
        (_store(ECHO, CTImageStorage), None),  # CT on the Verification context
        (_store(CT, MRImageStorage), None),  # an MR command on the CT context
        (_p_data(CT, 0x03, _command(dimse.C_ECHO_RQ, Verification, False)), None),  # echo on CT
        (_store(CT, CTImageStorage), 0x0000),
        (_echo(), 0x0000),
    ],
    ids=["ct-on-verification", "mr-on-ct", "echo-on-ct", "ct-on-ct", "echo-on-verification"],
)
def test_a_request_on_another_sop_class_s_context_is_not_served(
    send: bytes, served_by: int | None
) -> None:
    acceptor = _Acceptor()
    with _served(acceptor) as (peer, _):
        _associated(peer)
        peer.sendall(send)
        status = _status(_read_pdu(peer))
    if served_by is None:
        assert status == association.STATUS_SOP_CLASS_NOT_SUPPORTED
        assert acceptor.begun == 0 and acceptor.stored == []
    else:
        assert status == served_by


def test_a_ct_image_on_the_verification_context_is_not_stored(
    receiver: tuple[Receiver, Engine], tmp_path: Path
) -> None:
    scp, engine = receiver
    command, data = _ct_store(tmp_path)
    with socket.create_connection(("127.0.0.1", scp.port), timeout=10) as peer:
        _associated(peer)
        peer.sendall(_p_data(ECHO, 0x03, command))
        for i in range(0, len(data), 8192):
            peer.sendall(_p_data(ECHO, 0x02 if i + 8192 >= len(data) else 0x00, data[i : i + 8192]))
        assert _status(_read_pdu(peer)) == association.STATUS_SOP_CLASS_NOT_SUPPORTED
        peer.sendall(_p_data(CT, 0x03, command))  # the same image on its own context
        peer.sendall(_p_data(CT, 0x02, data))
        assert _status(_read_pdu(peer)) == 0x0000
        peer.sendall(RELEASE_RQ)
        assert _read_pdu(peer)[0] == dul.A_RELEASE_RP_TYPE
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Instance)) == 1
