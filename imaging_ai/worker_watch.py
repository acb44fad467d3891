"""Takes the worker pool's slots; gives them worker processes, supervised, and reads their replies.

Everything here runs in the thread of the pool's `Supervisor` (`imaging_ai.supervise`): it
starts each worker process (so that PR_SET_PDEATHSIG ends them with that thread), reads every
reply from their pipes, retries the batches of a worker that died or hung on the others, and
starts it again at once (its start, a spawn and every model loaded, is backoff enough). After
`PoolConfig.max_restarts` crashes in a row with no batch done between them a GPU worker comes
back on the CPU, and a CPU worker stays down.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from imaging_ai import logs
from imaging_ai.arena import ArenaRef
from imaging_ai.errors import EngineError
from imaging_ai.states import WorkerState
from imaging_ai.supervise import Backoff, Supervisor
from imaging_ai.worker_dispatch import LIVE, Dispatcher, Job, WorkerRecord, complete
from imaging_ai.worker_messages import Attach, Done, Failed, Ready
from imaging_ai.workers import BatchTrace, PoolConfig, WorkerSpec, worker_main

log = logging.getLogger(__name__)

_TICK_S = 0.1
_TRACES = 4096  # traces of the latest batches kept for `WorkerPool.take_traces`


class WorkerWatch:
    """The pool's worker processes under one `Supervisor`, and what they reply.

    Parameters
    ----------
    spec : WorkerSpec
        What each worker loads.
    config : PoolConfig
        Hang limits and restart counts.
    dispatch : Dispatcher
        The pool's slots, backlog and lock (every change here is made under `dispatch.cond`).
    """

    def __init__(self, spec: WorkerSpec, config: PoolConfig, dispatch: Dispatcher) -> None:
        self.spec, self.config, self._dispatch = spec, config, dispatch
        self._cond = dispatch.cond
        self._ctx: SpawnContext = multiprocessing.get_context("spawn")
        self.output_shapes: dict[str, tuple[int, ...]] = {}
        self.traces: deque[BatchTrace] = deque(maxlen=_TRACES)
        self.arenas: list[ArenaRef] = []  # announced to every worker as it becomes ready
        self.supervisor: Supervisor | None = None

    def start(self) -> None:
        """Start one worker per slot of `dispatch.workers`, from the supervisor's thread."""
        # Delay 0: a restart costs a spawn and loading every model, seconds already; a worker's
        # count resets only when it finished a batch (`healthy`), not after a stable time.
        backoff = Backoff(0.0, max_s=0.0, stable_s=math.inf, give_up_after=self.config.max_restarts)
        self.supervisor = Supervisor(
            "inference worker",
            len(self._dispatch.workers),
            self._launch,
            backoff,
            self._on_exit,
            fallback=self._fall_back,
            watch=self,
            tick_s=_TICK_S,
        )
        self.supervisor.start()

    def stop(self, timeout_s: float) -> None:
        """Tell every worker to stop; kill those still running after `timeout_s`."""
        if self.supervisor is not None:
            self.supervisor.stop(timeout_s, tell=self._tell_stop)

    def process(self, w: WorkerRecord) -> BaseProcess | None:
        """The current process of a worker slot, if any."""
        return self.supervisor.process(w.index) if self.supervisor is not None else None

    def announce(self, w: WorkerRecord, refs: list[ArenaRef]) -> None:
        """Have a ready worker map these arenas now (under the lock)."""
        assert w.conn is not None
        with contextlib.suppress(OSError):  # a dead worker: the watchdog restarts it
            for ref in refs:
                w.conn.send(Attach(ref))

    def _tell_stop(self) -> None:
        with self._cond:
            for w in self._dispatch.workers:
                if w.conn is not None and w.state in LIVE:
                    with contextlib.suppress(OSError):
                        w.conn.send(None)
                w.state = WorkerState.STOPPED

    # -- the supervisor's hooks (its thread)

    def handles(self) -> Mapping[Any, Callable[[], None]]:
        """Each live worker's pipe, with its reader."""
        with self._cond:
            return {
                w.conn: functools.partial(self._read, w)
                for w in self._dispatch.workers
                if w.conn is not None and w.state in LIVE
            }

    def check(self) -> None:
        """Kill a worker whose start or batch is late; it is restarted like a crash."""
        now = time.monotonic()
        with self._cond:
            for w in self._dispatch.workers:
                starting = w.state == WorkerState.STARTING
                limit = self.config.start_timeout_s if starting else self.config.hang_timeout_s
                late = (starting or w.inflight) and now - w.progress_at > limit
                proc = self.process(w)
                if late and proc is not None and proc.is_alive():
                    what = "start" if starting else "batch"
                    w.error = f"{what} took over {limit:.0f} s"
                    assert self.supervisor is not None
                    self.supervisor.kill(w.index, f"{w.device}: {w.error}")

    def _launch(self, index: int, crashes_in_row: int) -> BaseProcess:
        w = self._dispatch.workers[index]
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=worker_main,
            args=(self.spec, w.gpu, w.device, child, os.getpid(), logs.settings()),
            name=f"imaging-ai-infer-{w.index}",
            daemon=True,
        )
        try:
            proc.start()
        except Exception as exc:  # e.g. out of memory or PIDs: said why, tried again
            w.error = f"cannot start a process: {exc}"
            parent.close()
            raise
        finally:
            child.close()
        with self._cond:
            w.conn, w.state, w.progress_at = parent, WorkerState.STARTING, time.monotonic()
            w.error, w.infos, w.fallbacks_before, w.gpu_lost = "", {}, w.fallbacks, False
        return proc

    def _on_exit(self, index: int) -> None:
        """A worker exited (or did not start): its batches go to the others; restart it or not."""
        w = self._dispatch.workers[index]
        self._drain(w)
        proc = self.process(w)
        with self._cond:
            jobs = list(w.inflight.values())
            w.inflight.clear()
            w.exit_code = code = proc.exitcode if proc is not None else None
            log.error(
                "inference worker %s exited (code %s) with %d batch(es) in flight %s",
                w.device,
                code,
                len(jobs),
                w.error,
            )
            failed = [job for job in jobs if not self._dispatch.retry(job, w)]
            if w.conn is not None:
                w.conn.close()
                w.conn = None
            if self._dispatch.running:
                w.state = WorkerState.STARTING  # again, at once
            else:  # a failed start, or stopping: no restart
                assert self.supervisor is not None
                self.supervisor.leave_down(index)
                w.state = WorkerState.FAILED
            failed += self._orphaned()
        self._fail(w, failed)

    def _fall_back(self, index: int) -> bool:
        """`max_restarts` crashes in a row: a GPU worker comes back on the CPU, a CPU one not."""
        with self._cond:
            w = self._dispatch.workers[index]
            if w.gpu is not None:
                log.error("GPU worker %s keeps failing; restarting it on the CPU", w.device)
                w.gpu, w.degraded = None, True
                return True
            log.error(
                "CPU worker %d failed %d times in a row; left down",
                w.index,
                self.config.max_restarts,
            )
            w.state = WorkerState.FAILED
            failed = self._orphaned()
        self._fail(w, failed)
        return False

    def _orphaned(self) -> list[Job]:
        """With no worker left, the backlog taken out to fail; send what can go (under the lock)."""
        failed: list[Job] = []
        if not self._dispatch.alive():
            failed += self._dispatch.backlog
            self._dispatch.backlog.clear()
        self._dispatch.pump()
        self._cond.notify_all()
        return failed

    @staticmethod
    def _fail(w: WorkerRecord, jobs: list[Job]) -> None:
        for job in jobs:
            why = w.error or w.exit_code
            complete(job, EngineError(f"inference worker {w.device} failed: {why}"))

    # -- replies

    def _read(self, w: WorkerRecord) -> None:
        assert w.conn is not None
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            self._pipe_closed(w)
            return
        self._handle(w, message)

    def _drain(self, w: WorkerRecord) -> None:
        """Read what a worker sent before it died: its last results count."""
        conn = w.conn
        if conn is None:
            return
        with contextlib.suppress(EOFError, OSError):
            while conn.poll():
                self._handle(w, conn.recv())

    def _pipe_closed(self, w: WorkerRecord) -> None:
        """A worker's pipe closed early: it is ending; make sure, so the supervisor sees it exit."""
        proc = self.process(w)
        if proc is None:
            return
        proc.join(1.0)  # reap it, for its exit code
        if proc.is_alive():
            proc.kill()
            proc.join()

    def _handle(self, w: WorkerRecord, message: object) -> None:
        if isinstance(message, Ready):
            self._on_ready(w, message)
        elif isinstance(message, Done):
            self._on_done(w, message, time.monotonic_ns())
        elif isinstance(message, Failed):
            self._on_failed(w, message)

    def _on_ready(self, w: WorkerRecord, message: Ready) -> None:
        with self._cond:
            w.state, w.infos, w.progress_at = WorkerState.READY, message.infos, time.monotonic()
            self.output_shapes.update(message.output_shapes)
            proc = self.process(w)
            log.info("inference worker %s ready (pid %s)", w.device, proc and proc.pid)
            self.announce(w, self.arenas)
            self._dispatch.pump()
            self._cond.notify_all()

    def _on_done(self, w: WorkerRecord, message: Done, returned: int) -> None:
        with self._cond:
            job = w.inflight.pop(message.job, None)
            if job is None:
                return
            times = (job.sent, *message.marks, returned)
            self.traces.append(
                BatchTrace(
                    job.model, len(job.batch), w.index, *times, message.stages, message.runner
                )
            )
            w.batches_done, w.busy_s = w.batches_done + 1, w.busy_s + message.seconds
            w.sizes[len(job.batch)] += 1
            w.fallbacks = w.fallbacks_before + message.fallbacks
            w.gpu_lost = message.gpu_lost
            w.progress_at = time.monotonic()
            assert self.supervisor is not None
            self.supervisor.healthy(w.index)
            self._dispatch.pump()  # the worker's next batch first; the callback only queues copies
            self._cond.notify_all()
        complete(job, None)

    def _on_failed(self, w: WorkerRecord, message: Failed) -> None:
        if message.job is None:
            w.error = message.reason  # the process exits next; _on_exit handles it
            return
        with self._cond:
            job = w.inflight.pop(message.job, None)
            if job is None:
                return
            log.warning("batch of %s failed on %s: %s", job.model, w.device, message.reason)
            failed = not message.retry or not self._dispatch.retry(job, w)
            self._dispatch.pump()
            self._cond.notify_all()
        if failed:
            complete(job, EngineError(f"batch failed on {w.device}: {message.reason}"))
