"""Takes a database session and gives the status page's views: queues, studies, problems, audit.

Every query is bounded (a limit or a time window) so that the page stays fast on a database
that has a year of studies. Durations are computed here, in Python, because date arithmetic
differs between SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import overload

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session, aliased

from imaging_ai.config import PRIORITY_CLASSES
from imaging_ai.db.models import (
    AuditEvent,
    ClassControl,
    Delivery,
    Instance,
    Job,
    Purge,
    Report,
    Series,
    Study,
)
from imaging_ai.states import DeliveryState, JobState, StudyState

IN_FLIGHT = (
    StudyState.RECEIVING,
    StudyState.QUEUED,
    StudyState.PROCESSING,
    StudyState.DELIVERING,
)
LIST_LIMIT = 50


@dataclass(frozen=True)
class ClassQueue:
    """One priority class in the queue."""

    priority: str
    depth: int
    oldest_wait_s: float | None
    nearest_deadline: datetime | None
    paused: bool


@dataclass(frozen=True)
class Stage:
    """How long a study spent, or has spent so far, in one stage."""

    name: str
    seconds: float
    running: bool = False


@dataclass(frozen=True)
class StudyRow:
    """A study with its latest job: what the Now, Recent and Problems lists show."""

    uid: str
    accession: str
    state: StudyState
    priority: str
    received_at: datetime
    completed_at: datetime | None
    deadline: datetime | None
    late_instances: int
    error: str
    attempts: int = 0
    node: str = ""
    finished_at: datetime | None = None
    stages: tuple[Stage, ...] = ()
    step_timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # the job's, e.g. batches run on the CPU when the GPU failed

    @property
    def missed(self) -> bool:
        """Whether results came after the deadline."""
        return bool(self.finished_at and self.deadline and self.finished_at > self.deadline)


@dataclass(frozen=True)
class Turnaround:
    """A finished study's times from completion: results ready, report, last delivery."""

    study: StudyRow
    results_s: float | None
    report_s: float | None
    delivered_s: float | None
    refused: int = 0  # deliveries the destination refused for good


@dataclass(frozen=True)
class DeliveryRow:
    """A delivery that is retrying, was refused or was cancelled."""

    id: int
    study_uid: str
    accession: str
    kind: str
    destination: str
    state: DeliveryState
    attempts: int
    next_try_at: datetime
    last_error: str
    last_attempt_at: datetime | None = None


@dataclass(frozen=True)
class SearchHit:
    """A study found by accession number or date; for administrators only (patient name)."""

    study: StudyRow
    patient_name: str
    study_date: str


@dataclass(frozen=True)
class SpoolUse:
    """The spool: what it holds, what is free, how long that lasts, and retention."""

    size_bytes: int
    files: int
    free_bytes: int | None  # None when the disk could not be read
    low_water_bytes: int
    intake_bytes_per_day: float  # the mean over INTAKE_WINDOW
    retention_days: int
    last_purge: Purge | None

    @property
    def headroom_bytes(self) -> int | None:
        """Free space above the low-water mark, where C-STORE starts answering 0xA700."""
        return None if self.free_bytes is None else max(0, self.free_bytes - self.low_water_bytes)

    @property
    def levels_off(self) -> bool:
        """Whether retention keeps the spool from filling at the current intake."""
        growth = self.intake_bytes_per_day * self.retention_days - self.size_bytes
        return self.retention_days > 0 and growth <= (self.headroom_bytes or 0)

    @property
    def days_left(self) -> float | None:
        """Days until the low-water mark at the current intake; None if it never comes."""
        if self.headroom_bytes is None or self.intake_bytes_per_day <= 0 or self.levels_off:
            return None
        return self.headroom_bytes / self.intake_bytes_per_day


INTAKE_WINDOW = timedelta(days=7)


def spool_use(
    s: Session, now: datetime, free_bytes: int | None, low_water_bytes: int, retention_days: int
) -> SpoolUse:
    """The spool's figures from the catalogue; intake is what arrived in the last 7 days."""
    files, size = s.execute(
        select(func.count(Instance.id), func.coalesce(func.sum(Instance.size_bytes), 0)).where(
            Instance.missing.is_(False)
        )
    ).one()
    received = s.scalar(
        select(func.coalesce(func.sum(Instance.size_bytes), 0)).where(
            Instance.received_at >= now - INTAKE_WINDOW
        )
    )
    last = s.scalars(
        select(Purge).where(Purge.finished_at.is_not(None)).order_by(Purge.id.desc()).limit(1)
    ).first()
    per_day = float(received or 0) / INTAKE_WINDOW.days
    return SpoolUse(
        int(size), int(files), free_bytes, low_water_bytes, per_day, retention_days, last
    )


def study_purges(s: Session, uid: str) -> Sequence[Purge]:
    """The retention purges of a study's files, oldest first."""
    return s.scalars(
        select(Purge)
        .join(Study, Study.id == Purge.study_id)
        .where(Study.study_instance_uid == uid)
        .order_by(Purge.id)
    ).all()


def queues(s: Session, now: datetime) -> list[ClassQueue]:
    """Queue depth, oldest wait and nearest deadline of every priority class."""
    rows = s.execute(
        select(Job.priority, func.count(), func.min(Job.created_at), func.min(Job.deadline))
        .where(Job.state == JobState.QUEUED)
        .group_by(Job.priority)
    ).all()
    found = {r[0]: r for r in rows}
    paused = set(s.scalars(select(ClassControl.priority).where(ClassControl.paused)))
    out = []
    for priority in (*PRIORITY_CLASSES, *sorted(set(found) - set(PRIORITY_CLASSES))):
        _, depth, oldest, nearest = found.get(priority, (priority, 0, None, None))
        wait = (now - _aware(oldest)).total_seconds() if oldest else None
        out.append(ClassQueue(priority, depth, wait, _aware(nearest), priority in paused))
    return out


def in_flight(s: Session, now: datetime, limit: int = LIST_LIMIT) -> list[StudyRow]:
    """Studies not yet done, most urgent first, with their stage times so far."""
    query = (
        _studies_with_job()
        .where(Study.state.in_(IN_FLIGHT))
        .order_by(Study.deadline.is_(None), Study.deadline, Study.received_at)
        .limit(limit)
    )
    return [_row(study, job, now) for study, job in s.execute(query)]


def recent(s: Session, now: datetime, limit: int = LIST_LIMIT) -> list[Turnaround]:
    """Studies whose results came in the last day, newest first, with their turnaround."""
    query = (
        _studies_with_job()
        .where(Job.state == JobState.DONE, Job.finished_at >= now - timedelta(days=1))
        .order_by(Job.finished_at.desc())
        .limit(limit)
    )
    pairs = s.execute(query).all()
    reports, delivered = _milestones(s, [study.id for study, _ in pairs])
    refused = refused_counts(s, [study.id for study, _ in pairs])
    out = []
    for study, job in pairs:
        finished = job.finished_at if job else None
        out.append(
            Turnaround(
                _row(study, job, now),
                _since(study.completed_at, finished),
                _since(study.completed_at, reports.get(study.id)),
                _since(study.completed_at, delivered.get(study.id)),
                refused.get(study.id, 0),
            )
        )
    return out


def refused_counts(s: Session, ids: Sequence[int]) -> dict[int, int]:
    """How many deliveries of each study were refused for good."""
    rows = s.execute(
        select(Delivery.study_id, func.count())
        .where(Delivery.study_id.in_(ids), Delivery.state == DeliveryState.REFUSED)
        .group_by(Delivery.study_id)
    )
    return {i: n for i, n in rows}


def _milestones(
    s: Session, ids: Sequence[int]
) -> tuple[dict[int, datetime], dict[int, datetime | None]]:
    """When each study's report was written and its last delivery confirmed."""
    reports = s.execute(select(Report.study_id, Report.created_at).where(Report.study_id.in_(ids)))
    delivered = s.execute(
        select(Delivery.study_id, func.max(Delivery.delivered_at))
        .where(Delivery.study_id.in_(ids), Delivery.state == DeliveryState.DONE)
        .group_by(Delivery.study_id)
    )
    return {i: at for i, at in reports}, {i: at for i, at in delivered}


def finished_since(s: Session, since: datetime) -> list[tuple[str, datetime, float, bool]]:
    """(priority, finished at, seconds from completion to results, deadline missed) since then."""
    rows = s.execute(
        select(Job.priority, Job.finished_at, Job.deadline, Study.completed_at)
        .join(Study, Study.id == Job.study_id)
        .where(
            Job.state == JobState.DONE, Job.finished_at >= since, Study.completed_at.is_not(None)
        )
    )
    out = []
    for priority, finished, deadline, completed in rows:
        assert finished is not None and completed is not None
        seconds = (_aware(finished) - _aware(completed)).total_seconds()
        out.append((priority, _aware(finished), seconds, finished > deadline))
    return out


def failed(s: Session, limit: int = LIST_LIMIT) -> list[StudyRow]:
    """Failed studies, newest first, with the reason."""
    query = (
        _studies_with_job()
        .where(Study.state == StudyState.FAILED)
        .order_by(Job.finished_at.desc())
        .limit(limit)
    )
    return [_row(study, job, None) for study, job in s.execute(query)]


def late(s: Session, limit: int = LIST_LIMIT) -> list[StudyRow]:
    """Studies that received instances after they were complete, newest first."""
    query = (
        _studies_with_job()
        .where(Study.late_instances > 0)
        .order_by(Study.last_instance_at.desc())
        .limit(limit)
    )
    return [_row(study, job, None) for study, job in s.execute(query)]


def deliveries(s: Session, limit: int = LIST_LIMIT) -> list[DeliveryRow]:
    """Deliveries that failed at least once and are still retrying, were refused for good, or
    were cancelled."""
    retrying = and_(Delivery.state == DeliveryState.PENDING, Delivery.attempts > 0)
    ended = Delivery.state.in_((DeliveryState.REFUSED, DeliveryState.CANCELLED))
    query = (
        select(Delivery, Study.study_instance_uid, Study.accession_number)
        .join(Study, Study.id == Delivery.study_id)
        .where(or_(retrying, ended))
        .order_by(Delivery.state.desc(), Delivery.created_at.desc())
        .limit(limit)
    )
    rows = s.execute(query)
    return [
        DeliveryRow(
            d.id,
            uid,
            acc,
            d.kind,
            d.destination,
            d.state,
            d.attempts,
            d.next_try_at,
            d.last_error,
            d.last_attempt_at,
        )
        for d, uid, acc in rows
    ]


def search(s: Session, accession: str, date: str, limit: int = LIST_LIMIT) -> list[SearchHit]:
    """Studies by exact accession number and/or study date (YYYYMMDD)."""
    query = _studies_with_job().order_by(Study.received_at.desc()).limit(limit)
    if accession:
        query = query.where(Study.accession_number == accession)
    if date:
        query = query.where(Study.study_date == date)
    return [
        SearchHit(_row(study, job, None), study.patient_name, study.study_date)
        for study, job in s.execute(query)
    ]


def study(s: Session, uid: str, now: datetime) -> SearchHit | None:
    """One study with its latest job and patient name (administrators only), or None."""
    query = _studies_with_job().where(Study.study_instance_uid == uid)
    found = s.execute(query).first()
    if found is None:
        return None
    return SearchHit(_row(found[0], found[1], now), found[0].patient_name, found[0].study_date)


def audit_events(
    s: Session,
    limit: int,
    before_id: int | None = None,
    actions: Sequence[str] = (),
    actor: str = "",
    target: str = "",
) -> Sequence[AuditEvent]:
    """Audit events, newest first, optionally only some actions, one actor or one target."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    if actions:
        query = query.where(AuditEvent.action.in_(actions))
    if actor:
        query = query.where(AuditEvent.actor == actor)
    if target:
        query = query.where(AuditEvent.target == target)
    return s.scalars(query).all()


def study_series(s: Session, uid: str) -> list[tuple[Series, int]]:
    """A study's series with their instance counts, by series number."""
    rows = s.execute(
        select(Series, func.count(Instance.id))
        .join(Study, Study.id == Series.study_id)
        .join(Instance, Instance.series_id == Series.id, isouter=True)
        .where(Study.study_instance_uid == uid)
        .group_by(Series.id)
        .order_by(Series.series_number, Series.id)
    ).all()
    return [(row, int(count)) for row, count in rows]


def study_deliveries(s: Session, uid: str) -> Sequence[Delivery]:
    """Every delivery of a study, oldest first."""
    return s.scalars(
        select(Delivery)
        .join(Study, Study.id == Delivery.study_id)
        .where(Study.study_instance_uid == uid)
        .order_by(Delivery.id)
    ).all()


def _studies_with_job() -> Select[Study, Job]:
    # The latest job of each study (a retried study keeps its job; a re-sent one may add one).
    other = aliased(Job)
    latest = (
        select(func.max(other.id))
        .where(other.study_id == Study.id)
        .correlate(Study)
        .scalar_subquery()
    )
    return select(Study, Job).outerjoin(Job, Job.id == latest)


def _row(study: Study, job: Job | None, now: datetime | None) -> StudyRow:
    timings = {k: float(v) for k, v in (job.timings if job else {}).items() if k != "total"}
    return StudyRow(
        uid=study.study_instance_uid,
        accession=study.accession_number,
        state=study.state,
        priority=study.priority,
        received_at=_aware(study.received_at),
        completed_at=_aware(study.completed_at),
        deadline=_aware(job.deadline if job else study.deadline),
        late_instances=study.late_instances,
        error=study.error or (job.error if job else ""),
        attempts=job.attempts if job else 0,
        node=job.node if job else "",
        finished_at=_aware(job.finished_at) if job else None,
        stages=_stages(study, job, now) if now else (),
        step_timings=timings,
        notes=tuple(job.notes) if job else (),
    )


def _stages(study: Study, job: Job | None, now: datetime) -> tuple[Stage, ...]:
    """Receive, queue, process and deliver times; the current stage counts up to now."""
    marks = [
        ("receive", study.received_at, study.completed_at),
        ("queue", job.created_at if job else None, job.started_at if job else None),
        ("process", job.started_at if job else None, job.finished_at if job else None),
    ]
    if study.state == StudyState.DELIVERING and job is not None:
        marks.append(("deliver", job.finished_at, None))
    stages = []
    for name, start, end in marks:
        if start is None:
            break
        stages.append(Stage(name, ((end or now) - start).total_seconds(), end is None))
        if end is None:
            break
    return tuple(stages)


def _since(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (_aware(end) - _aware(start)).total_seconds()


@overload
def _aware(value: datetime) -> datetime: ...
@overload
def _aware(value: datetime | None) -> datetime | None: ...
def _aware(value: datetime | None) -> datetime | None:
    # Aggregates (min/max) bypass the UTC column type and come back naive from SQLite.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
