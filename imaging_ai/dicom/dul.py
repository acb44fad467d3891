"""Takes a connected socket and gives DICOM upper-layer PDUs and PDVs (PS3.8).

The storage SCP's data path lives here instead of in pynetdicom's reactor: pynetdicom hands
every PDU between two polling threads and reads 4 KB at a time, which costs about 5 ms of
CPU per 512×512 image on two cores (see shared/PEERS.md). pynetdicom's own PDU classes still
decode and encode association negotiation, and its presentation-context negotiation is used
as is; this module only frames PDUs. The DIMSE messages they carry are ``dimse``'s, the
association's state machine is ``association``'s.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Container, Iterator
from dataclasses import dataclass

from pydicom.uid import UID, generate_uid
from pynetdicom.pdu import A_ASSOCIATE_AC, A_ASSOCIATE_RQ
from pynetdicom.pdu_primitives import (
    A_ASSOCIATE,
    ImplementationClassUIDNotification,
    ImplementationVersionNameNotification,
    MaximumLengthNotification,
)
from pynetdicom.presentation import PresentationContext

from imaging_ai import __version__

# PDU types, PS3.8 section 9.3.1.
A_ASSOCIATE_RQ_TYPE = 0x01
A_ASSOCIATE_AC_TYPE = 0x02
A_ASSOCIATE_RJ_TYPE = 0x03
P_DATA_TF_TYPE = 0x04
A_RELEASE_RQ_TYPE = 0x05
A_RELEASE_RP_TYPE = 0x06
A_ABORT_TYPE = 0x07
PDU_TYPES = range(0x01, 0x08)

APPLICATION_CONTEXT = UID("1.2.840.10008.3.1.1.1")
IMPLEMENTATION_CLASS_UID = generate_uid(entropy_srcs=["imaging-ai implementation class"])
IMPLEMENTATION_VERSION = f"IMAGING_AI_{__version__}"[:16]

_HEADER = struct.Struct(">BBL")
_PDV_HEADER = struct.Struct(">LBB")
# A P-DATA-TF may exceed the negotiated maximum by its PDV item headers (6 bytes each);
# this much is tolerated, for up to 64 PDVs.
_PDV_HEADERS_ALLOWED = 6 * 64
# Largest A-ASSOCIATE-RQ/AC body taken: storescu's ~120 proposed contexts take ~8 KiB.
MAX_ASSOCIATE_LENGTH = 65536
# Body length of A-ASSOCIATE-RJ, A-RELEASE-RQ/RP and A-ABORT (PS3.8 section 9.3).
_FIXED_LENGTH = 4
# A PDU body is read into a buffer that grows as its bytes arrive, from this size: a length
# field is the peer's claim, and 0xFFFFFFFF must not buy 4 GiB of zeroed memory.
_FIRST_BUFFER = 65536

# A-ABORT sources and, for the service provider's (source 2), reasons: PS3.8 section 9.3.8.
SOURCE_SERVICE_USER = 0x00
SOURCE_SERVICE_PROVIDER = 0x02
REASON_NOT_SPECIFIED = 0x00
REASON_UNRECOGNIZED_PDU = 0x01
REASON_UNEXPECTED_PDU = 0x02
REASON_UNRECOGNIZED_PARAMETER = 0x04
REASON_UNEXPECTED_PARAMETER = 0x05
REASON_INVALID_PARAMETER = 0x06

# A-ASSOCIATE-RQ fixed fields, offsets in its body (PS3.8 section 9.3.2).
_PROTOCOL_VERSION_1 = 0x0001
CALLED_AE_FIELD = slice(4, 20)
CALLING_AE_FIELD = slice(20, 36)
_FIXED_RQ_FIELDS = 68
# Item types of an A-ASSOCIATE-RQ and the sub-item types of its user information item
# that pynetdicom decodes. Others are skipped, not refused: a sub-item from a later edition
# of the standard, or a vendor's, must not cost its sender the association.
_RQ_ITEMS = frozenset({0x10, 0x20, 0x50})
_USER_INFORMATION_ITEM = 0x50
_USER_SUB_ITEMS = frozenset(range(0x51, 0x59))
_ITEM_HEADER = struct.Struct(">BBH")


class ProtocolError(Exception):
    """The peer broke the upper-layer protocol (PS3.8's Evt19, an invalid PDU).

    ``reason`` is what the A-ABORT that answers it carries.
    """

    def __init__(self, message: str, reason: int = REASON_INVALID_PARAMETER) -> None:
        super().__init__(message)
        self.reason = reason


class UnexpectedPdu(ProtocolError):
    """A PDU of a known type that the association's state does not take, refused unread."""

    def __init__(self, pdu_type: int) -> None:
        super().__init__(f"unexpected PDU type 0x{pdu_type:02X}", REASON_UNEXPECTED_PDU)
        self.pdu_type = pdu_type


class ConnectionClosed(ProtocolError):
    """The peer closed the transport connection (PS3.8's Evt17), perhaps mid-PDU."""


class IdleTimeout(ProtocolError):
    """No byte came for the socket's receive timeout (the network idle timer)."""


@dataclass(frozen=True)
class Pdv:
    """One presentation data value item of a P-DATA-TF PDU."""

    context_id: int
    is_command: bool
    is_last: bool
    data: memoryview


def _read_into(sock: socket.socket, view: memoryview, before: int = 0, whole: int = 0) -> None:
    """Fill ``view`` from the socket with as few reads as the kernel allows.

    ``before`` bytes of the ``whole`` PDU came earlier (for the message only).
    """
    got, n = 0, len(view)
    while got < n:
        try:
            count = sock.recv_into(view[got:], n - got)
        except (BlockingIOError, TimeoutError, ssl.SSLWantReadError) as exc:
            # SO_RCVTIMEO on a blocking socket gives EAGAIN; settimeout gives TimeoutError.
            raise IdleTimeout(
                f"no data for the network timeout after {before + got} bytes of a PDU",
                REASON_NOT_SPECIFIED,
            ) from exc
        if count == 0:
            raise ConnectionClosed(
                f"connection closed after {before + got} of {whole or n} bytes of a PDU"
            )
        got += count


class PduReader:
    """Reads one connection's PDUs into one buffer, reused from PDU to PDU.

    A new buffer per PDU cost a receiver more in the kernel than its writes to the spool:
    above glibc's mmap threshold (which the daemon fixes at 128 KiB for its processes'
    memory to stay flat) every P-DATA-TF body was a fresh mmap, zeroed and page-faulted
    in, then unmapped again.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._header = bytearray(_HEADER.size)
        self._buffer = bytearray()
        self.unread = 0  # body bytes of the last PDU, refused by its header, still to come

    def read(self, max_pdu: int, expected: Container[int] = PDU_TYPES) -> tuple[int, memoryview]:
        """Read one PDU of an ``expected`` type; return its type and body (without the header).

        The body is a view of the reader's buffer: it is valid until the next ``read``.
        Its length is checked against the type's limit before any of it is read
        (``max_pdu``, ours, bounds a P-DATA-TF; 0: unbounded), and the buffer grows with
        the bytes that arrive, not with the length the peer claims.

        Raises
        ------
        ProtocolError
            An unknown or unexpected PDU type, a length outside its type's limit, or a
            broken connection.
        """
        _read_into(self.sock, memoryview(self._header))
        pdu_type, _, length = _HEADER.unpack(self._header)
        try:
            check_pdu(pdu_type, length, max_pdu, expected)
        except ProtocolError:
            self.unread = length
            raise
        if length > len(self._buffer):
            self._grow_into(length)
        else:
            _read_into(self.sock, memoryview(self._buffer)[:length])
        return pdu_type, memoryview(self._buffer)[:length]

    def skip_unread(self) -> None:
        """Read past the body of a PDU refused by its header, to the next PDU's header.

        Raises
        ------
        ProtocolError
            The connection closed or went idle first (``ConnectionClosed``, ``IdleTimeout``).
        """
        scratch = memoryview(bytearray(min(self.unread, _FIRST_BUFFER)))
        while self.unread:
            chunk = scratch[: min(self.unread, len(scratch))]
            _read_into(self.sock, chunk)
            self.unread -= len(chunk)

    def _grow_into(self, length: int) -> None:
        """Read a body longer than the buffer, doubling it as the bytes arrive.

        A new buffer each time, not a resize: views of the old one may still be held.
        """
        got = 0
        buffer = self._buffer
        while got < length:
            grown = bytearray(min(length, max(2 * got, _FIRST_BUFFER)))
            grown[:got] = buffer[:got]
            buffer = grown
            _read_into(self.sock, memoryview(buffer)[got:], got, length)
            got = len(buffer)
        self._buffer = buffer


def check_pdu(
    pdu_type: int, length: int, max_pdu: int, expected: Container[int] = PDU_TYPES
) -> None:
    """Refuse a PDU by its header: type unknown or unexpected, or a length beyond its type's.

    Raises
    ------
    ProtocolError
        With the A-ABORT reason PS3.8 gives (unrecognized PDU, unexpected PDU, invalid
        PDU parameter value).
    """
    if pdu_type not in PDU_TYPES:
        raise ProtocolError(f"unknown PDU type 0x{pdu_type:02X}", REASON_UNRECOGNIZED_PDU)
    if pdu_type not in expected:
        raise UnexpectedPdu(pdu_type)
    if pdu_type in (A_ASSOCIATE_RQ_TYPE, A_ASSOCIATE_AC_TYPE):
        if length > MAX_ASSOCIATE_LENGTH:
            raise ProtocolError(
                f"PDU type 0x{pdu_type:02X} of {length} bytes exceeds {MAX_ASSOCIATE_LENGTH}",
                REASON_INVALID_PARAMETER,
            )
    elif pdu_type == P_DATA_TF_TYPE:
        if max_pdu and length > max_pdu + _PDV_HEADERS_ALLOWED:
            raise ProtocolError(
                f"P-DATA-TF of {length} bytes exceeds our maximum PDU {max_pdu}",
                REASON_INVALID_PARAMETER,
            )
    elif length != _FIXED_LENGTH:
        raise ProtocolError(
            f"PDU type 0x{pdu_type:02X} of {length} bytes, not {_FIXED_LENGTH}",
            REASON_INVALID_PARAMETER,
        )


def iter_pdvs(body: bytearray | memoryview) -> Iterator[Pdv]:
    """The PDV items of a P-DATA-TF body."""
    view = memoryview(body)
    offset = 0
    while offset < len(body):
        if offset + _PDV_HEADER.size > len(body):
            raise ProtocolError("P-DATA-TF ends inside a PDV item header", REASON_INVALID_PARAMETER)
        length, context_id, control = _PDV_HEADER.unpack_from(body, offset)
        end = offset + 4 + length
        if length < 2 or end > len(body):
            raise ProtocolError(
                f"PDV item length {length} does not fit its P-DATA-TF", REASON_INVALID_PARAMETER
            )
        yield Pdv(context_id, bool(control & 0x01), bool(control & 0x02), view[offset + 6 : end])
        offset = end


def supports_protocol_version_1(body: bytes | bytearray) -> bool:
    """Whether an A-ASSOCIATE-RQ's protocol version has bit 0 (version 1) set.

    PS3.8 section 9.3.2: a receiver implementing only version 1 tests only that bit.
    """
    return len(body) >= 2 and bool(int.from_bytes(body[:2], "big") & _PROTOCOL_VERSION_1)


def is_ae_title(field: bytes | bytearray) -> bool:
    """Whether a 16-byte AE title field holds a valid AE title (PS3.5 section 6.2, AE VR).

    Leading and trailing spaces are not significant; all spaces, control characters (NUL
    padding among them) and the backslash are not allowed.
    """
    return (
        len(field) == 16
        and all(0x20 <= byte < 0x7F and byte != 0x5C for byte in field)
        and field.strip(b" ") != b""
    )


def decode_associate_rq(body: bytearray) -> A_ASSOCIATE:
    """The A-ASSOCIATE request primitive of an A-ASSOCIATE-RQ PDU body.

    Items and user information sub-items of types pynetdicom does not know are skipped.

    Raises
    ------
    ProtocolError
        A malformed request (an even presentation context ID among them), reason 6.
    """
    pdu = A_ASSOCIATE_RQ()
    try:
        known = _known_items(body)
        pdu.decode(bytes(_HEADER.pack(A_ASSOCIATE_RQ_TYPE, 0, len(known)) + known))
        return pdu.to_primitive()
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed A-ASSOCIATE-RQ: {exc}", REASON_INVALID_PARAMETER) from exc


def _known_items(body: bytearray) -> bytearray:
    """An A-ASSOCIATE-RQ body without the items and user sub-items of unknown types."""
    known = body[:_FIXED_RQ_FIELDS]
    for item_type, item in _items(body, _FIXED_RQ_FIELDS):
        if item_type == _USER_INFORMATION_ITEM:
            subs = b"".join(sub for sub_type, sub in _items(item, 4) if sub_type in _USER_SUB_ITEMS)
            known += _ITEM_HEADER.pack(item_type, 0, len(subs)) + subs
        elif item_type in _RQ_ITEMS:
            known += item
    return known


def _items(data: bytes | bytearray, offset: int) -> Iterator[tuple[int, bytes | bytearray]]:
    """The (type, whole item) of each variable item in ``data`` from ``offset``."""
    while offset < len(data):
        if offset + _ITEM_HEADER.size > len(data):
            raise ProtocolError("A-ASSOCIATE-RQ ends inside an item header")
        item_type, _, length = _ITEM_HEADER.unpack_from(data, offset)
        end = offset + _ITEM_HEADER.size + length
        if end > len(data):
            raise ProtocolError(f"item 0x{item_type:02X} of {length} bytes overruns its PDU")
        yield item_type, data[offset:end]
        offset = end


def encode_associate_ac(
    request: A_ASSOCIATE, results: list[PresentationContext], max_pdu: int
) -> bytes:
    """An A-ASSOCIATE-AC PDU answering ``request`` with negotiated context results."""
    primitive = A_ASSOCIATE()
    primitive.application_context_name = APPLICATION_CONTEXT
    primitive.calling_ae_title = request.calling_ae_title
    primitive.called_ae_title = request.called_ae_title
    primitive.result = 0x00
    primitive.result_source = 0x01
    primitive.presentation_context_definition_results_list = results
    max_length = MaximumLengthNotification()
    max_length.maximum_length_received = max_pdu
    class_uid = ImplementationClassUIDNotification()
    class_uid.implementation_class_uid = IMPLEMENTATION_CLASS_UID
    version = ImplementationVersionNameNotification()
    version.implementation_version_name = IMPLEMENTATION_VERSION
    primitive.user_information = [max_length, class_uid, version]
    pdu = A_ASSOCIATE_AC()
    pdu.from_primitive(primitive)
    return bytes(pdu.encode())


def encode_associate_rj(result: int, source: int, diagnostic: int) -> bytes:
    """An A-ASSOCIATE-RJ PDU (PS3.8 section 9.3.4)."""
    return _HEADER.pack(A_ASSOCIATE_RJ_TYPE, 0, 4) + bytes((0, result, source, diagnostic))


def encode_release_rp() -> bytes:
    """An A-RELEASE-RP PDU."""
    return _HEADER.pack(A_RELEASE_RP_TYPE, 0, 4) + bytes(4)


def encode_abort(
    source: int = SOURCE_SERVICE_PROVIDER, reason: int = REASON_NOT_SPECIFIED
) -> bytes:
    """An A-ABORT PDU; source 2 is the service provider, reason 0 not specified."""
    return _HEADER.pack(A_ABORT_TYPE, 0, 4) + bytes((0, 0, source, reason))


def encode_command_pdu(context_id: int, command: bytes) -> bytes:
    """A P-DATA-TF PDU carrying a whole encoded command set in one PDV."""
    pdv = _PDV_HEADER.pack(len(command) + 2, context_id, 0x03) + command
    return _HEADER.pack(P_DATA_TF_TYPE, 0, len(pdv)) + pdv
