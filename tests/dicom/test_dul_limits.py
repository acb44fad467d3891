"""PDU lengths are checked by type before a body is read, and buffers grow as bytes arrive."""

from __future__ import annotations

import socket
import struct
import threading
import tracemalloc

import pytest

from imaging_ai.dicom import dul

MAX_PDU = 16384


@pytest.mark.parametrize(
    ("pdu_type", "length", "reason"),
    [
        (0x08, 4, dul.REASON_UNRECOGNIZED_PDU),
        (dul.A_ASSOCIATE_RQ_TYPE, 0xFFFFFFFF, dul.REASON_INVALID_PARAMETER),
        (dul.A_ASSOCIATE_RQ_TYPE, dul.MAX_ASSOCIATE_LENGTH + 1, dul.REASON_INVALID_PARAMETER),
        (dul.A_ASSOCIATE_AC_TYPE, 0xFFFFFFFF, dul.REASON_INVALID_PARAMETER),
        (dul.A_ASSOCIATE_RJ_TYPE, 5, dul.REASON_INVALID_PARAMETER),
        (dul.A_RELEASE_RQ_TYPE, 0xFFFFFFFF, dul.REASON_INVALID_PARAMETER),
        (dul.A_RELEASE_RQ_TYPE, 3, dul.REASON_INVALID_PARAMETER),
        (dul.A_RELEASE_RP_TYPE, 0, dul.REASON_INVALID_PARAMETER),
        (dul.A_ABORT_TYPE, 0xFFFFFFFF, dul.REASON_INVALID_PARAMETER),
        (dul.P_DATA_TF_TYPE, MAX_PDU + 6 * 64 + 1, dul.REASON_INVALID_PARAMETER),
    ],
)
def test_a_pdu_beyond_its_type_s_limit_is_refused_by_its_header(
    pdu_type: int, length: int, reason: int
) -> None:
    with pytest.raises(dul.ProtocolError) as raised:
        dul.check_pdu(pdu_type, length, MAX_PDU)
    assert raised.value.reason == reason


@pytest.mark.parametrize(
    ("pdu_type", "length"),
    [
        (dul.A_ASSOCIATE_RQ_TYPE, dul.MAX_ASSOCIATE_LENGTH),
        (dul.A_RELEASE_RQ_TYPE, 4),
        (dul.A_ABORT_TYPE, 4),
        (dul.P_DATA_TF_TYPE, MAX_PDU + 6),
    ],
)
def test_pdus_within_their_limits_pass(pdu_type: int, length: int) -> None:
    dul.check_pdu(pdu_type, length, MAX_PDU)


def test_a_pdu_of_a_type_the_state_does_not_expect_is_refused_unread() -> None:
    with pytest.raises(dul.ProtocolError) as raised:
        dul.check_pdu(dul.P_DATA_TF_TYPE, 0xFFFFFFFF, 0, expected={dul.A_ASSOCIATE_RQ_TYPE})
    assert raised.value.reason == dul.REASON_UNEXPECTED_PDU


def test_the_reader_allocates_for_the_bytes_that_came_not_for_the_length_claimed() -> None:
    """An unbounded P-DATA-TF (max_pdu 0) claiming 64 MiB, of which 10 KiB arrive."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(struct.pack(">BBL", dul.P_DATA_TF_TYPE, 0, 64 << 20) + b"x" * 10240)
        theirs.shutdown(socket.SHUT_WR)
        tracemalloc.start()
        try:
            with pytest.raises(dul.ProtocolError, match="after 10240 of 67108864 bytes"):
                dul.PduReader(ours).read(0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 1 << 20


def test_a_long_pdu_arrives_whole_across_buffer_growth() -> None:
    payload = bytes(range(256)) * 1200  # 300 KiB: the buffer doubles from 64 KiB
    pdv = struct.pack(">LBB", len(payload) + 2, 1, 0x02) + payload
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sender = threading.Thread(
            target=theirs.sendall,
            args=(struct.pack(">BBL", dul.P_DATA_TF_TYPE, 0, len(pdv)) + pdv,),
        )
        sender.start()
        pdu_type, body = dul.PduReader(ours).read(0)
        sender.join()
        assert pdu_type == dul.P_DATA_TF_TYPE
        assert [bytes(p.data) for p in dul.iter_pdvs(body)] == [payload]


def test_the_body_of_a_pdu_refused_by_its_header_is_skipped_to_the_next_pdu() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(struct.pack(">BBL", 0x08, 0, 5) + b"hello" + struct.pack(">BBL", 7, 0, 4))
        theirs.sendall(bytes(4))
        reader = dul.PduReader(ours)
        with pytest.raises(dul.ProtocolError) as raised:
            reader.read(MAX_PDU)
        assert (raised.value.reason, reader.unread) == (dul.REASON_UNRECOGNIZED_PDU, 5)
        reader.skip_unread()
        assert reader.read(MAX_PDU)[0] == dul.A_ABORT_TYPE


def test_an_unexpected_pdu_says_its_type() -> None:
    with pytest.raises(dul.UnexpectedPdu) as raised:
        dul.check_pdu(dul.A_RELEASE_RP_TYPE, 4, MAX_PDU, expected={dul.P_DATA_TF_TYPE})
    assert raised.value.pdu_type == dul.A_RELEASE_RP_TYPE


def test_a_silent_peer_is_an_idle_timeout_and_a_closed_one_a_closed_connection() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", 0, 100_000))
        with pytest.raises(dul.IdleTimeout) as raised:
            dul.PduReader(ours).read(MAX_PDU)
        assert raised.value.reason == dul.REASON_NOT_SPECIFIED
        theirs.close()
        with pytest.raises(dul.ConnectionClosed):
            dul.PduReader(ours).read(MAX_PDU)


@pytest.mark.parametrize(
    ("field", "valid"),
    [
        (b"PACS            ", True),
        (b"  PACS          ", True),
        (b"A" * 16, True),
        (b" " * 16, False),
        (b"PACS" + b"\x00" * 12, False),
        (b"PA\\CS           ", False),
        (b"PACS\x7f           ", False),
        (b"PACS", False),
    ],
)
def test_ae_title_fields(field: bytes, valid: bool) -> None:
    assert dul.is_ae_title(field) is valid


@pytest.mark.parametrize(
    ("version", "supported"), [(b"\x00\x01", True), (b"\x00\x03", True), (b"\x00\x02", False)]
)
def test_protocol_version_1_is_bit_0(version: bytes, supported: bool) -> None:
    assert dul.supports_protocol_version_1(version + bytes(66)) is supported
