"""/metrics: the exposition parses, has every family, counts from the database, and leaks
no patient data; histograms of finished work grow incrementally."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from imaging_ai.config import PriorityConfig
from imaging_ai.db.session import session_factory, utcnow
from imaging_ai.metrics import CATALOGUE, DaemonCollector
from tests.web.conftest import LIVE
from tests.web.seed import Seeded, add_job, add_study


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_exposition_has_every_family_and_the_right_counts(
    client: TestClient, seeded: Seeded
) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert (
        "DOE" not in response.text
        and "ACC-" not in response.text
        and "1.2.826" not in response.text
    )
    names = {f.name for f in text_string_to_metric_families(response.text)}
    assert {f"imaging_ai_{n}" for n in CATALOGUE} <= names
    got = samples(response.text)
    expect = {
        ("imaging_ai_studies", (("state", "failed"),)): 1,
        ("imaging_ai_studies", (("state", "receiving"),)): 1,
        ("imaging_ai_queue_depth", (("priority", "outpatient"),)): 1,
        ("imaging_ai_queue_depth", (("priority", "urgent"),)): 0,
        ("imaging_ai_late_instances_total", ()): 2,
        ("imaging_ai_deliveries", (("state", "cancelled"),)): 1,
        ("imaging_ai_deliveries_failing", (("destination", "pacs:PACS@10.0.0.5:104"),)): 1,
        ("imaging_ai_deadline_misses_total", (("priority", "urgent"),)): 1,
        ("imaging_ai_jobs_finished_total", (("outcome", "failed"), ("priority", "inpatient"))): 1,
        ("imaging_ai_turnaround_seconds_count", (("priority", "inpatient"),)): 1,
        ("imaging_ai_turnaround_seconds_sum", (("priority", "inpatient"),)): 60,
        ("imaging_ai_stage_seconds_count", (("priority", "inpatient"), ("stage", "deliver"))): 1,
        ("imaging_ai_analysis_step_seconds_sum", (("step", "lung-seg"),)): 36,
        ("imaging_ai_sla_seconds", (("priority", "urgent"),)): 60,
        ("imaging_ai_associations_refused_total", ()): 1,
        (
            "imaging_ai_worker_busy_ratio",
            (("backend", "onnxruntime-cuda"), ("device", "cuda:0")),
        ): 0.42,
        ("imaging_ai_engine_fallbacks_total", (("device", "cuda:0"),)): 1,
        ("imaging_ai_batch_size_count", (("device", "cuda:0"),)): 13,
        ("imaging_ai_batch_size_sum", (("device", "cuda:0"),)): 8 * 10 + 16 * 3,
        ("imaging_ai_database_up", ()): 1,
    }
    for key, value in expect.items():
        assert got.get(key) == value, key
    assert got["imaging_ai_queue_oldest_wait_seconds", (("priority", "outpatient"),)] > 500


def test_finished_work_is_counted_once(engine: Engine, seeded: Seeded) -> None:
    clock = [utcnow()]
    collector = DaemonCollector(
        session_factory(engine), PriorityConfig(), lambda: LIVE, clock=lambda: clock[0]
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    key = ("imaging_ai_turnaround_seconds_count", (("priority", "urgent"),))

    def scrape() -> float:
        return samples(generate_latest(registry).decode())[key]

    assert scrape() == 1 and scrape() == 1  # the seeded missed study, not counted twice
    with Session(engine) as s, s.begin():
        study = add_study(s, "1.2.826.0.1.99", "done", "urgent", age_s=5)
        assert study.completed_at is not None
        job = add_job(s, study, "done", study.completed_at)
        job.finished_at = clock[0]
    assert scrape() == 1  # finished just now: left for the next scrape, in case of commits
    clock[0] += timedelta(seconds=31)
    assert scrape() == 2 and scrape() == 2


def test_database_down_is_reported(tmp_path: Path) -> None:
    broken = create_engine(f"sqlite:///{tmp_path / 'missing' / 'db.sqlite3'}")
    collector = DaemonCollector(session_factory(broken), PriorityConfig(), lambda: {})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    got = samples(generate_latest(registry).decode())
    assert got["imaging_ai_database_up", ()] == 0
    assert ("imaging_ai_sla_seconds", (("priority", "urgent"),)) in got
