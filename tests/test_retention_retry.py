"""A purged study asked to run again: the admin retry and the processor say the images are gone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from imaging_ai_devkit.bench.harness import free_port
from sqlalchemy import select
from sqlalchemy.orm import Session

from imaging_ai import pipeline
from imaging_ai.config import load_config
from imaging_ai.db.models import AuditEvent, Job, Study
from imaging_ai.db.session import session_factory, upgrade
from imaging_ai.process import Processor
from imaging_ai.retention import Retention
from imaging_ai.schedule import Scheduler
from imaging_ai.states import JobState, StudyState
from tests.test_retention import DAYS, LATER, seed_study


def _daemon(tmp_path: Path) -> pipeline.Daemon:
    path = tmp_path / "daemon.toml"
    path.write_text(
        f"[dicom]\nport = {free_port()}\n[http]\nport = {free_port()}\n"
        f'[storage]\ndata_dir = "{tmp_path / "data"}"\nmin_free_mb = 0\nnode_name = "node-a"\n'
    )
    (tmp_path / "data").mkdir()
    daemon = pipeline.Daemon(load_config(path))
    upgrade(daemon.engine)
    daemon.spool.prepare()
    return daemon


def _study(daemon: pipeline.Daemon, uid: str) -> Study:
    with Session(daemon.engine) as s:
        return s.scalars(select(Study).where(Study.study_instance_uid == uid)).one()


def test_the_admin_retry_of_a_purged_study_says_its_images_are_gone(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    purged = seed_study(daemon.engine, daemon.spool, 1, StudyState.FAILED)
    Retention(daemon.sessions, daemon.spool, DAYS, clock=lambda: LATER).run_once()
    kept = seed_study(daemon.engine, daemon.spool, 2, StudyState.FAILED)  # received since
    assert daemon.retry_study(purged.study_uid, "it") is False
    study = _study(daemon, purged.study_uid)
    assert study.state == StudyState.FAILED
    assert "deleted by retention" in study.error
    assert "send the study again from PACS" in study.error
    with Session(daemon.engine) as s:
        event = s.scalars(
            select(AuditEvent).where(
                AuditEvent.action == "retry_study", AuditEvent.target == purged.study_uid
            )
        ).one()
        assert event.detail.startswith("not retried: its images")
    # A failed study whose files are there is retried as before.
    assert daemon.retry_study(kept.study_uid, "it") is True
    assert _study(daemon, kept.study_uid).state == StudyState.QUEUED
    daemon.engine.dispose()


def test_a_purged_study_that_reaches_the_processor_fails_saying_why(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    purged = seed_study(daemon.engine, daemon.spool, 1)
    Retention(daemon.sessions, daemon.spool, DAYS, clock=lambda: LATER).run_once()
    # Queued again by some other way (a re-analysis): its job is claimed.
    with Session(daemon.engine) as s, s.begin():
        study = s.scalars(select(Study)).one()
        job = s.scalars(select(Job)).one()
        study.state, job.state, job.finished_at = StudyState.QUEUED, JobState.QUEUED, None
    sessions = session_factory(daemon.engine)
    scheduler = Scheduler(sessions, "node-a:1")
    engines: Any = SimpleNamespace()
    processor = Processor(sessions, scheduler, engines, daemon.config, outbox=daemon.outbox)
    claim = scheduler.claim()
    assert claim is not None
    processor._process(claim)
    study = _study(daemon, purged.study_uid)
    assert study.state == StudyState.FAILED
    assert study.error.startswith("not analysed: its images (3 instance file(s)) were deleted")
    daemon.engine.dispose()
