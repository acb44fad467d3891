"""Takes batches and the batchers' reservations; gives each batch to the least-loaded worker.

The worker pool's ready queue. `reserve` grants a batch only while a worker has fewer than
`PoolConfig.depth` batches in flight (a GPU worker `WorkerSpec.concurrency - 1` more, as it
runs that many at once), most urgent batcher first; a submitted batch waits in the backlog
(behind any retried one) until a ready worker has room, and a retried one avoids the worker it
failed on. Everything here runs under the pool's lock (`Dispatcher.cond`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from imaging_ai import faults
from imaging_ai.arena import SlotBatch
from imaging_ai.batch_requests import BatchCallback, Priority
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo
from imaging_ai.states import WorkerState
from imaging_ai.worker_messages import Task

log = logging.getLogger(__name__)
# A worker with a process that is, or will be, taking batches.
LIVE = (WorkerState.STARTING, WorkerState.READY)


def least_loaded(loads: Sequence[int | None], avoid: int | None = None) -> int | None:
    """The index of the least-loaded worker; None marks one that cannot take work.

    Ties go to the lowest index; `avoid` (where a batch just failed) only when it is the only one.
    """
    usable = [(n, i) for i, n in enumerate(loads) if n is not None]
    others = [u for u in usable if u[1] != avoid] or usable
    return min(others)[1] if others else None


@dataclass(eq=False)
class Job:
    """A batch on its way: its arena slots (which hold its inputs until it is done)."""

    id: int
    model: str
    batch: SlotBatch
    done: BatchCallback
    attempts: int = 0
    avoid: int | None = None
    sent: int = 0  # time.monotonic_ns() of its last send to a worker


@dataclass(eq=False)
class WorkerRecord:
    """The parent's record of one worker slot, across restarts of its process."""

    index: int
    gpu: int | None
    conn: Connection | None = None
    state: WorkerState = WorkerState.STARTING
    error: str = ""
    inflight: dict[int, Job] = field(default_factory=dict)
    infos: dict[str, BackendInfo] = field(default_factory=dict)
    progress_at: float = 0.0
    batches_done: int = 0
    busy_s: float = 0.0
    sizes: Counter[int] = field(default_factory=Counter)
    fallbacks: int = 0
    fallbacks_before: int = 0  # counted by earlier processes of this worker
    exit_code: int | None = None  # of its last process, once it exited
    degraded: bool = False  # a GPU worker restarted on the CPU
    gpu_lost: bool = False  # its engines run on their CPU fallback (reset by a restart)

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"


class Dispatcher:
    """The backlog of batches, the batchers waiting to reserve room, and the workers' loads.

    Parameters
    ----------
    depth : int
        Batches in flight on a CPU worker (`PoolConfig.depth`).
    concurrency : int
        Batches a GPU worker runs at once (`WorkerSpec.concurrency`): it gets that many less one
        on top of `depth`.
    max_attempts : int
        Sends of one batch before it fails (`PoolConfig.max_attempts`).
    """

    def __init__(self, depth: int, concurrency: int, max_attempts: int) -> None:
        self.cond = threading.Condition()
        self.workers: list[WorkerRecord] = []
        self.backlog: deque[Job] = deque()
        self.running = False  # taking batches: the pool started and is not stopping
        self._depth_cpu, self._extra_gpu = depth, concurrency - 1
        self._max_attempts = max_attempts
        self._waiters: list[tuple[Priority, int]] = []
        self._reserved = 0
        self._ids = itertools.count()

    def new_job(self, model: str, batch: SlotBatch, done: BatchCallback) -> Job:
        """A job for a submitted batch, with the next id."""
        return Job(next(self._ids), model, batch, done)

    def depth(self, w: WorkerRecord) -> int:
        """Batches in flight on a worker: `depth`, plus the extra it runs at once on a GPU."""
        return self._depth_cpu + (self._extra_gpu if w.gpu is not None else 0)

    def capacity(self) -> int:
        """Batches that can be reserved or running at once, over every worker."""
        return max(1, sum(self.depth(w) for w in self.workers))

    def reserve(self, priority: Priority, timeout_s: float) -> bool:
        """Wait until a worker has room and no more urgent batcher waits; hold that room.

        Returns at once (True) once the pool stops or has no worker, so that the submit that
        follows fails the batch instead of leaving its studies waiting.
        """
        with self.cond:
            ticket = (priority, next(self._ids))
            heapq.heappush(self._waiters, ticket)
            try:
                granted = self.cond.wait_for(lambda: self._grantable(ticket), timeout_s)
                if granted:
                    self._reserved += 1
                return granted
            finally:
                self._waiters.remove(ticket)
                heapq.heapify(self._waiters)
                self.cond.notify_all()

    def _grantable(self, ticket: tuple[Priority, int]) -> bool:
        if not self.running or not self.alive():
            return True
        return self._waiters[0] == ticket and self._room() > 0

    def _room(self) -> int:
        ready = [w for w in self.workers if w.state == WorkerState.READY]
        room = sum(max(0, self.depth(w) - len(w.inflight)) for w in ready)
        return room - self._reserved - len(self.backlog)

    def alive(self) -> bool:
        """Some worker is starting or ready (one that is down for good does not count)."""
        return any(w.state in LIVE for w in self.workers)

    def busy(self) -> bool:
        """Some batch is waiting or in flight."""
        return bool(self.backlog) or any(w.inflight for w in self.workers)

    def release(self) -> None:
        """Give back a reservation that no batch used."""
        with self.cond:
            self._reserved = max(0, self._reserved - 1)
            self.cond.notify_all()

    def add(self, job: Job) -> None:
        """Queue a submitted batch (using one reservation) and send what fits.

        Raises
        ------
        EngineError
            The pool is not running, or no worker is left.
        """
        with self.cond:
            self._reserved = max(0, self._reserved - 1)
            if not self.running:
                raise EngineError("inference workers are not running")
            if not self.alive():
                raise EngineError("no inference worker is running; see the log for why")
            self.backlog.append(job)  # behind any retried batch
            self.pump()

    def retry(self, job: Job, w: WorkerRecord) -> bool:
        """Queue a batch again, away from `w`; False once it has had every attempt."""
        if job.attempts >= self._max_attempts:
            return False
        job.avoid = w.index
        self.backlog.appendleft(job)
        return True

    def pump(self) -> None:
        """Send backlog batches to workers with room, least loaded first."""
        while self.backlog:
            loads = [
                len(w.inflight)
                if w.state == WorkerState.READY and len(w.inflight) < self.depth(w)
                else None
                for w in self.workers
            ]
            index = least_loaded(loads, self.backlog[0].avoid)
            if index is None:
                return
            self._send(self.workers[index], self.backlog.popleft())

    def _send(self, w: WorkerRecord, job: Job) -> None:
        job.attempts += 1
        if not w.inflight:
            w.progress_at = time.monotonic()
        w.inflight[job.id] = job
        assert w.conn is not None
        task = Task(job.id, job.model, job.batch.arena.ref, job.batch.slots)
        job.sent = time.monotonic_ns()
        with contextlib.suppress(OSError):  # a dead worker: the watchdog retries its batches
            w.conn.send(task)
        faults.reach("in:batch")

    def take_all(self) -> list[Job]:
        """Every batch waiting or in flight, taken out (the pool is stopping)."""
        left = [*self.backlog, *(j for w in self.workers for j in w.inflight.values())]
        self.backlog.clear()
        for w in self.workers:
            w.inflight.clear()
        return left


def complete(job: Job, result: BaseException | None) -> None:
    """Call a batch's callback (None: its outputs are in; else why it failed), whatever it does."""
    try:
        job.done(result)
    except Exception:  # one study's routing bug must not stop the watchdog
        log.exception("batch callback of %s failed", job.model)
