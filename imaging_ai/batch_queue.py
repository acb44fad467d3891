"""Takes studies' slices with their priority; gives them back from the head, batch by batch.

One model's queue, owned by its `imaging_ai.batch.Batcher`. `admit` copies a study's slices
into free slots of the model's arena and queues them as `SliceRequest`s, one per run; it blocks
while `max_pending` slices are queued or no slot is free, and the blocked studies are let in
most urgent first (a ticket per study, ordered like the requests). `take` waits up to the max
queue delay for a batch worth sending (`imaging_ai.batch_policy.choose_batch_size`) and pops it
from the head, splitting the last run if it does not fit; the slices of a study that failed are
dropped there, not run. Everything runs under one condition, in the callers' threads.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from imaging_ai.arena import SliceArena, runs
from imaging_ai.batch_policy import BatchingConfig, choose_batch_size
from imaging_ai.batch_requests import Priority, ResultSlot, SliceRequest, SliceWork
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import FloatArray


class SliceQueue:
    """One model's priority queue of slices, with admission in priority order.

    Parameters
    ----------
    model : str
        The model's name, for errors.
    config : BatchingConfig
        Batch sizes, queue delay and queue bound.
    """

    def __init__(self, model: str, config: BatchingConfig) -> None:
        self.model, self.config = model, config
        self._arena: SliceArena | None = None
        self._queue: list[SliceRequest] = []
        self._pending = 0  # slices in the queue
        self._copying = 0  # slices with a slot, being copied in
        self._admission: list[Priority] = []
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._last_ns = 0
        self._stopping = False
        self.peak_pending = 0

    def attach(self, arena: SliceArena) -> None:
        """The arena whose slots the slices are copied into (the batcher's, once started)."""
        self._arena = arena

    @property
    def pending(self) -> int:
        """Slices queued now (not yet in a batch)."""
        with self._cond:
            return self._pending

    def admit(
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

    def release(self, slots: Sequence[int]) -> None:
        """Free arena slots and wake studies waiting for room."""
        if self._arena is not None and slots:
            self._arena.free(slots)
        with self._cond:
            self._cond.notify_all()

    def head(self) -> Priority | None:
        """Wait for a queued slice; the head's priority, or None once stopped and drained."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queue) or self._stopping)
            return self._queue[0].priority if self._queue else None

    def take(self) -> list[SliceWork]:
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

    def stop(self) -> None:
        """Refuse new slices; what is queued goes out without waiting the max queue delay."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def abort(self, error: EngineError) -> None:
        """Stop, and fail the studies of every slice still queued (their slots are freed)."""
        with self._cond:
            self._stopping = True
            dropped, self._queue, self._pending = self._queue, [], 0
            self._cond.notify_all()
        for request in dropped:
            request.payload.result.fail(error)
            self.release(request.payload.slots)

    def wait_copied(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the copies into the arena in progress to end."""
        with self._cond:
            self._cond.wait_for(lambda: self._copying == 0, timeout_s)

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
                self.release(slots)
                if slot is not None and self._stopping:
                    raise EngineError(f"{self.model}: batcher stopped")
                return
            # Strictly increasing, so runs of one study keep their order among equal keys.
            self._last_ns = max(time.monotonic_ns(), self._last_ns + 1)
            work = SliceWork(study, start, slots, slot)
            heapq.heappush(self._queue, SliceRequest(rank, deadline, self._last_ns, work))
            self._pending += len(slots)
            self.peak_pending = max(self.peak_pending, self._pending)

    def _pop(self, size: int) -> list[SliceWork]:
        """Up to `size` slices from the head, splitting the last run if it does not fit."""
        works: list[SliceWork] = []
        count = 0
        while self._queue and count < size:
            request = heapq.heappop(self._queue)
            work = request.payload
            self._pending -= len(work.slots)
            if work.result.failed:  # its study has failed: drop, do not run
                self.release(work.slots)
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
