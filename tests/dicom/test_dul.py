"""The DIMSE response command set, encoded by hand, against pydicom's encoding of the same."""

from __future__ import annotations

import socket
import struct

import pytest
from pydicom import Dataset
from pynetdicom.dsutils import encode

from imaging_ai.dicom import dimse, dul

SOP_CLASS = "1.2.840.10008.5.1.4.1.1.2"
SOP_INSTANCE = "1.2.826.0.1.3680043.8.498.1234567890123456789012345"  # odd length: padded


def _request(with_instance: bool = True) -> Dataset:
    request = Dataset()
    request.AffectedSOPClassUID = SOP_CLASS
    request.CommandField = dimse.C_STORE_RQ
    request.MessageID = 4242
    request.Priority = 0
    request.CommandDataSetType = 0x0001
    if with_instance:
        request.AffectedSOPInstanceUID = SOP_INSTANCE
    return request


def _pydicom_response(request: Dataset, command_field: int, status: int, comment: str) -> bytes:
    rsp = Dataset()
    rsp.AffectedSOPClassUID = request.AffectedSOPClassUID
    rsp.CommandField = command_field
    rsp.MessageIDBeingRespondedTo = request.MessageID
    rsp.CommandDataSetType = dimse.NO_DATASET
    rsp.Status = status
    if comment:
        rsp.ErrorComment = comment[:64]
    if "AffectedSOPInstanceUID" in request:
        rsp.AffectedSOPInstanceUID = request.AffectedSOPInstanceUID
    elements = encode(rsp, True, True)
    assert elements is not None
    return struct.pack("<HHLL", 0, 0, 4, len(elements)) + elements


@pytest.mark.parametrize(
    ("status", "comment", "with_instance"),
    [
        (0x0000, "", True),
        (0xA700, "disk below storage.min_free_mb: 3 MB free", True),
        (0xC000, "odd", True),  # an odd-length comment is padded with a space
        (0x0211, "", False),
        (0xA900, "x" * 80, True),  # Error Comment is LO: cut to 64 characters
    ],
)
def test_response_is_byte_for_byte_what_pydicom_encodes(
    status: int, comment: str, with_instance: bool
) -> None:
    request = _request(with_instance)
    ours = dimse.response(request, dimse.C_STORE_RSP, status, comment)
    assert ours == _pydicom_response(request, dimse.C_STORE_RSP, status, comment)
    decoded = dimse.decode_command(ours)
    assert decoded.Status == status
    assert decoded.MessageIDBeingRespondedTo == 4242
    assert decoded.CommandField == dimse.C_STORE_RSP


def test_command_pdu_wraps_one_last_command_pdv() -> None:
    command = dimse.response(_request(), dimse.C_STORE_RSP, 0)
    pdu = dul.encode_command_pdu(3, command)
    pdu_type, _, length = struct.unpack(">BBL", pdu[:6])
    assert (pdu_type, length) == (dul.P_DATA_TF_TYPE, len(pdu) - 6)
    (pdv,) = list(dul.iter_pdvs(bytearray(pdu[6:])))
    assert (pdv.context_id, pdv.is_command, pdv.is_last) == (3, True, True)
    assert bytes(pdv.data) == command


@pytest.mark.parametrize("with_instance", [True, False])
def test_command_decoded_directly_reads_as_pydicom_reads_it(with_instance: bool) -> None:
    request = _request(with_instance)
    request.MoveOriginatorApplicationEntityTitle = "ODD_AE"
    request.MoveOriginatorMessageID = 7
    encoded = encode(request, True, True)
    assert encoded is not None
    raw = struct.pack("<HHLL", 0, 0, 4, len(encoded)) + encoded
    ours = dimse.decode_command(raw)
    for element in request:
        assert ours.get(element.keyword) == element.value, element.keyword
    assert ("AffectedSOPInstanceUID" in ours) is with_instance
    assert ours.get("Status", 0xFFFF) == 0xFFFF
    # Answering it from the direct decoding gives pydicom's encoding of the answer.
    assert dimse.response(ours, dimse.C_STORE_RSP, 0) == dimse.response(
        request, dimse.C_STORE_RSP, 0
    )


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack("<HHL", 0, 0x0100, 2),  # value cut off
        struct.pack("<HHL", 0, 0x0100, 4) + bytes(4),  # US of four bytes
        struct.pack("<HHL", 8, 0x0016, 2) + b"CT",  # not group 0000
        b"\x00\x00\x00",  # header cut off
    ],
)
def test_malformed_command_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(dul.ProtocolError):
        dimse.decode_command(raw)


def _p_data(payload: bytes) -> bytes:
    pdv = struct.pack(">LBB", len(payload) + 2, 1, 0x02) + payload
    return struct.pack(">BBL", dul.P_DATA_TF_TYPE, 0, len(pdv)) + pdv


def test_pdu_reader_reads_each_pdu_into_one_reused_buffer() -> None:
    """PDUs up to the buffer's size reuse it; a larger one gets a larger buffer, whole."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        first, second, large = b"a" * 1000, b"b" * 600, b"c" * 5000
        theirs.sendall(_p_data(first) + _p_data(second) + _p_data(large))
        reader = dul.PduReader(ours)
        pdu_type, body = reader.read(4096)
        buffer = reader._buffer
        assert pdu_type == dul.P_DATA_TF_TYPE
        assert [bytes(p.data) for p in dul.iter_pdvs(body)] == [first]
        _, body = reader.read(4096)
        assert reader._buffer is buffer  # no new buffer (nor its zeroing) per PDU
        assert [bytes(p.data) for p in dul.iter_pdvs(body)] == [second]
        _, body = reader.read(8192)
        assert [bytes(p.data) for p in dul.iter_pdvs(body)] == [large]


def test_pdu_reader_refuses_a_p_data_over_our_maximum_and_a_cut_off_pdu() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(_p_data(b"x" * 5000))
        with pytest.raises(dul.ProtocolError, match="exceeds our maximum PDU 4096"):
            dul.PduReader(ours).read(4096)
    ours, theirs = socket.socketpair()
    with ours:
        theirs.sendall(_p_data(b"x" * 100)[:50])
        theirs.close()
        with pytest.raises(dul.ProtocolError, match="connection closed after 44 of 106"):
            dul.PduReader(ours).read(4096)
