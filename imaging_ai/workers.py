"""Batches in; model outputs out, from one worker process per GPU (or CPU workers), watched.

Each worker process sees one GPU (as device 0, through CUDA_VISIBLE_DEVICES), loads every model
there and runs the batches it is sent (a GPU worker `WorkerSpec.concurrency` at once, each thread
taking the next task from the pipe itself); on a host without a GPU the same code runs
`PoolConfig.cpu_workers` CPU workers. A batch is slot numbers of its model's shared-memory arena
(`imaging_ai.arena`): a worker maps each arena once (and on a GPU page-locks it), reads the
batch's inputs straight from its slots and writes the outputs into them, so only a small task
message is pickled per batch and the daemon process copies no pixel on the way.

Batches go to the least-loaded worker, and `reserve` grants a batch only while a worker has fewer
than `PoolConfig.depth` batches in flight (a GPU worker `WorkerSpec.concurrency - 1` more, as it
runs that many at once), most urgent batcher first. A watchdog thread reads the
results, restarts a worker that dies or hangs, and retries its batches on the others; a GPU
worker that keeps failing comes back on the CPU. Workers die with the daemon (PR_SET_PDEATHSIG,
and a parent-PID poll), and `stop` drains the work in flight before it stops them.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np

from imaging_ai import faults, plugins
from imaging_ai.arena import ArenaRef, SliceArena, SlotBatch
from imaging_ai.batch import BatchCallback, Priority
from imaging_ai.errors import EngineError, StartupError
from imaging_ai.infer.base import (
    Backend,
    BackendInfo,
    Engine,
    EngineFactory,
    FloatArray,
    infer_into,
    sample_batch,
    write_pieces,
)
from imaging_ai.infer.cuda_mem import CudaRuntime, PinnedBuffer
from imaging_ai.infer.ort import last_stages
from imaging_ai.modelcard import ModelCard, load_model_card
from imaging_ai.states import PoolPhase, WorkerState

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_TICK_S = 0.1
_TRACES = 4096  # traces of the latest batches kept for `WorkerPool.take_traces`
_PR_SET_PDEATHSIG = 1
# A worker with a process that is, or will be, taking batches.
_LIVE = (WorkerState.STARTING, WorkerState.READY)
Pieces = tuple[FloatArray, FloatArray]


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker process loads: the model folders and how to run them.

    `backend` is a `make_backend` setting, or ``NAME:OPTIONS`` for a backend an installed package
    registers (`extension_backend`; tests: the development kit's
    `fake:latency=S,per_slice=S,max_batch=N`). `factory`, a picklable callable
    (card, device) -> Engine, replaces both (tests). A CPU worker runs `onnxruntime-cpu` whatever
    the setting. `cuda_graphs` turns ONNX Runtime's CUDA graphs on where the GPU default
    (`infer.ort.GPU_CUDA_GRAPHS`) has them off (benchmarks). `concurrency` is how many batches a GPU
    worker runs at once, each on its own copy of the engines (own CUDA streams), so one batch's
    copies and Python overlap another's kernels; a CPU worker runs one (its engine has threads of
    its own). CUDA graphs need one at a time: a capture in one thread breaks CUDA calls in the
    others. With `staged_copies` a GPU worker copies each batch through page-locked buffers of its
    own instead of page-locking the shared slots. `gpu_threads` is ONNX Runtime's intra-op threads
    per GPU session: a CUDA graph's few CPU nodes are shape arithmetic, and the default (0: one
    pinned thread per physical core, spinning after every run) puts dozens of spinning threads
    per worker on the cores that feed the GPUs. A GPU worker's CPU-fallback sessions keep
    `cpu_threads` but do not spin: they sit idle unless a GPU fails.
    """

    model_dirs: tuple[Path, ...]
    backend: str = "auto"
    data_dir: Path = Path("data")
    cpu_threads: int = 0
    precision: str = "fp16"
    max_batch_size: int = 32
    factory: EngineFactory | None = None
    cuda_graphs: bool = False
    concurrency: int = 2  # measured on two H200s: docs/benchmarks.md, "One GPU vs two"
    staged_copies: bool = False
    gpu_threads: int = 1

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency = {self.concurrency}: expected >= 1")
        if self.cuda_graphs and self.concurrency > 1:
            raise ValueError("CUDA graphs need concurrency = 1: a capture breaks other threads")
        if self.gpu_threads < 0:
            raise ValueError(f"gpu_threads = {self.gpu_threads}: expected >= 0")


@dataclass(frozen=True)
class PoolConfig:
    """How many workers, how deep their queues, and when the watchdog steps in.

    `gpus` None probes the host (0 for a factory, an extension backend and the CPU setting); 0
    means `cpu_workers` CPU workers. A batch running past `hang_timeout_s` (or a start past
    `start_timeout_s`: TensorRT may build a plan) kills the worker. A batch is tried `max_attempts`
    times; after `max_restarts` crashes in a row a GPU worker comes back on the CPU, and a CPU
    worker stays down.
    """

    gpus: int | None = None
    cpu_workers: int = 1
    depth: int = 2
    hang_timeout_s: float = 120.0
    start_timeout_s: float = 900.0
    max_attempts: int = 3
    max_restarts: int = 3


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as the status page shows it; `batch_sizes` is ((size, batches), ...)."""

    index: int
    pid: int | None
    backend: str
    device: str
    state: WorkerState
    alive: bool
    batches_done: int
    batch_sizes: tuple[tuple[int, int], ...]
    busy_fraction: float
    busy_s: float
    fallbacks: int
    restarts: int
    in_flight: int
    degraded: bool


@dataclass(frozen=True)
class BatchTrace:
    """One batch's way through a worker, in nanoseconds of the host's monotonic clock.

    `sent` and `returned` are the daemon's (task written to the worker's pipe, result read
    back); `received` (a free runner thread read it, so `received - sent` includes any wait for
    a free set of engines), `started`, `ended` (outputs in the slots) and `replied` the worker's.
    `stages` is the engine's own copy in, run and copy out (ns) where it reports them
    (`infer.ort.last_stages`). CLOCK_MONOTONIC is one clock for every process.
    """

    model: str
    size: int
    worker: int
    sent: int
    received: int
    started: int
    ended: int
    replied: int
    returned: int
    stages: tuple[int, int, int] | None
    runner: int = 0  # which of the worker's runner threads (sets of engines) ran it


@dataclass(frozen=True)
class _Task:
    """Parent to worker: run the inputs in these arena slots; write the outputs into them."""

    job: int
    model: str
    arena: ArenaRef
    slots: tuple[int, ...]


@dataclass(frozen=True)
class _Attach:
    """Parent to worker: map (and on a GPU page-lock) this arena now, before its first batch."""

    arena: ArenaRef


@dataclass(frozen=True)
class _Ready:
    """Worker to parent: every model loaded; their infos and output slice shapes."""

    infos: dict[str, BackendInfo]
    output_shapes: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class _Done:
    """Worker to parent: the outputs are in the batch's output slots.

    `marks` (the worker's received, started, ended, replied) and `stages` (the engine's) make
    the batch's `BatchTrace`.
    """

    job: int
    seconds: float
    fallbacks: int
    gpu_lost: bool = False  # an engine took its GPU as lost and runs every batch on the CPU
    marks: tuple[int, int, int, int] = (0, 0, 0, 0)
    stages: tuple[int, int, int] | None = None
    runner: int = 0


@dataclass(frozen=True)
class _Failed:
    """Worker to parent: a batch failed (`retry`: on another worker), or loading did."""

    job: int | None  # None: the models did not load
    reason: str
    retry: bool


def extension_backend(setting: str) -> Backend:
    """The backend an installed package registers for ``NAME:OPTIONS`` (`imaging_ai.plugins`).

    The development kit registers ``fake``: ``fake:latency=0.05,per_slice=0.001,max_batch=32``
    is a fixed-latency engine for the scheduler tests and the stage-time scripts.

    Raises
    ------
    EngineError
        Nothing registers ``NAME``, or its factory refuses the options.
    """
    name = setting.partition(":")[0]
    entry = plugins.find(plugins.BACKENDS, name)
    if entry is None:
        raise EngineError(
            f"backend = {setting!r}: no backend {name!r} is installed; {plugins.DEVKIT_HINT}"
        )
    make: Callable[[str], Backend] = entry.load()
    return make(setting)


def is_extension_backend(setting: str) -> bool:
    """Whether ``setting`` names an installed package's backend (``NAME:OPTIONS``)."""
    return ":" in setting


def least_loaded(loads: Sequence[int | None], avoid: int | None = None) -> int | None:
    """The index of the least-loaded worker; None marks one that cannot take work.

    Ties go to the lowest index; `avoid` (where a batch just failed) only when it is the only one.
    """
    usable = [(n, i) for i, n in enumerate(loads) if n is not None]
    others = [u for u in usable if u[1] != avoid] or usable
    return min(others)[1] if others else None


# ---- the worker process ---------------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the thread that started it (the watchdog) ends.

    A worker must not outlive the daemon and keep a GPU's memory; the parent-PID poll in
    `_serve` covers other systems and the moment before this call.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pin_device(gpu: int | None) -> None:
    """Let CUDA see only this worker's GPU, as device 0; a CPU worker sees none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else []
    if gpu is None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[gpu] if gpu < len(ids) else str(gpu)


def _load_engines(spec: WorkerSpec, device: str) -> tuple[dict[str, Engine], dict[str, ModelCard]]:
    cards = {c.name: c for c in (load_model_card(d) for d in spec.model_dirs)}
    if spec.factory is not None:
        return {n: spec.factory(c, device) for n, c in cards.items()}, cards
    if is_extension_backend(spec.backend):
        extension = extension_backend(spec.backend)
        return {n: extension.load(c) for n, c in cards.items()}, cards
    from imaging_ai.infer.ort import OrtOptions
    from imaging_ai.infer.select import load_engine, make_backend

    # The same options as `analyse.load_models`, so a worker runs what `imaging-ai infer` runs.
    cpu = OrtOptions(intra_op_threads=spec.cpu_threads, max_batch_size=spec.max_batch_size)
    gpu = replace(cpu, precision="fp16" if spec.precision == "fp16" else "fp32")
    gpu = replace(gpu, cuda_graph=spec.cuda_graphs, intra_op_threads=spec.gpu_threads)
    setting = "onnxruntime-cpu" if device == "cpu" else spec.backend
    backend = make_backend(setting, spec.data_dir, ort_cpu=cpu, ort_gpu=gpu)
    fallback = cpu if backend.device == "cpu" else replace(cpu, allow_spinning=False)
    return {n: load_engine(backend, c, cpu=fallback) for n, c in cards.items()}, cards


def _worker_main(
    spec: WorkerSpec, gpu: int | None, device: str, conn: Connection, parent_pid: int
) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    _pin_device(gpu)
    try:
        engines, cards = _load_engines(spec, device)
        # One warm-up slice per model also tells the parent how large outputs are.
        shapes = {n: e.infer(sample_batch(cards[n], 1)).shape[1:] for n, e in engines.items()}
        # ONNX Runtime's CPU arena grows (by powers of two) to the largest batch it has run
        # and keeps it: a full batch now makes that growth happen at start, so memory does
        # not step up later with the busiest moment (tests/test_memory_flat.py).
        for n, e in engines.items():
            if e.info.backend == "onnxruntime-cpu":
                e.infer(sample_batch(cards[n], e.max_batch_size))
        copies = spec.concurrency if gpu is not None else 1
        sets = [engines, *(_load_engines(spec, device)[0] for _ in range(copies - 1))]
        for extra in sets[1:]:  # a GPU session's first run plans its kernels: 0.3-0.6 s
            for n, e in extra.items():
                e.infer(sample_batch(cards[n], 1))
    except Exception as exc:  # reported to the parent, which refuses to start or retries
        with contextlib.suppress(OSError):
            conn.send(_Failed(None, f"{type(exc).__name__}: {exc}", retry=False))
        return
    infos = {n: e.info for n, e in engines.items()}
    try:
        conn.send(_Ready(infos, {n: tuple(s) for n, s in shapes.items()}))
    except OSError:  # the pool stopped while this worker loaded
        return
    _serve(conn, sets, parent_pid, spec.staged_copies)


def _serve(conn: Connection, sets: list[dict[str, Engine]], parent_pid: int, staged: bool) -> None:
    """Run tasks until told to stop or orphaned: one thread per set of engines, each taking the
    next task from the pipe itself as soon as it is free.

    No thread hands a task to another: a queued task starts the moment a set of engines is free,
    and an idle worker's batch wakes one thread, not two (a GPU worker once left 2.2 ms between
    batches with the next one waiting: CHANGELOG.md, 2026-11-30, "Where a worker's batch time
    goes").
    """
    on_gpu = any(e.info.device.startswith("cuda") for e in sets[0].values())
    arenas = _Arenas(page_lock=on_gpu and not staged)
    runners = [_Runner(engines, _Staging() if on_gpu and staged else None) for engines in sets]
    pipe = _Pipe(conn, parent_pid)
    clock = _BusyClock()

    def serve(runner: _Runner, index: int) -> None:
        try:
            batches(runner, index)
        except BaseException:  # a bug here: end the worker, so the parent retries its batches
            log.exception("inference worker thread failed")
            pipe.close()
            raise

    def batches(runner: _Runner, index: int) -> None:
        while (got := pipe.next_task()) is not None:
            task, received = got
            if isinstance(task, _Attach):  # page-locking 0.5 GB takes a first batch's time
                try:
                    arenas.get(task.arena)
                except Exception as exc:  # the arena's first batch tries again, and says why
                    log.warning("arena %s not mapped ahead: %s", task.arena.input_name, exc)
                continue
            started = time.monotonic_ns()
            clock.start()
            result = _run_task(task, runner, arenas, sets)
            ended = time.monotonic_ns()
            if isinstance(result, _Done):  # busy time counts once however many batches ran
                marks = (received, started, ended, 0)
                result = replace(result, seconds=clock.stop(), marks=marks, runner=index)
            else:
                clock.stop()
            pipe.reply(result)

    threads = [
        threading.Thread(target=serve, args=(r, i), name=f"batch-{i}", daemon=True)
        for i, r in enumerate(runners)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        arenas.close()
        for runner in runners:
            if runner.staging is not None:
                runner.staging.close()
        for engines in sets:
            for engine in engines.values():
                engine.close()


class _Pipe:
    """The worker's end of the pipe, shared by its runner threads: one reads at a time."""

    def __init__(self, conn: Connection, parent_pid: int) -> None:
        self._conn, self._parent_pid = conn, parent_pid
        self._receiving, self._sending = threading.Lock(), threading.Lock()
        self._closed = False

    def next_task(self) -> tuple[_Task | _Attach, int] | None:
        """The next task and when it was read (ns); None once told to stop or orphaned."""
        with self._receiving:
            try:
                while not self._closed and os.getppid() == self._parent_pid:
                    if self._conn.poll(_PARENT_POLL_S):
                        task = self._conn.recv()
                        if task is None:
                            break
                        return task, time.monotonic_ns()
            except (EOFError, OSError):  # the parent is gone
                pass
            self._closed = True  # the other runners stop too, after their batch
            return None

    def close(self) -> None:
        """Let no runner take another task."""
        self._closed = True

    def reply(self, result: _Done | _Failed) -> None:
        """Send a batch's result (with the time it leaves, for its trace)."""
        with self._sending, contextlib.suppress(OSError):  # the parent is gone: nothing to tell
            if isinstance(result, _Done):
                result = replace(result, marks=(*result.marks[:3], time.monotonic_ns()))
            self._conn.send(result)


class _BusyClock:
    """Time during which at least one batch ran, handed out in increments as batches end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running, self._since, self._total, self._told = 0, 0.0, 0.0, 0.0

    def start(self) -> None:
        with self._lock:
            if self._running == 0:
                self._since = time.perf_counter()
            self._running += 1

    def stop(self) -> float:
        """End one batch; the busy seconds not yet handed out."""
        with self._lock:
            now = time.perf_counter()
            self._total += now - self._since
            self._since = now
            self._running -= 1
            delta, self._told = self._total - self._told, self._total
            return delta


class _Arenas:
    """The arenas this worker has mapped, by name; on a GPU each is page-locked once, so
    the engines' copies to and from the GPU are DMA straight from and into the slots."""

    def __init__(self, page_lock: bool) -> None:
        self._mapped: dict[str, SliceArena] = {}
        self._page_lock = page_lock
        self._locked: list[int] = []
        self._cuda: CudaRuntime | None = None
        self._mutex = threading.Lock()

    def get(self, ref: ArenaRef) -> SliceArena:
        with self._mutex:
            arena = self._mapped.get(ref.input_name)
            if arena is None:
                arena = self._mapped[ref.input_name] = SliceArena.attach(ref)
                if self._page_lock:
                    self._lock(arena)
            return arena

    def _lock(self, arena: SliceArena) -> None:
        try:
            self._cuda = self._cuda or CudaRuntime()
            for view in (arena.inputs, arena.outputs):
                self._cuda.host_register(view.ctypes.data, view.nbytes)
                self._locked.append(view.ctypes.data)
        except EngineError as exc:  # copies still work from pageable memory, only slower
            log.warning("shared slots not page-locked (%s); GPU copies will be staged", exc)
            self._page_lock = False

    def close(self) -> None:
        for address in self._locked:
            with contextlib.suppress(EngineError):
                assert self._cuda is not None
                self._cuda.host_unregister(address)
        for arena in self._mapped.values():
            arena.close()
        self._mapped.clear()


@dataclass
class _Runner:
    """One set of engines and, in staged mode, its page-locked buffers: one batch at a time."""

    engines: dict[str, Engine]
    staging: _Staging | None


class _Staging:
    """Page-locked input and output buffers per model, for batches copied through them."""

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[FloatArray, FloatArray]] = {}
        self._pinned: list[PinnedBuffer] = []
        self._cuda: CudaRuntime | None = None

    def run(self, model: str, engine: Engine, ref: ArenaRef, pieces: list[Pieces]) -> None:
        """Gather the pieces, run them as one batch, scatter the outputs back."""
        x, y = self._for(model, engine.max_batch_size, ref)
        n = sum(len(a) for a, _ in pieces)
        at = 0
        for a, _ in pieces:
            x[at : at + len(a)] = a
            at += len(a)
        infer_into(engine, [x[:n]], [y[:n]])
        write_pieces(y[:n], [b for _, b in pieces])

    def _for(self, model: str, size: int, ref: ArenaRef) -> tuple[FloatArray, FloatArray]:
        if model not in self._buffers:
            shapes = ((size, *ref.input_shape), (size, *ref.output_shape))
            x, y = (self._array(shape) for shape in shapes)
            self._buffers[model] = (x, y)
        return self._buffers[model]

    def _array(self, shape: tuple[int, ...]) -> FloatArray:
        try:
            self._cuda = self._cuda or CudaRuntime()
            self._pinned.append(self._cuda.alloc_pinned(4 * math.prod(shape)))
        except EngineError as exc:  # still correct, only the copies are staged by the driver
            log.warning("staging buffers not page-locked: %s", exc)
            return np.empty(shape, np.float32)
        array: FloatArray = self._pinned[-1].array(np.float32, shape)
        return array

    def close(self) -> None:
        self._buffers.clear()
        for buffer in self._pinned:
            with contextlib.suppress(EngineError):
                buffer.close()


def _run_task(
    task: _Task, runner: _Runner, arenas: _Arenas, sets: list[dict[str, Engine]]
) -> _Done | _Failed:
    started = time.perf_counter()
    try:
        arena = arenas.get(task.arena)
        pieces = arena.pieces(task.slots)
        engine = runner.engines[task.model]
        last_stages()  # forget a failed batch's
        if runner.staging is not None:
            runner.staging.run(task.model, engine, arena.ref, pieces)
        else:
            infer_into(engine, [x for x, _ in pieces], [y for _, y in pieces])
    except Exception as exc:  # the parent decides: retry elsewhere, or fail the batch's studies
        reason = f"{type(exc).__name__}: {exc}"
        return _Failed(task.job, reason, retry=isinstance(exc, EngineError | MemoryError))
    infos = [e.info for each in sets for e in each.values()]
    fallbacks, lost = sum(i.fallbacks for i in infos), any(i.degraded for i in infos)
    return _Done(task.job, time.perf_counter() - started, fallbacks, lost, stages=last_stages())


# ---- the parent side -----------------------------------------------------------------------


@dataclass(eq=False)
class _Job:
    """A batch on its way: its arena slots (which hold its inputs until it is done)."""

    id: int
    model: str
    batch: SlotBatch
    done: BatchCallback
    attempts: int = 0
    avoid: int | None = None
    sent: int = 0  # time.monotonic_ns() of its last send to a worker


@dataclass(eq=False)
class _Worker:
    """The parent's record of one worker slot, across restarts of its process."""

    index: int
    gpu: int | None
    proc: BaseProcess | None = None
    conn: Connection | None = None
    state: WorkerState = WorkerState.STARTING
    error: str = ""
    inflight: dict[int, _Job] = field(default_factory=dict)
    infos: dict[str, BackendInfo] = field(default_factory=dict)
    progress_at: float = 0.0
    batches_done: int = 0
    busy_s: float = 0.0
    sizes: Counter[int] = field(default_factory=Counter)
    fallbacks: int = 0
    fallbacks_before: int = 0  # counted by earlier processes of this worker
    restarts: int = 0
    crashes_in_row: int = 0
    degraded: bool = False  # a GPU worker restarted on the CPU
    gpu_lost: bool = False  # its engines run on their CPU fallback (reset by a restart)

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"


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
        self._ctx = multiprocessing.get_context("spawn")
        self._cond = threading.Condition()
        self._workers: list[_Worker] = []
        self._backlog: deque[_Job] = deque()
        self._waiters: list[tuple[Priority, int]] = []
        self._reserved = 0
        self._ids = itertools.count()
        self._out_shapes: dict[str, tuple[int, ...]] = {}
        self._phase = PoolPhase.NEW
        self._traces: deque[BatchTrace] = deque(maxlen=_TRACES)
        self._arenas: list[ArenaRef] = []  # announced to every worker as it becomes ready
        self._started_at = time.monotonic()
        self._watchdog: threading.Thread | None = None

    # -- life cycle

    def start(self) -> None:
        """Start the workers and wait until each has loaded every model.

        Raises
        ------
        StartupError
            A worker could not load the models (its reason is in the message) or timed out.
        """
        self._workers = [_Worker(i, gpu) for i, gpu in enumerate(self._devices())]
        self._phase = PoolPhase.STARTING
        # Workers are started by the watchdog thread: PR_SET_PDEATHSIG fires when the thread
        # that forked them ends, and the watchdog lives exactly as long as the pool.
        self._watchdog = threading.Thread(target=self._watch, name="infer-watchdog", daemon=True)
        self._watchdog.start()
        with self._cond:
            self._cond.wait_for(self._start_settled, self.config.start_timeout_s)
            failed = [w for w in self._workers if w.state != WorkerState.READY]
            self._phase = PoolPhase.RUNNING if not failed else self._phase
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
            self._phase = PoolPhase.STOPPING
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._busy(), timeout_s)
            left = [*self._backlog, *(j for w in self._workers for j in w.inflight.values())]
            self._backlog.clear()
            for w in self._workers:
                w.inflight.clear()
        for job in left:
            _call(job, EngineError("inference stopped before this batch ran"))
        self._end_workers()
        with self._cond:
            self._phase = PoolPhase.STOPPED
        if self._watchdog is not None:
            self._watchdog.join()
        for w in self._workers:  # after the watchdog: it may still be waiting on these pipes
            if w.conn is not None:
                w.conn.close()

    def _end_workers(self) -> None:
        with self._cond:
            for w in self._workers:
                if w.conn is not None and w.state in _LIVE:
                    with contextlib.suppress(OSError):
                        w.conn.send(None)
                w.state = WorkerState.STOPPED
        for w in self._workers:
            if w.proc is not None:
                w.proc.join(5.0)
                if w.proc.is_alive():
                    log.warning("inference worker %s did not stop; killing it", w.device)
                    w.proc.kill()
                    w.proc.join()

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

    def _busy(self) -> bool:
        return bool(self._backlog) or any(w.inflight for w in self._workers)

    def _describe(self) -> str:
        return ", ".join(f"{w.device} ({w.proc.pid if w.proc else '-'})" for w in self._workers)

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
            if model not in self._out_shapes:
                raise EngineError(f"{model}: output shape unknown until the workers are up")
            return self._out_shapes[model]

    def batch_capacity(self) -> int:
        """Batches that can be reserved or running at once, over every worker."""
        return max(1, sum(self._depth(w) for w in self._workers))

    def _depth(self, w: _Worker) -> int:
        """Batches in flight on a worker: `depth`, plus the extra it runs at once on a GPU."""
        return self.config.depth + (self.spec.concurrency - 1 if w.gpu is not None else 0)

    def reserve(self, priority: Priority, timeout_s: float) -> bool:
        """Wait until a worker has room and no more urgent batcher waits; hold that room.

        Returns at once (True) once the pool stops or has no worker, so that the submit that
        follows fails the batch instead of leaving its studies waiting.
        """
        with self._cond:
            ticket = (priority, next(self._ids))
            heapq.heappush(self._waiters, ticket)
            try:
                granted = self._cond.wait_for(lambda: self._grantable(ticket), timeout_s)
                if granted:
                    self._reserved += 1
                return granted
            finally:
                self._waiters.remove(ticket)
                heapq.heapify(self._waiters)
                self._cond.notify_all()

    def _grantable(self, ticket: tuple[Priority, int]) -> bool:
        if self._phase != PoolPhase.RUNNING or not self._alive_workers():
            return True
        return self._waiters[0] == ticket and self._room() > 0

    def _room(self) -> int:
        ready = [w for w in self._workers if w.state == WorkerState.READY]
        room = sum(max(0, self._depth(w) - len(w.inflight)) for w in ready)
        return room - self._reserved - len(self._backlog)

    def _alive_workers(self) -> bool:
        return any(w.state in _LIVE for w in self._workers)

    def attach(self, ref: ArenaRef) -> None:
        """Have every worker map `ref` now (and each restarted worker when it is ready).

        A GPU worker page-locks an arena when it first sees it: about 0.2-0.7 s for a model's
        arena on an H200, which the first study after a start used to wait for.
        """
        with self._cond:
            self._arenas.append(ref)
            for w in self._workers:
                if w.state == WorkerState.READY:
                    self._announce(w, [ref])

    def _announce(self, w: _Worker, refs: list[ArenaRef]) -> None:
        assert w.conn is not None
        with contextlib.suppress(OSError):  # a dead worker: the watchdog restarts it
            for ref in refs:
                w.conn.send(_Attach(ref))

    def release(self) -> None:
        """Give back a reservation that no batch used."""
        with self._cond:
            self._reserved = max(0, self._reserved - 1)
            self._cond.notify_all()

    def submit(self, model: str, batch: SlotBatch, done: BatchCallback) -> None:
        """Run `batch` on the least-loaded worker; uses one reservation.

        `done` is called once, from the watchdog thread: with None once the outputs are in the
        batch's output slots, or with EngineError once every attempt failed.

        Raises
        ------
        EngineError
            The pool is not running, or no worker is left.
        """
        self.input_shape(model)  # refuses an unknown model
        job = _Job(next(self._ids), model, batch, done)
        with self._cond:
            self._reserved = max(0, self._reserved - 1)
            if self._phase != PoolPhase.RUNNING:
                raise EngineError("inference workers are not running")
            if not self._alive_workers():
                raise EngineError("no inference worker is running; see the log for why")
            self._backlog.append(job)  # behind any retried batch
            self._pump()

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
        with self._cond:
            return tuple(self._status(w) for w in self._workers)

    def take_traces(self) -> list[BatchTrace]:
        """Traces of the batches finished since the last call (of the latest 4,096 at most)."""
        with self._cond:
            traces = list(self._traces)
            self._traces.clear()
            return traces

    def _status(self, w: _Worker) -> WorkerStatus:
        backend = next(iter(w.infos.values())).backend if w.infos else ""
        elapsed = max(time.monotonic() - self._started_at, 1e-9)
        return WorkerStatus(
            index=w.index,
            pid=w.proc.pid if w.proc else None,
            backend=backend,
            device=w.device,
            state=w.state,
            alive=w.proc is not None and w.proc.is_alive(),
            batches_done=w.batches_done,
            batch_sizes=tuple(sorted(w.sizes.items())),
            busy_fraction=min(1.0, w.busy_s / elapsed),
            busy_s=w.busy_s,
            fallbacks=w.fallbacks,
            restarts=w.restarts,
            in_flight=len(w.inflight),
            degraded=w.degraded or w.gpu_lost,
        )

    # -- sending (under the lock)

    def _pump(self) -> None:
        """Send backlog batches to workers with room, least loaded first."""
        while self._backlog:
            loads = [
                len(w.inflight)
                if w.state == WorkerState.READY and len(w.inflight) < self._depth(w)
                else None
                for w in self._workers
            ]
            index = least_loaded(loads, self._backlog[0].avoid)
            if index is None:
                return
            self._send(self._workers[index], self._backlog.popleft())

    def _send(self, w: _Worker, job: _Job) -> None:
        job.attempts += 1
        if not w.inflight:
            w.progress_at = time.monotonic()
        w.inflight[job.id] = job
        assert w.conn is not None
        task = _Task(job.id, job.model, job.batch.arena.ref, job.batch.slots)
        job.sent = time.monotonic_ns()
        with contextlib.suppress(OSError):  # a dead worker: the watchdog retries its batches
            w.conn.send(task)
        faults.reach("in:batch")

    # -- the watchdog thread

    def _watch(self) -> None:
        with self._cond:
            for w in self._workers:
                self._launch(w)
            self._cond.notify_all()
        while self._phase != PoolPhase.STOPPED:
            try:
                self._watch_once()
            except Exception:  # keep watching: a lost watchdog would strand every study
                log.exception("inference watchdog error")

    def _watch_once(self) -> None:
        with self._cond:
            owner: dict[object, tuple[_Worker, BaseProcess]] = {}
            for w in self._workers:
                if w.state in _LIVE and w.conn and w.proc:
                    owner[w.conn] = owner[w.proc.sentinel] = (w, w.proc)
            handles = [h for h in owner if isinstance(h, Connection | int)]
        for handle in wait(handles, _TICK_S):
            w, proc = owner[handle]
            if w.proc is not proc or w.state not in _LIVE:
                continue  # the pipe and the sentinel of one death: the first one handled it
            if handle is w.conn:
                self._read(w)
            else:
                self._drain_then_exit(w)
        self._check_hangs()

    def _launch(self, w: _Worker) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self.spec, w.gpu, w.device, child, os.getpid()),
            name=f"imaging-ai-infer-{w.index}",
            daemon=True,
        )
        try:
            proc.start()
        except Exception as exc:  # e.g. out of memory or PIDs: the worker stays down, said why
            log.exception("cannot start inference worker %s", w.device)
            w.state, w.error = WorkerState.FAILED, f"cannot start a process: {exc}"
            parent.close()
            return
        finally:
            child.close()
        w.proc, w.conn, w.state, w.progress_at = (
            proc,
            parent,
            WorkerState.STARTING,
            time.monotonic(),
        )

    def _read(self, w: _Worker) -> None:
        assert w.conn is not None and w.proc is not None
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            self._on_exit(w, w.proc)
            return
        if isinstance(message, _Ready):
            self._on_ready(w, message)
        elif isinstance(message, _Done):
            self._on_done(w, message, time.monotonic_ns())
        elif isinstance(message, _Failed):
            self._on_failed(w, message)

    def _drain_then_exit(self, w: _Worker) -> None:
        """A worker exited: read what it sent before dying, then restart it."""
        proc, conn = w.proc, w.conn
        assert proc is not None and conn is not None
        with contextlib.suppress(EOFError, OSError):
            while w.proc is proc and conn.poll():  # a read may meet EOF and restart it
                self._read(w)
        self._on_exit(w, proc)

    def _on_ready(self, w: _Worker, message: _Ready) -> None:
        with self._cond:
            w.state, w.infos, w.progress_at = WorkerState.READY, message.infos, time.monotonic()
            self._out_shapes.update(message.output_shapes)
            log.info("inference worker %s ready (pid %s)", w.device, w.proc and w.proc.pid)
            self._announce(w, self._arenas)
            self._pump()
            self._cond.notify_all()

    def _on_done(self, w: _Worker, message: _Done, returned: int) -> None:
        with self._cond:
            job = w.inflight.pop(message.job, None)
            if job is None:
                return
            times = (job.sent, *message.marks, returned)
            self._traces.append(
                BatchTrace(
                    job.model, len(job.batch), w.index, *times, message.stages, message.runner
                )
            )
            w.batches_done, w.busy_s = w.batches_done + 1, w.busy_s + message.seconds
            w.sizes[len(job.batch)] += 1
            w.fallbacks = w.fallbacks_before + message.fallbacks
            w.gpu_lost = message.gpu_lost
            w.crashes_in_row, w.progress_at = 0, time.monotonic()
            self._pump()  # the worker's next batch first; the callback only queues copies
            self._cond.notify_all()
        _call(job, None)

    def _on_failed(self, w: _Worker, message: _Failed) -> None:
        if message.job is None:
            w.error = message.reason  # the process exits next; _on_exit handles it
            return
        with self._cond:
            job = w.inflight.pop(message.job, None)
            if job is None:
                return
            log.warning("batch of %s failed on %s: %s", job.model, w.device, message.reason)
            failed = not message.retry or not self._retry(job, w)
            self._pump()
            self._cond.notify_all()
        if failed:
            _call(job, EngineError(f"batch failed on {w.device}: {message.reason}"))

    def _retry(self, job: _Job, w: _Worker) -> bool:
        """Queue a batch again, away from `w`; False once it has had every attempt."""
        if job.attempts >= self.config.max_attempts:
            return False
        job.avoid = w.index
        self._backlog.appendleft(job)
        return True

    def _on_exit(self, w: _Worker, proc: BaseProcess) -> None:
        if not self._current(w, proc):
            return  # that exit was handled already (its pipe and its sentinel), or stop() did
        proc.join(1.0)  # reap it, for its exit code; a pipe closed early means it is ending
        if proc.is_alive():
            proc.kill()
        with self._cond:
            if not self._current(w, proc):
                return
            jobs = list(w.inflight.values())
            w.inflight.clear()
            code = proc.exitcode
            log.error(
                "inference worker %s exited (code %s) with %d batch(es) in flight %s",
                w.device,
                code,
                len(jobs),
                w.error,
            )
            failed = [job for job in jobs if not self._retry(job, w)]
            self._restart(w)
            if not self._alive_workers():
                failed += self._backlog
                self._backlog.clear()
            self._pump()
            self._cond.notify_all()
        for job in failed:
            _call(job, EngineError(f"inference worker {w.device} failed: {w.error or code}"))

    def _current(self, w: _Worker, proc: BaseProcess) -> bool:
        with self._cond:
            return w.proc is proc and w.state in _LIVE

    def _restart(self, w: _Worker) -> None:
        if w.conn is not None:
            w.conn.close()
        w.crashes_in_row += 1
        if self._phase != PoolPhase.RUNNING:  # a failed start, or stopping: no restart
            w.state = WorkerState.FAILED
            return
        if w.crashes_in_row >= self.config.max_restarts:
            if w.gpu is None:
                log.error(
                    "CPU worker %d failed %d times in a row; left down", w.index, w.crashes_in_row
                )
                w.state = WorkerState.FAILED
                return
            log.error("GPU worker %s keeps failing; restarting it on the CPU", w.device)
            w.gpu, w.degraded, w.crashes_in_row = None, True, 0
        w.restarts, w.error, w.infos, w.fallbacks_before = w.restarts + 1, "", {}, w.fallbacks
        w.gpu_lost = False
        self._launch(w)

    def _check_hangs(self) -> None:
        now = time.monotonic()
        with self._cond:
            for w in self._workers:
                starting = w.state == WorkerState.STARTING
                limit = self.config.start_timeout_s if starting else self.config.hang_timeout_s
                late = (starting or w.inflight) and now - w.progress_at > limit
                if late and w.proc is not None and w.proc.is_alive():
                    what = "start" if starting else "batch"
                    log.error("worker %s: %s took over %.0f s; killing it", w.device, what, limit)
                    w.error = f"{what} took over {limit:.0f} s"
                    w.proc.kill()


def _call(job: _Job, result: BaseException | None) -> None:
    try:
        job.done(result)
    except Exception:  # one study's routing bug must not stop the watchdog
        log.exception("batch callback of %s failed", job.model)
