"""Batches from the worker pool in; model outputs into their arena slots: one inference worker.

Each worker process sees one GPU (as device 0, through CUDA_VISIBLE_DEVICES), loads every model
there and runs the batches it is sent (a GPU worker `WorkerSpec.concurrency` at once, each thread
taking the next task from the pipe itself); on a host without a GPU the same code runs
`PoolConfig.cpu_workers` CPU workers. A batch is slot numbers of its model's shared-memory arena
(`imaging_ai.arena`): a worker maps each arena once (`imaging_ai.worker_arenas`), reads the
batch's inputs straight from its slots and writes the outputs into them, so only a small task
message (`imaging_ai.worker_messages`) is pickled per batch and the daemon process copies no
pixel on the way. Workers die with the daemon (PR_SET_PDEATHSIG, and a parent-PID poll).

The pool's side is `imaging_ai.worker_pool` (start, stop, the batchers' `Dispatch`), with
`worker_dispatch` (which worker runs the next batch) and `worker_watch` (the workers
supervised, their replies read); this module also holds the records that describe a worker
to both sides: `WorkerSpec`, `PoolConfig`, `WorkerStatus`, `BatchTrace`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path

from imaging_ai import plugins
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import Backend, Engine, EngineFactory, infer_into, sample_batch
from imaging_ai.infer.ort import last_stages
from imaging_ai.logs import setup_logging
from imaging_ai.modelcard import ModelCard, load_model_card
from imaging_ai.states import WorkerState
from imaging_ai.supervise import die_with_parent
from imaging_ai.worker_arenas import MappedArenas, Runner, Staging
from imaging_ai.worker_messages import Attach, Done, Failed, Ready, Task

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5


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


def worker_main(
    spec: WorkerSpec,
    gpu: int | None,
    device: str,
    conn: Connection,
    parent_pid: int,
    log_settings: tuple[str, str] | None = None,
) -> None:
    """One inference worker process: load the models, report Ready, serve batches.

    ``log_settings`` is the daemon's (level, format) (`imaging_ai.logs.settings`): a spawned
    process starts with no logging set up, so without it a worker's warnings would reach
    stderr as bare, unredacted text whatever ``[logging] format`` says.
    """
    if log_settings is not None:
        setup_logging(*log_settings)
    die_with_parent()
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
            conn.send(Failed(None, f"{type(exc).__name__}: {exc}", retry=False))
        return
    infos = {n: e.info for n, e in engines.items()}
    try:
        conn.send(Ready(infos, {n: tuple(s) for n, s in shapes.items()}))
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
    arenas = MappedArenas(page_lock=on_gpu and not staged)
    runners = [Runner(engines, Staging() if on_gpu and staged else None) for engines in sets]
    pipe = _Pipe(conn, parent_pid)
    clock = _BusyClock()

    def serve(runner: Runner, index: int) -> None:
        try:
            batches(runner, index)
        except BaseException:  # a bug here: end the worker, so the parent retries its batches
            log.exception("inference worker thread failed")
            pipe.close()
            raise

    def batches(runner: Runner, index: int) -> None:
        while (got := pipe.next_task()) is not None:
            task, received = got
            if isinstance(task, Attach):  # page-locking 0.5 GB takes a first batch's time
                try:
                    arenas.get(task.arena)
                except Exception as exc:  # the arena's first batch tries again, and says why
                    log.warning("arena %s not mapped ahead: %s", task.arena.input_name, exc)
                continue
            started = time.monotonic_ns()
            clock.start()
            result = _run_task(task, runner, arenas, sets)
            ended = time.monotonic_ns()
            if isinstance(result, Done):  # busy time counts once however many batches ran
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

    def next_task(self) -> tuple[Task | Attach, int] | None:
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

    def reply(self, result: Done | Failed) -> None:
        """Send a batch's result (with the time it leaves, for its trace)."""
        with self._sending, contextlib.suppress(OSError):  # the parent is gone: nothing to tell
            if isinstance(result, Done):
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


def _run_task(
    task: Task, runner: Runner, arenas: MappedArenas, sets: list[dict[str, Engine]]
) -> Done | Failed:
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
        return Failed(task.job, reason, retry=isinstance(exc, EngineError | MemoryError))
    infos = [e.info for each in sets for e in each.values()]
    fallbacks, lost = sum(i.fallbacks for i in infos), any(i.degraded for i in infos)
    return Done(task.job, time.perf_counter() - started, fallbacks, lost, stages=last_stages())
