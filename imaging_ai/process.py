"""Takes claimed jobs and gives reports: runs each study's analysis and records the outcome."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from hl7apy.exceptions import HL7apyException  # type: ignore[import-untyped]
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai import faults
from imaging_ai.analyse import Analysis, Models, analyse_study
from imaging_ai.config import Config
from imaging_ai.db.models import Instance, Job, Report, Series, Study
from imaging_ai.db.session import utcnow
from imaging_ai.engine_set import EngineSet
from imaging_ai.errors import ImagesPurged, InvalidDataset, OutputError, UnsupportedInput
from imaging_ai.infer.base import BackendInfo, Engine, FloatArray, LoadedModel
from imaging_ai.outbox import Outbox
from imaging_ai.outputs.common import source_headers
from imaging_ai.outputs.files import ResultFiles, write_results
from imaging_ai.outputs.messages import MessageBuilder
from imaging_ai.redact import exception_text
from imaging_ai.retention import images_gone
from imaging_ai.schedule import Claim, Scheduler
from imaging_ai.states import JobState, StudyState

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
# Input problems are the study's, not the daemon's, and results that cannot be encoded from
# them fail alike on every attempt: retrying cannot help.
PERMANENT = (UnsupportedInput, InvalidDataset, OutputError, ImagesPurged)
# What the SEG, SR, ORU and FHIR builders raise on values they cannot encode. A rebuild from the
# same analysis and headers is the same build (fixed UIDs and time), so it fails the same way;
# a disk or a helper process failing (OSError and the like) is not among these and is retried.
_ENCODING_ERRORS = (ValueError, TypeError, AttributeError, KeyError, IndexError, HL7apyException)


def impression(analysis: Analysis) -> str:
    """One plain sentence for RIS and people; marked as AI-generated and preliminary."""
    lesions = analysis.lesions
    if not lesions:
        found = "No lung nodule detected."
    else:
        largest = max(lesions, key=lambda lesion: lesion.long_axis_mm)
        found = (
            f"{len(lesions)} lung nodule(s) detected; largest {largest.long_axis_mm:.1f} mm "
            f"in the {largest.side or 'unknown'} lung."
        )
    caveats = "".join(f" {caveat}" for caveat in analysis.caveats)
    return f"{found}{caveats} AI-generated preliminary result; requires review by a radiologist."


def encoded(build: Callable[[], ResultFiles]) -> ResultFiles:
    """``build()``, with an encoding error raised as :class:`OutputError`, which is not retried.

    The reason names the error's type and where it was raised, not its message: an encoder's
    message may quote the value it could not encode (a birth date, a name).
    """
    try:
        return build()
    except _ENCODING_ERRORS as exc:
        raise OutputError(
            f"the results could not be encoded from this study's data ({_where(exc)}); "
            "not retried, since the same data fails the same way"
        ) from exc


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} in {Path(last.filename).name} line {last.lineno}"


class Processor:
    """Runs up to ``max_in_flight`` studies at once, plus one slot kept for urgent work.

    The kept slot means an urgent study never waits for a study in hand to finish before
    it is claimed; with batching engines its slices then overtake the others' at the next
    batch boundary.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        scheduler: Scheduler,
        engines: EngineSet,
        config: Config,
        outbox: Outbox,
        poll_s: float = 0.5,
        max_in_flight: int = 2,
        messages: MessageBuilder | None = None,
    ) -> None:
        self.sessions = sessions
        self.messages = messages
        self.scheduler = scheduler
        self.engines = engines
        self.config = config
        self.spool_root = config.storage.spool_dir
        self.outbox = outbox
        self.poll_s = poll_s
        self.max_in_flight = max_in_flight
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._current: dict[int, Claim] = {}
        self._lock = threading.Lock()

    @property
    def current(self) -> list[Claim]:
        """The studies in hand."""
        with self._lock:
            return list(self._current.values())

    def start(self) -> None:
        """Process jobs in background threads until stopped."""
        for slot in range(self.max_in_flight + 1):
            urgent_only = slot == self.max_in_flight
            thread = threading.Thread(
                target=self._run, args=(urgent_only,), name=f"processor-{slot}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def alive(self) -> bool:
        """Whether every processing thread runs (the systemd watchdog is fed only while they do)."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Finish the studies in hand, or give them back to the queue at the deadline."""
        self._stop.set()
        self.scheduler.wake()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for claim in self.current:
            self.scheduler.requeue(claim, "daemon stopped while processing")

    def _run(self, urgent_only: bool) -> None:
        while not self._stop.is_set():
            seen = self.scheduler.wakes
            try:
                worked = self.run_once(urgent_only)
            except Exception:
                log.exception("processing loop error; retrying")
                worked = False
            if not worked:
                # Woken at once for work queued on this node; the poll finds other nodes'.
                self.scheduler.wait_for_work(seen, self.poll_s)

    def run_once(self, urgent_only: bool = False) -> bool:
        """Claim and process one job; False if none was runnable."""
        claim = self.scheduler.claim(urgent_only=urgent_only)
        if claim is None:
            return False
        with self._lock:
            self._current[claim.job_id] = claim
        try:
            self._process(claim)
        finally:
            with self._lock:
                self._current.pop(claim.job_id, None)
        return True

    def _process(self, claim: Claim) -> None:
        started = time.perf_counter()
        keep_lease = _LeaseKeeper(self.scheduler, claim)
        try:
            faults.reach("before:preprocess")
            files = self._files(claim)
            # The set in use now; a model reload swaps in a new one for later studies.
            engines = self.engines
            fallbacks_before = engines.fallbacks()
            with engines.models_for(claim) as models:
                clocked, clocks = _clocked(models)
                t = time.perf_counter()
                analysis = analyse_study(files, clocked)
            faults.reach("after:postprocess")
            fell_back = engines.fallbacks() - fallbacks_before
            steps = split_steps(analysis.timings_s, t, clocks)
            created, text = utcnow(), impression(analysis)
            t = time.perf_counter()
            sources = source_headers(files)
            results = encoded(
                lambda: write_results(
                    analysis,
                    files,
                    claim.job_id,
                    created,
                    text,
                    self.config,
                    headers=sources.datasets,
                    builder=self.messages,
                )
            )
            timings = {**steps, "outputs": time.perf_counter() - t}
            faults.reach("after:outputs")
        except PERMANENT as exc:
            self._fail(claim, exception_text(exc))
            return
        except Exception as exc:  # the one boundary where any failure becomes the study's
            log.exception("job %d: analysis failed (attempt %d)", claim.job_id, claim.attempt)
            if claim.attempt >= MAX_ATTEMPTS:
                self._fail(claim, f"analysis failed {claim.attempt} times: {exception_text(exc)}")
            else:
                reason = f"attempt {claim.attempt} failed: {exception_text(exc)}"
                self.scheduler.requeue(claim, reason)
            return
        finally:
            keep_lease.stop()
        timings["total"] = time.perf_counter() - started
        notes = list(sources.notes)
        for note in sources.notes:
            log.warning("study %d: %s", claim.study_id, note)
        if fell_back:
            # Counted over the workers, so with studies in parallel it may include theirs.
            notes.append(
                f"{fell_back} batch(es) ran on the CPU instead of the GPU while this study ran: "
                "the GPU engine failed (the status page's inference workers say more)"
            )
        self._record(claim, analysis, timings, results, created, text, notes)

    def _files(self, claim: Claim) -> list[Path]:
        with self.sessions() as s:
            gone = images_gone(s, claim.study_id)
            if gone:  # analysing what is left would give a result for part of the study
                raise ImagesPurged(f"not analysed: {gone}")
            paths = s.scalars(
                select(Instance.path)
                .join(Series, Instance.series_id == Series.id)
                .where(Series.study_id == claim.study_id, Instance.missing.is_(False))
            ).all()
        return [self.spool_root / p for p in paths]

    def _record(
        self,
        claim: Claim,
        analysis: Analysis,
        timings: dict[str, float],
        results: ResultFiles,
        created: datetime,
        text: str,
        notes: list[str],
    ) -> None:
        """Report, job, study and deliveries in one transaction: all or nothing."""
        data_dir = Path(self.config.storage.data_dir)
        with self.sessions() as s, s.begin():
            job, study = s.get(Job, claim.job_id), s.get(Study, claim.study_id)
            assert job is not None and study is not None
            report = s.scalars(select(Report).where(Report.study_id == study.id)).first()
            report = report or Report(study_id=study.id)
            report.job_id, report.created_at, report.impression = job.id, created, text
            report.findings = {
                **analysis.findings_json(),
                "files": {
                    "folder": str(results.folder.relative_to(data_dir)),
                    "fhir": str(results.fhir.relative_to(data_dir)),
                },
            }
            s.add(report)
            job.state, job.finished_at, job.lease_until = JobState.DONE, created, None
            job.timings, job.notes = timings, [*job.notes, *notes]
            study.error = ""
            _mark_not_analysed(s, study.id, analysis)
            deliveries = self.outbox.enqueue(s, study, list(results.payloads), created)
        log.info(
            "study %d analysed in %.1f s: %d lesion(s), %d deliveries",
            claim.study_id,
            timings["total"],
            len(analysis.lesions),
            deliveries,
        )

    def _fail(self, claim: Claim, reason: str) -> None:
        now: datetime = utcnow()
        with self.sessions() as s, s.begin():
            job, study = s.get(Job, claim.job_id), s.get(Study, claim.study_id)
            assert job is not None and study is not None
            if job.state != JobState.PROCESSING or job.node != self.scheduler.node:
                # Given back meanwhile (shutdown, or a lease lost): not ours to fail.
                log.warning("job %d no longer ours; not marked failed", claim.job_id)
                return
            log.error("study %d failed: %s", claim.study_id, reason)
            job.state, job.finished_at, job.lease_until = JobState.FAILED, now, None
            job.error = reason
            study.state, study.error = StudyState.FAILED, reason


def _mark_not_analysed(s: Session, study_id: int, analysis: Analysis) -> None:
    """Record on the study's series why each was not analysed; the one analysed has none.

    A reason given at receipt (not CT, our own result) stands.
    """
    for series in s.scalars(select(Series).where(Series.study_id == study_id)):
        uid = series.series_instance_uid
        if uid == analysis.volume.series_instance_uid:
            series.not_analysed = ""
        elif not series.not_analysed and uid in analysis.not_analysed:
            series.not_analysed = analysis.not_analysed[uid][:200]


class EngineClock:
    """An engine that notes when its first batch went in and how long it spent inferring.

    A model's analysis step prepares every slice, runs the batches, then maps the outputs
    back to the source grid; the clock is what tells those three apart.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.first_call: float | None = None
        self.busy_s = 0.0

    @property
    def max_batch_size(self) -> int:
        return self.engine.max_batch_size

    @property
    def info(self) -> BackendInfo:
        return self.engine.info

    def infer(self, batch: FloatArray) -> FloatArray:
        start = time.perf_counter()
        if self.first_call is None:
            self.first_call = start
        try:
            return self.engine.infer(batch)
        finally:
            self.busy_s += time.perf_counter() - start

    def close(self) -> None:
        self.engine.close()


def _clocked(models: Models) -> tuple[Models, dict[str, EngineClock]]:
    """The models with clocked engines, and the clocks by step name in the order they run."""
    lungs, nodules = EngineClock(models.lungs.engine), EngineClock(models.nodules.engine)
    clocked = replace(
        models,
        lungs=LoadedModel(models.lungs.card, lungs),
        nodules=LoadedModel(models.nodules.card, nodules),
    )
    return clocked, {models.lungs.card.name: lungs, models.nodules.card.name: nodules}


def split_steps(
    steps: dict[str, float], started: float, clocks: dict[str, EngineClock]
) -> dict[str, float]:
    """The analysis steps with each model's step split into preparation, inference, mapping.

    ``preprocess`` is the slices' preparation for every model; a model's own key keeps only
    its inference (batching and the workers included); ``postprocess`` gains the mapping of
    outputs back to the source grid. The steps still add up to the same total.

    Parameters
    ----------
    steps
        ``Analysis.timings_s``: load, one step per model in ``clocks``' order, postprocess.
    started
        ``time.perf_counter()`` when the analysis began.
    clocks
        The clocked engines by model step name.
    """
    step_start = started + steps.get("load", 0.0)
    preprocess = mapped_back = 0.0
    inference = {}
    for name, clock in clocks.items():
        step = steps.get(name, 0.0)
        prepared = clock.first_call - step_start if clock.first_call is not None else 0.0
        inference[name] = clock.busy_s
        preprocess += prepared
        mapped_back += max(0.0, step - prepared - clock.busy_s)
        step_start += step
    out = {"load": steps.get("load", 0.0), "preprocess": preprocess, **inference}
    out["postprocess"] = steps.get("postprocess", 0.0) + mapped_back
    return out | {k: v for k, v in steps.items() if k not in out}


class _LeaseKeeper:
    """Renews a claim's lease in the background while a long analysis runs."""

    def __init__(self, scheduler: Scheduler, claim: Claim) -> None:
        self._stop = threading.Event()
        interval = scheduler.lease.total_seconds() / 3

        def renew() -> None:
            while not self._stop.wait(interval):
                if not scheduler.renew(claim):
                    log.warning("job %d: lease lost to another node", claim.job_id)
                    return

        self._thread = threading.Thread(target=renew, name="lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
