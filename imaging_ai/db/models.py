"""SQLAlchemy 2.0 typed models: studies, series, instances, jobs, purges and audit events."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from imaging_ai.states import DeliveryState, JobState, ReportStatus, StudyState

UID = String(64)
_State = TypeVar("_State", bound=StrEnum)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class StateType(TypeDecorator[_State]):
    """A state column: stored as its value (``String(16)``), read back as the enum's member.

    Bound values are not checked: a filter with a string that is no member (an API query)
    matches no row, as a plain string column would. mypy keeps the code's own writes members.
    """

    impl = String(16)
    cache_ok = True

    def __init__(self, states: type[_State]) -> None:
        super().__init__()
        self.states = states

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else str(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> _State | None:
        return None if value is None else self.states(value)


class Base(DeclarativeBase):
    """Declarative base of every table."""


class Study(Base):
    """A DICOM study as received; its state follows the pipeline."""

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_instance_uid: Mapped[str] = mapped_column(UID, unique=True)
    accession_number: Mapped[str] = mapped_column(String(64), default="", index=True)
    patient_name: Mapped[str] = mapped_column(String(200), default="")
    patient_id: Mapped[str] = mapped_column(String(64), default="")
    study_date: Mapped[str] = mapped_column(String(8), default="")
    calling_ae: Mapped[str] = mapped_column(String(16), default="")
    routing: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[StudyState] = mapped_column(
        StateType(StudyState), default=StudyState.RECEIVING, index=True
    )
    priority: Mapped[str] = mapped_column(String(16), default="")
    priority_reason: Mapped[str] = mapped_column(String(200), default="")
    error: Mapped[str] = mapped_column(Text, default="")
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_instance_at: Mapped[datetime] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    completion_reason: Mapped[str] = mapped_column(String(32), default="")
    deadline: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    late_instances: Mapped[int] = mapped_column(Integer, default=0)
    # Associations that delivered instances of the study and have not released (an aborted
    # or cut-off one never does), and when the last of them released: assembly's
    # release rule (`imaging_ai.assemble`).
    senders: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    series: Mapped[list[Series]] = relationship(back_populates="study")


class Series(Base):
    """A series of a study; complete after its idle time."""

    __tablename__ = "series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    series_instance_uid: Mapped[str] = mapped_column(UID, unique=True)
    modality: Mapped[str] = mapped_column(String(16), default="")
    series_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_instance_at: Mapped[datetime] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Why the series is kept but not analysed, in words ("not CT: X-Ray Radiation Dose SR
    # Storage", "our own result", "localizer"); empty while it may be analysed.
    not_analysed: Mapped[str] = mapped_column(String(200), default="", server_default="")

    study: Mapped[Study] = relationship(back_populates="series")
    instances: Mapped[list[Instance]] = relationship(back_populates="series")


class Instance(Base):
    """One stored SOP instance: a file in the spool."""

    __tablename__ = "instances"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), index=True)
    sop_instance_uid: Mapped[str] = mapped_column(UID, unique=True)
    sop_class_uid: Mapped[str] = mapped_column(UID)
    transfer_syntax_uid: Mapped[str] = mapped_column(UID)
    path: Mapped[str] = mapped_column(String(400))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    late: Mapped[bool] = mapped_column(Boolean, default=False)
    missing: Mapped[bool] = mapped_column(Boolean, default=False)
    # The node (``storage.node``) that spooled the file: only that node's retention deletes
    # it. Empty for rows recorded before this column existed.
    node: Mapped[str] = mapped_column(String(100), default="", server_default="")
    # The retention purge that deleted (or is deleting) the file; ``missing`` is then true.
    # Receiving the instance again clears both.
    purge_id: Mapped[int | None] = mapped_column(ForeignKey("purges.id"), nullable=True, index=True)

    series: Mapped[Series] = relationship(back_populates="instances")


class Job(Base):
    """Work on one completed study; the queue row that nodes claim."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_queue", "state", "rank", "deadline"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    state: Mapped[JobState] = mapped_column(StateType(JobState), default=JobState.QUEUED)
    priority: Mapped[str] = mapped_column(String(16))
    rank: Mapped[int] = mapped_column(Integer)
    deadline: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    node: Mapped[str] = mapped_column(String(100), default="")
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    notes: Mapped[list[str]] = mapped_column(JSON, default=list)


class Report(Base):
    """What the models found in a study: findings, organ volumes, model versions."""

    __tablename__ = "reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), unique=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[ReportStatus] = mapped_column(
        StateType(ReportStatus), default=ReportStatus.PRELIMINARY
    )
    impression: Mapped[str] = mapped_column(Text, default="")
    findings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Delivery(Base):
    """One result to one destination (the outbox): retried with backoff until it succeeds."""

    __tablename__ = "deliveries"
    __table_args__ = (Index("ix_deliveries_due", "state", "next_try_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    destination: Mapped[str] = mapped_column(String(200))
    payload: Mapped[str] = mapped_column(String(400))
    object_uid: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[DeliveryState] = mapped_column(
        StateType(DeliveryState), default=DeliveryState.PENDING
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # When the outbox last finished trying it (delivered, failed or refused).
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Purge(Base):
    """One retention purge of one study's files on one node: the audit row of what was deleted.

    Written before any file is deleted (``finished_at`` empty) and completed after: a purge
    still unfinished is finished by its node's next pass (`imaging_ai.retention`).
    """

    __tablename__ = "purges"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    node: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Files received (and written) before this time were deleted; a newer copy is kept.
    cutoff: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(String(200), default="")
    files: Mapped[int] = mapped_column(Integer, default=0)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class ClassControl(Base):
    """A priority class paused or resumed by an administrator (shared by every node)."""

    __tablename__ = "class_controls"

    priority: Mapped[str] = mapped_column(String(16), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    changed_by: Mapped[str] = mapped_column(String(100), default="")


class SessionRevocation(Base):
    """An admin session signed out before it expired: refused by every node until then."""

    __tablename__ = "session_revocations"

    sid: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class AuditEvent(Base):
    """Who did what, when, from where: sign-ins, report reads, admin actions."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(200), default="")
    detail: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(100), default="")
