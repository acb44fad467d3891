"""Takes studies in `receiving` and gives queued jobs once their series and study are complete."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai.config import AssembleConfig, PriorityConfig, PriorityRule
from imaging_ai.db.models import Job, Series, Study
from imaging_ai.db.session import utcnow
from imaging_ai.states import JobState, StudyState

log = logging.getLogger(__name__)

# Urgent work always goes first; the others share one rank so that earliest deadline decides.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RANKS = {"urgent": 0, "inpatient": 1, "outpatient": 1}
RELEASED = "association released"


class Wake(Protocol):
    """An event another thread or process sets to wake the assembler (threading or
    multiprocessing ``Event``)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True)
class Classification:
    """A study's priority class and the rule that gave it, in words."""

    priority: str
    reason: str


def classify(
    routing: dict[str, Any], calling_ae: str, rules: tuple[PriorityRule, ...]
) -> Classification:
    """Apply the priority rules in order; the first match wins, else outpatient."""
    for rule in rules:
        reason = _match(rule, routing, calling_ae)
        if reason:
            return Classification(rule.priority, reason)
    return Classification("outpatient", "no priority rule matched")


def _match(rule: PriorityRule, routing: dict[str, Any], calling_ae: str) -> str:
    if rule.calling_ae and calling_ae not in rule.calling_ae:
        return ""
    if rule.tag:
        value = str(routing.get(rule.tag, "")).strip()
        if rule.present and not value:
            return ""
        if rule.values and value.upper() not in {v.upper() for v in rule.values}:
            return ""
        what = f"{rule.tag} = {value}" if rule.values else f"{rule.tag} present"
    else:
        what = ""
    where = f"calling AE {calling_ae}" if rule.calling_ae else ""
    return " and ".join(p for p in (what, where) if p)


def routing_tags(rules: tuple[PriorityRule, ...]) -> tuple[str, ...]:
    """The DICOM keywords the receiver must keep for the rules."""
    return tuple(sorted({r.tag for r in rules if r.tag}))


class Assembler:
    """Decides when series and studies are complete and turns studies into queued jobs.

    Two rules. Release: a study whose every sending association released (the receivers
    count them, `imaging_ai.catalog`) and that received nothing since completes
    ``release_grace_s`` after the last release. Idle: otherwise series and studies complete
    after their idle times, and any study at ``force_complete_s``. Idle clocks run from the
    later of the last instance and ``started_at`` (the daemon sets it when its DICOM port
    opens), so after a restart a sender that was cut off still gets a full idle window to
    resend.

    Parameters
    ----------
    wake
        Set by the receivers after a release; the background thread then looks at once.
    on_queued
        Called after a pass that queued jobs (wakes this node's processor).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        assemble: AssembleConfig,
        priority: PriorityConfig,
        started_at: datetime | None = None,
        wake: Wake | None = None,
        on_queued: Callable[[], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = assemble
        self.priority = priority
        self.started_at = started_at or utcnow()
        self.wake: Wake = wake if wake is not None else threading.Event()
        self.on_queued = on_queued
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_release: datetime | None = None  # when a released study falls due

    def tick(self, now: datetime | None = None) -> list[str]:
        """Run one pass; return the Study Instance UIDs that became jobs."""
        now = now or utcnow()
        series_cutoff = self._idle_cutoff(now, self.config.series_idle_s)
        with self.sessions() as s, s.begin():
            s.execute(
                update(Series)
                .where(Series.completed_at.is_(None), Series.last_instance_at <= series_cutoff)
                .values(completed_at=now)
            )
        queued = []
        for study_id, reason in self._due_studies(now):
            uid = self._complete(study_id, now, reason)
            if uid:
                queued.append(uid)
        if queued and self.on_queued is not None:
            self.on_queued()
        return queued

    def _idle_cutoff(self, now: datetime, idle_s: float) -> datetime:
        cutoff = now - timedelta(seconds=idle_s)
        # Before the idle time has passed since start, nothing counts as idle.
        return cutoff if cutoff >= self.started_at else _EPOCH

    def _due_studies(self, now: datetime) -> list[tuple[int, str]]:
        """Studies to complete now, with the rule's reason ('' for the idle rules)."""
        study_cutoff = self._idle_cutoff(now, self.config.study_idle_s)
        force_cutoff = now - timedelta(seconds=self.config.force_complete_s)
        open_series = select(Series.id).where(
            Series.study_id == Study.id, Series.completed_at.is_(None)
        )
        idle = (Study.last_instance_at <= study_cutoff) & ~open_series.exists()
        query = select(Study.id).where(
            Study.state == StudyState.RECEIVING, idle | (Study.received_at <= force_cutoff)
        )
        with self.sessions() as s:
            due = [(i, "") for i in s.scalars(query.order_by(Study.received_at))]
            if not self.config.complete_on_release:
                return due
            released = self._released(s, now)
        timed = {i for i, _ in due}
        return [(i, RELEASED) for i in released if i not in timed] + due

    def _released(self, s: Session, now: datetime) -> list[int]:
        """Released studies past their grace; notes when the next one falls due."""
        grace = timedelta(seconds=self.config.release_grace_s)
        waiting = select(Study.id).where(Study.state == StudyState.RECEIVING, released_quietly())
        due = list(s.scalars(waiting.where(Study.released_at <= now - grace)))
        later = s.scalar(
            select(func.min(Study.released_at)).where(
                Study.state == StudyState.RECEIVING,
                released_quietly(),
                Study.released_at > now - grace,
            )
        )
        self._next_release = later + grace if later is not None else None
        return due

    def _complete(self, study_id: int, now: datetime, reason: str = "") -> str:
        with self.sessions() as s, s.begin():
            # Compare-and-set, so the assembler and an administrator's force-complete (or two
            # nodes) cannot both queue the same study.
            won = s.execute(
                update(Study)
                .where(Study.id == study_id, Study.state == StudyState.RECEIVING)
                .values(state=StudyState.QUEUED)
                .execution_options(synchronize_session=False)
            )
            if won.rowcount != 1:  # type: ignore[attr-defined]
                return ""
            study = s.get(Study, study_id)
            assert study is not None
            s.refresh(study)
            forced = s.scalars(
                select(Series).where(Series.study_id == study.id, Series.completed_at.is_(None))
            ).all()
            for series in forced:
                series.completed_at = now
            why = reason or ("force_complete_s reached" if forced else "idle")
            self._enqueue(s, study, now, why)
            return study.study_instance_uid

    def _enqueue(self, s: Session, study: Study, now: datetime, why: str) -> None:
        c = classify(study.routing or {}, study.calling_ae, self.priority.rules)
        deadline = now + timedelta(seconds=self.priority.sla_s(c.priority))
        study.state = StudyState.QUEUED
        study.completed_at = now
        study.completion_reason = why
        study.priority = c.priority
        study.priority_reason = c.reason
        study.deadline = deadline
        s.add(
            Job(
                study_id=study.id,
                state=JobState.QUEUED,
                priority=c.priority,
                rank=RANKS[c.priority],
                deadline=deadline,
                created_at=now,
            )
        )
        log.info("study %d complete (%s): queued as %s (%s)", study.id, why, c.priority, c.reason)

    def force_complete(self, study_uid: str, now: datetime | None = None) -> bool:
        """Complete a study now (admin action); False if it is not receiving."""
        with self.sessions() as s:
            study_id = s.scalar(select(Study.id).where(Study.study_instance_uid == study_uid))
        if study_id is None:
            return False
        return bool(self._complete(study_id, now or utcnow(), "forced by an administrator"))

    def start(self) -> None:
        """Run ticks in a background thread every ``poll_s``."""
        self._thread = threading.Thread(target=self._run, name="assembler", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """Whether the background thread runs (the systemd watchdog is fed only while it does)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the background thread after its current tick."""
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.wake.wait(self._pause_s()):
                self.wake.clear()  # before the pass, so a release during it wakes the next
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:
                # The assembler must outlive a database hiccup; the next tick retries.
                log.exception("assembly pass failed; retrying in %.1f s", self.config.poll_s)
                self._next_release = None

    def _pause_s(self) -> float:
        """Until the next poll, or sooner when a released study's grace ends first."""
        if self._next_release is None:
            return self.config.poll_s
        until = (self._next_release - utcnow()).total_seconds()
        return min(self.config.poll_s, max(0.0, until))


def released_quietly() -> ColumnElement[bool]:
    """A study whose sending associations all released and which received nothing since."""
    return (
        (Study.senders == 0)
        & Study.released_at.is_not(None)
        & (Study.released_at >= Study.last_instance_at)
    )
