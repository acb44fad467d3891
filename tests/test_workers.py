"""Worker processes: shared-memory batches, least-loaded dispatch, watchdog restarts, clean stop."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from imaging_ai_devkit.fake_engines import (
    FailingGpu,
    FixedLatencyBackend,
    FixedLatencyEngine,
    fake_backend,
)

from imaging_ai import worker_arenas, workers
from imaging_ai.arena import SliceArena, SlotBatch
from imaging_ai.batch import Batcher, BatchingEngine
from imaging_ai.batch_policy import BatchingConfig
from imaging_ai.errors import EngineError, StartupError
from imaging_ai.infer.base import BackendInfo, Engine, FloatArray
from imaging_ai.infer.cuda_mem import CudaRuntime
from imaging_ai.modelcard import ModelCard
from imaging_ai.worker_dispatch import least_loaded
from imaging_ai.worker_pool import WorkerPool
from imaging_ai.workers import PoolConfig, WorkerSpec
from tests.fakes.cudart_fake import FakeCudart
from tests.infer.tiny_model import TinyModel, make_tiny

TRIGGER = 777.0  # a batch holding a slice of this value sets off a FaultyEngine
SHAPE = (1, 16, 16)


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll until `condition()` holds; fail the test after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


@dataclass(frozen=True)
class Faulty:
    """A picklable engine factory for worker processes: fake engines that fail on cue.

    Modes: "gate" (multi-slice batches wait until `marker` exists), "crash-once" (the first
    batch holding TRIGGER kills the process, consuming `marker`), "crash-always", "hang-once",
    "crash-on-gpu" (TRIGGER kills a GPU worker, a CPU one runs it), "fail-load", "warn-load"
    (logs a warning as it loads).
    """

    mode: str
    marker: Path

    def __call__(self, card: ModelCard, device: str) -> Engine:
        if self.mode == "gate":
            self.marker.parent.joinpath(f"loaded-{os.getpid()}-{time.monotonic_ns()}").touch()
        if self.mode == "fail-load":
            raise EngineError("cannot load the model (test)")
        if self.mode == "warn-load":
            logging.getLogger("imaging_ai.workers").warning("loaded %s with a warning", card.name)
        return FaultyEngine(FixedLatencyBackend(0.0).load(card), self, device)


class FaultyEngine:
    """A FixedLatencyEngine that crashes, hangs or waits as its factory says."""

    def __init__(self, inner: FixedLatencyEngine, factory: Faulty, device: str) -> None:
        self.inner, self.factory, self.device = inner, factory, device

    @property
    def max_batch_size(self) -> int:
        return self.inner.max_batch_size

    @property
    def info(self) -> BackendInfo:
        return self.inner.info

    def infer(self, batch: FloatArray) -> FloatArray:
        mode, marker = self.factory.mode, self.factory.marker
        if mode == "gate" and len(batch) > 1:
            marker.parent.joinpath(f"running-{threading.get_ident()}").touch()
            while not marker.exists():
                time.sleep(0.005)
        if TRIGGER in batch:
            if mode in ("crash-once", "hang-once") and marker.exists():
                marker.unlink()
                if mode == "hang-once":
                    time.sleep(3600)
                os._exit(3)
            if mode == "crash-always" or (mode == "crash-on-gpu" and self.device != "cpu"):
                os._exit(3)
        return self.inner.infer(batch)

    def close(self) -> None:
        self.inner.close()


BatchResult = FloatArray | BaseException
ARENAS: list[SliceArena] = []


@pytest.fixture(autouse=True)
def close_arenas() -> Iterator[None]:
    """Remove the shared memory of the arenas a test made."""
    yield
    while ARENAS:
        ARENAS.pop().close()


class Results:
    """Sends batches through an arena of its own, as a batcher does; collects their outputs."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.arena = SliceArena.create(64, SHAPE, pool.output_shape("tiny"))
        ARENAS.append(self.arena)
        self.cond = threading.Condition()
        self.got: dict[str, BatchResult] = {}

    def batch(self, slices: Sequence[FloatArray]) -> SlotBatch:
        """The slices copied into free slots."""
        slots = tuple(int(s) for s in self.arena.allocate(len(slices)))
        for slot, x in zip(slots, slices, strict=True):
            self.arena.inputs[slot] = x
        return SlotBatch(self.arena, slots)

    def callback(self, label: str, batch: SlotBatch) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            kept = (
                error
                if error is not None
                else np.concatenate([y for _, y in batch.arena.pieces(batch.slots)])
            )
            self.arena.free(batch.slots)
            with self.cond:
                self.got[label] = kept
                self.cond.notify_all()

        return done

    def wait(self, *labels: str, timeout_s: float = 20.0) -> list[BatchResult]:
        with self.cond:
            ok = self.cond.wait_for(lambda: all(k in self.got for k in labels), timeout_s)
            assert ok, f"missing {set(labels) - set(self.got)}"
            return [self.got[k] for k in labels]


@pytest.fixture
def tiny(tmp_path: Path) -> TinyModel:
    """The tiny model's folder and card."""
    return make_tiny(tmp_path)


@pytest.fixture
def reference(tiny: TinyModel) -> FixedLatencyEngine:
    """The fake engine in this process, to compare against."""
    return FixedLatencyBackend(0.0, max_batch_size=64).load(tiny.card)


def start_pool(tiny: TinyModel, backend: str = "fake:latency=0", **config: object) -> WorkerPool:
    spec = WorkerSpec((tiny.card.folder,), backend=backend)
    if "factory" in config:
        spec = WorkerSpec((tiny.card.folder,), factory=config.pop("factory"))  # type: ignore[arg-type]
    pool = WorkerPool(spec, PoolConfig(**{"gpus": 0, **config}))  # type: ignore[arg-type]
    pool.start()
    return pool


@pytest.fixture
def pools() -> Iterator[list[WorkerPool]]:
    """Pools a test starts; stopped afterwards even when the test fails."""
    started: list[WorkerPool] = []
    yield started
    for pool in started:
        pool.stop(timeout_s=1.0)


def batch(*values: float) -> list[FloatArray]:
    return [np.full(SHAPE, v, np.float32) for v in values]


def submit(pool: WorkerPool, results: Results, label: str, slices: Sequence[FloatArray]) -> None:
    assert pool.reserve((1, 0.0, 0), timeout_s=10.0)
    batch = results.batch(slices)
    pool.submit("tiny", batch, results.callback(label, batch))


def gone(pid: int) -> bool:
    """True when no process `pid` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_least_loaded_prefers_idle_then_low_index_and_avoids_the_failed_worker() -> None:
    assert least_loaded([2, 1, 1]) == 1
    assert least_loaded([None, 2, 0]) == 2
    assert least_loaded([0, 0], avoid=0) == 1
    assert least_loaded([0, None], avoid=0) == 0  # the only one left
    assert least_loaded([None, None]) is None


def test_fake_backend_setting() -> None:
    backend = fake_backend("fake:latency=0.05,per_slice=0.001,max_batch=8")
    assert (backend.latency_s_per_batch, backend.per_slice_s, backend.max_batch_size) == (
        0.05,
        0.001,
        8,
    )
    with pytest.raises(EngineError, match="unknown fake option"):
        fake_backend("fake:latncy=1")


def test_studies_through_two_cpu_workers_equal_a_direct_engine_call(
    tiny: TinyModel, reference: FixedLatencyEngine, pools: list[WorkerPool]
) -> None:
    pool = start_pool(tiny, "fake:latency=0.002", cpu_workers=2)
    pools.append(pool)
    batcher = Batcher("tiny", BatchingConfig(max_batch_size=8, max_queue_delay_ms=1.0), pool)
    batcher.start()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, *SHAPE), dtype=np.float32) for n in (5, 40, 17, 64)]

    def study(k: int) -> FloatArray:
        return BatchingEngine(batcher, k % 2, float(k)).infer(inputs[k])

    with ThreadPoolExecutor(len(inputs)) as threads:
        outputs = list(threads.map(study, range(len(inputs))))
    for x, out in zip(inputs, outputs, strict=True):
        assert np.array_equal(out, reference.infer(x))
    batcher.stop()
    status = pool.status()
    assert sum(s.batches_done for s in status) == batcher.batches
    assert all(s.backend == "fixed-latency" and s.device == "cpu" and s.alive for s in status)
    assert pool.info("tiny").batch_sizes[-1] == 8


def test_a_real_onnx_model_runs_in_a_cpu_worker(tiny: TinyModel, pools: list[WorkerPool]) -> None:
    pool = start_pool(tiny, "onnxruntime-cpu")
    pools.append(pool)
    x = tiny.batch(6)
    results = Results(pool)
    submit(pool, results, "x", list(x))
    (out,) = results.wait("x")
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, tiny.expected(x), rtol=1e-5, atol=1e-6)
    assert pool.status()[0].backend == "onnxruntime-cpu"


def test_least_loaded_dispatch_and_shallow_queues_across_two_workers(
    tiny: TinyModel, tmp_path: Path, pools: list[WorkerPool]
) -> None:
    gate = tmp_path / "open"
    pool = start_pool(tiny, factory=Faulty("gate", gate), cpu_workers=2, depth=2)
    pools.append(pool)
    results = Results(pool)
    for k in range(4):
        submit(pool, results, str(k), batch(k, k))
    assert [s.in_flight for s in pool.status()] == [2, 2]  # 0 and 2 on one, 1 and 3 on the other
    assert not pool.reserve((0, 0.0, 0), timeout_s=0.2)  # both queues full: no fifth batch
    gate.touch()
    outs = results.wait("0", "1", "2", "3")
    assert [float(np.asarray(o)[0, 0, 0, 0]) for o in outs] == [0.0, 1.0, 2.0, 3.0]
    wait_until(lambda: [s.batches_done for s in pool.status()] == [2, 2])
    assert all(s.batch_sizes == ((2, 2),) for s in pool.status())
    assert pool.reserve((0, 0.0, 0), timeout_s=1.0)
    pool.release()


def test_a_worker_that_crashes_is_restarted_and_its_batch_retried_elsewhere(
    tiny: TinyModel, tmp_path: Path, reference: FixedLatencyEngine, pools: list[WorkerPool]
) -> None:
    marker = tmp_path / "crash"
    marker.touch()
    pool = start_pool(tiny, factory=Faulty("crash-once", marker), cpu_workers=2)
    pools.append(pool)
    results = Results(pool)
    slices = batch(1.0, TRIGGER, 3.0)
    submit(pool, results, "x", slices)
    (out,) = results.wait("x")
    assert isinstance(out, np.ndarray) and np.array_equal(out, reference.infer(np.stack(slices)))
    assert not marker.exists()
    wait_until(lambda: all(s.state == "ready" and s.alive for s in pool.status()))
    assert sorted(s.restarts for s in pool.status()) == [0, 1]
    assert sorted(s.batches_done for s in pool.status()) == [0, 1]


def test_a_hung_worker_is_killed_restarted_and_the_batch_completes(
    tiny: TinyModel, tmp_path: Path, pools: list[WorkerPool]
) -> None:
    marker = tmp_path / "hang"
    marker.touch()
    pool = start_pool(tiny, factory=Faulty("hang-once", marker), hang_timeout_s=1.0)
    pools.append(pool)
    results = Results(pool)
    submit(pool, results, "x", batch(TRIGGER, 5.0))
    (out,) = results.wait("x")
    assert isinstance(out, np.ndarray) and float(out[1, 0, 0, 0]) == 5.0
    assert pool.status()[0].restarts == 1


def test_a_gpu_worker_that_keeps_crashing_comes_back_on_the_cpu(
    tiny: TinyModel, tmp_path: Path, pools: list[WorkerPool]
) -> None:
    pool = start_pool(tiny, factory=Faulty("crash-on-gpu", tmp_path), gpus=1, max_restarts=1)
    pools.append(pool)
    assert pool.status()[0].device == "cuda:0"
    results = Results(pool)
    submit(pool, results, "x", batch(TRIGGER, 2.0))
    (out,) = results.wait("x")
    assert isinstance(out, np.ndarray)
    (status,) = pool.status()
    assert status.device == "cpu" and status.degraded and status.restarts == 1
    assert pool.info("tiny").degraded


def test_a_gpu_engine_that_fails_runs_its_batches_on_the_cpu_and_the_worker_says_so(
    tiny: TinyModel, pools: list[WorkerPool]
) -> None:
    # The daemon's own wrapping (select.load_engine) of a GPU engine that raises a CUDA error.
    pool = start_pool(tiny, factory=FailingGpu(max_batch_size=8), gpus=1)
    pools.append(pool)
    results = Results(pool)
    for i in range(6):  # two copies of the engines, in turn: three failures in a row each
        submit(pool, results, f"b{i}", batch(float(i), 2.0))
        (out,) = results.wait(f"b{i}")
        want = tiny.expected(np.stack(batch(float(i), 2.0)))
        np.testing.assert_allclose(np.asarray(out), want, atol=1e-5)
    (status,) = pool.status()
    assert status.device == "cuda:0" and status.degraded and status.restarts == 0
    assert status.fallbacks >= 6  # every batch (and the start's warm-up slice) ran on the CPU
    submit(pool, results, "after", batch(9.0))  # while degraded: straight to the CPU, counted
    results.wait("after")
    assert pool.status()[0].fallbacks == status.fallbacks + 1
    assert pool.info("tiny").degraded


def test_a_batch_that_kills_every_worker_fails_after_max_attempts(
    tiny: TinyModel, tmp_path: Path, pools: list[WorkerPool]
) -> None:
    pool = start_pool(tiny, factory=Faulty("crash-always", tmp_path), max_attempts=2)
    pools.append(pool)
    results = Results(pool)
    submit(pool, results, "poison", batch(TRIGGER, 1.0))
    (error,) = results.wait("poison")
    assert isinstance(error, EngineError)
    submit(pool, results, "fine", batch(1.0, 2.0))  # the restarted worker carries on
    (out,) = results.wait("fine")
    assert isinstance(out, np.ndarray)


def test_a_worker_that_cannot_load_the_models_stops_the_start_with_the_reason(
    tiny: TinyModel, tmp_path: Path
) -> None:
    with pytest.raises(StartupError, match="cannot load the model"):
        start_pool(tiny, factory=Faulty("fail-load", tmp_path))


def test_stop_drains_batches_in_flight_then_leaves_no_process(
    tiny: TinyModel, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    pool = start_pool(tiny, factory=Faulty("gate", gate), cpu_workers=2)
    pids = [s.pid for s in pool.status()]
    results = Results(pool)
    submit(pool, results, "a", batch(1.0, 2.0))
    submit(pool, results, "b", batch(3.0, 4.0))
    stopper = threading.Thread(target=pool.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive() and not results.got  # waiting for the gated batches
    gate.touch()
    stopper.join(10)
    assert all(isinstance(r, np.ndarray) for r in results.wait("a", "b"))
    assert all(pid is not None and gone(pid) for pid in pids)
    assert pool.reserve((0, 0.0, 0), timeout_s=5.0)  # at once: the submit below fails fast
    late = results.batch(batch(1.0))
    with pytest.raises(EngineError, match="not running"):
        pool.submit("tiny", late, results.callback("late", late))


PARENT = """
import sys, time
from pathlib import Path
from imaging_ai.worker_pool import WorkerPool
from imaging_ai.workers import PoolConfig, WorkerSpec
spec = WorkerSpec((Path(sys.argv[1]),), backend="fake:latency=0")
pool = WorkerPool(spec, PoolConfig(gpus=0, cpu_workers=2))
pool.start()
print(" ".join(str(s.pid) for s in pool.status()), flush=True)
time.sleep(60)
"""


def test_workers_die_with_a_killed_daemon(tiny: TinyModel) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tiny.card.folder)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and not any(gone(pid) for pid in pids)
    parent.kill()  # SIGKILL: no atexit, no stop(); only PR_SET_PDEATHSIG or the poll can help
    parent.wait()
    wait_until(lambda: all(gone(pid) for pid in pids), timeout_s=10.0)


JSON_PARENT = """
import sys
from pathlib import Path
from imaging_ai.logs import setup_logging
from imaging_ai.worker_pool import WorkerPool
from imaging_ai.workers import PoolConfig, WorkerSpec
from tests.test_workers import Faulty
setup_logging("INFO", "json")
folder = Path(sys.argv[1])
pool = WorkerPool(WorkerSpec((folder,), factory=Faulty("warn-load", folder)), PoolConfig(gpus=0))
pool.start()
pool.stop()
"""


def test_a_worker_logs_as_the_daemon_does(tiny: TinyModel) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", JSON_PARENT, str(tiny.card.folder)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    records = [json.loads(line) for line in done.stderr.splitlines()]
    from_worker = [r for r in records if r["process"] == "imaging-ai-infer-0"]
    assert [r["message"] for r in from_worker] == ["loaded tiny with a warning"]
    assert from_worker[0]["level"] == "WARNING"


def test_a_gpu_worker_page_locks_each_arena_once_and_unlocks_it_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt = FakeCudart()
    monkeypatch.setattr(worker_arenas, "CudaRuntime", lambda: CudaRuntime(rt))
    arena = SliceArena.create(4, SHAPE, (3, 16, 16))
    ARENAS.append(arena)
    mapped = worker_arenas.MappedArenas(page_lock=True)
    first = mapped.get(arena.ref)
    assert mapped.get(arena.ref) is first
    assert sorted(rt.registered.values()) == sorted([first.inputs.nbytes, first.outputs.nbytes])
    mapped.close()
    assert rt.registered == {}


def test_a_worker_without_cuda_python_copies_from_unlocked_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing() -> CudaRuntime:
        raise EngineError("cuda-python is not installed")

    monkeypatch.setattr(worker_arenas, "CudaRuntime", missing)
    arena = SliceArena.create(4, SHAPE, (3, 16, 16))
    ARENAS.append(arena)
    mapped = worker_arenas.MappedArenas(page_lock=True)
    assert mapped.get(arena.ref).capacity == 4
    mapped.close()


def test_a_gpu_worker_runs_batches_at_once_on_copies_of_its_engines(
    tiny: TinyModel, tmp_path: Path, pools: list[WorkerPool]
) -> None:
    gate = tmp_path / "gates" / "open"
    gate.parent.mkdir()
    spec = WorkerSpec((tiny.card.folder,), factory=Faulty("gate", gate), concurrency=2)
    pool = WorkerPool(spec, PoolConfig(gpus=1, depth=2))
    pool.start()
    pools.append(pool)
    assert len(list(gate.parent.glob("loaded-*"))) == 2  # one set of engines per batch at once
    results = Results(pool)
    submit(pool, results, "a", batch(1.0, 2.0))
    submit(pool, results, "b", batch(3.0, 4.0))
    wait_until(lambda: len(list(gate.parent.glob("running-*"))) == 2)  # both, before either ends
    gate.touch()
    a, b = results.wait("a", "b")
    assert isinstance(a, np.ndarray) and float(a[1, 0, 0, 0]) == 2.0
    assert isinstance(b, np.ndarray) and float(b[0, 0, 0, 0]) == 3.0
    (status,) = pool.status()
    assert status.batches_done == 2 and 0 < status.busy_s < 30


def test_a_queued_batch_is_taken_from_the_pipe_by_the_first_free_set_of_engines(
    tiny: TinyModel, tmp_path: Path, pools: list[WorkerPool]
) -> None:
    gate = tmp_path / "gates" / "open"
    gate.parent.mkdir()
    spec = WorkerSpec((tiny.card.folder,), factory=Faulty("gate", gate), concurrency=2)
    pool = WorkerPool(spec, PoolConfig(gpus=1, depth=2))  # three in flight: two run, one waits
    pool.start()
    pools.append(pool)
    results = Results(pool)
    for label, first in (("a", 1.0), ("b", 3.0), ("c", 5.0)):
        submit(pool, results, label, batch(first, first + 1))
    wait_until(lambda: len(list(gate.parent.glob("running-*"))) == 2)
    time.sleep(0.2)
    assert len(list(gate.parent.glob("running-*"))) == 2  # the third waits in the pipe
    gate.touch()
    outputs = results.wait("a", "b", "c")
    assert [float(y[0, 0, 0, 0]) for y in outputs if isinstance(y, np.ndarray)] == [1.0, 3.0, 5.0]
    wait_until(lambda: len(pool._traces) == 3)
    *running, queued = sorted(pool.take_traces(), key=lambda t: t.received)
    assert queued.received >= min(t.ended for t in running)  # read once a set of engines was free
    (status,) = pool.status()
    pid = status.pid
    assert pid is not None
    pool.stop()
    assert gone(pid)


def test_staged_copies_gather_a_batch_into_page_locked_buffers_and_scatter_it_back(
    monkeypatch: pytest.MonkeyPatch, reference: FixedLatencyEngine
) -> None:
    rt = FakeCudart()
    monkeypatch.setattr(worker_arenas, "CudaRuntime", lambda: CudaRuntime(rt))
    arena = SliceArena.create(8, SHAPE, (3, 16, 16))
    ARENAS.append(arena)
    arena.inputs[...] = np.random.default_rng(0).random((8, *SHAPE), dtype=np.float32)
    slots = (5, 6, 0, 1, 2)
    staging = worker_arenas.Staging()
    staging.run("tiny", reference, arena.ref, arena.pieces(slots))
    expected = reference.infer(arena.inputs[list(slots)])
    np.testing.assert_array_equal(arena.outputs[list(slots)], expected)
    assert len(rt.pinned_mem) == 2  # one input and one output buffer, reused
    staging.run("tiny", reference, arena.ref, arena.pieces((3,)))
    assert len(rt.pinned_mem) == 2
    staging.close()
    assert rt.leaks()["pinned"] == 0


def test_cuda_graphs_need_one_batch_at_a_time(tiny: TinyModel) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need concurrency = 1"):
        WorkerSpec((tiny.card.folder,), cuda_graphs=True, concurrency=2)


def test_each_batch_leaves_a_trace_of_its_way_through_the_worker(
    tiny: TinyModel, pools: list[WorkerPool]
) -> None:
    pool = start_pool(tiny, "fake:latency=0.02")
    pools.append(pool)
    results = Results(pool)
    submit(pool, results, "a", batch(1.0, 2.0, 3.0))
    results.wait("a")
    wait_until(lambda: bool(pool._traces))
    (trace,) = pool.take_traces()
    assert (trace.model, trace.size, trace.worker, trace.stages) == ("tiny", 3, 0, None)
    times = (trace.sent, trace.received, trace.started, trace.ended, trace.replied, trace.returned)
    assert list(times) == sorted(times) and trace.sent > 0
    assert trace.ended - trace.started >= 20_000_000  # the engine's 20 ms are inside
    assert pool.take_traces() == []


@dataclass
class Loaded:
    """What `_load_engines` asked of `make_backend` and `load_engine`."""

    gpu: object = None
    fallback: list[object] | None = None


@pytest.mark.parametrize(("device", "spins"), [("cuda:0", False), ("cpu", True)])
def test_gpu_sessions_get_their_own_threads_and_their_fallbacks_do_not_spin(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, device: str, spins: bool
) -> None:
    from imaging_ai.infer import select

    seen = Loaded(fallback=[])

    def make_backend(setting: str, data_dir: Path, **options: object) -> object:
        seen.gpu = options["ort_gpu"]
        return types.SimpleNamespace(device=device)

    def load_engine(backend: object, card: ModelCard, *, cpu: object) -> object:
        assert seen.fallback is not None
        seen.fallback.append(cpu)
        return object()

    monkeypatch.setattr(select, "make_backend", make_backend)
    monkeypatch.setattr(select, "load_engine", load_engine)
    spec = WorkerSpec((tiny.card.folder,), backend="onnxruntime-cuda", cpu_threads=3)
    workers._load_engines(spec, device)
    assert seen.gpu.intra_op_threads == 1  # type: ignore[attr-defined]
    (fallback,) = seen.fallback
    assert fallback.intra_op_threads == 3 and fallback.allow_spinning is spins  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="gpu_threads"):
        WorkerSpec((tiny.card.folder,), gpu_threads=-1)


def test_an_attached_arena_is_mapped_before_its_first_batch(
    tiny: TinyModel, pools: list[WorkerPool]
) -> None:
    pool = start_pool(tiny)
    pools.append(pool)
    results = Results(pool)
    missing = replace(results.arena.ref, input_name="imaging-ai-no-such-arena")
    pool.attach(missing)  # refused in the worker with a warning; the worker carries on
    pool.attach(results.arena.ref)
    wait_until(lambda: pool.status()[0].in_flight == 0)
    time.sleep(0.5)  # the worker reads the attach messages
    # With the names gone from /dev/shm, only an arena mapped ahead of its batch still works.
    for shm in results.arena._buffers:
        shm.unlink()
    submit(pool, results, "a", batch(1.0, 2.0))
    (out,) = results.wait("a")
    assert not isinstance(out, BaseException) and out.shape[0] == 2
    assert pool.status()[0].restarts == 0
