"""Takes result files and one PACS destination; gives each file's outcome over one association.

C-STORE SCU with pynetdicom. Every way a send can end is an :class:`Outcome` with a reason in
words radiology IT can act on (which PACS, which SOP class, which status and what it means):

- stored: a success or warning status;
- failed, tried again later: the PACS cannot be reached, rejects or aborts the association,
  does not answer in time, or answers a status that may change (0xA7xx Out of Resources,
  0x0110 Processing Failure, anything not known to be final);
- refused for good (``final``): the PACS accepted the association but no presentation context
  for the object's SOP class, or answered a status that says the object itself is not taken
  (0x0118 No Such SOP Class, 0x0122 SOP Class Not Supported, 0x0124 Not Authorised,
  0x0211 Unrecognised Operation, 0xA9xx, 0xCxxx). Sending the same
  bytes again would get the same answer, so the outbox stops.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydicom import dcmread
from pydicom.errors import InvalidDicomError
from pydicom.uid import UID, Comprehensive3DSRStorage, SegmentationStorage
from pynetdicom import AE, evt
from pynetdicom.status import STORAGE_SERVICE_CLASS_STATUS

from imaging_ai.config import PacsDestination
from imaging_ai.dicom.dul import IMPLEMENTATION_CLASS_UID, IMPLEMENTATION_VERSION
from imaging_ai.errors import DeliveryError

# C-STORE statuses that mean "stored": success and the warnings (coercion, elements discarded).
STORED = {0x0000, 0xB000, 0xB006, 0xB007}
# Statuses about the object itself (PS3.4 B.2.3, PS3.7 C): the same bytes get the same answer.
FINAL_STATUSES = {0x0118, 0x0122, 0x0124, 0x0211}
FINAL_RANGES = (range(0xA900, 0xAA00), range(0xC000, 0xD000))
TIMEOUT_S = 60.0
# PS3.8 9.3.3.2: why a presentation context was not accepted.
CONTEXT_RESULTS = {
    1: "user rejection",
    2: "no reason given",
    3: "abstract syntax not supported",
    4: "transfer syntax not supported",
}


@dataclass(frozen=True)
class Outcome:
    """What became of one object at one destination: delivered when ``reason`` is empty."""

    reason: str = ""
    # A refusal a retry cannot change: the delivery ends refused.
    final: bool = False

    @property
    def delivered(self) -> bool:
        """Whether the destination confirmed it."""
        return not self.reason


DELIVERED = Outcome()


def send_files(
    calling_ae: str,
    dest: PacsDestination,
    files: Mapping[int, Path],
    tls_files: tuple[str, str, str],
) -> dict[int, Outcome]:
    """C-STORE each file (by delivery id) to ``dest`` over one association.

    Raises
    ------
    DeliveryError
        When no association was made (unreachable, rejected, aborted, no answer): the same
        failure for every file.
    """
    outcomes: dict[int, Outcome] = {}
    contexts: dict[int, tuple[UID, UID]] = {}
    for row_id, path in files.items():
        try:
            contexts[row_id] = _context_of(path)
        except (OSError, InvalidDicomError, AttributeError) as exc:
            outcomes[row_id] = Outcome(f"result file {path.name} cannot be read: {exc}")
    if not contexts:
        return outcomes
    assoc = _associate(calling_ae, dest, set(contexts.values()), tls_files)
    try:
        refusals = refused_contexts(assoc, dest)
        for row_id, (sop_class, _) in contexts.items():
            if sop_class in refusals:
                outcomes[row_id] = Outcome(refusals[sop_class], final=True)
            else:
                outcomes[row_id] = _store(assoc, dest, files[row_id])
    finally:
        if assoc.is_established:
            assoc.release()
    return outcomes


def _context_of(path: Path) -> tuple[UID, UID]:
    ds = dcmread(path, stop_before_pixels=True)
    return UID(str(ds.SOPClassUID)), UID(str(ds.file_meta.TransferSyntaxUID))


def _store(assoc: Any, dest: PacsDestination, path: Path) -> Outcome:
    """One C-STORE and what its answer (or the lack of one) means."""
    if not assoc.is_established:
        return Outcome(f"not sent: the association with PACS {dest.ae_title} had ended")
    started = time.monotonic()
    status = assoc.send_c_store(path)
    if "Status" in status:
        return status_outcome(int(status.Status), str(status.get("ErrorComment", "")))
    if time.monotonic() - started >= assoc.dimse_timeout:
        return Outcome(
            f"PACS {dest.ae_title} sent no C-STORE response within {assoc.dimse_timeout:g} s"
        )
    return Outcome(
        f"PACS {dest.ae_title} aborted the association or closed the connection "
        "before its C-STORE response"
    )


def status_outcome(code: int, comment: str = "") -> Outcome:
    """A C-STORE response status as an outcome: stored, failed (retry) or refused (final)."""
    if code in STORED:
        return DELIVERED
    meaning = STORAGE_SERVICE_CLASS_STATUS.get(code, ("", "unknown status"))[1]
    detail = f"0x{code:04X} {meaning}" + (f" ({comment.strip()})" if comment.strip() else "")
    if code in FINAL_STATUSES or any(code in r for r in FINAL_RANGES):
        return Outcome(f"C-STORE refused: {detail}; not sent again", final=True)
    return Outcome(f"C-STORE failed: {detail}")


def refused_contexts(assoc: Any, dest: PacsDestination) -> dict[UID, str]:
    """The SOP classes the PACS accepted no presentation context for, with the reason.

    Read from the A-ASSOCIATE-AC: also when pynetdicom aborted the association because no
    context at all was accepted (a PACS that takes none of what is due).
    """
    accepted = {cx.abstract_syntax for cx in assoc.accepted_contexts}
    reasons: dict[UID, str] = {}
    for cx in assoc.rejected_contexts:
        sop_class = UID(cx.abstract_syntax)
        if sop_class in accepted or sop_class in reasons:
            continue
        why = CONTEXT_RESULTS.get(cx.result, f"result {cx.result}")
        syntax = UID(cx.transfer_syntax[0]).name if cx.transfer_syntax else "any transfer syntax"
        reasons[sop_class] = (
            f"refused by PACS {dest.ae_title}: it accepted the association but no "
            f"presentation context for {sop_class.name} ({sop_class}) in {syntax} ({why}); "
            f"not sent again{_hint(sop_class)}"
        )
    return reasons


def _hint(sop_class: UID) -> str:
    """What to change in our configuration, where something can."""
    if sop_class == Comprehensive3DSRStorage:
        return '; sr = "comprehensive" for this [[outputs.pacs]] sends Comprehensive SR instead'
    if sop_class == SegmentationStorage:
        return '; results without "seg" for this [[outputs.pacs]] stops sending it SEG'
    return ""


def scu_ae(calling_ae: str) -> AE:
    """The Storage SCU's application entity: the daemon's own implementation identity, as its
    SCP announces it (a PACS logs and filters associations by it), not pynetdicom's."""
    ae = AE(ae_title=calling_ae)
    ae.implementation_class_uid = IMPLEMENTATION_CLASS_UID
    ae.implementation_version_name = IMPLEMENTATION_VERSION
    return ae


def _associate(
    calling_ae: str,
    dest: PacsDestination,
    contexts: set[tuple[UID, UID]],
    tls_files: tuple[str, str, str],
) -> Any:
    """An association proposing each (SOP class, transfer syntax); one whose contexts were
    all refused is returned too (not established), for :func:`refused_contexts` to read."""
    ae = scu_ae(calling_ae)
    for sop_class, syntax in sorted(contexts):
        ae.add_requested_context(sop_class, syntax)
    ae.network_timeout = ae.acse_timeout = ae.dimse_timeout = TIMEOUT_S
    ae.connection_timeout = TIMEOUT_S
    opened: list[bool] = []
    tls = (_tls_context(tls_files), dest.host) if dest.tls else None
    assoc = ae.associate(
        dest.host,
        dest.port,
        ae_title=dest.ae_title,
        evt_handlers=[(evt.EVT_CONN_OPEN, lambda event: _opened(event, opened))],
        tls_args=tls,
    )
    if assoc.is_established or assoc.rejected_contexts:
        return assoc
    raise DeliveryError(association_failure(assoc, dest, bool(opened)))


def association_failure(assoc: Any, dest: PacsDestination, connected: bool) -> str:
    """Why no association was made, from what pynetdicom kept of the attempt."""
    where = f"PACS {dest.ae_title} at {dest.host}:{dest.port} did not accept the association"
    if not connected:
        return f"{where}: no connection ({connect_error(dest.host, dest.port, dest.tls)})"
    answer = assoc.acceptor.primitive
    if assoc.is_rejected and answer is not None:
        # Retried even when "permanent": the cause (an AE title, a whitelist on either side)
        # is fixed by a person without telling us, and then the next try gets through.
        return (
            f"{where}: A-ASSOCIATE-RJ {answer.result_str} from the "
            f"{answer.source_str}: {answer.reason_str}"
        )
    if answer is None:
        return f"{where}: no answer to the association request within {TIMEOUT_S:g} s"
    return f"{where}: the association was aborted during negotiation"


def connect_error(host: str, port: int, tls: bool = False, timeout_s: float = 5.0) -> str:
    """The operating system's reason a TCP connection fails now (pynetdicom logs and drops it)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            if tls:
                return (
                    "TCP connects, so the TLS handshake failed: check outputs.tls_ca and the "
                    "PACS certificate"
                )
            return "the first connection failed; a second one just now succeeded"
    except TimeoutError:
        return f"connecting timed out after {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def _opened(event: Any, opened: list[bool]) -> None:
    opened.append(True)
    _nodelay(event)


def _nodelay(event: Any) -> None:
    # pynetdicom has no option for it; without it every PDU waits for a delayed ACK.
    sock = event.assoc.dul.socket.socket
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _tls_context(files: tuple[str, str, str]) -> ssl.SSLContext:
    """Verify the PACS against ``outputs.tls_ca`` (system CAs when empty); present our own
    certificate when ``outputs.tls_cert``/``tls_key`` are set (PACS that require one)."""
    ca, cert, key = files
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key)
    return context
