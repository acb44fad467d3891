"""The status page's spool figures (use, free space, days left, retention, last purge) and the
spool and purge metrics."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from imaging_ai.config import PriorityConfig
from imaging_ai.db.models import Instance, Purge, Series, Study
from imaging_ai.db.session import session_factory, utcnow
from imaging_ai.metrics import DaemonCollector
from imaging_ai.web import status
from imaging_ai.web.pages import size
from tests.web.conftest import BASE, make_app, sign_in
from tests.web.fakes import FakeActions

MIB = 2**20
NOW = utcnow()


def seed_spool(engine: Engine) -> None:
    """7 MiB received over the last 7 days, 1 MiB before, and a purged 5 MiB file; a purge."""
    with Session(engine) as s, s.begin():
        study = Study(
            study_instance_uid="1.2.7",
            state="done",
            received_at=NOW - timedelta(days=10),
            last_instance_at=NOW,
        )
        s.add(study)
        s.flush()
        series = Series(study_id=study.id, series_instance_uid="1.2.7.1", last_instance_at=NOW)
        s.add(series)
        s.flush()
        ages = [*range(7), 10]  # days
        for i, age in enumerate(ages):
            s.add(_instance(series.id, i, NOW - timedelta(days=age, hours=1), MIB))
        purge = Purge(
            study_id=study.id,
            node="node-a",
            started_at=NOW - timedelta(hours=2),
            finished_at=NOW - timedelta(hours=2),
            cutoff=NOW - timedelta(days=30),
            reason="done and untouched for over 30 day(s)",
            files=1,
            size_bytes=5 * MIB,
        )
        s.add(purge)
        s.flush()
        gone = _instance(series.id, 99, NOW - timedelta(days=40), 5 * MIB)
        gone.missing, gone.purge_id = True, purge.id
        s.add(gone)


def _instance(series_id: int, i: int, at: datetime, size_bytes: int) -> Instance:
    return Instance(
        series_id=series_id,
        sop_instance_uid=f"1.2.7.1.{i}",
        sop_class_uid="1.2.840.10008.5.1.4.1.1.2",
        transfer_syntax_uid="1.2.840.10008.1.2.1",
        path=f"1.2.7/1.2.7.1/1.2.7.1.{i}.dcm",
        size_bytes=size_bytes,
        received_at=at,
    )


@pytest.mark.parametrize(
    ("retention_days", "days_left", "levels_off"),
    [
        (0, 70.0, False),  # no retention: 70 MiB of headroom at 1 MiB a day
        (30, None, True),  # at most 30 MiB held, 8 there: it never fills
        (100, 70.0, False),  # it would hold 100 MiB: fills first
    ],
)
def test_spool_figures(
    engine: Engine, retention_days: int, days_left: float | None, levels_off: bool
) -> None:
    seed_spool(engine)
    with Session(engine) as s:
        use = status.spool_use(s, NOW, 100 * MIB, 30 * MIB, retention_days)
    assert (use.size_bytes, use.files) == (8 * MIB, 8), "purged files are not counted"
    assert use.intake_bytes_per_day == pytest.approx(MIB)
    assert use.headroom_bytes == 70 * MIB
    assert use.levels_off is levels_off
    assert use.days_left == (pytest.approx(days_left) if days_left else None)
    assert use.last_purge is not None and use.last_purge.files == 1


def test_days_left_needs_intake_and_a_readable_disk(engine: Engine) -> None:
    with Session(engine) as s:
        assert status.spool_use(s, NOW, 100 * MIB, 0, 0).days_left is None  # nothing arrives
    seed_spool(engine)
    with Session(engine) as s:
        assert status.spool_use(s, NOW, None, 0, 0).days_left is None


def test_the_status_page_shows_the_spool(engine: Engine, tmp_path: Path) -> None:
    seed_spool(engine)
    (tmp_path / "spool").mkdir()
    app = make_app(engine, FakeActions(session_factory(engine)), data_dir=tmp_path)
    client = TestClient(app, base_url=BASE)
    assert sign_in(client).status_code == 303
    html = client.get("/admin").text
    free = shutil.disk_usage(tmp_path / "spool").free
    for words in (
        "Spool",
        "8.0 MiB in 8 files",
        f"{size(free)}",
        "1.0 MiB a day (last 7 days)",
        "levels off",  # retention 30 days by default: 30 MiB at most
        "30 days after a study is done or failed",
        "1 files, 5.0 MiB on node-a",
    ):
        assert words in html, words


def test_the_study_page_says_its_images_were_deleted(engine: Engine, tmp_path: Path) -> None:
    seed_spool(engine)
    client = TestClient(make_app(engine, FakeActions(session_factory(engine))), base_url=BASE)
    assert sign_in(client).status_code == 303
    html = client.get("/admin/studies/1.2.7").text
    assert "1 files (5.0 MiB) deleted by retention" in html
    assert "Send the study again from PACS" in html


def test_metrics_expose_spool_and_purges(engine: Engine) -> None:
    seed_spool(engine)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(session_factory(engine), PriorityConfig(), lambda: {}))
    text = generate_latest(registry).decode()
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples["imaging_ai_spool_bytes"] == 8 * MIB
    assert samples["imaging_ai_spool_files"] == 8
    assert samples["imaging_ai_purged_files_total"] == 1
    assert samples["imaging_ai_purged_bytes_total"] == 5 * MIB
