"""Assembly timing and priority rules on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.assemble import Assembler, classify
from imaging_ai.catalog import Catalog, InstanceMeta
from imaging_ai.config import DEFAULT_RULES, AssembleConfig, PriorityConfig, PriorityRule
from imaging_ai.db.models import Job, Series, Study
from imaging_ai.db.session import session_factory
from imaging_ai.spool import Spool

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
TIMING = AssembleConfig(series_idle_s=10, study_idle_s=20, force_complete_s=300)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def meta(
    sop: str,
    series: str,
    study: str = "1.2",
    routing: dict[str, str] | None = None,
    calling_ae: str = "PACS",
) -> InstanceMeta:
    return InstanceMeta(
        study,
        series,
        sop,
        "1.2.840.10008.5.1.4.1.1.2",
        "1.2.840.10008.1.2.1",
        calling_ae=calling_ae,
        routing=routing or {},
    )


@pytest.fixture
def parts(engine: Engine, tmp_path: Path) -> tuple[Catalog, Assembler]:
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    assembler = Assembler(session_factory(engine), TIMING, PriorityConfig(), started_at=T0)
    return Catalog(engine, spool), assembler


def study_row(engine: Engine, uid: str = "1.2") -> Study:
    with Session(engine) as s:
        return s.scalars(select(Study).where(Study.study_instance_uid == uid)).one()


def test_series_then_study_complete_after_idle(
    parts: tuple[Catalog, Assembler], engine: Engine
) -> None:
    catalog, assembler = parts
    catalog.record(meta("1.4.1", "1.3.1"), "a", 1, at(0))
    catalog.record(meta("1.4.2", "1.3.2"), "b", 1, at(5))
    assert assembler.tick(at(12)) == []  # series 1 idle, series 2 not yet
    with Session(engine) as s:
        done = {r.series_instance_uid: r.completed_at for r in s.scalars(select(Series))}
    assert done == {"1.3.1": at(12), "1.3.2": None}
    assert assembler.tick(at(16)) == []  # both series complete, study idle only 11 s
    assert study_row(engine).state == "receiving"
    assert assembler.tick(at(25.5)) == ["1.2"]
    study = study_row(engine)
    assert study.state == "queued"
    assert study.completed_at == at(25.5)
    assert study.completion_reason == "idle"
    assert study.priority == "outpatient"
    assert study.deadline == at(25.5 + 1800)
    assert assembler.tick(at(100)) == []


def test_new_instance_reopens_series(parts: tuple[Catalog, Assembler], engine: Engine) -> None:
    catalog, assembler = parts
    catalog.record(meta("1.4.1", "1.3.1"), "a", 1, at(0))
    assembler.tick(at(11))
    catalog.record(meta("1.4.2", "1.3.1"), "b", 1, at(15))
    assert assembler.tick(at(21)) == []
    with Session(engine) as s:
        assert s.scalars(select(Series)).one().completed_at is None
    assert assembler.tick(at(36)) == ["1.2"]


def test_force_complete_cap(parts: tuple[Catalog, Assembler], engine: Engine) -> None:
    catalog, assembler = parts
    for i in range(0, 310, 5):  # a sender that never pauses long enough
        catalog.record(meta(f"1.4.{i}", "1.3.1"), "a", 1, at(i))
        if i < 300:
            assert assembler.tick(at(i + 1)) == []
    assert assembler.tick(at(301)) == ["1.2"]
    assert study_row(engine).completion_reason == "force_complete_s reached"


def test_idle_clock_restarts_with_the_process(engine: Engine, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 0)
    Catalog(engine, spool).record(meta("1.4.1", "1.3.1"), "a", 1, at(0))
    # The daemon restarts an hour later: the study gets a full idle window again.
    timing = AssembleConfig(series_idle_s=10, study_idle_s=20, force_complete_s=7200)
    later = Assembler(session_factory(engine), timing, PriorityConfig(), started_at=at(3600))
    assert later.tick(at(3605)) == []
    assert later.tick(at(3611)) == []
    assert later.tick(at(3621)) == ["1.2"]


def test_late_instance_after_completion(parts: tuple[Catalog, Assembler], engine: Engine) -> None:
    catalog, assembler = parts
    catalog.record(meta("1.4.1", "1.3.1"), "a", 1, at(0))
    assembler.tick(at(31))
    assert catalog.record(meta("1.4.2", "1.3.1"), "b", 1, at(40)) is True
    assert study_row(engine).late_instances == 1
    assert study_row(engine).state == "queued"


def test_completion_creates_job_with_rank_and_deadline(
    parts: tuple[Catalog, Assembler], engine: Engine
) -> None:
    catalog, assembler = parts
    catalog.record(
        meta("1.4.1", "1.3.1", "1.2.1", {"RequestedProcedurePriority": "STAT"}), "a", 1, at(0)
    )
    catalog.record(meta("1.4.2", "1.3.2", "1.2.2", {"AdmissionID": "ADM1"}), "b", 1, at(0))
    catalog.record(meta("1.4.3", "1.3.3", "1.2.3"), "c", 1, at(0))
    assert sorted(assembler.tick(at(31))) == ["1.2.1", "1.2.2", "1.2.3"]
    with Session(engine) as s:
        jobs = {j.priority: j for j in s.scalars(select(Job))}
    assert jobs["urgent"].rank < jobs["inpatient"].rank == jobs["outpatient"].rank
    assert jobs["urgent"].deadline == at(31 + 60)
    assert jobs["inpatient"].deadline == at(31 + 300)
    assert study_row(engine, "1.2.1").priority_reason == "RequestedProcedurePriority = STAT"


def test_admin_force_complete(parts: tuple[Catalog, Assembler], engine: Engine) -> None:
    catalog, assembler = parts
    catalog.record(meta("1.4.1", "1.3.1"), "a", 1, at(0))
    assert assembler.force_complete("1.2", at(1)) is True
    assert study_row(engine).completion_reason == "forced by an administrator"
    assert assembler.force_complete("1.2", at(2)) is False
    assert assembler.force_complete("9.9", at(2)) is False


@pytest.mark.parametrize(
    ("routing", "calling_ae", "expected"),
    [
        ({"RequestedProcedurePriority": "STAT"}, "PACS", "urgent"),
        ({"RequestedProcedurePriority": "high"}, "PACS", "urgent"),
        ({"RequestedProcedurePriority": "ROUTINE", "AdmissionID": "A7"}, "PACS", "inpatient"),
        ({"CurrentPatientLocation": "WARD 5B"}, "PACS", "inpatient"),
        ({"RequestedProcedurePriority": "ROUTINE"}, "PACS", "outpatient"),
        ({}, "PACS", "outpatient"),
    ],
)
def test_default_rules(routing: dict[str, str], calling_ae: str, expected: str) -> None:
    assert classify(routing, calling_ae, DEFAULT_RULES).priority == expected


def test_configured_rules_by_calling_ae_and_order() -> None:
    rules = (
        PriorityRule("urgent", calling_ae=("ER_CT",)),
        PriorityRule("inpatient", tag="AdmissionID", present=True, calling_ae=("WARD_CT",)),
        *DEFAULT_RULES,
    )
    assert classify({}, "ER_CT", rules).priority == "urgent"
    assert classify({}, "ER_CT", rules).reason == "calling AE ER_CT"
    assert classify({"AdmissionID": "1"}, "WARD_CT", rules).priority == "inpatient"
    assert classify({}, "WARD_CT", rules).priority == "outpatient"
