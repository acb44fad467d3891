"""Rows for a daemon caught mid-day: studies in every state, deliveries failing, audit events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai.db.models import AuditEvent, ClassControl, Delivery, Job, Report, Study
from imaging_ai.db.session import utcnow

PATIENT = "DOE^JANE"
RANKS = {"urgent": 0, "inpatient": 1, "outpatient": 1}


def add_study(
    s: Session,
    uid: str,
    state: str,
    priority: str = "outpatient",
    *,
    age_s: float = 600.0,
    job_state: str | None = None,
    accession: str = "",
    **extra: Any,
) -> Study:
    """A study received ``age_s`` ago; with a job in ``job_state`` when given."""
    now = utcnow()
    received = now - timedelta(seconds=age_s)
    completed = None if state == "receiving" else received + timedelta(seconds=30)
    study = Study(
        study_instance_uid=uid,
        accession_number=accession or f"ACC-{uid.rsplit('.', 1)[-1]}",
        patient_name=PATIENT,
        patient_id="PID-1",
        study_date=received.strftime("%Y%m%d"),
        state=state,
        priority=priority if state != "receiving" else "",
        received_at=received,
        last_instance_at=completed or received,
        completed_at=completed,
        deadline=completed + timedelta(seconds=300) if completed else None,
        **extra,
    )
    s.add(study)
    s.flush()
    if job_state is not None and completed is not None:
        add_job(s, study, job_state, completed)
    return study


def add_job(s: Session, study: Study, state: str, created: datetime) -> Job:
    """The study's job, started 20 s after queueing and finished 40 s later where it applies."""
    started = created + timedelta(seconds=20) if state != "queued" else None
    finished = started + timedelta(seconds=40) if started and state in ("done", "failed") else None
    job = Job(
        study_id=study.id,
        state=state,
        priority=study.priority,
        rank=RANKS[study.priority],
        deadline=study.deadline or created,
        created_at=created,
        started_at=started,
        finished_at=finished,
        node="node-a:1" if started else "",
        attempts=1 if started else 0,
        timings={"load": 1.5, "lung-seg": 12.0, "total": 40.0} if state == "done" else {},
        error=study.error,
    )
    s.add(job)
    s.flush()
    return job


@dataclass
class Seeded:
    """The UIDs and ids the tests refer to."""

    uids: dict[str, str] = field(default_factory=dict)
    failing_delivery: int = 0
    cancelled_delivery: int = 0


def seed(engine: Engine, data_dir: Path | None = None) -> Seeded:
    """A study in each state, a missed deadline, a failure, deliveries failing, late instances.

    With ``data_dir`` the done study's report has four findings (two reported, two not) and
    a caveat, with their key images in its result folder under ``data_dir``.
    """
    out = Seeded()
    sessions = sessionmaker(engine, expire_on_commit=False)
    with sessions() as s, s.begin():
        for name, state, priority, job in (
            ("receiving", "receiving", "", None),
            ("queued", "queued", "outpatient", "queued"),
            ("processing", "processing", "urgent", "processing"),
            ("done", "done", "inpatient", "done"),
            ("delivering", "delivering", "outpatient", "done"),
        ):
            uid = f"1.2.826.0.1.{len(out.uids) + 1}"
            add_study(s, uid, state, priority, job_state=job, accession=f"ACC-{name.upper()}")
            out.uids[name] = uid
        missed = add_study(
            s,
            "1.2.826.0.1.90",
            "done",
            "urgent",
            job_state="done",
            accession="ACC-MISSED",
            late_instances=2,
        )
        assert missed.completed_at is not None
        missed.deadline = missed.completed_at
        _job_of(s, missed).deadline = missed.completed_at  # finished 60 s after it
        out.uids["missed"] = missed.study_instance_uid
        failed = add_study(
            s,
            "1.2.826.0.1.91",
            "failed",
            "inpatient",
            job_state="failed",
            accession="ACC-FAILED",
            error="The CT series has no axial slices the lung model can use.",
        )
        out.uids["failed"] = failed.study_instance_uid
        _deliveries(s, out)
        _report(s, out.uids["done"], data_dir)
        s.add(ClassControl(priority="inpatient", paused=False, changed_at=utcnow()))
        s.add(
            AuditEvent(
                at=utcnow(), actor="ris", action="read_report", target="1.2.3", source="10.0.0.7"
            )
        )
    return out


def _job_of(s: Session, study: Study) -> Job:
    return s.scalars(select(Job).where(Job.study_id == study.id)).one()


def _deliveries(s: Session, out: Seeded) -> None:
    now = utcnow()
    delivering = s.scalars(
        select(Study).where(Study.study_instance_uid == out.uids["delivering"])
    ).one()
    done = s.scalars(select(Study).where(Study.study_instance_uid == out.uids["done"])).one()
    failing = Delivery(
        study_id=delivering.id,
        kind="sr",
        destination="pacs:PACS@10.0.0.5:104",
        payload="out/x.dcm",
        state="pending",
        attempts=3,
        next_try_at=now,
        last_error="connection refused by 10.0.0.5:104",
        created_at=now,
    )
    cancelled = Delivery(
        study_id=delivering.id,
        kind="oru",
        destination="ris:10.0.0.6:2575",
        payload="out/x.hl7",
        state="cancelled",
        attempts=9,
        next_try_at=now,
        last_error="ACK AE: unknown patient",
        created_at=now,
    )
    delivered_at = (done.completed_at or now) + timedelta(seconds=90)
    ok = Delivery(
        study_id=done.id,
        kind="seg",
        destination="pacs:PACS@10.0.0.5:104",
        payload="out/y.dcm",
        state="done",
        attempts=1,
        next_try_at=now,
        created_at=delivered_at - timedelta(seconds=5),
        delivered_at=delivered_at,
    )
    s.add_all([failing, cancelled, ok])
    s.flush()
    out.failing_delivery, out.cancelled_delivery = failing.id, cancelled.id


def _report(s: Session, uid: str, data_dir: Path | None) -> None:
    study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).one()
    job = _job_of(s, study)
    report = Report(
        study_id=study.id,
        job_id=job.id,
        created_at=job.finished_at or utcnow(),
        impression="No nodule detected.",
    )
    if data_dir is not None:
        # Imported here: it loads the analysis' stack, which most web tests do without.
        from tests.web.findings_seed import write_findings

        report.impression = (
            "2 lung nodule(s) detected; largest 15.3 mm in the right lung. "
            "AI-generated preliminary result; requires review by a radiologist."
        )
        report.findings = write_findings(data_dir, uid, job.id)
    s.add(report)
