"""Takes studies done, or failed and not retried, for ``storage.retention_days``; gives their
instance files deleted from this node's spool, each purge recorded in ``purges``.

Records, reports and result files are kept. Nothing in flight (receiving, queued, processing,
delivering, a job waiting for its next attempt) is touched, nor a study that anything happened
to within the retention time: an instance, a job or a delivery newer than the cutoff keeps it.
Each node deletes only the files it spooled itself (``instances.node``); rows from before that
column are taken by the node whose spool holds their file.

A purge, in an order chosen so that a crash anywhere leaves database and files consistent:

1. **mark** (one transaction, the study's row locked and checked again): an unfinished
   ``purges`` row, and the study's instance rows of this node ``missing`` with its id;
2. **delete** the marked files, each renamed into this node's tmp first and looked at there,
   so that a copy received again meanwhile is put back (`Spool.discard`);
3. **record**: the purge finished with the files and bytes gone, and an audit event.

Marking first means the database never says a file is there that may be gone: after a crash
between 1 and 3 some marked files are still on disk, and the node's next pass (at start, then
hourly) deletes them and records the purge. Deleting first would leave rows pointing at
deleted files, taken at the next start for lost files, with no audit row.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai.db.models import AuditEvent, Delivery, Instance, Job, Purge, Series, Study
from imaging_ai.db.session import utcnow
from imaging_ai.spool import Spool
from imaging_ai.states import DeliveryState, StudyState

log = logging.getLogger(__name__)

# Retention counts in days: a pass an hour late is 0.14 % of the default 30, and a pass that
# finds nothing costs a few indexed queries. Fixed, so there is no key to get wrong.
PASS_INTERVAL_S = 3600.0
_STUDIES_PER_QUERY = 100
_ROWS_PER_UPDATE = 500  # bound parameters per statement, well under SQLite's limit
ACTOR = "retention"
ENDED = (StudyState.DONE, StudyState.FAILED)


@dataclass(frozen=True)
class PassResult:
    """What one pass deleted."""

    studies: int = 0
    files: int = 0
    size_bytes: int = 0


def _purgeable(cutoff: datetime, node: str) -> ColumnElement[bool]:
    """An instance row whose file this node may delete: its own (or unowned), still there."""
    return and_(
        Instance.node.in_((node, "")),
        Instance.purge_id.is_(None),
        Instance.missing.is_(False),
        Instance.received_at < cutoff,
    )


def eligible(cutoff: datetime, node: str) -> ColumnElement[bool]:
    """A study whose files this node purges: ended, and nothing about it newer than cutoff."""
    of_study = Series.study_id == Study.id
    instances = select(Instance.id).join(Series, Instance.series_id == Series.id).where(of_study)
    recent_job = or_(Job.created_at >= cutoff, Job.finished_at.is_(None), Job.finished_at >= cutoff)
    recent_delivery = or_(
        Delivery.created_at >= cutoff,
        Delivery.state == DeliveryState.PENDING,
        Delivery.delivered_at >= cutoff,
    )
    return and_(
        Study.state.in_(ENDED),
        Study.last_instance_at < cutoff,
        Study.completed_at < cutoff,
        exists(instances.where(_purgeable(cutoff, node))),
        ~exists(instances.where(Instance.received_at >= cutoff)),
        ~exists(select(Job.id).where(Job.study_id == Study.id, recent_job)),
        ~exists(select(Delivery.id).where(Delivery.study_id == Study.id, recent_delivery)),
    )


def images_gone(s: Session, study_id: int) -> str:
    """Why the study cannot be analysed from the spool, or "": its files deleted by retention."""
    count, last = s.execute(
        select(func.count(Instance.id), func.max(Purge.started_at))
        .join(Series, Instance.series_id == Series.id)
        .join(Purge, Purge.id == Instance.purge_id)
        .where(Series.study_id == study_id)
    ).one()
    if not count:
        return ""
    return (
        f"its images ({count} instance file(s)) were deleted by retention on "
        f"{last:%Y-%m-%d} (storage.retention_days): send the study again from PACS to "
        "analyse it"
    )


class Retention:
    """The purge passes of one node: at start, then every ``interval_s``.

    Parameters
    ----------
    sessions
        The process's session factory.
    spool
        This node's spool; its ``node`` says which instances are this node's.
    days
        ``storage.retention_days``; 0 deletes nothing (unfinished purges are still finished).
    clock
        The current time (tests move it).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        spool: Spool,
        days: int,
        clock: Callable[[], datetime] = utcnow,
        interval_s: float = PASS_INTERVAL_S,
    ) -> None:
        self.sessions, self.spool, self.days = sessions, spool, days
        self.node, self.clock, self.interval_s = spool.node, clock, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run passes in a background thread until stopped."""
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the file being deleted; the rest of a purge is finished at next start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def refuse_retry(self, study_uid: str) -> str:
        """Why a failed study cannot be retried (its images purged, now said on its record)."""
        with self.sessions() as s, s.begin():
            study = s.scalars(select(Study).where(Study.study_instance_uid == study_uid)).first()
            if study is None or study.state != StudyState.FAILED:
                return ""
            return note_gone(s, study)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.run_once()
                if done.studies:
                    log.info(
                        "retention: %d study(ies), %d file(s), %d bytes deleted",
                        done.studies,
                        done.files,
                        done.size_bytes,
                    )
            except Exception:  # a pass that failed is tried again at the next one
                log.exception("retention pass failed; trying again in %.0f s", self.interval_s)
            self._stop.wait(self.interval_s)

    def run_once(self) -> PassResult:
        """One pass: finish what a crash interrupted, then purge every eligible study."""
        now = self.clock()
        self._restore_discarded()
        with self.sessions() as s:
            unfinished = s.scalars(
                select(Purge.id).where(Purge.node == self.node, Purge.finished_at.is_(None))
            ).all()
        results = [self._finish(purge_id, now) for purge_id in unfinished]
        if self.days > 0:
            results.extend(self._purge_eligible(now, now - timedelta(days=self.days)))
        return PassResult(
            len(results), sum(r.files for r in results), sum(r.size_bytes for r in results)
        )

    def _purge_eligible(self, now: datetime, cutoff: datetime) -> list[PassResult]:
        results, after = [], 0
        while not self._stop.is_set():
            with self.sessions() as s:
                ids = s.scalars(
                    select(Study.id)
                    .where(Study.id > after, eligible(cutoff, self.node))
                    .order_by(Study.id)
                    .limit(_STUDIES_PER_QUERY)
                ).all()
            if not ids:
                break
            for study_id in ids:
                purge_id = self._mark(study_id, now, cutoff)
                if purge_id is not None:
                    results.append(self._finish(purge_id, now))
            after = ids[-1]
        return results

    def _mark(self, study_id: int, now: datetime, cutoff: datetime) -> int | None:
        """Step 1: the purge row and the rows of the files to delete, or None if none."""
        with self.sessions() as s, s.begin():
            study = s.scalars(
                select(Study)
                .where(Study.id == study_id, eligible(cutoff, self.node))
                .with_for_update(of=Study)
            ).first()
            if study is None:  # changed since it was listed (re-opened, retried)
                return None
            rows = s.execute(
                select(Instance.id, Instance.path, Instance.node)
                .join(Series, Instance.series_id == Series.id)
                .where(Series.study_id == study_id, _purgeable(cutoff, self.node))
            ).all()
            # An unowned row is this node's when its file is in this node's spool.
            ids = [i for i, path, node in rows if node == self.node or self.spool.exists(path)]
            if not ids:
                return None
            purge = Purge(
                study_id=study_id,
                node=self.node,
                started_at=now,
                cutoff=cutoff,
                reason=f"{study.state} and untouched for over {self.days} day(s)",
                files=0,
                size_bytes=0,
            )
            s.add(purge)
            s.flush()
            for start in range(0, len(ids), _ROWS_PER_UPDATE):
                chunk = ids[start : start + _ROWS_PER_UPDATE]
                s.execute(
                    update(Instance)
                    .where(Instance.id.in_(chunk), _purgeable(cutoff, self.node))
                    .values(purge_id=purge.id, missing=True)
                )
            return purge.id

    def _finish(self, purge_id: int, now: datetime) -> PassResult:
        """Steps 2 and 3: delete the marked files, then record what is gone."""
        with self.sessions() as s:
            purge = s.get(Purge, purge_id)
            assert purge is not None
            written_before = purge.cutoff.timestamp()
            rows = s.execute(
                select(Instance.path, Instance.size_bytes).where(Instance.purge_id == purge_id)
            ).all()
        for path, _ in rows:
            self.spool.discard(path, written_before)
        self.spool.sync_dirs(path for path, _ in rows)
        # Counted from what is gone, so a purge finished after a crash counts the files
        # deleted before it too; a copy received again meanwhile is kept and not counted.
        gone = [(path, size) for path, size in rows if not self.spool.exists(path)]
        return self._record(purge_id, now, gone)

    def _record(self, purge_id: int, now: datetime, gone: Sequence[tuple[str, int]]) -> PassResult:
        size = sum(size for _, size in gone)
        with self.sessions() as s, s.begin():
            purge = s.get(Purge, purge_id)
            assert purge is not None
            study = s.get(Study, purge.study_id)
            assert study is not None
            purge.finished_at, purge.files, purge.size_bytes = now, len(gone), size
            detail = f"{len(gone)} file(s), {size} bytes deleted on {self.node}: {purge.reason}"
            s.add(
                AuditEvent(
                    at=now,
                    actor=ACTOR,
                    action="purge",
                    target=study.study_instance_uid,
                    detail=detail,
                )
            )
            if study.state == StudyState.FAILED:
                note_gone(s, study)
        log.info("study %d: %d instance file(s) deleted by retention", purge.study_id, len(gone))
        return PassResult(1, len(gone), size)

    def _restore_discarded(self) -> None:
        """Files a crash left in tmp mid-deletion: deleted if marked and old, else put back."""
        with self.sessions() as s:
            rows = s.execute(
                select(Instance.path, Purge.cutoff)
                .join(Purge, Purge.id == Instance.purge_id)
                .where(Purge.node == self.node, Purge.finished_at.is_(None))
            )
            marked = {path: cutoff for path, cutoff in rows}

        def keep(relative: str, mtime: float) -> bool:
            cutoff = marked.get(relative)
            return cutoff is None or mtime >= cutoff.timestamp()

        restored, deleted = self.spool.restore_discarded(keep)
        if restored or deleted:
            log.warning(
                "retention: after an interrupted purge, %d file(s) deleted and %d received "
                "again meanwhile put back",
                deleted,
                restored,
            )


def note_gone(s: Session, study: Study) -> str:
    """Say on a study's record that its images are gone; the sentence, or "" if they are not."""
    gone = images_gone(s, study.id)
    if gone and gone not in study.error:
        sentence = f"Not analysable again: {gone}."
        study.error = f"{study.error} {sentence}".strip() if study.error else sentence
    return gone
