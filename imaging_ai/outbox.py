"""Takes delivery rows and gives results to PACS (C-STORE) and RIS (HL7 over MLLP), with retries.

Every delivery is a row: it is marked done only after the destination confirmed it. Every try
that does not end so is an attempt with its reason in ``last_error`` (an unexpected error too,
by its type and message); failures back off from ``retry_min_s`` to ``retry_max_s`` and keep
going across restarts; a refusal that a retry cannot change (:mod:`imaging_ai.outbox_pacs`)
ends the row ``refused``. Objects keep their UIDs on retry, so a PACS that already has one
treats the resend as a replace.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai import faults
from imaging_ai.config import Config, PacsDestination, RisDestination
from imaging_ai.db.models import AuditEvent, Delivery, Study
from imaging_ai.db.session import utcnow
from imaging_ai.errors import DeliveryError
from imaging_ai.outbox_pacs import DELIVERED, Outcome, send_files
from imaging_ai.redact import exception_text
from imaging_ai.states import DeliveryState, StudyState

log = logging.getLogger(__name__)

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
        """Add a row per payload and destination that takes it (a PACS's ``results``), in the
        caller's transaction."""
        count = 0
        for payload in payloads:
            targets = self.ris if payload.kind == "oru" else self.pacs
            keys = [payload.destination] if payload.destination else list(targets)
            for key in (k for k in keys if k in targets and self._takes(k, payload.kind)):
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

    def _takes(self, key: str, kind: str) -> bool:
        pacs = self.pacs.get(key)
        return pacs is None or kind in pacs.results

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
                results = {row.id: Outcome("destination no longer configured") for row in rows}
        except DeliveryError as exc:
            results = {row.id: Outcome(str(exc)) for row in rows}
        except Exception as exc:  # an attempt like any other, not a silent retry at the lease
            reason = f"unexpected error: {type(exc).__name__}: {exception_text(exc)}"
            if any(row.last_error != reason for row in rows):
                log.exception("delivery to %s: unexpected error", destination)
            else:  # its traceback was logged when it first happened
                log.warning("delivery to %s: the same unexpected error again", destination)
            results = {row.id: Outcome(reason) for row in rows}
        if any(o.delivered for o in results.values()):
            faults.reach("after:deliver")
        self._record(rows, results)

    def _send_dicom(self, dest: PacsDestination, rows: list[Delivery]) -> dict[int, Outcome]:
        """One association for every due object to one PACS."""
        files = {row.id: self.data_dir / row.payload for row in rows}
        outputs = self.config.outputs
        tls_files = (outputs.tls_ca, outputs.tls_cert, outputs.tls_key)
        return send_files(self.config.dicom.ae_title, dest, files, tls_files)

    def _send_hl7(self, dest: RisDestination, row: Delivery) -> Outcome:
        if self.hl7_sender is None:
            return Outcome("no HL7 sender available")
        # Bytes, not read_text: HL7 separates segments with CR, which text mode would change.
        message = (self.data_dir / row.payload).read_bytes().decode("utf-8")
        try:
            self.hl7_sender(dest, message)
        except DeliveryError as exc:
            return Outcome(str(exc))
        return DELIVERED

    def _record(self, rows: list[Delivery], results: dict[int, Outcome]) -> None:
        now = utcnow()
        low, high = self.config.outputs.retry_min_s, self.config.outputs.retry_max_s
        with self.sessions() as s, s.begin():
            for row in rows:
                current = s.get(Delivery, row.id)
                if current is None or current.state != DeliveryState.PENDING:
                    continue
                current.attempts += 1
                current.last_attempt_at = now
                outcome = results.get(row.id, Outcome("not attempted"))
                current.last_error = outcome.reason
                if outcome.delivered:
                    current.state, current.delivered_at = DeliveryState.DONE, now
                elif outcome.final:
                    current.state = DeliveryState.REFUSED
                    log.warning(
                        "delivery %d to %s refused for good (attempt %d); reason on the "
                        "status page",
                        current.id,
                        current.destination,
                        current.attempts,
                    )
                else:
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
                _settle_study(s, current.study_id)

    def retry(self, delivery_id: int, actor: str) -> bool:
        """Admin action: try a pending delivery now, or a refused one again (once the PACS
        or its destination's configuration was changed)."""
        return self._admin(
            delivery_id,
            actor,
            "retry_delivery",
            DeliveryState.PENDING,
            (DeliveryState.PENDING, DeliveryState.REFUSED),
        )

    def cancel(self, delivery_id: int, actor: str) -> bool:
        """Admin action: stop trying a delivery."""
        return self._admin(
            delivery_id, actor, "cancel_delivery", DeliveryState.CANCELLED, (DeliveryState.PENDING,)
        )

    def _admin(
        self,
        delivery_id: int,
        actor: str,
        action: str,
        state: DeliveryState,
        allowed: tuple[DeliveryState, ...],
    ) -> bool:
        now = utcnow()
        with self.sessions() as s, s.begin():
            row = s.get(Delivery, delivery_id)
            if row is None or row.state not in allowed:
                return False
            if row.state == DeliveryState.REFUSED:
                _reopen_study(s, row.study_id)
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
    """A study is done once none of its deliveries is pending.

    Refused ones count as settled: nothing the daemon does will change them, and a study
    left "delivering" would hide the refusal among the studies still in flight (and keep
    its deliver stage counting for ever). The study shows "done" with its refusals beside
    it (status page, API), not "failed": its analysis and every accepted result are fine,
    and a study retry would re-analyse it only to be refused again.
    """
    pending = s.scalars(
        select(Delivery.id).where(
            Delivery.study_id == study_id, Delivery.state == DeliveryState.PENDING
        )
    ).first()
    study = s.get(Study, study_id)
    if study is not None and pending is None and study.state == StudyState.DELIVERING:
        study.state = StudyState.DONE


def _reopen_study(s: Session, study_id: int) -> None:
    """A refused delivery retried by an administrator makes its done study deliver again."""
    study = s.get(Study, study_id)
    if study is not None and study.state == StudyState.DONE:
        study.state = StudyState.DELIVERING
