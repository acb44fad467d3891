"""Slices of one model from many studies in; priority-ordered batches for the worker pool out.

Triton's dynamic batcher, in-process. Each study's `BatchingEngine.infer` queues its slices as
`SliceRequest`s, ordered urgent first, then earliest deadline, then arrival. One `Batcher` thread
per model forms each batch from the head of that queue at the moment a worker has room for it,
so an urgent study that arrives during a backlog is in the next batch formed: preemption at
batch boundaries. A batch leaves at once when the queue fills a preferred size (or the max batch
size), else when its oldest request has waited the max queue delay. Each batch's outputs are
copied back into their studies' results in slice order.

Two bounds keep latency and memory flat whatever the backlog: the dispatcher grants a batch only
while some worker's queue is shallow (`Dispatch.reserve`), so an urgent batch never waits behind
a deep queue; and `infer` blocks while `max_pending` slices are queued, admitting the waiting
studies in priority order.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, FloatArray

log = logging.getLogger(__name__)

Priority = tuple[int, float, int]
"""(rank, deadline, sequence): the sort key of a request or a waiter; smaller goes first."""
BatchResult = FloatArray | BaseException
BatchCallback = Callable[[BatchResult], None]

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
    """Where batches run: the worker pool (`imaging_ai.workers.WorkerPool`), or a test fake."""

    def input_shape(self, model: str) -> tuple[int, ...]:
        """(C, H, W) of one input slice of `model`."""
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

    def submit(self, model: str, slices: Sequence[FloatArray], done: BatchCallback) -> None:
        """Run `slices` as one batch; `done` gets outputs (valid during the call) or an error."""
        ...


class ResultSlot:
    """The outputs of one `infer` call, filled slice by slice by whichever batches carry them."""

    def __init__(self, slices: int) -> None:
        self._slices, self._left = slices, slices
        self._out: FloatArray | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.done = threading.Event()

    @property
    def failed(self) -> bool:
        """True once any of its slices failed; its queued slices are then dropped, not run."""
        return self._error is not None

    def put(self, index: int, value: FloatArray) -> None:
        """Copy one slice's output into place; the last one sets `done`."""
        with self._lock:
            if self._error is not None:
                return
            if self._out is None:
                self._out = np.empty((self._slices, *value.shape), np.float32)
            self._out[index] = value
            self._left -= 1
            if self._left == 0:
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
        assert self._out is not None
        return self._out


@dataclass(frozen=True)
class SliceWork:
    """A request's payload: its study, slice index, input slice (a view) and result slot."""

    study: str
    index: int
    data: FloatArray
    result: ResultSlot


@dataclass(frozen=True, order=True)
class SliceRequest:
    """One queued slice, ordered by (rank, deadline, enqueued_ns); the payload is not compared."""

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
    """

    def __init__(
        self, model: str, config: BatchingConfig, dispatch: Dispatch, *, slot_wait_s: float = 0.05
    ) -> None:
        self.model, self.config, self._dispatch = model, config, dispatch
        self._slot_wait_s = slot_wait_s
        self._input_shape = tuple(dispatch.input_shape(model))
        self._queue: list[SliceRequest] = []
        self._admission: list[Priority] = []
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._last_ns = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.peak_pending = 0
        self.batches = 0

    @property
    def pending(self) -> int:
        """Slices queued now (not yet in a batch)."""
        with self._cond:
            return len(self._queue)

    @property
    def info(self) -> BackendInfo:
        """The dispatcher's figures for this model."""
        return self._dispatch.info(self.model)

    def start(self) -> None:
        """Start the batching thread."""
        self._thread = threading.Thread(target=self._run, name=f"batch-{self.model}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Refuse new studies, dispatch what is queued, and end the thread.

        Slices still queued after `timeout_s` fail their studies with EngineError. Batches
        already dispatched complete through the dispatcher, so stop the batchers before it.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._abort(EngineError(f"{self.model}: stopped before these slices ran"))

    def infer(
        self, batch: FloatArray, *, rank: int, deadline: float, study: str = ""
    ) -> FloatArray:
        """Queue every slice of `batch` with the study's priority; wait for all outputs.

        Parameters
        ----------
        batch : FloatArray
            float32 [N, C, H, W], 1 <= N <= STUDY_MAX_SLICES; slices are queued as views.
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
            A batch failed on every worker, or the batcher stopped.
        """
        self._check(batch)
        slot = ResultSlot(len(batch))
        self._admit(batch, rank, deadline, study, slot)
        slot.done.wait()
        return slot.result(self.model)

    def _check(self, batch: FloatArray) -> None:
        # A wrong slice must fail its own study here, not the mixed batch it would land in.
        if batch.dtype != np.float32 or batch.ndim != 4 or batch.shape[1:] != self._input_shape:
            raise ValueError(
                f"{self.model}: batch {batch.dtype} {batch.shape}, "
                f"expected float32 (N, {', '.join(map(str, self._input_shape))})"
            )
        if not 1 <= len(batch) <= STUDY_MAX_SLICES:
            raise ValueError(f"{self.model}: {len(batch)} slices, expected 1..{STUDY_MAX_SLICES}")

    def _admit(
        self, batch: FloatArray, rank: int, deadline: float, study: str, slot: ResultSlot
    ) -> None:
        """Queue the slices as room allows; among blocked studies the most urgent goes first."""
        ticket: Priority = (rank, deadline, next(self._tickets))
        with self._cond:
            heapq.heappush(self._admission, ticket)
            try:
                start = 0
                while start < len(batch):
                    self._cond.wait_for(lambda: self._stopping or self._may_admit(ticket))
                    if self._stopping:
                        raise EngineError(f"{self.model}: batcher stopped")
                    start = self._push(batch, start, rank, deadline, study, slot)
            except BaseException as exc:
                slot.fail(exc)  # its slices already queued are dropped when they reach the head
                raise
            finally:
                self._admission.remove(ticket)
                heapq.heapify(self._admission)
                self._cond.notify_all()

    def _may_admit(self, ticket: Priority) -> bool:
        return len(self._queue) < self.config.max_pending and self._admission[0] == ticket

    def _push(
        self,
        batch: FloatArray,
        start: int,
        rank: int,
        deadline: float,
        study: str,
        slot: ResultSlot,
    ) -> int:
        stop = min(len(batch), start + self.config.max_pending - len(self._queue))
        for i in range(start, stop):
            # Strictly increasing, so slices of one study keep their order among equal keys.
            self._last_ns = max(time.monotonic_ns(), self._last_ns + 1)
            work = SliceWork(study, i, batch[i], slot)
            heapq.heappush(self._queue, SliceRequest(rank, deadline, self._last_ns, work))
        self.peak_pending = max(self.peak_pending, len(self._queue))
        self._cond.notify_all()
        return stop

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
        requests: list[SliceRequest] = []
        try:
            requests = self._form()
            if requests:
                self._send(requests)
        finally:
            if not requests:
                self._dispatch.release()
        return True

    def _form(self) -> list[SliceRequest]:
        """Wait (up to the max queue delay) for a batch worth sending, then pop it."""
        delay_ns = int(self.config.max_queue_delay_ms * 1e6)
        with self._cond:
            while self._queue:
                oldest = min(r.enqueued_ns for r in self._queue)
                wait_ns = oldest + delay_ns - time.monotonic_ns()
                expired = self._stopping or wait_ns <= 0
                size = choose_batch_size(len(self._queue), self.config, expired)
                if size:
                    return self._pop(size)
                self._cond.wait(wait_ns / 1e9)
            return []

    def _pop(self, size: int) -> list[SliceRequest]:
        batch: list[SliceRequest] = []
        while self._queue and len(batch) < size:
            request = heapq.heappop(self._queue)
            if not request.payload.result.failed:  # its study has failed: drop, do not run
                batch.append(request)
        self._cond.notify_all()  # room for blocked studies
        return batch

    def _send(self, requests: list[SliceRequest]) -> None:
        def done(result: BatchResult) -> None:
            route(requests, result)

        self.batches += 1
        try:
            self._dispatch.submit(self.model, [r.payload.data for r in requests], done)
        except EngineError as exc:
            log.warning("%s: batch of %d not dispatched: %s", self.model, len(requests), exc)
            route(requests, exc)

    def _abort(self, error: EngineError) -> None:
        with self._cond:
            self._stopping = True
            dropped, self._queue = self._queue, []
            self._cond.notify_all()
        for request in dropped:
            request.payload.result.fail(error)


def route(requests: Sequence[SliceRequest], result: BatchResult) -> None:
    """Hand each slice's output (or the batch's error) to its study's result slot.

    Parameters
    ----------
    requests : Sequence[SliceRequest]
        The batch's requests, in batch order.
    result : FloatArray or BaseException
        [N, K, h, w] outputs in the same order (read here, not kept), or what went wrong.
    """
    if isinstance(result, BaseException):
        for request in requests:
            request.payload.result.fail(result)
        return
    for i, request in enumerate(requests):
        request.payload.result.put(request.payload.index, result[i])


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
