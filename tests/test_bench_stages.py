"""Stage times: the processor's split of each model's step, and the stages the benchmarks read
back from the database, which add up to the turnaround."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from imaging_ai_devkit.bench.stages import label, read_stages
from sqlalchemy.orm import Session

from imaging_ai.db.models import Delivery, Instance, Job, Series, Study
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.infer.base import BackendInfo, FloatArray
from imaging_ai.process import EngineClock, split_steps


class _Engine:
    max_batch_size = 4
    info = BackendInfo("m", "fake", "cpu", "fp32", 4)

    def infer(self, batch: FloatArray) -> FloatArray:
        return batch * 2

    def close(self) -> None:
        pass


def _clock(first_call: float, busy_s: float) -> EngineClock:
    clock = EngineClock(_Engine())
    clock.first_call, clock.busy_s = first_call, busy_s
    return clock


def test_engine_clock_passes_batches_through_and_times_them() -> None:
    clock = EngineClock(_Engine())
    out = clock.infer(np.ones((2, 1, 4, 4), np.float32))
    assert float(out.max()) == 2.0
    assert clock.first_call is not None and clock.busy_s > 0
    assert clock.max_batch_size == 4 and clock.info.backend == "fake"


def test_split_steps_keeps_the_total() -> None:
    # Analysis started at 100: load 1 s; lung-seg 4 s (prepared 1, inferred 2, mapped back 1);
    # nodule-det 6 s (prepared 0.5, inferred 5, mapped back 0.5); lesions 2 s.
    steps = {"load": 1.0, "lung-seg": 4.0, "nodule-det": 6.0, "postprocess": 2.0}
    clocks = {"lung-seg": _clock(102.0, 2.0), "nodule-det": _clock(105.5, 5.0)}
    out = split_steps(steps, 100.0, clocks)
    assert out == pytest.approx(
        {"load": 1.0, "preprocess": 1.5, "lung-seg": 2.0, "nodule-det": 5.0, "postprocess": 3.5}
    )
    assert list(out) == ["load", "preprocess", "lung-seg", "nodule-det", "postprocess"]
    assert sum(out.values()) == pytest.approx(sum(steps.values()))


def test_read_stages_from_the_daemons_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    engine = make_engine(url)
    upgrade(engine)
    t0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    timings = {"load": 0.5, "preprocess": 1.0, "lung-seg": 2.0, "nodule-det": 3.0}
    timings |= {"postprocess": 1.5, "outputs": 1.0, "total": 9.2}
    with Session(engine) as s, s.begin():
        study = Study(
            study_instance_uid="1.2.3", received_at=t0, last_instance_at=at(0), completed_at=at(2)
        )
        study.priority, study.state = "urgent", "done"
        s.add(study)
        s.flush()
        series = Series(study_id=study.id, series_instance_uid="1.2.3.1", last_instance_at=t0)
        s.add(series)
        s.flush()
        for i in range(3):
            s.add(
                Instance(
                    series_id=series.id,
                    sop_instance_uid=f"1.2.3.1.{i}",
                    sop_class_uid="1.2.840.10008.5.1.4.1.1.2",
                    transfer_syntax_uid="1.2.840.10008.1.2.1",
                    path=f"x/{i}",
                    size_bytes=1,
                    received_at=t0,
                )
            )
        s.add(
            Job(
                study_id=study.id,
                state="done",
                priority="urgent",
                rank=0,
                deadline=at(60),
                created_at=at(2),
                started_at=at(3),
                finished_at=at(11.2),
                timings=timings,
            )
        )
        for kind, delivered in (("seg", 13.0), ("sr", 13.0), ("oru", 12.5)):
            s.add(
                Delivery(
                    study_id=study.id,
                    kind=kind,
                    destination="d",
                    payload="p",
                    state="done",
                    next_try_at=at(11.2),
                    created_at=at(11.2),
                    delivered_at=at(delivered),
                )
            )
    engine.dispose()
    stages = read_stages(url, "1.2.3")
    assert stages.slices == 3 and stages.priority == "urgent"
    assert stages.turnaround_s == pytest.approx(13.0)
    assert stages.report_s == pytest.approx(12.2)
    assert stages.stages["assemble"] == pytest.approx(2.0)
    assert stages.stages["queue"] == pytest.approx(1.0)
    assert stages.stages["deliver"] == pytest.approx(0.8)
    assert stages.stages["other"] == pytest.approx(0.2)
    assert sum(stages.stages.values()) == pytest.approx(13.0)
    assert stages.slowest == ("nodule-det", 3.0)
    assert label("nodule-det") == "inference nodule-det" and label("queue") == "queued"
