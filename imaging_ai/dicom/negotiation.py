"""Takes an A-ASSOCIATE-RQ's body and what we accept; gives the answer (PS3.8 7.1, PS3.7 D.3).

The fixed fields (protocol version, AE titles) are checked before anything is decoded; the
presentation contexts are negotiated by pynetdicom's ``negotiate_as_acceptor``, each then
given the sender's first choice of transfer syntax among those we accept (pynetdicom takes
ours), and the A-ASSOCIATE-AC is encoded once. Admission (who may associate) is the
receiver's decision and is not taken here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pynetdicom.presentation import PresentationContext, negotiate_as_acceptor

from imaging_ai.dicom import dul

# A-ASSOCIATE-RJ (result, source, diagnostic), PS3.8 section 9.3.4.
REJECT_CALLING_AE = (0x01, 0x01, 0x03)
REJECT_CALLED_AE = (0x01, 0x01, 0x07)
REJECT_PROTOCOL_VERSION = (0x01, 0x02, 0x02)
REJECT_BUSY = (0x02, 0x03, 0x02)
SOURCE_ACSE = 0x02  # an A-ASSOCIATE-RJ source: the service provider's ACSE function


@dataclass(frozen=True)
class Offer:
    """An A-ASSOCIATE-RQ's AE titles and the negotiated answer to it."""

    calling_ae: str
    called_ae: str
    # The A-ASSOCIATE-RJ its fixed fields earn (protocol version, AE titles), if any.
    refused: tuple[int, int, int] | None
    contexts: dict[int, PresentationContext]  # accepted, by presentation context ID
    abstract_syntaxes: dict[int, str]  # of the accepted contexts, by ID
    accept: bytes  # the A-ASSOCIATE-AC PDU


# A sender repeats the same request for every association (storescu proposes ~120 contexts,
# whose decoding and negotiation took ~20 ms); the answer to a request already seen is reused.
_OFFERS: dict[tuple[object, ...], Offer] = {}
_OFFERS_LOCK = threading.Lock()
_OFFERS_KEPT = 64


def answer(body: bytes, max_pdu: int, contexts: list[PresentationContext]) -> Offer:
    """What to answer an A-ASSOCIATE-RQ body (admission aside)."""
    ours = tuple((str(cx.abstract_syntax), tuple(cx.transfer_syntax)) for cx in contexts)
    key = (max_pdu, ours, body)
    with _OFFERS_LOCK:
        offer = _OFFERS.get(key)
    if offer is not None:
        return offer
    offer = _negotiated(body, max_pdu, contexts)
    with _OFFERS_LOCK:
        if len(_OFFERS) >= _OFFERS_KEPT:
            _OFFERS.clear()
        _OFFERS[key] = offer
    return offer


def _negotiated(body: bytes, max_pdu: int, ours: list[PresentationContext]) -> Offer:
    called, calling = (_title(body[field]) for field in (dul.CALLED_AE_FIELD, dul.CALLING_AE_FIELD))
    refused = _refusal(body)
    if refused is not None:
        return Offer(calling, called, refused, {}, {}, b"")
    request = dul.decode_associate_rq(bytearray(body))
    requested = request.presentation_context_definition_list
    results, _roles = negotiate_as_acceptor(requested, ours, None)
    _senders_choice(requested, results, ours)
    contexts = {int(cx.context_id or 0): cx for cx in results if cx.result == 0x00}
    return Offer(
        calling_ae=calling,
        called_ae=called,
        refused=None,
        contexts=contexts,
        abstract_syntaxes={cid: str(cx.abstract_syntax) for cid, cx in contexts.items()},
        accept=dul.encode_associate_ac(request, results, max_pdu),
    )


def _senders_choice(
    requested: list[PresentationContext],
    results: list[PresentationContext],
    ours: list[PresentationContext],
) -> None:
    """Give each accepted context the first syntax the sender proposed that we accept.

    The sender lists its syntaxes in its order of preference (PS3.8 9.3.2.2): a PACS that
    holds a study JPEG-LS compressed sends it as it is, without decompressing it for us.
    """
    proposed = {cx.context_id: cx.transfer_syntax for cx in requested}
    accepted = {str(cx.abstract_syntax): set(cx.transfer_syntax) for cx in ours}
    for cx in results:
        if cx.result != 0x00:
            continue
        ours_here = accepted.get(str(cx.abstract_syntax), set())
        choice = next((ts for ts in proposed.get(cx.context_id, []) if ts in ours_here), None)
        if choice is not None:
            cx.transfer_syntax = [choice]


def _refusal(body: bytes) -> tuple[int, int, int] | None:
    """The A-ASSOCIATE-RJ a request's fixed fields earn, before its items are decoded."""
    if len(body) < 36:
        raise dul.ProtocolError(f"A-ASSOCIATE-RQ of {len(body)} bytes has no AE titles")
    if not dul.supports_protocol_version_1(body):
        return REJECT_PROTOCOL_VERSION
    if not dul.is_ae_title(body[dul.CALLED_AE_FIELD]):
        return REJECT_CALLED_AE
    if not dul.is_ae_title(body[dul.CALLING_AE_FIELD]):
        return REJECT_CALLING_AE
    return None


def _title(field: bytes) -> str:
    return field.decode("ascii", "replace").strip()
