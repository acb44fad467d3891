"""Takes delivery rows and gives results to PACS (C-STORE) and RIS (HL7 over MLLP), with retries.

Every delivery is a row: it is marked done only after the destination confirmed it; failures
back off from ``retry_min_s`` to ``retry_max_s`` and keep going across restarts. Objects keep
their UIDs on retry, so a PACS that already has one treats the resend as a replace.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydicom import dcmread
from pynetdicom import AE, evt
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai import faults
from imaging_ai.config import Config, PacsDestination, RisDestination
from imaging_ai.db.models import AuditEvent, Delivery, Study
from imaging_ai.db.session import utcnow
from imaging_ai.errors import DeliveryError
from imaging_ai.states import DeliveryState, StudyState

log = logging.getLogger(__name__)

# C-STORE statuses that mean "stored": success and the warnings (coercion, elements discarded).
STORED = {0x0000, 0xB000, 0xB006, 0xB007}
BATCH = 20
# A send lease is this many job leases (storage.job_lease_s): 180 s by default.
SEND_LEASE_JOB_LEASES = 1.5


@dataclass(frozen=True)
class Payload:
    """A result ready to deliver: a DICOM file, or an HL7 message in a file."""

    kind: str  # "seg", "sr" (DICOM files) or "oru" (HL7 v2 text)
    path: Path
    object_uid: str
    destination: str = ""  # one destination key, or "" for every destination of its kind


def backoff_s(attempts: int, low: float, high: float) -> float:
    """Seconds before the next try: doubling from ``low``, capped at ``high``, with jitter
    so that many deliveries to one recovered RIS do not all return at the same second."""
    base = min(high, low * 2 ** max(0, attempts - 1))
    return float(base * random.uniform(0.8, 1.0))


class Outbox:
    """Creates delivery rows for a study's results and sends them in a background thread."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: Config,
        data_dir: Path,
        hl7_sender: Callable[[RisDestination, str], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config
        self.data_dir = data_dir
        self.pacs = {d.key: d for d in config.outputs.pacs}
        self.ris = {d.key: d for d in config.outputs.ris}
        self.hl7_sender = hl7_sender
        # How long a claimed row waits before another node (or this one, restarted after a
        # crash mid-send) may try it again: as long as a node may be silent before its jobs
        # are taken over, and half as long again, since one pass sends up to BATCH rows.
        self.send_lease = timedelta(seconds=SEND_LEASE_JOB_LEASES * config.storage.job_lease_s)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def enqueue(self, s: Session, study: Study, payloads: list[Payload], now: datetime) -> int:
        """Add a row per payload and destination, in the caller's transaction."""
        count = 0
        for payload in payloads:
            targets = self.ris if payload.kind == "oru" else self.pacs
            keys = [payload.destination] if payload.destination else list(targets)
            for key in (k for k in keys if k in targets):
                s.add(
                    Delivery(
                        study_id=study.id,
                        kind=payload.kind,
                        destination=key,
                        payload=str(payload.path.relative_to(self.data_dir)),
                        object_uid=payload.object_uid,
                        next_try_at=now,
                        created_at=now,
                    )
                )
                count += 1
        study.state = StudyState.DELIVERING if count else StudyState.DONE
        # Woken once the rows are committed: woken now, the sender would look before they
        # exist and then sleep a whole poll interval.
        event.listen(s, "after_commit", lambda _session: self._wake.set(), once=True)
        return count

    def start(self) -> None:
        """Deliver in a background thread until stopped."""
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop after the current send (waiting ``timeout_s`` at most); pending rows, and a
        send cut short, stay for the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self.deliver_due()
            except Exception:
                log.exception("outbox pass failed; retrying")
                sent = 0
            if not sent:
                self._wake.wait(1.0)
                self._wake.clear()

    def deliver_due(self, now: datetime | None = None) -> int:
        """Try every delivery that is due; return how many were attempted.

        Each destination in its own thread: a RIS that takes its 30-s timeout to fail does
        not hold back the SEG and SR for PACS (nor one PACS another).
        """
        due = self._claim_due(now or utcnow())
        by_destination: dict[str, list[Delivery]] = {}
        for row in due:
            by_destination.setdefault(row.destination, []).append(row)
        if len(by_destination) == 1:
            self._deliver(*next(iter(by_destination.items())))
        elif by_destination:
            with ThreadPoolExecutor(len(by_destination), "outbox-send") as pool:
                for sent in [pool.submit(self._deliver, *each) for each in by_destination.items()]:
                    sent.result()  # an unexpected error reaches _run's log, as before
        return len(due)

    def _claim_due(self, now: datetime) -> list[Delivery]:
        """Take due rows for this node: SKIP LOCKED plus a short lease, so two nodes
        sharing one database never send the same row at once, and a node that dies
        mid-send leaves the row due again when the lease ends."""
        with self.sessions() as s, s.begin():
            due = list(
                s.scalars(
                    select(Delivery)
                    .where(Delivery.state == DeliveryState.PENDING, Delivery.next_try_at <= now)
                    .order_by(Delivery.next_try_at, Delivery.id)
                    .limit(BATCH)
                    .with_for_update(skip_locked=True)
                )
            )
            for row in due:
                row.next_try_at = now + self.send_lease
            s.flush()  # the lease must reach the database: expunged rows are never flushed
            s.expunge_all()
        return due

    def _deliver(self, destination: str, rows: list[Delivery]) -> None:
        try:
            if destination in self.pacs:
                results = self._send_dicom(self.pacs[destination], rows)
            elif destination in self.ris:
                results = {row.id: self._send_hl7(self.ris[destination], row) for row in rows}
            else:
                results = {row.id: "destination no longer configured" for row in rows}
        except DeliveryError as exc:
            results = {row.id: str(exc) for row in rows}
        if "" in results.values():
            faults.reach("after:deliver")
        self._record(rows, results)

    def _send_dicom(self, dest: PacsDestination, rows: list[Delivery]) -> dict[int, str]:
        """One association for every due object to one PACS; '' means delivered."""
        files = {row.id: self.data_dir / row.payload for row in rows}
        outputs = self.config.outputs
        tls_files = (outputs.tls_ca, outputs.tls_cert, outputs.tls_key)
        assoc = _associate(self.config.dicom.ae_title, dest, files.values(), tls_files)
        results: dict[int, str] = {}
        try:
            for row_id, path in files.items():
                status = assoc.send_c_store(path)
                code = getattr(status, "Status", None)
                if code in STORED:
                    results[row_id] = ""
                else:
                    comment = getattr(status, "ErrorComment", "") if status else ""
                    detail = f"0x{code:04X} {comment}".strip() if code is not None else "no reply"
                    results[row_id] = f"C-STORE refused: {detail}"
        finally:
            assoc.release()
        return results

    def _send_hl7(self, dest: RisDestination, row: Delivery) -> str:
        if self.hl7_sender is None:
            return "no HL7 sender available"
        # Bytes, not read_text: HL7 separates segments with CR, which text mode would change.
        message = (self.data_dir / row.payload).read_bytes().decode("utf-8")
        try:
            self.hl7_sender(dest, message)
        except DeliveryError as exc:
            return str(exc)
        return ""

    def _record(self, rows: list[Delivery], results: dict[int, str]) -> None:
        now = utcnow()
        low, high = self.config.outputs.retry_min_s, self.config.outputs.retry_max_s
        with self.sessions() as s, s.begin():
            for row in rows:
                current = s.get(Delivery, row.id)
                if current is None or current.state != DeliveryState.PENDING:
                    continue
                current.attempts += 1
                error = results.get(row.id, "not attempted")
                if error:
                    current.last_error = error
                    current.next_try_at = now + timedelta(
                        seconds=backoff_s(current.attempts, low, high)
                    )
                    # The peer's text may quote the patient (a RIS's "unknown patient X"): it
                    # stays in the row, for the status page, and out of the log.
                    log.warning(
                        "delivery %d to %s failed (attempt %d); last error on the status page",
                        current.id,
                        current.destination,
                        current.attempts,
                    )
                else:
                    current.state, current.delivered_at = DeliveryState.DONE, now
                    current.last_error = ""
                _settle_study(s, current.study_id)

    def retry(self, delivery_id: int, actor: str) -> bool:
        """Admin action: try a pending delivery now."""
        return self._admin(delivery_id, actor, "retry_delivery", DeliveryState.PENDING)

    def cancel(self, delivery_id: int, actor: str) -> bool:
        """Admin action: stop trying a delivery."""
        return self._admin(delivery_id, actor, "cancel_delivery", DeliveryState.CANCELLED)

    def _admin(self, delivery_id: int, actor: str, action: str, state: DeliveryState) -> bool:
        now = utcnow()
        with self.sessions() as s, s.begin():
            row = s.get(Delivery, delivery_id)
            if row is None or row.state != DeliveryState.PENDING:
                return False
            row.state, row.next_try_at = state, now
            s.add(
                AuditEvent(
                    at=now,
                    actor=actor,
                    action=action,
                    target=str(delivery_id),
                    detail=row.destination,
                )
            )
            _settle_study(s, row.study_id)
        self._wake.set()
        return True


def _settle_study(s: Session, study_id: int) -> None:
    """A study is done once none of its deliveries is pending."""
    pending = s.scalars(
        select(Delivery.id).where(
            Delivery.study_id == study_id, Delivery.state == DeliveryState.PENDING
        )
    ).first()
    study = s.get(Study, study_id)
    if study is not None and pending is None and study.state == StudyState.DELIVERING:
        study.state = StudyState.DONE


def _tls_context(files: tuple[str, str, str]) -> ssl.SSLContext:
    """Verify the PACS against ``outputs.tls_ca`` (system CAs when empty); present our own
    certificate when ``outputs.tls_cert``/``tls_key`` are set (PACS that require one)."""
    ca, cert, key = files
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def _associate(
    calling_ae: str, dest: PacsDestination, files: Any, tls_files: tuple[str, str, str]
) -> Any:
    ae = AE(ae_title=calling_ae)
    contexts = set()
    for path in files:
        ds = dcmread(path, stop_before_pixels=True)
        contexts.add((str(ds.SOPClassUID), str(ds.file_meta.TransferSyntaxUID)))
    for sop_class, syntax in sorted(contexts):
        ae.add_requested_context(sop_class, syntax)
    ae.network_timeout = ae.acse_timeout = ae.dimse_timeout = 60
    tls = (_tls_context(tls_files), dest.host) if dest.tls else None
    assoc = ae.associate(
        dest.host,
        dest.port,
        ae_title=dest.ae_title,
        evt_handlers=[(evt.EVT_CONN_OPEN, _nodelay)],
        tls_args=tls,
    )
    if not assoc.is_established:
        raise DeliveryError(
            f"PACS {dest.ae_title} at {dest.host}:{dest.port} did not accept the association"
        )
    return assoc


def _nodelay(event: Any) -> None:
    # pynetdicom has no option for it; without it every PDU waits for a delayed ACK.
    sock = event.assoc.dul.socket.socket
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
