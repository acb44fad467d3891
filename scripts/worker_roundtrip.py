#!/usr/bin/env python3
"""One batch's round trip through a CPU worker against the same fake engine in this process.

    .venv/bin/python scripts/worker_roundtrip.py --latency 0.005 --batches 200

The test-only fixed-latency engine (`imaging_ai_devkit.fake_engines`) on the tests' tiny model;
batches of 32 submitted straight to a `WorkerPool` with one CPU worker, 1 and then 2 in flight.
Prints the engine's time in this process, then per batch through the pool the wall time and the
medians of its `BatchTrace`: to the worker, waiting for a free set of engines, the run, the reply
and the way back. What is left over is what the worker path costs beyond the engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devkit")]

from imaging_ai_devkit.fake_engines import FixedLatencyBackend  # noqa: E402

from imaging_ai.arena import SliceArena, SlotBatch  # noqa: E402
from imaging_ai.worker_pool import WorkerPool  # noqa: E402
from imaging_ai.workers import BatchTrace, PoolConfig, WorkerSpec  # noqa: E402
from tests.infer.tiny_model import make_tiny  # noqa: E402

BATCH = 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--latency", type=float, default=0.005, help="the fake engine's seconds")
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    tiny = make_tiny(Path(tempfile.mkdtemp()))
    engine = FixedLatencyBackend(args.latency, max_batch_size=64).load(tiny.card)
    x = np.zeros((BATCH, *tiny.card.input_shape), np.float32)
    times = []
    for _ in range(args.batches):
        t0 = time.perf_counter()
        engine.infer(x)
        times.append(time.perf_counter() - t0)
    print(f"in this process: {statistics.median(times) * 1e3:.2f} ms per batch (median)")
    spec = WorkerSpec((tiny.card.folder,), backend=f"fake:latency={args.latency},max_batch=64")
    pool = WorkerPool(spec, PoolConfig(gpus=0))
    pool.start()
    arena = SliceArena.create(2 * BATCH, tiny.card.input_shape, pool.output_shape("tiny"))
    try:
        for deep in (1, 2):
            print(through_pool(pool, arena, deep, args.batches))
    finally:
        pool.stop()
        arena.close()
    return 0


def through_pool(pool: WorkerPool, arena: SliceArena, deep: int, batches: int) -> str:
    free = threading.Semaphore(deep)
    pool.take_traces()
    t0 = time.perf_counter()
    for i in range(batches):
        free.acquire()
        assert pool.reserve((1, 0.0, i), 10.0)
        slots = tuple(range(BATCH * (i % 2), BATCH * (i % 2) + BATCH))
        pool.submit("tiny", SlotBatch(arena, slots), lambda error: free.release())
    for _ in range(deep):
        free.acquire()
    wall = (time.perf_counter() - t0) / batches * 1e3
    traces = pool.take_traces()

    def ms(part: Callable[[BatchTrace], int]) -> float:
        return statistics.median(part(t) for t in traces) / 1e6

    parts = {
        "to worker": ms(lambda t: t.received - t.sent),
        "wait": ms(lambda t: t.started - t.received),
        "run": ms(lambda t: t.ended - t.started),
        "reply": ms(lambda t: t.replied - t.ended),
        "back": ms(lambda t: t.returned - t.replied),
        "round trip": ms(lambda t: t.returned - t.sent),
    }
    medians = ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
    return f"through the pool, {deep} in flight: {wall:.2f} ms per batch; medians (ms): {medians}"


if __name__ == "__main__":
    sys.exit(main())
