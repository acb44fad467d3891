"""The in-process dynamic batcher: batch order by priority, preemption, routing, bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from imaging_ai_devkit.fake_engines import FixedLatencyBackend, FixedLatencyEngine

from imaging_ai.arena import SlotBatch
from imaging_ai.batch import STUDY_MAX_SLICES, Batcher, BatchingEngine
from imaging_ai.batch_policy import BatchingConfig
from imaging_ai.batch_requests import BatchCallback, Priority
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, FloatArray
from tests.infer.tiny_model import make_tiny

SHAPE = (1, 16, 16)  # the tiny model's input slice
URGENT, ROUTINE = 0, 1


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll until `condition()` holds; fail the test after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.002)


def labelled(study: int, slices: int) -> FloatArray:
    """Slices filled with study * 100 + index, so a batch shows where each slice came from."""
    return np.stack([np.full(SHAPE, study * 100 + i, np.float32) for i in range(slices)])


def labels(batch: FloatArray) -> list[int]:
    """The label of each slice of a batch."""
    return [round(float(s.flat[0])) for s in batch]


@pytest.fixture
def engine(tmp_path: Path) -> FixedLatencyEngine:
    """A zero-latency fake engine for the tiny model: output channel c of a slice = c + mean."""
    return FixedLatencyBackend(0.0, max_batch_size=64).load(make_tiny(tmp_path).card)


OUT_SHAPE = (3, *SHAPE[1:])  # the fake engine's output slice for the tiny model


@dataclass
class Sent:
    """One batch the dispatcher was given: its slots, a copy of its inputs, when."""

    labels: list[int]
    batch: FloatArray
    done: BatchCallback
    at: float
    slots: SlotBatch


class ManualDispatch:
    """A dispatcher the test drives: room for a batch only when granted; batches run on cue."""

    def __init__(self, engine: FixedLatencyEngine) -> None:
        self.engine = engine
        self.cond = threading.Condition()
        self.room = 0
        self.sent: list[Sent] = []

    def input_shape(self, model: str) -> tuple[int, ...]:
        return SHAPE

    def output_shape(self, model: str) -> tuple[int, ...]:
        return OUT_SHAPE

    def batch_capacity(self) -> int:
        return 8  # tests grant and hold up to this many batches before completing them

    def info(self, model: str) -> BackendInfo:
        return self.engine.info

    def reserve(self, priority: Priority, timeout_s: float) -> bool:
        with self.cond:
            if not self.cond.wait_for(lambda: self.room > 0, timeout_s):
                return False
            self.room -= 1
            return True

    def release(self) -> None:
        self.grant()

    def submit(self, model: str, slots: SlotBatch, done: BatchCallback) -> None:
        batch = slots.inputs()
        with self.cond:
            self.sent.append(Sent(labels(batch), batch, done, time.monotonic(), slots))
            self.cond.notify_all()

    def grant(self, batches: int = 1) -> None:
        with self.cond:
            self.room += batches
            self.cond.notify_all()

    def wait_sent(self, count: int) -> list[Sent]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sent) >= count, 5.0), self.sent
            return list(self.sent)

    def complete(self, index: int, error: BaseException | None = None) -> None:
        sent = self.sent[index]
        if error is None:
            sent.slots.write_outputs(self.engine.infer(sent.batch))
        sent.done(error)


class ThreadDispatch:
    """A dispatcher that runs every batch at once on `slots` threads, on the given engine."""

    def __init__(self, engine: FixedLatencyEngine, slots: int = 2) -> None:
        self.engine = engine
        self.free = threading.Semaphore(slots)
        self.pool = ThreadPoolExecutor(slots)

    def input_shape(self, model: str) -> tuple[int, ...]:
        return SHAPE

    def output_shape(self, model: str) -> tuple[int, ...]:
        return OUT_SHAPE

    def batch_capacity(self) -> int:
        return 2

    def info(self, model: str) -> BackendInfo:
        return self.engine.info

    def reserve(self, priority: Priority, timeout_s: float) -> bool:
        return self.free.acquire(timeout=timeout_s)

    def release(self) -> None:
        self.free.release()

    def submit(self, model: str, slots: SlotBatch, done: BatchCallback) -> None:
        def run() -> None:
            try:
                slots.write_outputs(self.engine.infer(slots.inputs()))
                done(None)
            finally:
                self.free.release()

        self.pool.submit(run)


class Study(threading.Thread):
    """A study's analysis thread: one `infer` call with its priority."""

    def __init__(self, batcher: Batcher, study: int, slices: int, rank: int, deadline: float):
        super().__init__(daemon=True)
        self.batcher, self.x = batcher, labelled(study, slices)
        self.engine = BatchingEngine(batcher, rank, deadline, study=str(study))
        self.out: FloatArray | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.out = self.engine.infer(self.x)
        except BaseException as exc:
            self.error = exc


def make_batcher(dispatch: ManualDispatch | ThreadDispatch, **config: object) -> Batcher:
    defaults: dict[str, object] = {"max_batch_size": 4, "max_queue_delay_ms": 60_000.0}
    batcher = Batcher("tiny", BatchingConfig(**{**defaults, **config}), dispatch)  # type: ignore[arg-type]
    batcher.start()
    return batcher


def queue(batcher: Batcher, *studies: tuple[int, int, int, float]) -> list[Study]:
    """Start studies (id, slices, rank, deadline) one after another, each fully queued."""
    started: list[Study] = []
    for study, slices, rank, deadline in studies:
        before = batcher.pending
        started.append(Study(batcher, study, slices, rank, deadline))
        wait_until(lambda b=before, n=slices: batcher.pending == b + n)  # type: ignore[misc]
    return started


def test_urgent_slices_lead_the_next_batch_under_mixed_load(engine: FixedLatencyEngine) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch, max_queue_delay_ms=1.0)  # no slot until all are queued
    queue(batcher, (1, 6, ROUTINE, 500.0), (2, 2, ROUTINE, 100.0), (3, 3, URGENT, 900.0))
    dispatch.grant(3)
    sent = dispatch.wait_sent(3)
    # urgent first whatever its deadline; then earliest deadline (study 2); then study 1
    assert [s.labels for s in sent] == [[300, 301, 302, 200], [201, 100, 101, 102], [103, 104, 105]]
    batcher.stop()


def test_no_starvation_old_outpatient_overtakes_newer_inpatient(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch)
    # the inpatient study arrived later but queues first; the outpatient's deadline is earlier
    queue(batcher, (1, 4, ROUTINE, 2_000.0), (2, 4, ROUTINE, 1_000.0))
    dispatch.grant(2)
    assert [s.labels for s in dispatch.wait_sent(2)] == [[200, 201, 202, 203], [100, 101, 102, 103]]
    batcher.stop()


def test_urgent_study_is_in_the_very_next_batch_during_a_backlog(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch, max_queue_delay_ms=1.0)  # no slot until the test grants
    (backlog,) = queue(batcher, (1, 12, ROUTINE, 100.0))
    dispatch.grant()
    assert dispatch.wait_sent(1)[0].labels == [100, 101, 102, 103]  # running, not finished
    (urgent,) = queue(batcher, (9, 2, URGENT, 999.0))
    dispatch.grant()
    assert dispatch.wait_sent(2)[1].labels == [900, 901, 104, 105]
    dispatch.grant(2)
    dispatch.wait_sent(4)
    for i in range(4):
        dispatch.complete(i)
    for study in (backlog, urgent):
        study.join(5)
        assert study.out is not None and np.array_equal(study.out, engine.infer(study.x))
    batcher.stop()


def test_batches_mix_studies_and_results_are_routed_back_in_slice_order(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch)
    studies = queue(batcher, (1, 3, ROUTINE, 10.0), (2, 2, ROUTINE, 20.0), (3, 3, ROUTINE, 30.0))
    dispatch.grant(2)
    assert [s.labels for s in dispatch.wait_sent(2)] == [[100, 101, 102, 200], [201, 300, 301, 302]]
    for i in (1, 0):  # outputs arrive out of order
        dispatch.complete(i)
    for study in studies:
        study.join(5)
        assert study.error is None and study.out is not None
        assert np.array_equal(study.out, engine.infer(study.x))
    batcher.stop()


def test_concurrent_studies_get_what_a_direct_engine_call_gives(
    engine: FixedLatencyEngine,
) -> None:
    batcher = make_batcher(ThreadDispatch(engine), max_batch_size=8, max_queue_delay_ms=1.0)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, *SHAPE), dtype=np.float32) for n in (1, 7, 30, 64, 13)]
    with ThreadPoolExecutor(len(inputs)) as pool:
        outputs = list(pool.map(lambda x: BatchingEngine(batcher, ROUTINE, 0.0).infer(x), inputs))
    for x, out in zip(inputs, outputs, strict=True):
        assert np.array_equal(out, engine.infer(x))
    assert BatchingEngine(batcher, 0, 0.0).max_batch_size == STUDY_MAX_SLICES
    assert BatchingEngine(batcher, 0, 0.0).info == engine.info
    batcher.stop()


def test_a_partial_batch_waits_the_max_queue_delay(engine: FixedLatencyEngine) -> None:
    dispatch = ManualDispatch(engine)
    dispatch.grant()
    batcher = make_batcher(dispatch, max_batch_size=8, max_queue_delay_ms=100.0)
    queued_at = time.monotonic()
    study = Study(batcher, 1, 3, ROUTINE, 0.0)
    sent = dispatch.wait_sent(1)[0]
    assert sent.labels == [100, 101, 102]
    assert sent.at - queued_at >= 0.1  # not before the delay (how long after: benchmarks)
    dispatch.complete(0)
    study.join(5)
    assert study.out is not None
    batcher.stop()


def test_a_preferred_size_goes_at_once_and_stop_drains_the_rest(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch, max_batch_size=8, preferred_batch_sizes=(4,))
    (study,) = queue(batcher, (1, 6, ROUTINE, 0.0))
    dispatch.grant(2)
    assert dispatch.wait_sent(1)[0].labels == [100, 101, 102, 103]
    assert batcher.pending == 2  # two slices cannot fill a preferred size: they wait (60 s)
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    assert dispatch.wait_sent(2)[1].labels == [104, 105]
    stopper.join(5)
    dispatch.complete(0)
    dispatch.complete(1)
    study.join(5)
    assert study.out is not None and np.array_equal(study.out, engine.infer(study.x))


def test_back_pressure_blocks_infer_and_admits_the_urgent_study_first(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch, max_pending=4, max_queue_delay_ms=1.0)
    routine = Study(batcher, 1, 12, ROUTINE, 100.0)
    wait_until(lambda: batcher.pending == 4)
    later = Study(batcher, 2, 4, ROUTINE, 200.0)
    urgent = Study(batcher, 3, 2, URGENT, 900.0)
    time.sleep(0.05)  # both blocked: the queue is full (a wait on nothing can only be short)
    assert batcher.pending == 4 and batcher.peak_pending == 4
    dispatch.grant()
    assert dispatch.wait_sent(1)[0].labels == [100, 101, 102, 103]
    wait_until(lambda: batcher.pending == 4)
    dispatch.grant()
    assert dispatch.wait_sent(2)[1].labels == [300, 301, 104, 105]
    dispatch.grant(10)
    dispatch.wait_sent(5)
    for i in range(5):
        dispatch.complete(i)
    for study in (routine, later, urgent):
        study.join(5)
        assert study.out is not None and np.array_equal(study.out, engine.infer(study.x))
    assert batcher.peak_pending == 4
    batcher.stop()


def test_many_studies_through_a_small_bound_keep_the_queue_bounded(
    engine: FixedLatencyEngine,
) -> None:
    batcher = make_batcher(
        ThreadDispatch(engine), max_batch_size=4, max_pending=16, max_queue_delay_ms=1.0
    )
    studies = [Study(batcher, k, 40, k % 2, float(k)) for k in range(12)]
    for study in studies:
        study.join(30)
        assert study.out is not None and np.array_equal(study.out, engine.infer(study.x))
    assert batcher.peak_pending <= 16 and batcher.pending == 0
    assert batcher.batches >= 12 * 40 // 4
    batcher.stop()


def test_a_failed_batch_fails_only_the_studies_in_it(engine: FixedLatencyEngine) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch)
    bad, good = queue(batcher, (1, 6, ROUTINE, 10.0), (2, 4, ROUTINE, 20.0))
    dispatch.grant()
    dispatch.wait_sent(1)
    dispatch.complete(0, EngineError("GPU fell off the bus"))
    bad.join(5)
    assert isinstance(bad.error, EngineError) and "fell off the bus" in str(bad.error)
    assert batcher.pending == 6  # 104, 105 are still queued; they are dropped, not run
    dispatch.grant(2)
    assert dispatch.wait_sent(2)[1].labels == [200, 201, 202, 203]
    dispatch.complete(1)
    good.join(5)
    assert good.out is not None
    batcher.stop()


def test_a_slice_that_does_not_fit_the_model_is_refused_before_queuing(
    engine: FixedLatencyEngine,
) -> None:
    batcher = make_batcher(ManualDispatch(engine))
    study = BatchingEngine(batcher, ROUTINE, 0.0)
    with pytest.raises(ValueError, match="expected float32"):
        study.infer(np.zeros((2, 1, 8, 8), np.float32))
    with pytest.raises(ValueError, match="expected float32"):
        study.infer(np.zeros((2, *SHAPE), np.float64))
    assert batcher.pending == 0
    batcher.stop()


def test_stop_fails_studies_it_cannot_run_and_refuses_new_ones(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)  # never grants: the queue cannot drain
    batcher = make_batcher(dispatch)
    (study,) = queue(batcher, (1, 3, ROUTINE, 0.0))
    batcher.stop(timeout_s=0.1)
    study.join(5)
    assert isinstance(study.error, EngineError)
    with pytest.raises(EngineError, match="stopped"):
        BatchingEngine(batcher, ROUTINE, 0.0).infer(labelled(2, 1))


def test_a_study_larger_than_the_arena_goes_through_and_every_slot_comes_back(
    engine: FixedLatencyEngine,
) -> None:
    batcher = make_batcher(
        ThreadDispatch(engine), max_batch_size=4, max_pending=4, max_queue_delay_ms=1.0
    )
    assert batcher.slots == (0, 4 + 2 * 4)  # max_pending + the batches that can be out
    studies = [Study(batcher, k, n, ROUTINE, float(k)) for k, n in enumerate((40, 3, 17))]
    for study in studies:
        study.join(30)
        assert study.out is not None and np.array_equal(study.out, engine.infer(study.x))
    wait_until(lambda: batcher.slots[0] == 0)
    batcher.stop()


def test_stop_removes_the_shared_memory_once_the_last_batch_is_back(
    engine: FixedLatencyEngine,
) -> None:
    dispatch = ManualDispatch(engine)
    batcher = make_batcher(dispatch)
    (study,) = queue(batcher, (1, 4, ROUTINE, 0.0))
    dispatch.grant()
    dispatch.wait_sent(1)
    ref = batcher._arena.ref if batcher._arena else None  # the names, to look for them
    assert ref is not None
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    stopper.join(5)
    shm = Path("/dev/shm")
    assert not shm.is_dir() or (shm / ref.input_name).exists()  # a batch is still out
    dispatch.complete(0)
    study.join(5)
    assert study.out is not None and np.array_equal(study.out, engine.infer(study.x))
    assert not (shm / ref.input_name).exists() and not (shm / ref.output_name).exists()
