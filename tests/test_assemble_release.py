"""Assembly's release rule: a study completes soon after its senders released their associations,
and only then; the idle timers still decide for everything else (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pydicom
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.assemble import RELEASED, Assembler
from imaging_ai.catalog import Catalog
from imaging_ai.config import AssembleConfig, PriorityConfig
from imaging_ai.db.models import Instance, Series, Study
from imaging_ai.db.session import session_factory, utcnow
from imaging_ai.schedule import Scheduler
from imaging_ai.spool import Spool
from tests.conftest import wait_until
from tests.dicom_factory import ct_series
from tests.test_assemble import T0, at, meta, study_row
from tests.test_receive import associate, start_receiver

TIMING = AssembleConfig(series_idle_s=10, study_idle_s=20, force_complete_s=300)


@pytest.fixture
def catalog(engine: Engine, tmp_path: Path) -> Catalog:
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    return Catalog(engine, spool)


def assembler(engine: Engine, config: AssembleConfig = TIMING) -> Assembler:
    return Assembler(session_factory(engine), config, PriorityConfig(), started_at=T0)


def send(catalog: Catalog, sops: list[str], series: str, start_s: float) -> None:
    """One association's instances: the first counts the association as a sender."""
    for n, sop in enumerate(sops):
        catalog.record(meta(sop, series), sop, 1, at(start_s + n * 0.1), new_sender=n == 0)


def test_released_study_completes_after_the_grace(catalog: Catalog, engine: Engine) -> None:
    assemble = assembler(engine)
    send(catalog, ["1.4.1", "1.4.2"], "1.3.1", 0)
    catalog.record(meta("1.4.3", "1.3.2"), "c", 1, at(0.3))  # same association, second series
    assert assemble.tick(at(1)) == []  # still sending: nothing released
    catalog.released(["1.2"], at(1))
    assert assemble.tick(at(1.4)) == []  # within the 0.5-s grace
    assert assemble.tick(at(1.5)) == ["1.2"]
    study = study_row(engine)
    assert (study.state, study.completion_reason, study.completed_at) == (
        "queued",
        RELEASED,
        at(1.5),
    )
    with Session(engine) as s:
        assert {r.completed_at for r in s.scalars(select(Series))} == {at(1.5)}


def test_study_waits_for_every_sending_association(catalog: Catalog, engine: Engine) -> None:
    assemble = assembler(engine)
    send(catalog, ["1.4.1", "1.4.2"], "1.3.1", 0)  # association A
    send(catalog, ["1.4.3"], "1.3.2", 0.05)  # association B, at the same time
    catalog.released(["1.2"], at(1))  # A is done, B is still open
    assert assemble.tick(at(3)) == []
    assert study_row(engine).state == "receiving"
    catalog.record(meta("1.4.4", "1.3.2"), "d", 1, at(4))  # B goes on slowly
    catalog.released(["1.2"], at(4.5))
    assert assemble.tick(at(5)) == ["1.2"]


def test_instance_after_the_release_waits_for_its_own(catalog: Catalog, engine: Engine) -> None:
    assemble = assembler(engine)
    send(catalog, ["1.4.1"], "1.3.1", 0)
    catalog.released(["1.2"], at(1))
    send(catalog, ["1.4.2"], "1.3.2", 1.2)  # the next association, within the grace
    assert assemble.tick(at(1.6)) == []
    assert study_row(engine).senders == 1
    catalog.released(["1.2"], at(2))
    assert assemble.tick(at(2.5)) == ["1.2"]


def test_aborted_association_leaves_the_idle_timers(catalog: Catalog, engine: Engine) -> None:
    assemble = assembler(engine)
    send(catalog, ["1.4.1"], "1.3.1", 0)  # never released: aborted or cut off
    send(catalog, ["1.4.2"], "1.3.1", 1)  # another association, released
    catalog.released(["1.2"], at(2))
    assert assemble.tick(at(5)) == []
    assert assemble.tick(at(12)) == []  # series idle, study not yet
    assert assemble.tick(at(31.5)) == ["1.2"]
    assert study_row(engine).completion_reason == "idle"


def test_rule_off_leaves_the_idle_timers(catalog: Catalog, engine: Engine) -> None:
    assemble = assembler(engine, replace(TIMING, complete_on_release=False))
    send(catalog, ["1.4.1"], "1.3.1", 0)
    catalog.released(["1.2"], at(1))
    assert assemble.tick(at(5)) == []
    assert assemble.tick(at(11)) == []
    assert assemble.tick(at(30.5)) == ["1.2"]


def test_late_instance_after_release_completion_is_flagged(
    catalog: Catalog, engine: Engine
) -> None:
    assemble = assembler(engine)
    send(catalog, ["1.4.1"], "1.3.1", 0)
    catalog.released(["1.2"], at(1))
    assert assemble.tick(at(2)) == ["1.2"]
    assert catalog.record(meta("1.4.2", "1.3.2"), "b", 1, at(3), new_sender=True) is True
    catalog.released(["1.2"], at(3.5))  # no longer receiving: changes nothing
    study = study_row(engine)
    assert (study.state, study.late_instances, study.senders) == ("queued", 1, 0)
    with Session(engine) as s:
        late = s.scalars(select(Instance).where(Instance.sop_instance_uid == "1.4.2")).one()
    assert late.late


def test_release_wakes_the_assembler_and_it_wakes_the_claimers(
    catalog: Catalog, engine: Engine
) -> None:
    sessions = session_factory(engine)
    scheduler = Scheduler(sessions, "node-a:1")
    seen = scheduler.wakes
    config = replace(TIMING, poll_s=30.0, release_grace_s=0.2)
    wake = threading.Event()
    assemble = Assembler(
        sessions, config, PriorityConfig(), utcnow(), wake=wake, on_queued=scheduler.wake
    )
    assemble.start()
    try:
        now = utcnow()
        catalog.record(meta("1.4.1", "1.3.1"), "a", 1, now, new_sender=True)
        catalog.released(["1.2"], now)
        wake.set()  # what a receiver process does after the release (ReceiverPool.released)
        scheduler.wait_for_work(seen, 10.0)
        # Counted from the release's own time, which is what the grace runs from: the two
        # commits above can take a good part of the grace on a loaded machine.
        waited = (utcnow() - now).total_seconds()
    finally:
        assemble.stop()
    assert study_row(engine).completion_reason == RELEASED
    assert 0.19 < waited < 2.0  # the grace, not the 30-s poll
    assert scheduler.claim() is not None


def test_wait_for_work_times_out_without_a_wake(engine: Engine) -> None:
    scheduler = Scheduler(session_factory(engine), "node-a:1")
    started = time.monotonic()
    scheduler.wait_for_work(scheduler.wakes, 0.2)
    assert time.monotonic() - started >= 0.19
    seen = scheduler.wakes
    scheduler.wake()
    started = time.monotonic()
    scheduler.wait_for_work(seen, 5.0)  # a wake since `seen`: no wait
    assert time.monotonic() - started < 0.1


def _study(engine: Engine) -> Study:
    with Session(engine) as s:
        return s.scalars(select(Study)).one()


@pytest.mark.parametrize("how", ["release", "abort"])
def test_receiver_counts_senders_and_records_the_release(
    how: str, engine: Engine, tmp_path: Path
) -> None:
    receiver = start_receiver(engine, tmp_path)
    released: list[bool] = []
    receiver.release_observers.append(lambda: released.append(True))
    try:
        files = ct_series(tmp_path / "src", slices=3)
        assoc = associate(receiver.port)
        for path in files:
            assert assoc.send_c_store(pydicom.dcmread(path)).Status == 0  # type: ignore[attr-defined]
        before = datetime.now(UTC)
        assert _study(engine).senders == 1
        getattr(assoc, how)()
        if how == "release":
            wait_until(lambda: released)
            study = _study(engine)
            assert study.senders == 0
            assert study.released_at is not None
            assert before - timedelta(seconds=1) < study.released_at >= study.last_instance_at
        else:
            wait_until(lambda: receiver.active_associations() == 0)
            study = _study(engine)
            assert (study.senders, study.released_at, released) == (1, None, [])
    finally:
        receiver.stop()
