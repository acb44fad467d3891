"""Negotiation: a repeated A-ASSOCIATE-RQ reuses its answer, and admission is still per peer."""

from __future__ import annotations

import socket
import struct
import threading

from pynetdicom.pdu import A_ASSOCIATE_RQ
from pynetdicom.pdu_primitives import A_ASSOCIATE, MaximumLengthNotification
from pynetdicom.presentation import PresentationContext, build_context
from pynetdicom.sop_class import CTImageStorage, Verification  # type: ignore[attr-defined]

from imaging_ai.dicom import dimse, dul, negotiation
from imaging_ai.dicom.association import Association, Incoming, Peer
from imaging_ai.dicom.negotiation import REJECT_CALLING_AE


class _Acceptor:
    ae_title = "IMAGING_AI"
    max_pdu = 131072

    def __init__(self, allowed_address: str) -> None:
        self.contexts: list[PresentationContext] = [build_context(CTImageStorage)]
        self.allowed_address = allowed_address

    def admit(self, peer: Peer) -> tuple[int, int, int] | None:
        return None if peer.address == self.allowed_address else REJECT_CALLING_AE

    def begin_store(self, command: dimse.Command, syntax: str, peer: Peer) -> Incoming:
        raise AssertionError("no C-STORE in these tests")


def _request_pdu(calling_ae: str) -> bytes:
    primitive = A_ASSOCIATE()
    primitive.application_context_name = dul.APPLICATION_CONTEXT
    primitive.calling_ae_title = calling_ae
    primitive.called_ae_title = "IMAGING_AI"
    contexts = [build_context(CTImageStorage), build_context(Verification)]
    for i, cx in enumerate(contexts):
        cx.context_id = 2 * i + 1
    primitive.presentation_context_definition_list = contexts
    max_length = MaximumLengthNotification()
    max_length.maximum_length_received = 16384
    primitive.user_information = [max_length]
    pdu = A_ASSOCIATE_RQ()
    pdu.from_primitive(primitive)
    return bytes(pdu.encode())


def _negotiate(
    acceptor: _Acceptor, address: str, calling_ae: str = "PACS"
) -> tuple[int, Association]:
    """Send an A-ASSOCIATE-RQ over a socket pair; the PDU type answered and the association."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assoc = Association(ours, address, acceptor)
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(assoc._negotiate()))
        thread.start()
        theirs.sendall(_request_pdu(calling_ae))
        pdu_type, _, length = struct.unpack(">BBL", theirs.recv(6))
        theirs.recv(length)
        thread.join(5)
    assert result == [pdu_type == dul.A_ASSOCIATE_AC_TYPE]
    return pdu_type, assoc


def test_a_repeated_request_reuses_the_answer_but_each_peer_is_admitted_afresh() -> None:
    negotiation._OFFERS.clear()
    acceptor = _Acceptor(allowed_address="10.0.0.5")
    first_type, first = _negotiate(acceptor, "10.0.0.5")
    assert first_type == dul.A_ASSOCIATE_AC_TYPE
    assert len(negotiation._OFFERS) == 1
    assert first.peer == Peer("PACS", "IMAGING_AI", "10.0.0.5")
    assert set(first.contexts) == {1}  # CT accepted; Verification not offered by us
    # The same bytes from a host that is not allowed: rejected, though the answer is cached.
    rejected_type, _ = _negotiate(acceptor, "10.0.0.99")
    assert rejected_type == dul.A_ASSOCIATE_RJ_TYPE
    again_type, again = _negotiate(acceptor, "10.0.0.5")
    assert again_type == dul.A_ASSOCIATE_AC_TYPE
    assert again.contexts is first.contexts
    assert len(negotiation._OFFERS) == 1


def test_another_calling_ae_or_other_contexts_are_negotiated_anew() -> None:
    negotiation._OFFERS.clear()
    acceptor = _Acceptor(allowed_address="10.0.0.5")
    _negotiate(acceptor, "10.0.0.5", calling_ae="PACS")
    _negotiate(acceptor, "10.0.0.5", calling_ae="OTHER")
    assert len(negotiation._OFFERS) == 2
    verification_too = _Acceptor(allowed_address="10.0.0.5")
    verification_too.contexts.append(build_context(Verification))
    _, assoc = _negotiate(verification_too, "10.0.0.5")
    assert set(assoc.contexts) == {1, 3}
    assert len(negotiation._OFFERS) == 3
