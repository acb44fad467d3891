"""Takes one accepted connection and runs one DICOM association as acceptor, gives DIMSE.

The upper layer is PS3.8's state machine (section 9.2, Table 9-10), with its states, events
and actions under the standard's names, restricted to what an acceptor passes through:
Sta2 (connection open), Sta3 (admission), Sta6 (data transfer), Sta8 (release asked),
Sta13 (waiting for the peer to close) and Sta1 (done: the caller closes the connection).
DIMSE (PS3.7) runs inside DT-2.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from pydicom import Dataset
from pynetdicom.presentation import PresentationContext

from imaging_ai.admission import Ticket
from imaging_ai.dicom import dimse, dul, negotiation

log = logging.getLogger(__name__)

STATUS_SOP_CLASS_NOT_SUPPORTED = 0x0122
STATUS_UNRECOGNIZED_OPERATION = 0x0211
# How long Sta13 waits for the peer to close after our last PDU. It only bounds how long a
# peer that never closes holds its thread and place: closing first loses nothing.
ARTIM_S = 1.0


class State(StrEnum):
    """PS3.8 Table 9-10's states an acceptor passes through."""

    STA1 = "Sta1"  # idle: the transport connection can close
    STA2 = "Sta2"  # transport connection open, awaiting A-ASSOCIATE-RQ PDU
    STA3 = "Sta3"  # awaiting local A-ASSOCIATE response primitive
    STA6 = "Sta6"  # association established and ready for data transfer
    STA8 = "Sta8"  # awaiting local A-RELEASE response primitive
    STA13 = "Sta13"  # awaiting transport connection close indication


class Event(StrEnum):
    """PS3.8 Table 9-10's events that reach an acceptor, and the network idle timer."""

    EVT3 = "Evt3"  # A-ASSOCIATE-AC PDU received
    EVT4 = "Evt4"  # A-ASSOCIATE-RJ PDU received
    EVT6 = "Evt6"  # A-ASSOCIATE-RQ PDU received
    EVT7 = "Evt7"  # A-ASSOCIATE response primitive (accept)
    EVT8 = "Evt8"  # A-ASSOCIATE response primitive (reject)
    EVT10 = "Evt10"  # P-DATA-TF PDU received
    EVT12 = "Evt12"  # A-RELEASE-RQ PDU received
    EVT13 = "Evt13"  # A-RELEASE-RP PDU received
    EVT14 = "Evt14"  # A-RELEASE response primitive
    EVT15 = "Evt15"  # A-ABORT request primitive
    EVT16 = "Evt16"  # A-ABORT PDU received
    EVT17 = "Evt17"  # transport connection closed indication
    EVT18 = "Evt18"  # ARTIM timer expired
    EVT19 = "Evt19"  # unrecognized or invalid PDU received
    # Not in PS3.8: no byte for the socket's receive timeout in Sta6. The provider gives
    # up on the peer as it does on an invalid PDU (AA-8), reason not specified.
    IDLE = "idle"


class Action(StrEnum):
    """PS3.8 Table 9-10's actions an acceptor takes."""

    AE_6 = "AE-6"  # stop ARTIM; A-ASSOCIATE indication (Sta3), or A-ASSOCIATE-RJ (Sta13)
    AE_7 = "AE-7"  # send A-ASSOCIATE-AC PDU
    AE_8 = "AE-8"  # send A-ASSOCIATE-RJ PDU, start ARTIM
    DT_2 = "DT-2"  # P-DATA indication (DIMSE; its responses are DT-1, P-DATA-TF sent)
    AR_2 = "AR-2"  # A-RELEASE indication
    AR_4 = "AR-4"  # send A-RELEASE-RP PDU, start ARTIM
    AR_5 = "AR-5"  # stop ARTIM
    AA_1 = "AA-1"  # send A-ABORT PDU, start ARTIM
    AA_2 = "AA-2"  # stop ARTIM, close transport connection
    AA_3 = "AA-3"  # A-ABORT or A-P-ABORT indication, close transport connection
    AA_4 = "AA-4"  # A-P-ABORT indication
    AA_5 = "AA-5"  # stop ARTIM
    AA_6 = "AA-6"  # ignore PDU
    AA_7 = "AA-7"  # send A-ABORT PDU
    AA_8 = "AA-8"  # send A-ABORT PDU (service-provider source), A-P-ABORT indication, ARTIM


_S, _E, _A = State, Event, Action
# PS3.8 Table 9-10, the rows of the states above; the next state is each action's.
TRANSITIONS: dict[tuple[State, Event], Action] = {
    **{(_S.STA2, e): _A.AA_1 for e in (_E.EVT3, _E.EVT4, _E.EVT10, _E.EVT12, _E.EVT13)},
    (_S.STA2, _E.EVT6): _A.AE_6,
    (_S.STA2, _E.EVT16): _A.AA_2,
    (_S.STA2, _E.EVT17): _A.AA_5,
    (_S.STA2, _E.EVT18): _A.AA_2,
    (_S.STA2, _E.EVT19): _A.AA_1,
    (_S.STA3, _E.EVT7): _A.AE_7,
    (_S.STA3, _E.EVT8): _A.AE_8,
    **{(_S.STA6, e): _A.AA_8 for e in (_E.EVT3, _E.EVT4, _E.EVT6, _E.EVT13, _E.EVT19)},
    (_S.STA6, _E.EVT10): _A.DT_2,
    (_S.STA6, _E.EVT12): _A.AR_2,
    (_S.STA6, _E.EVT16): _A.AA_3,
    (_S.STA6, _E.EVT17): _A.AA_4,
    (_S.STA6, _E.IDLE): _A.AA_8,
    (_S.STA8, _E.EVT14): _A.AR_4,
    (_S.STA8, _E.EVT15): _A.AA_1,
    **{(_S.STA13, e): _A.AA_6 for e in (_E.EVT3, _E.EVT4, _E.EVT10, _E.EVT12, _E.EVT13)},
    (_S.STA13, _E.EVT6): _A.AA_7,
    (_S.STA13, _E.EVT16): _A.AA_2,
    (_S.STA13, _E.EVT17): _A.AR_5,
    (_S.STA13, _E.EVT18): _A.AA_2,
    (_S.STA13, _E.EVT19): _A.AA_7,
}
PDU_EVENTS = {
    dul.A_ASSOCIATE_RQ_TYPE: Event.EVT6,
    dul.A_ASSOCIATE_AC_TYPE: Event.EVT3,
    dul.A_ASSOCIATE_RJ_TYPE: Event.EVT4,
    dul.P_DATA_TF_TYPE: Event.EVT10,
    dul.A_RELEASE_RQ_TYPE: Event.EVT12,
    dul.A_RELEASE_RP_TYPE: Event.EVT13,
    dul.A_ABORT_TYPE: Event.EVT16,
}
# The PDU types whose bodies a state reads; others are refused by their header (an
# A-ABORT answers them), so that an unexpected PDU's claimed length buys nothing.
_READS: dict[State, frozenset[int]] = {
    State.STA2: frozenset({dul.A_ASSOCIATE_RQ_TYPE, dul.A_ABORT_TYPE}),
    State.STA6: frozenset({dul.P_DATA_TF_TYPE, dul.A_RELEASE_RQ_TYPE, dul.A_ABORT_TYPE}),
    State.STA13: frozenset(dul.PDU_TYPES),
}
# What an event brings its action: a received PDU's body, a PDU to send, the error, or None.
_Input = memoryview | bytes | dul.ProtocolError | None
# Each action's method; an action is called with its event's input (see each method).
_METHODS = {
    Action.AE_6: "_ae_6",
    Action.AE_7: "_ae_7",
    Action.AE_8: "_ae_8",
    Action.DT_2: "_dt_2",
    Action.AR_2: "_ar_2",
    Action.AR_4: "_ar_4",
    Action.AR_5: "_closed",
    Action.AA_1: "_aa_1",
    Action.AA_2: "_closed",
    Action.AA_3: "_aa_3",
    Action.AA_4: "_aa_4",
    Action.AA_5: "_aa_5",
    Action.AA_6: "_aa_6",
    Action.AA_7: "_aa_7",
    Action.AA_8: "_aa_8",
}
# States whose next event is not the next PDU: local primitives, or Sta13's wait.
_NOT_READING = frozenset({State.STA3, State.STA8, State.STA13})
_ENDED = frozenset({State.STA1})
_NEGOTIATED = frozenset({State.STA1, State.STA6, State.STA13})


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

    def begin_store(self, command: dimse.Command, syntax: str, peer: Peer) -> Incoming:
        """A C-STORE request announced a data set: where its fragments go."""


class _NotServed:
    """The data set of a C-STORE whose SOP Class is not its context's: read and dropped."""

    def write(self, data: memoryview) -> None:
        """Drop the fragment."""

    def finish(self) -> Dataset:
        """The C-STORE status: SOP Class not supported (PS3.4 B.2.3)."""
        status = Dataset()
        status.Status = STATUS_SOP_CLASS_NOT_SUPPORTED
        status.ErrorComment = "SOP Class differs from its presentation context's"
        return status

    def discard(self) -> None:
        """Nothing was kept."""


class Association:
    """One association as acceptor, run as PS3.8's state machine (``TRANSITIONS``)."""

    def __init__(
        self, sock: socket.socket, address: str, acceptor: Acceptor, ticket: Ticket | None = None
    ) -> None:
        """``ticket``: the connection's wait for admission at the gate, if it has one.

        The connection was accepted (Evt5, AE-5): the association starts in Sta2, the
        gate's deadline for its A-ASSOCIATE-RQ being Sta2's ARTIM timer.
        """
        self.sock = sock
        self.pdus = dul.PduReader(sock)
        self.address = address
        self.acceptor = acceptor
        self.ticket = ticket
        self.state = State.STA2
        self.admitted = False  # accepted: it holds one of the acceptor's places
        self.peer = Peer("", "", address)
        self.contexts: dict[int, PresentationContext] = {}
        self.released = False  # the peer ended it with A-RELEASE-RQ: it says it is done
        self._offer: negotiation.Offer | None = None
        self._abstract_syntaxes: dict[int, str] = {}
        self._artim_deadline = 0.0
        self._command = bytearray()
        self._request: dimse.Command | None = None
        self._request_context = 0
        self._incoming: Incoming | None = None
        # TRANSITIONS with each action as this association's method: one lookup per PDU.
        self._transitions: dict[tuple[State, Event], Callable[[Any], State]] = {
            key: getattr(self, _METHODS[action]) for key, action in TRANSITIONS.items()
        }

    def run(self) -> None:
        """Run the state machine from Sta2 until Sta1, when the connection can close."""
        try:
            self._run_until(_ENDED)
        except OSError as exc:  # a send failed: the transport connection is gone
            log.warning("association with %s ended: %s", self.address, exc)
        finally:
            self._discard_partial()

    def _negotiate(self) -> bool:
        """Run Sta2 and Sta3: whether the association is established (Sta6)."""
        self._run_until(_NEGOTIATED)
        return self.state is State.STA6

    def _run_until(self, states: frozenset[State]) -> None:
        while self.state not in states:
            event, data = self._local_event() if self.state in _NOT_READING else self._receive()
            try:
                self.state = self._transitions[self.state, event](data)
            except dul.ProtocolError as exc:  # AE-6 or DT-2 found the PDU invalid
                self.state = self._transitions[self.state, Event.EVT19](exc)

    def _local_event(self) -> tuple[Event, _Input]:
        """A local primitive in Sta3 and Sta8; in Sta13, the peer's close or ARTIM's end."""
        if self.state is State.STA3:
            return self._associate_response()
        if self.state is State.STA8:
            return self._release_response()
        if self.state is State.STA13:
            remaining = self._artim_deadline - time.monotonic()
            if remaining <= 0:
                return Event.EVT18, None
            self.sock.settimeout(remaining)  # the connection's last reads: no need for speed
            try:
                self.pdus.skip_unread()  # an aborted PDU's body is not a PDU
            except dul.IdleTimeout:
                return Event.EVT18, None
            except (dul.ConnectionClosed, OSError) as exc:
                return Event.EVT17, dul.ConnectionClosed(str(exc))
        return self._receive()

    def _receive(self) -> tuple[Event, _Input]:
        """The event of the next PDU, or of its absence."""
        try:
            pdu_type, body = self.pdus.read(self.acceptor.max_pdu, _READS[self.state])
        except dul.UnexpectedPdu as exc:
            return PDU_EVENTS[exc.pdu_type], exc
        except dul.IdleTimeout as exc:
            return (Event.IDLE if self.state is State.STA6 else Event.EVT18), exc
        except dul.ConnectionClosed as exc:
            return Event.EVT17, exc
        except dul.ProtocolError as exc:
            return Event.EVT19, exc
        except OSError as exc:  # reset by the peer, or shut down by the gate
            return Event.EVT17, dul.ConnectionClosed(str(exc))
        return PDU_EVENTS[pdu_type], body

    # Local user primitives (the acceptor's answers)

    def _associate_response(self) -> tuple[Event, _Input]:
        """Sta3: accept (Evt7) or reject (Evt8) the A-ASSOCIATE indication."""
        assert self._offer is not None
        rejection = self._offer.refused
        if rejection is not None:
            log.warning(
                "association refused (AE title not valid): calling AE %r, called AE %r, from %s",
                self.peer.calling_ae,
                self.peer.called_ae,
                self.address,
            )
        else:
            rejection = self.acceptor.admit(self.peer)
        if rejection is not None:
            return Event.EVT8, dul.encode_associate_rj(*rejection)
        self.admitted = True
        return Event.EVT7, self._offer.accept

    def _release_response(self) -> tuple[Event, _Input]:
        """Sta8: release (Evt14), or abort (Evt15) if a DIMSE message was cut off by it.

        A release in the middle of a command or data set is not the sender saying it is
        done: the instance is dropped unanswered, and the association aborted.
        """
        if self._command or self._request is not None:
            log.warning(
                "A-RELEASE-RQ from %s in the middle of a DIMSE message: instance dropped, "
                "association aborted",
                self.address,
            )
            self._command = bytearray()
            self._request = None
            self._discard_partial()
            return Event.EVT15, None
        self.released = True
        return Event.EVT14, dul.encode_release_rp()

    # Actions, PS3.8 Table 9-10: each returns the next state.

    def _ae_6(self, body: memoryview) -> State:
        if self.ticket is not None and not self.ticket.settle():
            return State.STA1  # its ARTIM ran out meanwhile: the gate has closed it (AA-2)
        offer = negotiation.answer(bytes(body), self.acceptor.max_pdu, self.acceptor.contexts)
        self._offer = offer
        self.peer = Peer(offer.calling_ae, offer.called_ae, self.address)
        if offer.refused is not None and offer.refused[1] == negotiation.SOURCE_ACSE:
            log.warning("association from %s refused: protocol version not 1", self.address)
            return self._ae_8(dul.encode_associate_rj(*offer.refused))
        return State.STA3

    def _ae_7(self, pdu: bytes) -> State:
        assert self._offer is not None
        self.contexts = self._offer.contexts
        self._abstract_syntaxes = self._offer.abstract_syntaxes
        self.sock.sendall(pdu)
        return State.STA6

    def _ae_8(self, pdu: bytes) -> State:
        self.sock.sendall(pdu)
        return self._start_artim()

    def _dt_2(self, body: memoryview) -> State:
        self._on_p_data(body)
        return State.STA6

    def _ar_2(self, body: memoryview) -> State:
        return State.STA8

    def _ar_4(self, pdu: bytes) -> State:
        self.sock.sendall(pdu)
        return self._start_artim()

    def _aa_1(self, cause: dul.ProtocolError | None) -> State:
        """Send A-ABORT, (re)start ARTIM.

        PS3.8 names the service-user source; when the provider found the PDU at fault it
        says so (source 2), for the peer to learn the reason.
        """
        if cause is not None:
            self._log_abort(cause)
            self._send_quietly(dul.encode_abort(dul.SOURCE_SERVICE_PROVIDER, cause.reason))
        else:
            self._send_quietly(dul.encode_abort(dul.SOURCE_SERVICE_USER, 0))
        return self._start_artim()

    def _aa_3(self, body: memoryview) -> State:
        raw = bytes(body)
        log.warning(
            "association with %s aborted by the peer (source %d, reason %d)",
            self.address,
            raw[2],
            raw[3],
        )
        return State.STA1

    def _aa_4(self, cause: dul.ProtocolError) -> State:
        log.warning("association with %s ended: %s", self.address, cause)
        return State.STA1

    def _aa_5(self, cause: dul.ProtocolError) -> State:
        if self.ticket is None or not self.ticket.closed:  # else the gate logged why
            log.info("connection from %s closed before an A-ASSOCIATE-RQ", self.address)
        return State.STA1

    def _aa_6(self, body: _Input) -> State:
        return State.STA13

    def _aa_7(self, cause: _Input) -> State:
        reason = cause.reason if isinstance(cause, dul.ProtocolError) else dul.REASON_UNEXPECTED_PDU
        self._send_quietly(dul.encode_abort(dul.SOURCE_SERVICE_PROVIDER, reason))
        return State.STA13

    def _aa_8(self, cause: dul.ProtocolError) -> State:
        self._log_abort(cause)
        self._send_quietly(dul.encode_abort(dul.SOURCE_SERVICE_PROVIDER, cause.reason))
        return self._start_artim()

    def _closed(self, data: _Input) -> State:
        """AR-5 and AA-2: stop ARTIM; the caller closes the connection."""
        return State.STA1

    def _start_artim(self) -> State:
        self._artim_deadline = time.monotonic() + ARTIM_S
        return State.STA13

    def _log_abort(self, cause: dul.ProtocolError) -> None:
        if self.ticket is None or not self.ticket.closed:  # else the gate logged why
            log.warning("association with %s aborted: %s", self.address, cause)

    # DIMSE, inside DT-2

    def _on_p_data(self, body: memoryview) -> None:
        for pdv in dul.iter_pdvs(body):
            if pdv.context_id not in self.contexts:
                raise dul.ProtocolError(
                    f"PDV on presentation context {pdv.context_id}, which was not accepted"
                )
            if pdv.is_command:
                self._on_command_fragment(pdv)
            else:
                self._on_data_fragment(pdv)

    def _on_command_fragment(self, pdv: dul.Pdv) -> None:
        if self._request is not None:
            raise dul.ProtocolError(
                "a new command arrived before the data set was complete",
                dul.REASON_UNEXPECTED_PARAMETER,
            )
        if len(self._command) + len(pdv.data) > dimse.MAX_COMMAND_LENGTH:
            raise dul.ProtocolError(f"command set longer than {dimse.MAX_COMMAND_LENGTH} bytes")
        self._command += pdv.data
        if not pdv.is_last:
            return
        request = dimse.decode_command(self._command)
        self._command = bytearray()
        self._request, self._request_context = request, pdv.context_id
        if request.get("CommandDataSetType", dimse.NO_DATASET) == dimse.NO_DATASET:
            self._dispatch(None)
        elif not self._serves(request, pdv.context_id):
            self._incoming = _NotServed()
        else:
            syntax = str(self.contexts[pdv.context_id].transfer_syntax[0])
            self._incoming = self.acceptor.begin_store(request, syntax, self.peer)

    def _serves(self, request: dimse.Command, context_id: int) -> bool:
        """Whether the request's SOP Class, if it names one, is its context's."""
        sop_class = request.get("AffectedSOPClassUID")
        return sop_class is None or sop_class == self._abstract_syntaxes[context_id]

    def _on_data_fragment(self, pdv: dul.Pdv) -> None:
        if self._incoming is None or pdv.context_id != self._request_context:
            raise dul.ProtocolError(
                "data set fragment without a command that announced it",
                dul.REASON_UNEXPECTED_PARAMETER,
            )
        self._incoming.write(pdv.data)
        if pdv.is_last:
            incoming, self._incoming = self._incoming, None
            self._dispatch(incoming)

    def _dispatch(self, incoming: Incoming | None) -> None:
        """Answer a complete request (DT-1: the response goes out as a P-DATA-TF)."""
        request, context_id = self._request, self._request_context
        assert request is not None
        self._request = None
        field = int(request.get("CommandField", 0))
        if field == dimse.C_STORE_RQ and incoming is not None:
            status = incoming.finish()
            answer = dimse.response(
                request, dimse.C_STORE_RSP, status.Status, str(status.get("ErrorComment", ""))
            )
        elif incoming is not None:  # a data set with a request we do not serve
            incoming.discard()
            answer = dimse.response(request, field | 0x8000, STATUS_UNRECOGNIZED_OPERATION)
        elif field == dimse.C_ECHO_RQ:
            served = self._serves(request, context_id)
            answer = dimse.response(
                request, dimse.C_ECHO_RSP, 0x0000 if served else STATUS_SOP_CLASS_NOT_SUPPORTED
            )
        else:
            answer = dimse.response(request, field | 0x8000, STATUS_UNRECOGNIZED_OPERATION)
        self.sock.sendall(dul.encode_command_pdu(context_id, answer))

    def _send_quietly(self, pdu: bytes) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(pdu)

    def _discard_partial(self) -> None:
        """A data set cut off mid-transfer was never answered Success: drop it."""
        if self._incoming is not None:
            self._incoming.discard()
            self._incoming = None
