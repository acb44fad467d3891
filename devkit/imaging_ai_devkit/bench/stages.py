"""Takes the daemon's database and a study; gives the seconds of each stage from the study's last
instance received to its results stored in PACS, as the daemon recorded them.

The sources: the study row (last instance, completion by the idle timers), its job (created,
claimed, finished, and ``timings``: the analysis steps as `imaging_ai.process` records them, each
model's inference apart from the preparation and mapping around it), and its deliveries (when
the PACS confirmed the SEG and SR). The stages add up to the turnaround: what the named stages
do not cover (claiming, listing the files, committing rows) is ``other``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Delivery, Instance, Job, Series, Study

# Job timing keys that are not a model's inference.
_STEPS = ("load", "preprocess", "postprocess", "outputs", "total")
LABELS = {
    "assemble": "receive -> assembled",
    "queue": "queued",
    "load": "load DICOM into a volume",
    "preprocess": "preprocess",
    "postprocess": "postprocess",
    "outputs": "SEG/SR/report writing",
    "deliver": "delivery to PACS (C-STORE SEG+SR)",
    "other": "other (claim, commits)",
}


@dataclass(frozen=True)
class StudyStages:
    """One study's turnaround and its stages, in pipeline order (seconds)."""

    study_uid: str
    priority: str
    slices: int
    turnaround_s: float
    report_s: float
    stages: dict[str, float]
    completion: str = ""  # the assembly rule that completed it ("association released", "idle")

    @property
    def slowest(self) -> tuple[str, float]:
        """The stage that took longest."""
        name = max(self.stages, key=lambda k: self.stages[k])
        return name, self.stages[name]


def label(stage: str) -> str:
    """A stage's name for tables and plots (a model's inference is named after the model)."""
    return LABELS.get(stage, f"inference {stage}")


def read_stages(database_url: str, study_uid: str) -> StudyStages:
    """The stages of a study whose SEG and SR were delivered.

    Raises
    ------
    LookupError
        The study has no finished job or no delivered PACS result yet.
    """
    engine = create_engine(database_url)
    try:
        with Session(engine) as s:
            return _stages(s, study_uid)
    finally:
        engine.dispose()


def job_times(database_url: str, study_uid: str) -> tuple[datetime, datetime, datetime, datetime]:
    """(claimed, results ready, study completed, deadline) of a study's finished job."""
    engine = create_engine(database_url)
    try:
        with Session(engine) as s:
            row = s.execute(
                select(Job.started_at, Job.finished_at, Study.completed_at, Job.deadline)
                .join(Study, Study.id == Job.study_id)
                .where(Study.study_instance_uid == study_uid, Job.state == "done")
                .order_by(Job.id.desc())
            ).first()
    finally:
        engine.dispose()
    started, finished, completed, deadline = row or (None, None, None, None)
    if started is None or finished is None or completed is None or deadline is None:
        raise LookupError(f"study {study_uid} has no finished job")
    return started, finished, completed, deadline


def _stages(s: Session, study_uid: str) -> StudyStages:
    study = s.scalars(select(Study).where(Study.study_instance_uid == study_uid)).one()
    job = s.scalars(select(Job).where(Job.study_id == study.id).order_by(Job.id.desc())).first()
    pacs = select(func.max(Delivery.delivered_at)).where(
        Delivery.study_id == study.id, Delivery.kind.in_(("seg", "sr")), Delivery.state == "done"
    )
    delivered = s.scalar(pacs)
    if job is None or job.started_at is None or job.finished_at is None or delivered is None:
        raise LookupError(f"study {study_uid} has no delivered results yet")
    assert study.completed_at is not None
    slices = s.scalar(
        select(func.count(Instance.id))
        .join(Series, Instance.series_id == Series.id)
        .where(Series.study_id == study.id)
    )
    steps = {k: float(v) for k, v in job.timings.items()}
    ready = _plus(job.finished_at, steps.get("outputs", 0.0))
    stages = {
        "assemble": _seconds(study.last_instance_at, study.completed_at),
        "queue": _seconds(study.completed_at, job.started_at),
        "load": steps.get("load", 0.0),
        "preprocess": steps.get("preprocess", 0.0),
        **{k: v for k, v in steps.items() if k not in _STEPS},
        "postprocess": steps.get("postprocess", 0.0),
        "outputs": steps.get("outputs", 0.0),
        "deliver": _seconds(ready, delivered),
    }
    turnaround = _seconds(study.last_instance_at, delivered)
    stages["other"] = turnaround - sum(stages.values())
    return StudyStages(
        study_uid,
        study.priority,
        int(slices or 0),
        turnaround,
        _seconds(study.last_instance_at, ready),
        stages,
        study.completion_reason,
    )


def _seconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


def _plus(when: datetime, seconds: float) -> datetime:
    return when + timedelta(seconds=seconds)
