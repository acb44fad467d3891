"""Retention on a test clock, on SQLite and PostgreSQL: what it deletes and what it leaves."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.orm import Session

from imaging_ai.catalog import Catalog, InstanceMeta
from imaging_ai.db.models import AuditEvent, Delivery, Instance, Job, Purge, Report, Study
from imaging_ai.db.session import alembic_config, session_factory, utcnow
from imaging_ai.retention import Retention, images_gone
from imaging_ai.spool import DISCARD_PREFIX, Spool
from imaging_ai.states import DeliveryState, JobState, StudyState

DAYS = 30
# Rows and files are made now; the retention clock is moved past or short of the cutoff.
BASE = utcnow()
LATER = BASE + timedelta(days=DAYS + 10)
SOONER = BASE + timedelta(days=DAYS - 10)
CT = "1.2.840.10008.5.1.4.1.1.2"
FILES = 3
SIZE = 100


@dataclass(frozen=True)
class Seeded:
    study_uid: str
    paths: list[str]


def node_spool(root: Path, node: str = "node-a") -> Spool:
    spool = Spool(root, 0, node)
    spool.prepare()
    return spool


def seed_study(
    engine: Engine,
    spool: Spool,
    n: int,
    state: StudyState = StudyState.DONE,
    job_state: JobState | None = None,
    delivery: DeliveryState = DeliveryState.DONE,
) -> Seeded:
    """A study of FILES instances received at BASE, ended (or not) at BASE."""
    study, series = f"1.2.9.{n}", f"1.2.9.{n}.1"
    catalog = Catalog(engine, spool)
    paths = []
    for i in range(FILES):
        sop = f"1.2.9.{n}.1.{i}"
        stored = spool.store(b"x" * SIZE, study, series, sop)
        meta = InstanceMeta(study, series, sop, CT, "1.2.840.10008.1.2.1")
        catalog.record(meta, stored.relative, stored.size_bytes, BASE)
        paths.append(stored.relative)
    job_state = job_state or (JobState.FAILED if state == StudyState.FAILED else JobState.DONE)
    with Session(engine) as s, s.begin():
        row = s.scalars(select(Study).where(Study.study_instance_uid == study)).one()
        row.state, row.completed_at = state, BASE
        if state == StudyState.FAILED:
            row.error = "The CT series has no axial slices the lung model can use."
        if state == StudyState.RECEIVING:
            return Seeded(study, paths)
        finished = BASE if job_state in (JobState.DONE, JobState.FAILED) else None
        job = Job(
            study_id=row.id,
            state=job_state,
            priority="outpatient",
            rank=1,
            deadline=BASE,
            created_at=BASE,
            finished_at=finished,
        )
        s.add(job)
        s.flush()
        if job_state == JobState.DONE:
            s.add(Report(study_id=row.id, job_id=job.id, created_at=BASE))
            s.add(
                Delivery(
                    study_id=row.id,
                    kind="seg",
                    destination="PACS",
                    payload="results/x/seg.dcm",
                    state=delivery,
                    next_try_at=BASE,
                    created_at=BASE,
                    delivered_at=BASE if delivery == DeliveryState.DONE else None,
                )
            )
    return Seeded(study, paths)


def retention(engine: Engine, spool: Spool, now: datetime, days: int = DAYS) -> Retention:
    return Retention(session_factory(engine), spool, days, clock=lambda: now)


def instances(engine: Engine, study_uid: str) -> list[Instance]:
    with Session(engine) as s:
        study = s.scalars(select(Study).where(Study.study_instance_uid == study_uid)).one()
        return list(
            s.scalars(
                select(Instance).where(Instance.series.has(study_id=study.id)).order_by(Instance.id)
            )
        )


def on_disk(spool: Spool, seeded: Seeded) -> list[bool]:
    return [spool.exists(p) for p in seeded.paths]


def test_a_done_study_older_than_retention_is_purged(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    old = seed_study(engine, spool, 1)
    result = retention(engine, spool, LATER).run_once()
    assert (result.studies, result.files, result.size_bytes) == (1, FILES, FILES * SIZE)
    assert on_disk(spool, old) == [False] * FILES
    rows = instances(engine, old.study_uid)
    assert len(rows) == FILES, "the instance rows are kept"
    assert all(r.missing and r.purge_id is not None for r in rows)
    with Session(engine) as s:
        purge = s.scalars(select(Purge)).one()
        assert (purge.files, purge.size_bytes, purge.node) == (FILES, FILES * SIZE, "node-a")
        assert purge.finished_at == LATER and purge.started_at == LATER
        assert purge.cutoff == LATER - timedelta(days=DAYS)
        assert s.scalar(select(func.count(Report.id))) == 1, "the report is kept"
        study = s.scalars(select(Study)).one()
        assert study.state == StudyState.DONE and study.error == ""
        event = s.scalars(select(AuditEvent).where(AuditEvent.action == "purge")).one()
        assert event.target == old.study_uid and f"{FILES} file(s)" in event.detail
    # A second pass finds nothing more to do.
    assert retention(engine, spool, LATER).run_once().studies == 0


def test_a_study_within_retention_is_kept(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    young = seed_study(engine, spool, 1)
    assert retention(engine, spool, SOONER).run_once().studies == 0
    assert on_disk(spool, young) == [True] * FILES
    assert not any(r.missing for r in instances(engine, young.study_uid))


@pytest.mark.parametrize(
    ("state", "job_state", "delivery"),
    [
        (StudyState.RECEIVING, None, DeliveryState.DONE),
        (StudyState.QUEUED, JobState.QUEUED, DeliveryState.DONE),  # also: awaiting a retry
        (StudyState.PROCESSING, JobState.PROCESSING, DeliveryState.DONE),
        (StudyState.DELIVERING, JobState.DONE, DeliveryState.PENDING),
        # done, but a delivery still pending (a re-delivery asked for): left alone as well
        (StudyState.DONE, JobState.DONE, DeliveryState.PENDING),
    ],
)
def test_a_study_in_flight_is_kept_however_old(
    engine: Engine,
    tmp_path: Path,
    state: StudyState,
    job_state: JobState | None,
    delivery: DeliveryState,
) -> None:
    spool = node_spool(tmp_path / "spool")
    busy = seed_study(engine, spool, 1, state, job_state, delivery)
    assert retention(engine, spool, LATER).run_once().studies == 0
    assert on_disk(spool, busy) == [True] * FILES
    with Session(engine) as s:
        assert s.scalar(select(func.count(Purge.id))) == 0


def test_a_failed_study_is_purged_only_when_not_retried(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    failed = seed_study(engine, spool, 1, StudyState.FAILED)
    retried = seed_study(engine, spool, 2, StudyState.QUEUED, JobState.QUEUED)
    # Retried 5 days ago and failed again: its clock starts again from that failure.
    failed_again = seed_study(engine, spool, 3, StudyState.FAILED)
    with Session(engine) as s, s.begin():
        job = s.scalars(
            select(Job)
            .join(Study, Study.id == Job.study_id)
            .where(Study.study_instance_uid == failed_again.study_uid)
        ).one()
        job.finished_at = LATER - timedelta(days=5)
    assert retention(engine, spool, LATER).run_once().studies == 1
    assert on_disk(spool, failed) == [False] * FILES
    assert on_disk(spool, retried) == [True] * FILES
    assert on_disk(spool, failed_again) == [True] * FILES
    with Session(engine) as s:
        study = s.scalars(select(Study).where(Study.study_instance_uid == failed.study_uid)).one()
        # The record says the images are gone, after the reason it failed.
        assert study.error.startswith("The CT series has no axial slices")
        assert "deleted by retention" in study.error
        assert "send the study again from PACS" in study.error


def test_retention_days_0_keeps_everything(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    done = seed_study(engine, spool, 1)
    failed = seed_study(engine, spool, 2, StudyState.FAILED)
    far = BASE + timedelta(days=36500)
    assert retention(engine, spool, far, days=0).run_once().studies == 0
    assert on_disk(spool, done) + on_disk(spool, failed) == [True] * (2 * FILES)


@pytest.mark.parametrize("shared", [True, False], ids=["one spool", "a spool each"])
def test_the_other_nodes_files_are_not_touched(
    engine: Engine, tmp_path: Path, shared: bool
) -> None:
    spool_a = node_spool(tmp_path / "spool-a", "node-a")
    spool_b = node_spool(tmp_path / ("spool-a" if shared else "spool-b"), "node-b")
    of_a = seed_study(engine, spool_a, 1)
    of_b = seed_study(engine, spool_b, 2)
    assert retention(engine, spool_a, LATER).run_once().studies == 1
    assert on_disk(spool_a, of_a) == [False] * FILES
    assert on_disk(spool_b, of_b) == [True] * FILES
    assert not any(r.missing or r.purge_id for r in instances(engine, of_b.study_uid))
    # Node b's own pass then deletes its files.
    assert retention(engine, spool_b, LATER).run_once().files == FILES
    assert on_disk(spool_b, of_b) == [False] * FILES


def test_rows_from_before_node_ownership_go_to_the_node_holding_the_file(
    engine: Engine, tmp_path: Path
) -> None:
    spool_a = node_spool(tmp_path / "spool-a", "node-a")
    spool_b = node_spool(tmp_path / "spool-b", "node-b")
    legacy = seed_study(engine, spool_b, 1)
    with Session(engine) as s, s.begin():
        for row in s.scalars(select(Instance)):
            row.node = ""
    assert retention(engine, spool_a, LATER).run_once().studies == 0
    assert not any(r.missing for r in instances(engine, legacy.study_uid))
    assert retention(engine, spool_b, LATER).run_once().files == FILES
    assert on_disk(spool_b, legacy) == [False] * FILES


def test_a_study_sent_again_after_its_purge_has_new_files(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    study = seed_study(engine, spool, 1)
    retention(engine, spool, LATER).run_once()
    with Session(engine) as s:
        study_id = s.scalars(select(Study.id)).one()
        assert "3 instance file(s)" in images_gone(s, study_id)
    # PACS sends one instance again: a new file and a row no longer purged.
    catalog = Catalog(engine, spool)
    stored = spool.store(b"y" * SIZE, study.study_uid, "1.2.9.1.1", "1.2.9.1.1.0")
    meta = InstanceMeta(study.study_uid, "1.2.9.1.1", "1.2.9.1.1.0", CT, "1.2.840.10008.1.2.1")
    catalog.record(meta, stored.relative, stored.size_bytes, LATER)
    rows = instances(engine, study.study_uid)
    assert (rows[0].missing, rows[0].purge_id) == (False, None)
    with Session(engine) as s:
        # Two instances are still gone: the study is not analysed on a third of itself.
        assert "2 instance file(s)" in images_gone(s, study_id)
    # The new file is within retention (received now): the next pass leaves it.
    assert retention(engine, spool, LATER).run_once().studies == 0
    assert spool.exists(stored.relative)


def test_a_purge_interrupted_after_marking_is_finished_by_the_next_pass(
    engine: Engine, tmp_path: Path
) -> None:
    spool = node_spool(tmp_path / "spool")
    study = seed_study(engine, spool, 1)
    crashed = retention(engine, spool, LATER)
    with Session(engine) as s:
        study_id = s.scalars(select(Study.id)).one()
    # Step 1 only, then one file deleted, as if the process died in step 2.
    purge_id = crashed._mark(study_id, LATER, LATER - timedelta(days=DAYS))
    assert purge_id is not None
    spool.discard(study.paths[0], LATER.timestamp())
    # Consistent meanwhile: every row whose file may be gone already says so.
    assert all(r.missing for r in instances(engine, study.study_uid))
    with Session(engine) as s:
        assert s.get(Purge, purge_id).finished_at is None  # type: ignore[union-attr]
    result = retention(engine, spool, LATER).run_once()
    assert (result.studies, result.files) == (1, FILES)  # counted with the one deleted before
    assert on_disk(spool, study) == [False] * FILES
    with Session(engine) as s:
        purge = s.scalars(select(Purge)).one()
        assert purge.finished_at == LATER and purge.files == FILES


def test_a_copy_written_while_its_purge_runs_is_kept(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    study = seed_study(engine, spool, 1)
    job = retention(engine, spool, LATER)
    with Session(engine) as s:
        study_id = s.scalars(select(Study.id)).one()
    purge_id = job._mark(study_id, LATER, LATER - timedelta(days=DAYS))
    assert purge_id is not None
    # Between mark and delete, PACS sends the first instance again: its file is new.
    fresh = spool.root / study.paths[0]
    fresh.write_bytes(b"z" * SIZE)
    os.utime(fresh, (LATER.timestamp(), LATER.timestamp()))
    result = job._finish(purge_id, LATER)
    assert on_disk(spool, study) == [True, False, False]
    assert fresh.read_bytes() == b"z" * SIZE
    assert result.files == FILES - 1


def test_a_file_taken_for_deletion_when_the_process_died_is_put_back_or_deleted(
    engine: Engine, tmp_path: Path
) -> None:
    spool = node_spool(tmp_path / "spool")
    study = seed_study(engine, spool, 1)
    job = retention(engine, spool, LATER)
    with Session(engine) as s:
        study_id = s.scalars(select(Study.id)).one()
    assert job._mark(study_id, LATER, LATER - timedelta(days=DAYS)) is not None
    # The process died between discard's rename and its unlink, for two files: one old,
    # one a copy received again just then.
    taken = [spool.tmp_dir / (DISCARD_PREFIX + p.replace("/", "_")) for p in study.paths[:2]]
    for path, dest in zip(study.paths[:2], taken, strict=True):
        os.rename(spool.root / path, dest)
    os.utime(taken[1], (LATER.timestamp(), LATER.timestamp()))
    spool.prepare()  # a restart keeps them for retention
    assert all(t.exists() for t in taken)
    retention(engine, spool, LATER).run_once()
    assert not any(t.exists() for t in taken)
    assert on_disk(spool, study) == [False, True, False]


def test_spool_prepare_still_drops_unfinished_writes(tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    (spool.tmp_dir / "abc.part").write_bytes(b"x")
    spool.prepare()
    assert list(spool.tmp_dir.iterdir()) == []


def test_migration_0006_goes_down_and_up_again(engine: Engine, tmp_path: Path) -> None:
    spool = node_spool(tmp_path / "spool")
    seed_study(engine, spool, 1)
    config = alembic_config(engine)
    command.downgrade(config, "0005")
    assert "purges" not in inspect(engine).get_table_names()
    command.upgrade(config, "head")
    with Session(engine) as s:
        assert {r.node for r in s.scalars(select(Instance))} == {""}
    # Rows without a node are purged by the node whose spool holds their files.
    assert retention(engine, spool, LATER).run_once().files == FILES
