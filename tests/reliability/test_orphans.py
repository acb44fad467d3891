"""A restarted node takes back at once the jobs its killed process held, not waiting out their
leases; jobs of live processes and of other nodes keep theirs. The outbox's send lease follows
storage.job_lease_s, so a delivery a killed process held comes back as soon as a job would."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from imaging_ai.config import Config, OutputsConfig, PacsDestination, StorageConfig
from imaging_ai.db.models import Delivery, Job, Study
from imaging_ai.db.session import make_engine, session_factory, upgrade, utcnow
from imaging_ai.outbox import Outbox, Payload
from imaging_ai.schedule import Scheduler


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_requeue_orphans_takes_back_only_jobs_of_a_dead_process_of_this_node(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    upgrade(engine)
    now = utcnow()
    holders = {
        "dead here": f"ward-3:{dead_pid()}",
        "alive here": f"ward-3:{os.getppid()}",
        "other node": f"ward-4:{dead_pid()}",
        "name prefix": f"ward-3x:{dead_pid()}",
    }
    with Session(engine) as s, s.begin():
        for i, node in enumerate(holders.values()):
            study = Study(
                study_instance_uid=f"1.2.{i}",
                state="processing",
                received_at=now,
                last_instance_at=now,
            )
            s.add(study)
            s.flush()
            s.add(
                Job(
                    study_id=study.id,
                    state="processing",
                    priority="urgent",
                    rank=0,
                    deadline=now,
                    created_at=now,
                    node=node,
                    lease_until=now + timedelta(minutes=2),
                )
            )
    scheduler = Scheduler(session_factory(engine), f"ward-3:{os.getpid()}")
    assert scheduler.requeue_orphans() == 1
    with Session(engine) as s:
        states = {
            uid: (job_state, study_state)
            for uid, job_state, study_state in s.execute(
                select(Study.study_instance_uid, Job.state, Study.state).join(
                    Job, Job.study_id == Study.id
                )
            )
        }
    assert states == {
        "1.2.0": ("queued", "queued"),
        "1.2.1": ("processing", "processing"),
        "1.2.2": ("processing", "processing"),
        "1.2.3": ("processing", "processing"),
    }
    claim = scheduler.claim()
    assert claim is not None and claim.study_uid == "1.2.0"
    engine.dispose()


def test_send_lease_follows_the_job_lease(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    default = Outbox(session_factory(engine), Config(), tmp_path)
    assert default.send_lease == timedelta(seconds=180)  # as before the lease was configurable
    short = Config(storage=StorageConfig(job_lease_s=10.0))
    assert Outbox(session_factory(engine), short, tmp_path).send_lease == timedelta(seconds=15)
    engine.dispose()


def test_a_claimed_delivery_holds_its_send_lease_in_the_database(tmp_path: Path) -> None:
    """Two nodes (or a restarted one) must not take a row another is sending: the lease has to
    be in the database, not only on the claiming process's copy of the row."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    upgrade(engine)
    config = Config(
        storage=StorageConfig(job_lease_s=10.0),
        outputs=OutputsConfig(pacs=(PacsDestination("PACS", "127.0.0.1", 104),)),
    )
    outbox = Outbox(session_factory(engine), config, tmp_path)
    (tmp_path / "seg.dcm").write_bytes(b"")
    now = utcnow()
    with Session(engine) as s, s.begin():
        study = Study(
            study_instance_uid="1.2.9", state="processing", received_at=now, last_instance_at=now
        )
        s.add(study)
        s.flush()
        outbox.enqueue(s, study, [Payload("seg", tmp_path / "seg.dcm", "1.2.9.1")], now)
    claimed_at = utcnow()
    assert len(outbox._claim_due(claimed_at)) == 1
    other_node = Outbox(session_factory(engine), config, tmp_path)
    assert other_node._claim_due(claimed_at + timedelta(seconds=14)) == []
    with Session(engine) as s:
        [lease] = s.scalars(select(Delivery.next_try_at)).all()
    assert lease.replace(tzinfo=UTC) == claimed_at + timedelta(seconds=15)
    assert len(other_node._claim_due(claimed_at + timedelta(seconds=16))) == 1  # sender died
    engine.dispose()
