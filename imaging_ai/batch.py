"""Slices of one model from many studies in; priority-ordered batches for the worker pool out.

Triton's dynamic batcher, in-process. Each study's `BatchingEngine.infer` copies its slices once
into free slots of the model's shared-memory `SliceArena` and queues them as `SliceRequest`s
(one per run of a study's slices), ordered urgent first, then earliest deadline, then arrival.
One `Batcher` thread per model forms each batch from the head of that queue at the moment a
worker has room for it, so an urgent study that arrives during a backlog is in the next batch
formed: preemption at batch boundaries. A batch leaves at once when the queue fills a preferred
size (or the max batch size), else when its oldest request has waited the max queue delay. It
travels as slot numbers (`SlotBatch`): the worker reads the inputs from the slots and writes the
outputs into them; a few copier threads copy each study's outputs out in slice order and free
the slots. The batcher thread never touches pixel data.

Bounds keep latency and memory flat whatever the backlog: the dispatcher grants a batch only
while some worker's queue is shallow (`Dispatch.reserve`), so an urgent batch never waits behind
a deep queue; `infer` blocks while `max_pending` slices are queued or the arena has no free
slot, admitting the waiting studies in priority order.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from imaging_ai.arena import ArenaRef, SliceArena, SlotBatch, runs
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, FloatArray

log = logging.getLogger(__name__)

Priority = tuple[int, float, int]
"""(rank, deadline, sequence): the sort key of a request or a waiter; smaller goes first."""
BatchCallback = Callable[[BaseException | None], None]
"""Called once per batch: None when its outputs are in their arena slots, else the error."""

# `infer` takes a whole study at once: CT series rarely exceed ~2,000 slices, and queuing a
# study's slices together lets batches fill across studies instead of one chunk at a time.
STUDY_MAX_SLICES = 4096


@dataclass(frozen=True)
class BatchingConfig:
    """Triton's knobs (max batch size, preferred batch sizes, max queue delay) and a queue bound.

    `max_pending` is the most slices queued for the model at once; `infer` blocks beyond it.
    """

    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float = 5.0
    max_pending: int = 512

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size = {self.max_batch_size}: expected >= 1")
        bad = [s for s in self.preferred_batch_sizes if not 1 <= s <= self.max_batch_size]
        if bad:
            raise ValueError(
                f"preferred_batch_sizes = {self.preferred_batch_sizes}: {bad} outside "
                f"1..max_batch_size ({self.max_batch_size})"
            )
        if self.max_queue_delay_ms < 0:
            raise ValueError(f"max_queue_delay_ms = {self.max_queue_delay_ms}: expected >= 0")
        if self.max_pending < self.max_batch_size:
            raise ValueError(
                f"max_pending = {self.max_pending}: expected >= max_batch_size "
                f"({self.max_batch_size}), so that a full batch can queue"
            )


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


def _keep(slots: Sequence[int]) -> None:
    """The release of a ResultSlot that owns no arena slots (tests)."""


class ResultSlot:
    """The outputs of one `infer` call, copied out of the arena run by run as batches finish.

    Parameters
    ----------
    slices : int
        Slices of the study.
    output_shape : tuple[int, ...]
        (K, h, w) of one output slice.
    release : callable
        Frees arena slots once their outputs are copied (or no longer wanted).
    """

    def __init__(
        self,
        slices: int,
        output_shape: tuple[int, ...] = (),
        release: Callable[[Sequence[int]], None] = _keep,
    ) -> None:
        self._left = slices
        self._out = np.empty((slices, *output_shape), np.float32)
        self._release = release
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.done = threading.Event()

    @property
    def failed(self) -> bool:
        """True once any of its slices failed; its queued slices are then dropped, not run."""
        return self._error is not None

    def deliver(self, outputs: FloatArray, first: int, slots: Sequence[int]) -> None:
        """Copy slices first, first+1, ... out of arena `outputs` at `slots`; free the slots.

        The last slice sets `done`. Outputs of a study that has failed are not copied.
        """
        try:
            if self._error is None:
                for _, i, s, n in runs(range(first, first + len(slots)), slots):
                    self._out[i : i + n] = outputs[s : s + n]
        finally:
            self._release(slots)
        with self._lock:
            self._left -= len(slots)
            if self._left <= 0:
                self.done.set()

    def fail(self, error: BaseException) -> None:
        """Record the first error and wake the waiting study."""
        with self._lock:
            if self._error is None:
                self._error = error
        self.done.set()

    def result(self, model: str) -> FloatArray:
        """The outputs in slice order, once `done` is set; raises EngineError if a batch failed."""
        if self._error is not None:
            # A fresh exception per study: the same error may be shared by several studies.
            raise EngineError(f"{model}: {self._error}") from self._error
        return self._out


@dataclass(frozen=True)
class SliceWork:
    """A request's payload: slices `first`, `first`+1, ... of a study, in these arena slots."""

    study: str
    first: int
    slots: tuple[int, ...]
    result: ResultSlot


@dataclass(frozen=True, order=True)
class SliceRequest:
    """A run of queued slices, ordered by (rank, deadline, enqueued_ns); payload not compared.

    A batch may take the first part of a run; the rest goes back to the queue with its key,
    so it keeps its place.
    """

    rank: int
    deadline: float
    enqueued_ns: int
    payload: SliceWork = field(compare=False)

    @property
    def priority(self) -> Priority:
        """The sort key as a tuple, for `Dispatch.reserve`."""
        return (self.rank, self.deadline, self.enqueued_ns)


def choose_batch_size(waiting: int, config: BatchingConfig, expired: bool) -> int:
    """How many of the `waiting` requests to batch now; 0 means wait for more.

    Parameters
    ----------
    waiting : int
        Requests in the queue.
    config : BatchingConfig
        The model's batching knobs.
    expired : bool
        The oldest request has waited the max queue delay (or the batcher is draining).

    Returns
    -------
    int
        The largest preferred size `waiting` fills; else a full max batch; else, once expired,
        everything waiting; else 0.
    """
    fits = [s for s in config.preferred_batch_sizes if s <= waiting]
    if fits:
        return max(fits)
    if waiting >= config.max_batch_size:
        return config.max_batch_size
    return waiting if expired else 0


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
        self._queue: list[SliceRequest] = []
        self._pending = 0  # slices in the queue
        self._copying = 0  # slices with a slot, being copied in
        self._admission: list[Priority] = []
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._last_ns = 0
        self._stopping = self._closing = self._closed = False
        self._in_flight = 0  # batches submitted and not finished
        self._thread: threading.Thread | None = None
        self._arena: SliceArena | None = None
        self._copier: ThreadPoolExecutor | None = None
        self.peak_pending = 0
        self.batches = 0

    @property
    def pending(self) -> int:
        """Slices queued now (not yet in a batch)."""
        with self._cond:
            return self._pending

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
        self._copier = ThreadPoolExecutor(self._copiers, thread_name_prefix=f"copy-{self.model}")
        self._thread = threading.Thread(target=self._run, name=f"batch-{self.model}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Refuse new studies, dispatch what is queued, and end the thread.

        Slices still queued after `timeout_s` fail their studies with EngineError. Batches
        already dispatched complete through the dispatcher, so stop the batchers before it; the
        arena goes once the last of them has finished.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._abort(EngineError(f"{self.model}: stopped before these slices ran"))
        with self._cond:
            self._cond.wait_for(lambda: self._copying == 0, 5.0)
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
        slot = ResultSlot(len(batch), arena.ref.output_shape, self._release)
        self._admit(batch, rank, deadline, study, slot)
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

    def _admit(
        self, batch: FloatArray, rank: int, deadline: float, study: str, slot: ResultSlot
    ) -> None:
        """Copy in and queue the slices as room allows; the most urgent blocked study goes first."""
        ticket: Priority = (rank, deadline, next(self._tickets))
        with self._cond:
            heapq.heappush(self._admission, ticket)
        try:
            start = 0
            while start < len(batch) and not slot.failed:
                slots = self._take_slots(ticket, len(batch) - start)
                try:
                    # Outside the lock: the batcher thread forms batches while this copies.
                    for _, i, s, n in runs(range(start, start + len(slots)), slots):
                        self._arena_of().inputs[s : s + n] = batch[i : i + n]
                except BaseException:
                    self._push(start, slots, rank, deadline, study, None)
                    raise
                self._push(start, slots, rank, deadline, study, slot)
                start += len(slots)
        except BaseException as exc:
            slot.fail(exc)  # its slices already queued are dropped when they reach the head
            raise
        finally:
            with self._cond:
                self._admission.remove(ticket)
                heapq.heapify(self._admission)
                self._cond.notify_all()

    def _arena_of(self) -> SliceArena:
        assert self._arena is not None
        return self._arena

    def _take_slots(self, ticket: Priority, wanted: int) -> tuple[int, ...]:
        """Wait for room at the head of admission; the arena slots for the next slices."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or self._may_admit(ticket))
            if self._stopping:
                raise EngineError(f"{self.model}: batcher stopped")
            room = self.config.max_pending - self._pending - self._copying
            slots = tuple(int(s) for s in self._arena_of().allocate(min(wanted, room)))
            self._copying += len(slots)
            return slots

    def _may_admit(self, ticket: Priority) -> bool:
        room = self._pending + self._copying < self.config.max_pending
        return room and self._admission[0] == ticket and self._arena_of().available > 0

    def _push(
        self,
        start: int,
        slots: tuple[int, ...],
        rank: int,
        deadline: float,
        study: str,
        slot: ResultSlot | None,
    ) -> None:
        """Queue copied slices (or, without a result slot or when stopping, free their slots)."""
        with self._cond:
            self._copying -= len(slots)
            self._cond.notify_all()
            if slot is None or self._stopping or slot.failed:
                self._release(slots)
                if slot is not None and self._stopping:
                    raise EngineError(f"{self.model}: batcher stopped")
                return
            # Strictly increasing, so runs of one study keep their order among equal keys.
            self._last_ns = max(time.monotonic_ns(), self._last_ns + 1)
            work = SliceWork(study, start, slots, slot)
            heapq.heappush(self._queue, SliceRequest(rank, deadline, self._last_ns, work))
            self._pending += len(slots)
            self.peak_pending = max(self.peak_pending, self._pending)

    def _release(self, slots: Sequence[int]) -> None:
        """Free arena slots and wake studies waiting for room."""
        if self._arena is not None and slots:
            self._arena.free(slots)
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception as exc:  # a bug here must fail the waiting studies, not hang them
            log.exception("%s: batcher failed", self.model)
            self._abort(EngineError(f"{self.model}: batcher failed: {exc}"))

    def _step(self) -> bool:
        """Form and dispatch one batch; False once stopped and drained."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queue) or self._stopping)
            if not self._queue:
                return False
            head = self._queue[0].priority
        # Re-read the head after each short wait: a more urgent study may have arrived.
        if not self._dispatch.reserve(head, self._slot_wait_s):
            return True
        works: list[SliceWork] = []
        try:
            works = self._form()
            if works:
                self._send(works)
        finally:
            if not works:
                self._dispatch.release()
        return True

    def _form(self) -> list[SliceWork]:
        """Wait (up to the max queue delay) for a batch worth sending, then pop it."""
        delay_ns = int(self.config.max_queue_delay_ms * 1e6)
        with self._cond:
            while self._queue:
                oldest = min(r.enqueued_ns for r in self._queue)
                wait_ns = oldest + delay_ns - time.monotonic_ns()
                expired = self._stopping or wait_ns <= 0
                size = choose_batch_size(self._pending, self.config, expired)
                if size:
                    return self._pop(size)
                self._cond.wait(wait_ns / 1e9)
            return []

    def _pop(self, size: int) -> list[SliceWork]:
        """Up to `size` slices from the head, splitting the last run if it does not fit."""
        works: list[SliceWork] = []
        count = 0
        while self._queue and count < size:
            request = heapq.heappop(self._queue)
            work = request.payload
            self._pending -= len(work.slots)
            if work.result.failed:  # its study has failed: drop, do not run
                self._release(work.slots)
                continue
            take = min(size - count, len(work.slots))
            if take < len(work.slots):
                rest = replace(work, first=work.first + take, slots=work.slots[take:])
                heapq.heappush(self._queue, replace(request, payload=rest))
                self._pending += len(rest.slots)
                work = replace(work, slots=work.slots[:take])
            works.append(work)
            count += take
        self._cond.notify_all()  # room for blocked studies
        return works

    def _send(self, works: list[SliceWork]) -> None:
        def done(error: BaseException | None) -> None:
            self._finish(works, error)

        batch = SlotBatch(self._arena_of(), tuple(s for w in works for s in w.slots))
        with self._cond:
            self.batches += 1
            self._in_flight += 1
        try:
            self._dispatch.submit(self.model, batch, done)
        except EngineError as exc:
            log.warning("%s: batch of %d not dispatched: %s", self.model, len(batch), exc)
            self._finish(works, exc)

    def _finish(self, works: list[SliceWork], error: BaseException | None) -> None:
        """A batch is back: hand its runs to the copiers, or fail their studies."""
        try:
            for work in works:
                if error is not None:
                    work.result.fail(error)
                    self._release(work.slots)
                else:
                    assert self._copier is not None
                    self._copier.submit(self._deliver, work)
        finally:
            with self._cond:
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

    def _abort(self, error: EngineError) -> None:
        with self._cond:
            self._stopping = True
            dropped, self._queue, self._pending = self._queue, [], 0
            self._cond.notify_all()
        for request in dropped:
            request.payload.result.fail(error)
            self._release(request.payload.slots)

    def _close(self) -> None:
        """Let the copiers finish, then unmap and remove the arena (once)."""
        with self._cond:
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
