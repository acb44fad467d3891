"""Slices of one model from many studies in; priority-ordered batches for the worker pool out.

Triton's dynamic batcher, in-process. Each study's `BatchingEngine.infer` copies its slices once
into free slots of the model's shared-memory `SliceArena` and queues them as `SliceRequest`s
(one per run of a study's slices; `imaging_ai.batch_requests`), ordered urgent first, then
earliest deadline, then arrival (`imaging_ai.batch_queue`). One `Batcher` thread per model forms
each batch from the head of that queue at the moment a worker has room for it, so an urgent
study that arrives during a backlog is in the next batch formed: preemption at batch boundaries.
A batch leaves at once when the queue fills a preferred size (or the max batch size), else when
its oldest request has waited the max queue delay (`imaging_ai.batch_policy`). It travels as
slot numbers (`SlotBatch`) to the `Dispatch`: the worker reads the inputs from the slots and
writes the outputs into them; a few copier threads copy each study's outputs out in slice order
and free the slots. The batcher thread never touches pixel data.

Bounds keep latency and memory flat whatever the backlog: the dispatcher grants a batch only
while some worker's queue is shallow (`Dispatch.reserve`), so an urgent batch never waits behind
a deep queue; `infer` blocks while `max_pending` slices are queued or the arena has no free
slot, admitting the waiting studies in priority order.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from imaging_ai.arena import ArenaRef, SliceArena, SlotBatch
from imaging_ai.batch_policy import BatchingConfig
from imaging_ai.batch_queue import SliceQueue
from imaging_ai.batch_requests import BatchCallback, Priority, ResultSlot, SliceWork
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, FloatArray

log = logging.getLogger(__name__)

# `infer` takes a whole study at once: CT series rarely exceed ~2,000 slices, and queuing a
# study's slices together lets batches fill across studies instead of one chunk at a time.
STUDY_MAX_SLICES = 4096


class Dispatch(Protocol):
    """Where batches run: the worker pool (`imaging_ai.worker_pool.WorkerPool`), or a test fake."""

    def input_shape(self, model: str) -> tuple[int, ...]:
        """(C, H, W) of one input slice of `model`."""
        ...

    def output_shape(self, model: str) -> tuple[int, ...]:
        """(K, h, w) of one output slice of `model` (known once the workers are up)."""
        ...

    def batch_capacity(self) -> int:
        """How many batches can be reserved or running at once, over every worker."""
        ...

    def info(self, model: str) -> BackendInfo:
        """Backend, devices and fallback figures of `model` for the status page."""
        ...

    def reserve(self, priority: Priority, timeout_s: float) -> bool:
        """Wait until a worker has room for one more batch and no more urgent batcher waits."""
        ...

    def release(self) -> None:
        """Give back a reservation that no batch used."""
        ...

    def submit(self, model: str, batch: SlotBatch, done: BatchCallback) -> None:
        """Run the slots' inputs as one batch into their outputs; then `done(None)` or an error."""
        ...


class Batcher:
    """One model's priority queue of slices and the thread that batches them onto `dispatch`.

    Parameters
    ----------
    model : str
        The model's name, as the dispatcher knows it.
    config : BatchingConfig
        Batch sizes, queue delay and queue bound.
    dispatch : Dispatch
        The worker pool.
    slot_wait_s : float
        How long one `reserve` waits before the batcher looks at its queue head again.
    copiers : int
        Threads that copy finished outputs out of the arena into the studies' arrays.
    """

    def __init__(
        self,
        model: str,
        config: BatchingConfig,
        dispatch: Dispatch,
        *,
        slot_wait_s: float = 0.05,
        copiers: int = 4,
    ) -> None:
        self.model, self.config, self._dispatch = model, config, dispatch
        self._slot_wait_s, self._copiers = slot_wait_s, copiers
        self._input_shape = tuple(dispatch.input_shape(model))
        self._slices = SliceQueue(model, config)
        self._lock = threading.Lock()  # the batches sent and in flight, and closing
        self._closing = self._closed = False
        self._in_flight = 0  # batches submitted and not finished
        self._thread: threading.Thread | None = None
        self._arena: SliceArena | None = None
        self._copier: ThreadPoolExecutor | None = None
        self.batches = 0

    @property
    def pending(self) -> int:
        """Slices queued now (not yet in a batch)."""
        return self._slices.pending

    @property
    def peak_pending(self) -> int:
        """The most slices queued at once since start."""
        return self._slices.peak_pending

    @property
    def info(self) -> BackendInfo:
        """The dispatcher's figures for this model."""
        return self._dispatch.info(self.model)

    @property
    def arena_ref(self) -> ArenaRef | None:
        """What a worker needs to map this model's arena; None before `start`."""
        return None if self._arena is None else self._arena.ref

    @property
    def slots(self) -> tuple[int, int]:
        """Arena slots (in use, capacity): queued, running and not yet copied-out slices."""
        arena = self._arena
        return (0, 0) if arena is None else (arena.capacity - arena.available, arena.capacity)

    def start(self) -> None:
        """Create the model's arena (the workers must be up) and start the batching thread.

        Raises
        ------
        EngineError
            Shared memory cannot hold the arena.
        """
        batch = self.config.max_batch_size
        capacity = self.config.max_pending + self._dispatch.batch_capacity() * batch
        out_shape = tuple(self._dispatch.output_shape(self.model))
        self._arena = SliceArena.create(capacity, self._input_shape, out_shape)
        self._slices.attach(self._arena)
        self._copier = ThreadPoolExecutor(self._copiers, thread_name_prefix=f"copy-{self.model}")
        self._thread = threading.Thread(target=self._run, name=f"batch-{self.model}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Refuse new studies, dispatch what is queued, and end the thread.

        Slices still queued after `timeout_s` fail their studies with EngineError. Batches
        already dispatched complete through the dispatcher, so stop the batchers before it; the
        arena goes once the last of them has finished.
        """
        self._slices.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._slices.abort(EngineError(f"{self.model}: stopped before these slices ran"))
        self._slices.wait_copied(5.0)
        with self._lock:
            self._closing = True
            idle = self._in_flight == 0
        if idle:
            self._close()

    def infer(
        self, batch: FloatArray, *, rank: int, deadline: float, study: str = ""
    ) -> FloatArray:
        """Queue every slice of `batch` with the study's priority; wait for all outputs.

        Parameters
        ----------
        batch : FloatArray
            float32 [N, C, H, W], 1 <= N <= STUDY_MAX_SLICES; copied into the arena as admitted.
        rank : int
            0 for urgent, larger for less urgent.
        deadline : float
            The study's deadline (seconds since the epoch); earlier runs first within a rank.
        study : str
            The study's key, for logs.

        Returns
        -------
        FloatArray
            [N, K, h, w], in slice order.

        Raises
        ------
        ValueError
            The batch does not fit the model.
        EngineError
            A batch failed on every worker, or the batcher stopped (or never started).
        """
        self._check(batch)
        arena = self._arena
        if arena is None:
            raise EngineError(f"{self.model}: batcher not started")
        slot = ResultSlot(len(batch), arena.ref.output_shape, self._slices.release)
        self._slices.admit(batch, rank, deadline, study, slot)
        slot.done.wait()
        return slot.result(self.model)

    def _check(self, batch: FloatArray) -> None:
        # A wrong slice must fail its own study here, not the mixed batch it would land in.
        if batch.dtype != np.float32 or batch.shape[1:] != self._input_shape:
            raise ValueError(
                f"{self.model}: batch {batch.dtype} {batch.shape}, "
                f"expected float32 (N, {', '.join(map(str, self._input_shape))})"
            )
        if not 1 <= len(batch) <= STUDY_MAX_SLICES:
            raise ValueError(f"{self.model}: {len(batch)} slices, expected 1..{STUDY_MAX_SLICES}")

    def _arena_of(self) -> SliceArena:
        assert self._arena is not None
        return self._arena

    # -- the batcher's thread

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception as exc:  # a bug here must fail the waiting studies, not hang them
            log.exception("%s: batcher failed", self.model)
            self._slices.abort(EngineError(f"{self.model}: batcher failed: {exc}"))

    def _step(self) -> bool:
        """Form and dispatch one batch; False once stopped and drained."""
        head = self._slices.head()
        if head is None:
            return False
        # Re-read the head after each short wait: a more urgent study may have arrived.
        if not self._dispatch.reserve(head, self._slot_wait_s):
            return True
        works: list[SliceWork] = []
        try:
            works = self._slices.take()
            if works:
                self._send(works)
        finally:
            if not works:
                self._dispatch.release()
        return True

    def _send(self, works: list[SliceWork]) -> None:
        def done(error: BaseException | None) -> None:
            self._finish(works, error)

        batch = SlotBatch(self._arena_of(), tuple(s for w in works for s in w.slots))
        with self._lock:
            self.batches += 1
            self._in_flight += 1
        try:
            self._dispatch.submit(self.model, batch, done)
        except EngineError as exc:
            log.warning("%s: batch of %d not dispatched: %s", self.model, len(batch), exc)
            self._finish(works, exc)

    # -- batches back (in the dispatcher's threads), outputs out (in the copiers)

    def _finish(self, works: list[SliceWork], error: BaseException | None) -> None:
        """A batch is back: hand its runs to the copiers, or fail their studies."""
        try:
            for work in works:
                if error is not None:
                    work.result.fail(error)
                    self._slices.release(work.slots)
                else:
                    assert self._copier is not None
                    self._copier.submit(self._deliver, work)
        finally:
            with self._lock:
                self._in_flight -= 1
                last = self._closing and self._in_flight == 0
            if last:
                self._close()

    def _deliver(self, work: SliceWork) -> None:
        try:
            work.result.deliver(self._arena_of().outputs, work.first, work.slots)
        except Exception as exc:  # a copy bug must fail the study, not leave it waiting
            log.exception("%s: copying outputs failed", self.model)
            work.result.fail(EngineError(f"{self.model}: copying outputs failed: {exc}"))

    def _close(self) -> None:
        """Let the copiers finish, then unmap and remove the arena (once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._copier is not None:
            self._copier.shutdown(wait=True)
        if self._arena is not None:
            self._arena.close()


class BatchingEngine:
    """One study's `Engine`: its slices go through a shared Batcher with the study's priority.

    Parameters
    ----------
    batcher : Batcher
        The model's batcher, shared by every study.
    rank : int
        0 for urgent (`imaging_ai.assemble.RANKS`).
    deadline : float
        The study's deadline in seconds since the epoch (`claim.deadline.timestamp()`).
    study : str
        The study's key, for logs.
    """

    def __init__(self, batcher: Batcher, rank: int, deadline: float, *, study: str = "") -> None:
        self._batcher, self._rank, self._deadline, self._study = batcher, rank, deadline, study

    @property
    def max_batch_size(self) -> int:
        """STUDY_MAX_SLICES: callers pass whole studies; the batcher splits them."""
        return STUDY_MAX_SLICES

    @property
    def info(self) -> BackendInfo:
        """The worker pool's figures for the model."""
        return self._batcher.info

    def infer(self, batch: FloatArray) -> FloatArray:
        """Run every slice through the batcher; blocks until all outputs are back, in order."""
        return self._batcher.infer(
            batch, rank=self._rank, deadline=self._deadline, study=self._study
        )

    def close(self) -> None:
        """Nothing to release: the batcher and the workers outlive the study."""
