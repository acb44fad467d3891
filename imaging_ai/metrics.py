"""Takes the database, the daemon's live state and the spool's disk; gives Prometheus metrics.

Most values are computed at scrape time from the database, so they are right across receiver
processes and across nodes sharing one PostgreSQL (every node then reports the same totals:
aggregate those with ``max``, not ``sum``). Histograms of finished work are accumulated
incrementally: each scrape reads only the jobs and deliveries that finished since the previous
one, a little in the past so that rows still being committed are not missed. No label carries
patient data: only priority classes, states, stage names, configured destinations and devices.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai import __version__
from imaging_ai.config import PRIORITY_CLASSES, PriorityConfig
from imaging_ai.db.models import ClassControl, Delivery, Instance, Job, Purge, Study
from imaging_ai.db.session import utcnow
from imaging_ai.states import DeliveryState, JobState

log = logging.getLogger(__name__)

Metric = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily
Samples = Iterable[tuple[tuple[str, ...], float]]

# Every family exported, without the imaging_ai_ prefix: (type, help, labels).
CATALOGUE: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "build_info": ("gauge", "Version of imaging-ai.", ("version",)),
    "sla_seconds": ("gauge", "SLA per class: study completion to results.", ("priority",)),
    "database_up": ("gauge", "1 when the database answered this scrape.", ()),
    "instances_received": ("counter", "Instances stored, all nodes.", ()),
    "late_instances": ("counter", "Instances that came after their study was complete.", ()),
    "studies": ("gauge", "Studies by state.", ("state",)),
    "queue_depth": ("gauge", "Queued jobs per class.", ("priority",)),
    "queue_oldest_wait_seconds": ("gauge", "Wait of the oldest queued job.", ("priority",)),
    "queue_paused": ("gauge", "1 while an administrator has paused the class.", ("priority",)),
    "deliveries": ("gauge", "Deliveries by state: pending, done, cancelled, refused.",
                   ("state",)),
    "deliveries_failing": ("gauge", "Pending deliveries that failed at least once.",
                           ("destination",)),
    "deliveries_failing_oldest_seconds": ("gauge", "Age of the oldest failing delivery.",
                                          ("destination",)),
    "deliveries_refused": ("gauge", "Deliveries the destination refused for good (no retry).",
                           ("destination",)),
    "turnaround_seconds": ("histogram", "Study completion to results ready.", ("priority",)),
    "stage_seconds": ("histogram", "Time in a stage: receive, queue, process, deliver.",
                      ("stage", "priority")),
    "analysis_step_seconds": ("histogram", "Time of an analysis step (load, model, post).",
                              ("step",)),
    "jobs_finished": ("counter", "Jobs finished, by outcome.", ("priority", "outcome")),
    "deadline_misses": ("counter", "Results ready after the deadline.", ("priority",)),
    "receiver_processes": ("gauge", "DICOM receiver processes alive on this node.", ()),
    "receiver_restarts": ("counter", "DICOM receiver processes restarted after dying.", ()),
    "dicom_accepting": ("gauge", "1 while the DICOM port can take an association.", ()),
    "associations_active": ("gauge", "DICOM associations open on this node.", ()),
    "associations_refused": ("counter", "Associations refused on this node since start.", ()),
    "worker_busy_ratio": ("gauge", "Busy fraction of a worker (its GPU, or CPU), 0-1.",
                          ("device", "backend")),
    "worker_memory_used_bytes": ("gauge", "Device memory used by a worker.", ("device",)),
    "worker_up": ("gauge", "1 while a worker process is alive.", ("device", "backend")),
    "worker_degraded": ("gauge", "1 while a GPU worker runs on the CPU fallback.", ("device",)),
    "engine_fallbacks": ("counter", "Batches that fell back from the GPU to the CPU.",
                         ("device",)),
    "batch_size": ("histogram", "Slices per inference batch.", ("device",)),
    "spool_free_bytes": ("gauge", "Free space on the spool's disk.", ()),
    "spool_low_water_bytes": ("gauge", "Below this free space C-STORE is refused.", ()),
    "spool_bytes": ("gauge", "Bytes of instance files kept in the spool, all nodes.", ()),
    "spool_files": ("gauge", "Instance files kept in the spool, all nodes.", ()),
    "purged_files": ("counter", "Instance files deleted by retention, all nodes.", ()),
    "purged_bytes": ("counter", "Bytes of instance files deleted by retention, all nodes.", ()),
}  # fmt: skip
# Seconds: from an urgent study's minute to an outpatient backlog of hours.
TIME_BUCKETS = (1, 2.5, 5, 10, 15, 30, 45, 60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800,
                2700, 3600, 7200, 14400)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Rows finished less than this long ago are left for the next scrape (commit in flight).
SETTLE = timedelta(seconds=30)
STAGES = ("receive", "queue", "process", "deliver")
OUTCOMES = (JobState.DONE, JobState.FAILED)


def family(name: str, samples: Samples = ()) -> GaugeMetricFamily | CounterMetricFamily:
    """A gauge or counter of the catalogue with its samples."""
    kind, doc, labels = CATALOGUE[name]
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    metric = cls(f"imaging_ai_{name}", doc, labels=labels)
    for values, value in samples:
        metric.add_metric(list(values), float(value))
    return metric


class Histograms:
    """Cumulative histograms per label values, fed one observation at a time."""

    def __init__(self, name: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.bounds = tuple(float(b) for b in bounds)
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def seed(self, labels: tuple[str, ...]) -> None:
        """Make a label set exist at zero, so that ``rate`` has a starting point."""
        self._counts.setdefault(labels, [0] * (len(self.bounds) + 1))
        self._sums.setdefault(labels, 0.0)

    def observe(self, labels: tuple[str, ...], value: float, times: int = 1) -> None:
        """Count ``value`` once, or ``times`` times."""
        self.seed(labels)
        self._counts[labels][_bucket(self.bounds, value)] += times
        self._sums[labels] += value * times

    def family(self) -> HistogramMetricFamily:
        """The metric family, with cumulative ``le`` buckets."""
        _, doc, labelnames = CATALOGUE[self.name]
        metric = HistogramMetricFamily(f"imaging_ai_{self.name}", doc, labels=labelnames)
        for labels, counts in sorted(self._counts.items()):
            metric.add_metric(labels, _cumulative(self.bounds, counts), self._sums[labels])
        return metric


class DaemonCollector(Collector):
    """Every ``imaging_ai_`` metric, computed when Prometheus scrapes.

    Parameters
    ----------
    sessions
        The process's session factory.
    priority
        The classes' SLAs, exported so that alert rules compare against them.
    live
        The daemon's in-memory state (receivers, workers), as on the status page.
    spool_dir, low_water_bytes
        The spool's disk and the free space below which C-STORE is refused.
    clock
        The current time (tests move it).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        priority: PriorityConfig,
        live: Callable[[], Mapping[str, Any]],
        spool_dir: Path | None = None,
        low_water_bytes: int = 0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.sessions, self.priority, self.live = sessions, priority, live
        self.spool_dir, self.low_water_bytes, self.clock = spool_dir, low_water_bytes, clock
        self._lock = threading.Lock()
        self._jobs_since: datetime | None = None
        self._deliveries_since: datetime | None = None
        self._turnaround = Histograms("turnaround_seconds", TIME_BUCKETS)
        self._stages = Histograms("stage_seconds", TIME_BUCKETS)
        self._steps = Histograms("analysis_step_seconds", TIME_BUCKETS)
        self._finished = dict.fromkeys(((p, o) for p in PRIORITY_CLASSES for o in OUTCOMES), 0)
        self._misses = dict.fromkeys(PRIORITY_CLASSES, 0)
        for p in PRIORITY_CLASSES:
            self._turnaround.seed((p,))
            for stage in STAGES:
                self._stages.seed((stage, p))

    def describe(self) -> list[Metric]:
        """Nothing: describing would query the database when the collector is registered."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family; those from the database only while it answers."""
        yield family("build_info", [((__version__,), 1.0)])
        yield family("sla_seconds", [((p,), self.priority.sla_s(p)) for p in PRIORITY_CLASSES])
        families: list[Metric] = []
        try:
            with self._lock, self.sessions() as s:
                families = [
                    *self._current(s),
                    *self._deliveries(s),
                    *self._finished_work(s),
                    *self._spool(s),
                ]
        except SQLAlchemyError as exc:
            log.warning("metrics: database unavailable (%s)", exc.__class__.__name__)
        yield family("database_up", [((), 1.0 if families else 0.0)])
        yield from families
        live = self._live()
        yield from self._receivers(live)
        yield from self._workers(live)
        yield from self._disk()

    def _current(self, s: Session) -> list[Metric]:
        now = self.clock()
        instances = s.scalar(select(func.count(Instance.id))) or 0
        late = s.scalar(select(func.coalesce(func.sum(Study.late_instances), 0))) or 0
        states = s.execute(select(Study.state, func.count()).group_by(Study.state))
        rows = s.execute(
            select(Job.priority, func.count(), func.min(Job.created_at))
            .where(Job.state == JobState.QUEUED)
            .group_by(Job.priority)
        ).all()
        depth = {p: n for p, n, _ in rows}
        waits = {p: _age(now, oldest) for p, _, oldest in rows}
        paused = set(s.scalars(select(ClassControl.priority).where(ClassControl.paused)))
        classes = sorted({*PRIORITY_CLASSES, *depth})
        return [
            family("instances_received", [((), instances)]),
            family("late_instances", [((), late)]),
            family("studies", [((state,), n) for state, n in states]),
            family("queue_depth", [((p,), depth.get(p, 0)) for p in classes]),
            family("queue_oldest_wait_seconds", [((p,), waits.get(p, 0.0)) for p in classes]),
            family("queue_paused", [((p,), float(p in paused)) for p in classes]),
        ]

    def _spool(self, s: Session) -> list[Metric]:
        files, size = s.execute(
            select(func.count(Instance.id), func.coalesce(func.sum(Instance.size_bytes), 0)).where(
                Instance.missing.is_(False)
            )
        ).one()
        purged_files, purged_bytes = s.execute(
            select(
                func.coalesce(func.sum(Purge.files), 0),
                func.coalesce(func.sum(Purge.size_bytes), 0),
            )
        ).one()
        return [
            family("spool_bytes", [((), float(size))]),
            family("spool_files", [((), float(files))]),
            family("purged_files", [((), float(purged_files))]),
            family("purged_bytes", [((), float(purged_bytes))]),
        ]

    def _deliveries(self, s: Session) -> list[Metric]:
        now = self.clock()
        found = dict(s.execute(select(Delivery.state, func.count()).group_by(Delivery.state)).all())
        failing = s.execute(
            select(Delivery.destination, func.count(), func.min(Delivery.created_at))
            .where(Delivery.state == DeliveryState.PENDING, Delivery.attempts > 0)
            .group_by(Delivery.destination)
        )
        rows = [(dest, n, _age(now, oldest)) for dest, n, oldest in failing]
        refused = s.execute(
            select(Delivery.destination, func.count())
            .where(Delivery.state == DeliveryState.REFUSED)
            .group_by(Delivery.destination)
        )
        # Every state, 0 included: an alert on refused > 0 needs the series before the first.
        states = [((state,), found.get(state, 0)) for state in DeliveryState]
        return [
            family("deliveries", states),
            family("deliveries_refused", [((dest,), n) for dest, n in refused]),
            family("deliveries_failing", [((dest,), n) for dest, n, _ in rows]),
            family("deliveries_failing_oldest_seconds", [((dest,), a) for dest, _, a in rows]),
        ]

    def _finished_work(self, s: Session) -> list[Metric]:
        cutoff = self.clock() - SETTLE
        self._observe_jobs(s, cutoff)
        self._observe_deliveries(s, cutoff)
        return [
            self._turnaround.family(),
            self._stages.family(),
            self._steps.family(),
            family("jobs_finished", sorted(self._finished.items())),
            family("deadline_misses", [((p,), n) for p, n in sorted(self._misses.items())]),
        ]

    def _observe_jobs(self, s: Session, cutoff: datetime) -> None:
        query = (
            select(Job, Study.received_at, Study.completed_at)
            .join(Study, Study.id == Job.study_id)
            .where(Job.state.in_(OUTCOMES), Job.finished_at <= cutoff)
        )
        if self._jobs_since is not None:
            query = query.where(Job.finished_at > self._jobs_since)
        for job, received, completed in s.execute(query):
            self._observe_job(job, received, completed)
        self._jobs_since = cutoff

    def _observe_job(self, job: Job, received: datetime, completed: datetime | None) -> None:
        p = job.priority
        self._finished[p, job.state] = self._finished.get((p, job.state), 0) + 1
        if job.state != JobState.DONE or job.finished_at is None:
            return
        if completed is not None:
            self._turnaround.observe((p,), (job.finished_at - completed).total_seconds())
            self._stages.observe(("receive", p), (completed - received).total_seconds())
        if job.started_at is not None:
            self._stages.observe(("queue", p), (job.started_at - job.created_at).total_seconds())
            self._stages.observe(("process", p), (job.finished_at - job.started_at).total_seconds())
        if job.finished_at > job.deadline:
            self._misses[p] = self._misses.get(p, 0) + 1
        for step, seconds in (job.timings or {}).items():
            if step != "total" and _number(seconds) is not None:
                self._steps.observe((str(step),), float(seconds))

    def _observe_deliveries(self, s: Session, cutoff: datetime) -> None:
        query = (
            select(Delivery.created_at, Delivery.delivered_at, Study.priority)
            .join(Study, Study.id == Delivery.study_id)
            .where(Delivery.state == DeliveryState.DONE, Delivery.delivered_at <= cutoff)
        )
        if self._deliveries_since is not None:
            query = query.where(Delivery.delivered_at > self._deliveries_since)
        for created, delivered, priority in s.execute(query):
            if delivered is not None:
                self._stages.observe(("deliver", priority), (delivered - created).total_seconds())
        self._deliveries_since = cutoff

    def _live(self) -> Mapping[str, Any]:
        try:
            live = self.live()
        except Exception:
            # The live view is best effort: a broken one must not take the database metrics
            # down with it; it is logged so that it gets fixed.
            log.exception("metrics: live status failed")
            return {}
        return live if isinstance(live, Mapping) else {}

    def _receivers(self, live: Mapping[str, Any]) -> list[Metric]:
        rx = live.get("receivers")
        rx = rx if isinstance(rx, Mapping) else {}
        return [
            family("receiver_processes", _one(rx.get("processes"))),
            family("receiver_restarts", _one(rx.get("restarts"))),
            family("dicom_accepting", _one(_flag(rx.get("accepting")))),
            family("associations_active", _one(rx.get("active"))),
            family("associations_refused", _one(rx.get("refused"))),
        ]

    def _workers(self, live: Mapping[str, Any]) -> list[Metric]:
        """From each worker (``workers.WorkerStatus`` or its dict): ``device``, ``backend``,
        ``busy_fraction``, ``memory_used_bytes``, ``fallbacks``, ``degraded``, ``alive`` and
        ``batch_sizes`` (``{size: batches}`` or ``((size, batches), ...)``)."""
        busy, memory, fallbacks, degraded, up = [], [], [], [], []
        batches = Histograms("batch_size", BATCH_BUCKETS)
        for i, w in enumerate(worker_dicts(live)):
            device, backend = str(w.get("device", i)), str(w.get("backend", ""))
            busy += [((device, backend), v) for v in _opt(w.get("busy_fraction"))]
            memory += [((device,), v) for v in _opt(w.get("memory_used_bytes"))]
            fallbacks.append(((device,), _number(w.get("fallbacks")) or 0.0))
            degraded += [((device,), float(bool(w["degraded"])))] if "degraded" in w else []
            up += [((device, backend), float(bool(w["alive"])))] if "alive" in w else []
            batches.seed((device,))
            for size, times in _pairs(w.get("batch_sizes")):
                batches.observe((device,), size, int(times))
        return [
            family("worker_busy_ratio", busy),
            family("worker_memory_used_bytes", memory),
            family("worker_up", up),
            family("worker_degraded", degraded),
            family("engine_fallbacks", fallbacks),
            batches.family(),
        ]

    def _disk(self) -> list[Metric]:
        free: list[tuple[tuple[str, ...], float]] = []
        if self.spool_dir is not None:
            try:
                free = [((), float(shutil.disk_usage(self.spool_dir).free))]
            except OSError as exc:
                log.warning("metrics: cannot read free space of %s: %s", self.spool_dir, exc)
        return [
            family("spool_free_bytes", free),
            family("spool_low_water_bytes", [((), float(self.low_water_bytes))]),
        ]


def worker_dicts(live: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The live status's workers as mappings (dataclasses are converted)."""
    out = []
    for w in live.get("workers") or ():
        if dataclasses.is_dataclass(w) and not isinstance(w, type):
            w = dataclasses.asdict(w)
        if isinstance(w, Mapping):
            out.append(w)
    return out


def _pairs(value: Any) -> list[tuple[float, float]]:
    items = value.items() if isinstance(value, Mapping) else value or ()
    try:
        return [(float(k), float(v)) for k, v in items]
    except (TypeError, ValueError):
        return []  # not a size histogram: shown on the page as it is, left out here


def _bucket(bounds: Sequence[float], value: float) -> int:
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, count in zip((*(repr(b) for b in bounds), "+Inf"), counts, strict=True):
        running += count
        out.append((bound, float(running)))
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _flag(value: Any) -> float | None:
    """A live check ("ok" or why not) as 1 or 0; None if absent."""
    return None if value is None else float(value == "ok")


def _opt(value: Any) -> list[float]:
    number = _number(value)
    return [] if number is None else [number]


def _one(value: Any) -> list[tuple[tuple[str, ...], float]]:
    return [((), v) for v in _opt(value)]


def _age(now: datetime, since: datetime | None) -> float:
    if since is None:
        return 0.0
    # Aggregates bypass the UTC column type and come back naive from SQLite.
    since = since.replace(tzinfo=UTC) if since.tzinfo is None else since
    return (now - since).total_seconds()
