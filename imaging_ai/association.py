"""Takes one accepted connection and runs one DICOM association: negotiation, then DIMSE."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from pydicom import Dataset
from pynetdicom.dsutils import create_file_meta, encode_file_meta
from pynetdicom.presentation import PresentationContext, negotiate_as_acceptor

from imaging_ai import dul

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


class Acceptor(Protocol):
    """What an association asks of the receiver (one handler whose answer matters each)."""

    ae_title: str
    max_pdu: int
    tmp_dir: Path
    contexts: list[PresentationContext]

    def admit(self, peer: Peer) -> tuple[int, int, int] | None:
        """None to accept, else the A-ASSOCIATE-RJ (result, source, diagnostic)."""

    def store(self, path: Path, command: Dataset, syntax: str, peer: Peer) -> Dataset:
        """Keep a received dataset file; return the C-STORE response status dataset."""


class Association:
    """One association as acceptor: PS3.8 state machine reduced to what a storage SCP needs."""

    def __init__(self, sock: socket.socket, address: str, acceptor: Acceptor) -> None:
        self.sock = sock
        self.address = address
        self.acceptor = acceptor
        self.peer = Peer("", "", address)
        self.contexts: dict[int, PresentationContext] = {}
        self._command = bytearray()
        self._request: Dataset | None = None
        self._request_context = 0
        self._file: IO[bytes] | None = None
        self._path: Path | None = None

    def run(self) -> None:
        """Negotiate, then serve DIMSE requests until the peer releases or aborts."""
        try:
            if self._negotiate():
                self._serve()
        except dul.ProtocolError as exc:
            log.warning("association with %s aborted: %s", self.address, exc)
            self._send_quietly(dul.encode_abort())
        except OSError as exc:
            log.warning("association with %s ended: %s", self.address, exc)
        finally:
            self._discard_partial()

    def _negotiate(self) -> bool:
        pdu_type, body = dul.read_pdu(self.sock, 0)
        if pdu_type != dul.A_ASSOCIATE_RQ_TYPE:
            raise dul.ProtocolError(f"expected A-ASSOCIATE-RQ, got PDU type 0x{pdu_type:02X}")
        request = dul.decode_associate_rq(body)
        self.peer = Peer(
            request.calling_ae_title.strip(), request.called_ae_title.strip(), self.address
        )
        rejection = self.acceptor.admit(self.peer)
        if rejection is not None:
            self.sock.sendall(dul.encode_associate_rj(*rejection))
            return False
        results, _roles = negotiate_as_acceptor(
            request.presentation_context_definition_list, self.acceptor.contexts, None
        )
        self.contexts = {int(cx.context_id or 0): cx for cx in results if cx.result == 0x00}
        self.sock.sendall(dul.encode_associate_ac(request, results, self.acceptor.max_pdu))
        return True

    def _serve(self) -> None:
        handlers: dict[int, Callable[[bytearray], bool]] = {
            dul.P_DATA_TF_TYPE: self._on_p_data,
            dul.A_RELEASE_RQ_TYPE: self._on_release,
            dul.A_ABORT_TYPE: lambda body: False,
        }
        while True:
            pdu_type, body = dul.read_pdu(self.sock, self.acceptor.max_pdu)
            handler = handlers.get(pdu_type)
            if handler is None:
                raise dul.ProtocolError(f"unexpected PDU type 0x{pdu_type:02X}")
            if not handler(body):
                return

    def _on_release(self, body: bytearray) -> bool:
        self.sock.sendall(dul.encode_release_rp())
        return False

    def _on_p_data(self, body: bytearray) -> bool:
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
        self._command += pdv.data
        if not pdv.is_last:
            return
        request = dul.decode_command(self._command)
        self._command = bytearray()
        self._request, self._request_context = request, pdv.context_id
        if request.get("CommandDataSetType", dul.NO_DATASET) == dul.NO_DATASET:
            self._dispatch(None)
        else:
            self._open_dataset_file(request, pdv.context_id)

    def _on_data_fragment(self, pdv: dul.Pdv) -> None:
        if self._file is None or pdv.context_id != self._request_context:
            raise dul.ProtocolError("data set fragment without a command that announced it")
        self._file.write(pdv.data)
        if pdv.is_last:
            self._file.close()
            self._file = None
            self._dispatch(self._path)

    def _open_dataset_file(self, request: Dataset, context_id: int) -> None:
        """Write the Part-10 preamble and file meta, then the fragments as they arrive."""
        syntax = self.contexts[context_id].transfer_syntax[0]
        meta = create_file_meta(
            sop_class_uid=request.get("AffectedSOPClassUID", ""),
            sop_instance_uid=request.get("AffectedSOPInstanceUID", ""),
            transfer_syntax=syntax,
        )
        self._path = self.acceptor.tmp_dir / f"{uuid.uuid4().hex}.part"
        self._file = open(self._path, "wb")  # noqa: SIM115 - closed on the last fragment
        self._file.write(b"\x00" * 128 + b"DICM" + encode_file_meta(meta))

    def _dispatch(self, path: Path | None) -> None:
        request, context_id = self._request, self._request_context
        assert request is not None
        self._request = None
        field = int(request.get("CommandField", 0))
        if field == dul.C_STORE_RQ and path is not None:
            syntax = str(self.contexts[context_id].transfer_syntax[0])
            status = self.acceptor.store(path, request, syntax, self.peer)
            answer = dul.response(
                request, dul.C_STORE_RSP, status.Status, str(status.get("ErrorComment", ""))
            )
            self._path = None
            if path.exists():  # not adopted into the spool: the instance was refused
                path.unlink()
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
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
