#!/usr/bin/env python3
"""Why a GPU worker's batches take longer than the same engine's batches in one process.

Run on the GPU machine from the repository root, with onnxruntime-gpu on PYTHONPATH:

    python3 benchmarks/device/worker_overhead.py [--seconds 3]

The daemon's engines for both shipped models (`make_backend` + `load_engine`, as a worker loads
them: FallbackEngine with its CPU session) run batches of 64 from a page-locked arena,
alternating lung-seg and nodule-det as a worker does, (1) on the main thread, (2) on a
ThreadPoolExecutor thread as the worker's runner does, (3) on the main thread while
`nvidia-smi -lms 100` samples the GPU as the load benchmark does; then (4) the real WorkerPool
with one GPU worker, batches submitted straight to it two deep (no batcher, no studies).
Reported: ms per pair of batches (one of each model). `--backend onnxruntime-cpu` is a dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from imaging_ai.arena import SliceArena, SlotBatch  # noqa: E402
from imaging_ai.infer.base import infer_into  # noqa: E402
from imaging_ai.infer.ort import OrtOptions  # noqa: E402
from imaging_ai.infer.select import load_engine, make_backend  # noqa: E402
from imaging_ai.modelcard import load_model_card  # noqa: E402
from imaging_ai.worker_pool import WorkerPool  # noqa: E402
from imaging_ai.workers import PoolConfig, WorkerSpec  # noqa: E402

BATCH = 64
NAMES = ("lung-seg", "nodule-det")


def pairs_per_s(run_pair: Callable[[], None], seconds: float) -> float:
    run_pair()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        run_pair()
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


def in_process(backend_name: str, seconds: float) -> list[dict[str, Any]]:
    cards = [load_model_card(ROOT / "engines" / n) for n in NAMES]
    cpu = OrtOptions(max_batch_size=BATCH)
    gpu = OrtOptions(precision="fp16", max_batch_size=BATCH)
    backend = make_backend(backend_name, Path("/tmp"), ort_cpu=cpu, ort_gpu=gpu)
    engines = [load_engine(backend, c, cpu=cpu) for c in cards]
    arenas = []
    for engine, card in zip(engines, cards, strict=True):
        out = engine.infer(np.zeros((1, *card.input_shape), np.float32)).shape[1:]
        arenas.append(SliceArena.create(BATCH, card.input_shape, out))
    cuda = None
    if backend_name != "onnxruntime-cpu":
        from imaging_ai.infer.cuda_mem import CudaRuntime

        cuda = CudaRuntime()
        for arena in arenas:
            for view in (arena.inputs, arena.outputs):
                cuda.host_register(view.ctypes.data, view.nbytes)
    for arena in arenas:
        arena.inputs[...] = 0.5

    def pair() -> None:
        for engine, arena in zip(engines, arenas, strict=True):
            infer_into(engine, [arena.inputs], [arena.outputs])

    try:
        return measure(pair, seconds)
    finally:
        if cuda is not None:
            for arena in arenas:
                for view in (arena.inputs, arena.outputs):
                    cuda.host_unregister(view.ctypes.data)
        for arena in arenas:
            arena.close()
        for engine in engines:
            engine.close()


def measure(pair: Callable[[], None], seconds: float) -> list[dict[str, Any]]:
    """The pair on the main thread, on a runner thread, and with nvidia-smi sampling."""
    rows = [{"what": "main thread", "ms_per_pair": pairs_per_s(pair, seconds)}]
    with ThreadPoolExecutor(1) as runner:
        ms = runner.submit(pairs_per_s, pair, seconds).result()
    rows.append({"what": "runner thread", "ms_per_pair": ms})
    query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv", "-lms", "100"]
    try:
        smi: subprocess.Popen[bytes] | None = subprocess.Popen(query, stdout=subprocess.DEVNULL)
    except OSError:
        smi = None
    ms = pairs_per_s(pair, seconds)
    rows.append({"what": "main thread, nvidia-smi sampling", "ms_per_pair": ms})
    if smi is not None:
        smi.terminate()
        smi.wait(5)
    return rows


def through_pool(backend_name: str, seconds: float) -> list[dict[str, Any]]:
    cards = [load_model_card(ROOT / "engines" / n) for n in NAMES]
    folders = tuple(c.folder for c in cards)
    spec = WorkerSpec(folders, backend=backend_name, max_batch_size=BATCH, concurrency=1)
    gpus = 0 if backend_name == "onnxruntime-cpu" else 1
    pool = WorkerPool(spec, PoolConfig(gpus=gpus, cpu_workers=1, depth=2))
    pool.start()
    arenas = {}
    for card in cards:
        arenas[card.name] = SliceArena.create(BATCH, card.input_shape, pool.output_shape(card.name))
        arenas[card.name].inputs[...] = 0.5
    rows = []
    try:
        for deep in (1, 2):
            free = threading.Semaphore(deep)
            slots = tuple(range(BATCH))
            pairs, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for card in cards:
                    free.acquire()
                    assert pool.reserve((1, 0.0, pairs), 30.0)
                    batch = SlotBatch(arenas[card.name], slots)
                    pool.submit(card.name, batch, lambda error, done=free.release: done())
                pairs += 1
            for _ in range(deep):
                free.acquire()
            ms = (time.perf_counter() - t0) / pairs * 1e3
            (status,) = pool.status()
            what = f"worker pool, {deep} batch(es) in flight"
            rows.append({"what": what, "ms_per_pair": ms, "busy_s": status.busy_s})
    finally:
        pool.stop()
        for arena in arenas.values():
            arena.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--backend", default="onnxruntime-cuda")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for step in (in_process, through_pool):
        try:
            rows += step(args.backend, args.seconds)
        except Exception as exc:  # keep what the other step measured
            rows.append({"what": f"{step.__name__} FAILED", "note": f"{type(exc).__name__}: {exc}"})
        for r in rows:
            ms = r.get("ms_per_pair", float("nan"))
            print(f"{r['what']:<44} {ms:8.2f} ms/pair  {r.get('note', '')}", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "device_worker_check.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
