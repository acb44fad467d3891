"""Takes one accepted connection and runs one DICOM association: negotiation, then DIMSE."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydicom import Dataset
from pynetdicom.presentation import PresentationContext, negotiate_as_acceptor

from imaging_ai import dul
from imaging_ai.admission import Ticket

log = logging.getLogger(__name__)

STATUS_UNRECOGNIZED_OPERATION = 0x0211
# A-ASSOCIATE-RJ (result, source, diagnostic), PS3.8 section 9.3.4.
REJECT_CALLING_AE = (0x01, 0x01, 0x03)
REJECT_CALLED_AE = (0x01, 0x01, 0x07)
REJECT_BUSY = (0x02, 0x03, 0x02)


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of an association."""

    calling_ae: str
    called_ae: str
    address: str


class Incoming(Protocol):
    """A C-STORE data set on its way in: fed fragment by fragment, then finished or discarded."""

    def write(self, data: memoryview) -> None:
        """Take the next fragment of the data set."""

    def finish(self) -> Dataset:
        """The data set is complete: keep it; return the C-STORE response status dataset."""

    def discard(self) -> None:
        """The transfer broke off: drop what was received."""


class Acceptor(Protocol):
    """What an association asks of the receiver (one handler whose answer matters each)."""

    ae_title: str
    max_pdu: int
    contexts: list[PresentationContext]

    def admit(self, peer: Peer) -> tuple[int, int, int] | None:
        """None to accept, else the A-ASSOCIATE-RJ (result, source, diagnostic).

        An accepted association holds one of the acceptor's places until it ends
        (``Association.admitted`` says whether it did).
        """

    def begin_store(self, command: dul.Command, syntax: str, peer: Peer) -> Incoming:
        """A C-STORE request announced a data set: where its fragments go."""


@dataclass(frozen=True)
class _Offer:
    """An A-ASSOCIATE-RQ's AE titles and the negotiated answer to it."""

    calling_ae: str
    called_ae: str
    contexts: dict[int, PresentationContext]  # accepted, by presentation context ID
    accept: bytes  # the A-ASSOCIATE-AC PDU


# A sender repeats the same request for every association (storescu proposes ~120 contexts,
# whose decoding and negotiation took ~20 ms); the answer to a request already seen is reused.
_OFFERS: dict[tuple[object, ...], _Offer] = {}
_OFFERS_LOCK = threading.Lock()
_OFFERS_KEPT = 64


def _answer(body: bytes, acceptor: Acceptor) -> _Offer:
    """What to answer an A-ASSOCIATE-RQ body (admission aside)."""
    ours = tuple((str(cx.abstract_syntax), tuple(cx.transfer_syntax)) for cx in acceptor.contexts)
    key = (acceptor.max_pdu, ours, body)
    with _OFFERS_LOCK:
        offer = _OFFERS.get(key)
    if offer is not None:
        return offer
    request = dul.decode_associate_rq(bytearray(body))
    results, _roles = negotiate_as_acceptor(
        request.presentation_context_definition_list, acceptor.contexts, None
    )
    offer = _Offer(
        calling_ae=request.calling_ae_title.strip(),
        called_ae=request.called_ae_title.strip(),
        contexts={int(cx.context_id or 0): cx for cx in results if cx.result == 0x00},
        accept=dul.encode_associate_ac(request, results, acceptor.max_pdu),
    )
    with _OFFERS_LOCK:
        if len(_OFFERS) >= _OFFERS_KEPT:
            _OFFERS.clear()
        _OFFERS[key] = offer
    return offer


_NEGOTIATING = frozenset({dul.A_ASSOCIATE_RQ_TYPE})
_ASSOCIATED = frozenset({dul.P_DATA_TF_TYPE, dul.A_RELEASE_RQ_TYPE, dul.A_ABORT_TYPE})


class Association:
    """One association as acceptor: PS3.8 state machine reduced to what a storage SCP needs."""

    def __init__(
        self, sock: socket.socket, address: str, acceptor: Acceptor, ticket: Ticket | None = None
    ) -> None:
        """``ticket``: the connection's wait for admission at the gate, if it has one."""
        self.sock = sock
        self.pdus = dul.PduReader(sock)
        self.address = address
        self.acceptor = acceptor
        self.ticket = ticket
        self.admitted = False  # accepted: it holds one of the acceptor's places
        self.peer = Peer("", "", address)
        self.contexts: dict[int, PresentationContext] = {}
        self._command = bytearray()
        self._request: dul.Command | None = None
        self._request_context = 0
        self._incoming: Incoming | None = None
        self.released = False  # the peer ended it with A-RELEASE-RQ: it says it is done

    def run(self) -> None:
        """Negotiate, then serve DIMSE requests until the peer releases or aborts."""
        try:
            if self._negotiate():
                self._serve()
        except dul.ProtocolError as exc:
            if self.ticket is not None and self.ticket.closed:
                return  # the gate closed it while it waited, and logged why
            log.warning("association with %s aborted: %s", self.address, exc)
            self._send_quietly(dul.encode_abort(0x02, exc.reason))
        except OSError as exc:
            log.warning("association with %s ended: %s", self.address, exc)
        finally:
            self._discard_partial()

    def _negotiate(self) -> bool:
        _, body = self.pdus.read(0, _NEGOTIATING)
        offer = _answer(bytes(body), self.acceptor)
        self.peer = Peer(offer.calling_ae, offer.called_ae, self.address)
        if self.ticket is not None and not self.ticket.settle():
            return False  # its wait ran out meanwhile: the gate has shut it down
        rejection = self.acceptor.admit(self.peer)
        if rejection is not None:
            self.sock.sendall(dul.encode_associate_rj(*rejection))
            return False
        self.admitted = True
        self.contexts = offer.contexts
        self.sock.sendall(offer.accept)
        return True

    def _serve(self) -> None:
        handlers: dict[int, Callable[[memoryview], bool]] = {
            dul.P_DATA_TF_TYPE: self._on_p_data,
            dul.A_RELEASE_RQ_TYPE: self._on_release,
            dul.A_ABORT_TYPE: lambda body: False,
        }
        while True:
            pdu_type, body = self.pdus.read(self.acceptor.max_pdu, _ASSOCIATED)
            if not handlers[pdu_type](body):
                return

    def _on_release(self, body: memoryview) -> bool:
        self.released = True
        self.sock.sendall(dul.encode_release_rp())
        return False

    def _on_p_data(self, body: memoryview) -> bool:
        for pdv in dul.iter_pdvs(body):
            if pdv.context_id not in self.contexts:
                raise dul.ProtocolError(
                    f"PDV on presentation context {pdv.context_id}, which was not accepted"
                )
            if pdv.is_command:
                self._on_command_fragment(pdv)
            else:
                self._on_data_fragment(pdv)
        return True

    def _on_command_fragment(self, pdv: dul.Pdv) -> None:
        if self._request is not None:
            raise dul.ProtocolError("a new command arrived before the data set was complete")
        if len(self._command) + len(pdv.data) > dul.MAX_COMMAND_LENGTH:
            raise dul.ProtocolError(
                f"command set longer than {dul.MAX_COMMAND_LENGTH} bytes",
                dul.REASON_INVALID_PARAMETER,
            )
        self._command += pdv.data
        if not pdv.is_last:
            return
        request = dul.decode_command(self._command)
        self._command = bytearray()
        self._request, self._request_context = request, pdv.context_id
        if request.get("CommandDataSetType", dul.NO_DATASET) == dul.NO_DATASET:
            self._dispatch(None)
        else:
            syntax = str(self.contexts[pdv.context_id].transfer_syntax[0])
            self._incoming = self.acceptor.begin_store(request, syntax, self.peer)

    def _on_data_fragment(self, pdv: dul.Pdv) -> None:
        if self._incoming is None or pdv.context_id != self._request_context:
            raise dul.ProtocolError("data set fragment without a command that announced it")
        self._incoming.write(pdv.data)
        if pdv.is_last:
            incoming, self._incoming = self._incoming, None
            self._dispatch(incoming)

    def _dispatch(self, incoming: Incoming | None) -> None:
        request, context_id = self._request, self._request_context
        assert request is not None
        self._request = None
        field = int(request.get("CommandField", 0))
        if field == dul.C_STORE_RQ and incoming is not None:
            status = incoming.finish()
            answer = dul.response(
                request, dul.C_STORE_RSP, status.Status, str(status.get("ErrorComment", ""))
            )
        elif incoming is not None:  # a data set with a request we do not serve
            incoming.discard()
            answer = dul.response(request, field | 0x8000, STATUS_UNRECOGNIZED_OPERATION)
        elif field == dul.C_ECHO_RQ:
            answer = dul.response(request, dul.C_ECHO_RSP, 0x0000)
        else:
            answer = dul.response(request, field | 0x8000, STATUS_UNRECOGNIZED_OPERATION)
        self.sock.sendall(dul.encode_command_pdu(context_id, answer))

    def _send_quietly(self, pdu: bytes) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(pdu)

    def _discard_partial(self) -> None:
        """A data set cut off mid-transfer was never answered Success: drop it."""
        if self._incoming is not None:
            self._incoming.discard()
            self._incoming = None
