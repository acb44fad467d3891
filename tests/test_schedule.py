"""Job claiming on SQLite and PostgreSQL: policy order, leases, pause/resume, raised priority."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.assemble import RANKS
from imaging_ai.db.models import AuditEvent, Job, Study
from imaging_ai.db.session import session_factory
from imaging_ai.schedule import Scheduler

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def add_job(engine: Engine, uid: str, priority: str, deadline_s: float) -> int:
    with Session(engine) as s, s.begin():
        study = Study(
            study_instance_uid=uid,
            state="queued",
            priority=priority,
            received_at=T0,
            last_instance_at=T0,
        )
        s.add(study)
        s.flush()
        job = Job(
            study_id=study.id,
            state="queued",
            priority=priority,
            rank=RANKS[priority],
            deadline=T0 + timedelta(seconds=deadline_s),
            created_at=T0,
        )
        s.add(job)
        s.flush()
        return job.id


def order(scheduler: Scheduler, now: datetime) -> list[str]:
    uids = []
    while (claim := scheduler.claim(now)) is not None:
        uids.append(claim.study_uid)
    return uids


def test_urgent_first_then_earliest_deadline(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 1800)  # completed long ago: deadline soon
    add_job(engine, "1.2", "inpatient", 2900)  # new inpatient: later deadline
    add_job(engine, "1.3", "urgent", 4000)  # urgent always first, whatever its deadline
    add_job(engine, "1.4", "inpatient", 1000)
    scheduler = Scheduler(session_factory(engine), "node-a")
    assert order(scheduler, T0) == ["1.3", "1.4", "1.1", "1.2"]


def test_claim_marks_processing_and_lease(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 60)
    scheduler = Scheduler(session_factory(engine), "node-a", lease_s=30)
    claim = scheduler.claim(T0)
    assert claim is not None and claim.attempt == 1
    with Session(engine) as s:
        job = s.get(Job, claim.job_id)
        assert job is not None
        assert (job.state, job.node, job.lease_until) == (
            "processing",
            "node-a",
            T0 + timedelta(seconds=30),
        )
        assert s.get(Study, claim.study_id).state == "processing"  # type: ignore[union-attr]
    assert scheduler.claim(T0) is None


def test_expired_lease_is_claimed_by_another_node(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 60)
    sessions = session_factory(engine)
    dead = Scheduler(sessions, "node-a", lease_s=30)
    alive = Scheduler(sessions, "node-b", lease_s=30)
    first = dead.claim(T0)
    assert first is not None
    assert alive.claim(T0 + timedelta(seconds=10)) is None
    second = alive.claim(T0 + timedelta(seconds=31))
    assert second is not None and second.job_id == first.job_id and second.attempt == 2
    assert dead.renew(first, T0 + timedelta(seconds=32)) is False
    assert alive.renew(second, T0 + timedelta(seconds=32)) is True


def test_pause_and_resume_a_class(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 60)
    add_job(engine, "1.2", "inpatient", 600)
    scheduler = Scheduler(session_factory(engine), "node-a")
    scheduler.set_paused("outpatient", True, "it-admin")
    assert order(scheduler, T0) == ["1.2"]
    scheduler.set_paused("outpatient", False, "it-admin")
    assert order(scheduler, T0) == ["1.1"]
    with Session(engine) as s:
        actions = [a.action for a in s.scalars(select(AuditEvent).order_by(AuditEvent.id))]
    assert actions == ["pause_class", "resume_class"]


def test_raise_priority(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 1800)
    add_job(engine, "1.2", "inpatient", 300)
    scheduler = Scheduler(session_factory(engine), "node-a")
    assert scheduler.raise_priority("1.1", "urgent", "it-admin") is True
    assert scheduler.raise_priority("9.9", "urgent", "it-admin") is False
    assert order(scheduler, T0) == ["1.1", "1.2"]
    with Session(engine) as s:
        study = s.scalars(select(Study).where(Study.study_instance_uid == "1.1")).one()
        assert study.priority == "urgent"
        assert study.priority_reason == "raised from outpatient by it-admin"


def test_requeue_gives_the_job_back(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 60)
    scheduler = Scheduler(session_factory(engine), "node-a")
    claim = scheduler.claim(T0)
    assert claim is not None
    scheduler.requeue(claim, "daemon stopped")
    again = scheduler.claim(T0)
    assert again is not None and again.attempt == 2
    with Session(engine) as s:
        assert s.get(Job, claim.job_id).notes == ["daemon stopped"]  # type: ignore[union-attr]


def test_concurrent_claimers_never_claim_the_same_job(db_url: str, tmp_path: Path) -> None:
    """Two nodes on PostgreSQL (SKIP LOCKED), or a node's processor threads on SQLite."""
    import threading

    from imaging_ai.db.session import make_engine, upgrade

    engine = make_engine(db_url)
    upgrade(engine)
    for i in range(40):
        add_job(engine, f"1.{i}", "outpatient", 60 + i)
    claimed: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def node(name: str) -> None:
        scheduler = Scheduler(session_factory(engine), name)
        while (claim := scheduler.claim(T0)) is not None:
            claimed[name].append(claim.job_id)

    threads = [threading.Thread(target=node, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_ids = [job for jobs in claimed.values() for job in jobs]
    assert sorted(all_ids) == sorted(set(all_ids)) and len(all_ids) == 40
    engine.dispose()


def test_retry_failed_study(engine: Engine) -> None:
    add_job(engine, "1.1", "inpatient", 60)
    scheduler = Scheduler(session_factory(engine), "node-a")
    assert scheduler.retry_failed("1.1", T0) is False  # not failed
    claim = scheduler.claim(T0)
    assert claim is not None
    with Session(engine) as s, s.begin():
        job, study = s.get(Job, claim.job_id), s.get(Study, claim.study_id)
        assert job is not None and study is not None
        job.state, study.state, study.error = "failed", "failed", "boom"
    assert scheduler.retry_failed("1.1", T0 + timedelta(minutes=1)) is True
    again = scheduler.claim(T0 + timedelta(minutes=1))
    assert again is not None and again.job_id == claim.job_id
    assert again.deadline == T0 + timedelta(minutes=1, seconds=300)


def test_urgent_only_claims_leave_other_classes(engine: Engine) -> None:
    add_job(engine, "1.1", "outpatient", 10)
    add_job(engine, "1.2", "inpatient", 20)
    scheduler = Scheduler(session_factory(engine), "node-a")
    assert scheduler.claim(T0, urgent_only=True) is None
    add_job(engine, "1.3", "urgent", 60)
    claim = scheduler.claim(T0, urgent_only=True)
    assert claim is not None and claim.study_uid == "1.3"
