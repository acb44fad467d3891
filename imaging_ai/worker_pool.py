"""Batches in; model outputs out, from one worker process per GPU (or CPU workers), watched.

The batchers' `Dispatch` (`imaging_ai.batch`). Batches go to the least-loaded worker, and
`reserve` grants a batch only while a worker has room, most urgent batcher first
(`imaging_ai.worker_dispatch`). The workers run under one `Supervisor`, whose thread reads
their results, restarts a worker that dies or hangs and retries its batches on the others; a
GPU worker that keeps failing comes back on the CPU (`imaging_ai.worker_watch`). What a worker
process does is `imaging_ai.workers`. `stop` drains the work in flight before it stops them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from imaging_ai.arena import ArenaRef, SlotBatch
from imaging_ai.batch_requests import BatchCallback, Priority
from imaging_ai.errors import EngineError, StartupError
from imaging_ai.infer.base import BackendInfo
from imaging_ai.modelcard import load_model_card
from imaging_ai.states import PoolPhase, WorkerState
from imaging_ai.supervise import ChildStatus
from imaging_ai.worker_dispatch import Dispatcher, WorkerRecord, complete
from imaging_ai.worker_watch import WorkerWatch
from imaging_ai.workers import (
    BatchTrace,
    PoolConfig,
    WorkerSpec,
    WorkerStatus,
    is_extension_backend,
)

log = logging.getLogger(__name__)

_STOP_S = 5.0  # for the workers to exit once told to stop, before they are killed


class WorkerPool:
    """Worker processes that run batches for every model; the batchers' `Dispatch`.

    Parameters
    ----------
    spec : WorkerSpec
        What each worker loads.
    config : PoolConfig, optional
        Worker count, queue depth and watchdog limits.
    """

    def __init__(self, spec: WorkerSpec, config: PoolConfig | None = None) -> None:
        self.spec, self.config = spec, config or PoolConfig()
        self._cards = {c.name: c for c in (load_model_card(d) for d in spec.model_dirs)}
        self._dispatch = Dispatcher(self.config.depth, spec.concurrency, self.config.max_attempts)
        self._cond = self._dispatch.cond
        self._watch = WorkerWatch(spec, self.config, self._dispatch)
        self._traces = self._watch.traces
        self._phase = PoolPhase.NEW
        self._started_at = time.monotonic()

    @property
    def _workers(self) -> list[WorkerRecord]:
        return self._dispatch.workers

    # -- life cycle

    def start(self) -> None:
        """Start the workers and wait until each has loaded every model.

        Raises
        ------
        StartupError
            A worker could not load the models (its reason is in the message) or timed out.
        """
        self._dispatch.workers = [WorkerRecord(i, gpu) for i, gpu in enumerate(self._devices())]
        self._phase = PoolPhase.STARTING
        self._watch.start()
        with self._cond:
            self._cond.wait_for(self._start_settled, self.config.start_timeout_s)
            failed = [w for w in self._workers if w.state != WorkerState.READY]
            if not failed:
                self._phase, self._dispatch.running = PoolPhase.RUNNING, True
        if failed:
            self.stop(timeout_s=0)
            w = failed[0]
            why = w.error or f"not ready after {self.config.start_timeout_s:.0f} s"
            raise StartupError(f"inference worker on {w.device} could not start: {why}")
        log.info("%d inference worker(s): %s", len(self._workers), self._describe())

    def stop(self, timeout_s: float = 60.0) -> None:
        """Finish the batches in flight (failing what is left after `timeout_s`), stop workers.

        Stop the batchers first: a batch submitted from now on fails with EngineError.
        """
        with self._cond:
            self._phase, self._dispatch.running = PoolPhase.STOPPING, False
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._dispatch.busy(), timeout_s)
            left = self._dispatch.take_all()
        for job in left:
            complete(job, EngineError("inference stopped before this batch ran"))
        self._watch.stop(_STOP_S)
        with self._cond:
            self._phase = PoolPhase.STOPPED
        for w in self._workers:  # after the supervisor's thread: it may still be waiting on these
            if w.conn is not None:
                w.conn.close()

    def _devices(self) -> list[int | None]:
        gpus = self.config.gpus
        if gpus is None:
            cpu_only = self.spec.factory is not None or is_extension_backend(self.spec.backend)
            if cpu_only or self.spec.backend == "onnxruntime-cpu":
                gpus = 0
            else:
                from imaging_ai.infer.select import probe_environment

                gpus = probe_environment().gpus
        return list(range(gpus)) if gpus > 0 else [None] * self.config.cpu_workers

    def _start_settled(self) -> bool:
        return all(w.state == WorkerState.READY for w in self._workers) or any(
            w.state == WorkerState.FAILED for w in self._workers
        )

    def _describe(self) -> str:
        procs = [(w, self._watch.process(w)) for w in self._workers]
        return ", ".join(f"{w.device} ({p.pid if p else '-'})" for w, p in procs)

    # -- Dispatch, for the batchers

    def input_shape(self, model: str) -> tuple[int, ...]:
        """(C, H, W) of one input slice of `model`, from its card; ValueError if unknown."""
        if model not in self._cards:
            known = ", ".join(sorted(self._cards))
            raise ValueError(f"no model {model!r} in the worker pool (it has: {known})")
        return self._cards[model].input_shape

    def output_shape(self, model: str) -> tuple[int, ...]:
        """(K, h, w) of one output slice of `model`, as the workers found it at start."""
        self.input_shape(model)  # refuses an unknown model
        with self._cond:
            if model not in self._watch.output_shapes:
                raise EngineError(f"{model}: output shape unknown until the workers are up")
            return self._watch.output_shapes[model]

    def batch_capacity(self) -> int:
        """Batches that can be reserved or running at once, over every worker."""
        return self._dispatch.capacity()

    def reserve(self, priority: Priority, timeout_s: float) -> bool:
        """Wait until a worker has room and no more urgent batcher waits; hold that room.

        Returns at once (True) once the pool stops or has no worker, so that the submit that
        follows fails the batch instead of leaving its studies waiting.
        """
        return self._dispatch.reserve(priority, timeout_s)

    def attach(self, ref: ArenaRef) -> None:
        """Have every worker map `ref` now (and each restarted worker when it is ready).

        A GPU worker page-locks an arena when it first sees it: about 0.2-0.7 s for a model's
        arena on an H200, which the first study after a start used to wait for.
        """
        with self._cond:
            self._watch.arenas.append(ref)
            for w in self._workers:
                if w.state == WorkerState.READY:
                    self._watch.announce(w, [ref])

    def release(self) -> None:
        """Give back a reservation that no batch used."""
        self._dispatch.release()

    def submit(self, model: str, batch: SlotBatch, done: BatchCallback) -> None:
        """Run `batch` on the least-loaded worker; uses one reservation.

        `done` is called once, from the supervisor's thread: with None once the outputs are in
        the batch's output slots, or with EngineError once every attempt failed.

        Raises
        ------
        EngineError
            The pool is not running, or no worker is left.
        """
        self.input_shape(model)  # refuses an unknown model
        self._dispatch.add(self._dispatch.new_job(model, batch, done))

    # -- figures, for the status page and the metrics

    def info(self, model: str) -> BackendInfo:
        """`model`'s figures over every worker: devices, batch sizes seen, fallbacks."""
        with self._cond:
            ready = [w for w in self._workers if model in w.infos]
            base = ready[0].infos[model] if ready else BackendInfo(model, "", "", "fp32", 0)
            return replace(
                base,
                device=", ".join(dict.fromkeys(w.device for w in ready)),
                batch_sizes=tuple(sorted(set[int]().union(*(w.sizes for w in self._workers)))),
                fallbacks=sum(w.fallbacks for w in self._workers),
                degraded=any(w.degraded or w.gpu_lost for w in self._workers),
            )

    def status(self) -> tuple[WorkerStatus, ...]:
        """Every worker's figures, for the status page."""
        supervisor = self._watch.supervisor
        children = supervisor.status() if supervisor is not None else ()
        with self._cond:
            return tuple(self._status(w, children) for w in self._workers)

    def take_traces(self) -> list[BatchTrace]:
        """Traces of the batches finished since the last call (of the latest 4,096 at most)."""
        with self._cond:
            traces = list(self._traces)
            self._traces.clear()
            return traces

    def _status(self, w: WorkerRecord, children: tuple[ChildStatus, ...]) -> WorkerStatus:
        child = children[w.index] if w.index < len(children) else None
        backend = next(iter(w.infos.values())).backend if w.infos else ""
        elapsed = max(time.monotonic() - self._started_at, 1e-9)
        return WorkerStatus(
            index=w.index,
            pid=child.pid if child is not None else None,
            backend=backend,
            device=w.device,
            state=w.state,
            alive=child is not None and child.alive,
            batches_done=w.batches_done,
            batch_sizes=tuple(sorted(w.sizes.items())),
            busy_fraction=min(1.0, w.busy_s / elapsed),
            busy_s=w.busy_s,
            fallbacks=w.fallbacks,
            restarts=child.restarts if child is not None else 0,
            in_flight=len(w.inflight),
            degraded=w.degraded or w.gpu_lost,
        )
