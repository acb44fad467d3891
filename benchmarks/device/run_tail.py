#!/usr/bin/env python3
"""Issue 4: where the slow engine runs under load come from (a GPU worker's engines, in process).

Under the batchers' load a GPU worker's nodule-det runs take 9 ms at the median but about 20 of them
in 15 s take 0.6-1.9 s (worker_feed.py's raw traces; CHANGELOG.md, 2026-12-01, "Why the GPU idled"),
which leaves the GPU idle most of the time. This loads the engines exactly as a GPU worker does
(`workers._load_engines`)
and runs: (A) 150 pairs of full batches, one thread; (B) 150 batches of mixed sizes, one
thread; (C) two threads, each with its own set of engines (a worker's two runners), full
batches for 10 s; (D) as C with mixed sizes. It prints every run over 100 ms with its phase,
model, size and thread, and per phase the run-time median, p99 and max. Writes
$OUT/run_tail.json. Run after `source benchmarks/device/setup_ort.sh`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from imaging_ai.infer.base import infer_into  # noqa: E402
from imaging_ai.infer.ort import last_stages  # noqa: E402
from imaging_ai.modelcard import load_model_card  # noqa: E402
from imaging_ai.stats import quantile  # noqa: E402
from imaging_ai.workers import WorkerSpec, _load_engines  # noqa: E402

NAMES = ("lung-seg", "nodule-det")
BACKEND = "onnxruntime-cuda"
SECONDS = 10.0
SIZES = (64, 64, 64, 64, 64, 32, 16, 8, 48, 20)


def run(engines: dict[str, Any], model: str, n: int, log: list[tuple[Any, ...]], tag: str) -> None:
    x = np.random.default_rng(n).random((n, *SHAPES[model]), dtype=np.float32)
    y = np.empty((n, *OUT_SHAPES[model]), np.float32)
    t0 = time.perf_counter()
    infer_into(engines[model], [x], [y])
    wall = time.perf_counter() - t0
    stages = last_stages()
    log.append(
        (tag, model, n, threading.current_thread().name, wall, stages[1] / 1e9 if stages else wall)
    )


SHAPES: dict[str, tuple[int, ...]] = {}
OUT_SHAPES: dict[str, tuple[int, ...]] = {}


def main() -> int:
    global BACKEND, SECONDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpu", action="store_true", help="a short dry run on the CPU")
    if parser.parse_args().cpu:
        BACKEND, SECONDS = "onnxruntime-cpu", 1.0
    cards = [load_model_card(ROOT / "engines" / n) for n in NAMES]
    for c in cards:
        SHAPES[c.name] = tuple(c.input_shape)
    spec = WorkerSpec(model_dirs=tuple(c.folder for c in cards), backend=BACKEND, max_batch_size=64)
    t0 = time.perf_counter()
    sets = [
        _load_engines(spec, "cpu" if BACKEND.endswith("cpu") else "cuda:0")[0] for _ in range(2)
    ]
    print(f"engines loaded: {time.perf_counter() - t0:.1f} s", flush=True)
    for c in cards:
        OUT_SHAPES[c.name] = tuple(
            sets[0][c.name].infer(np.zeros((1, *c.input_shape), np.float32)).shape[1:]
        )
    log: list[tuple[Any, ...]] = []
    for engines in sets:  # every padded size once per set, as a warm worker would have
        for size in (1, 2, 4, 8, 16, 32, 64):
            for name in NAMES:
                run(engines, name, size, log, "warm")
    rng = np.random.default_rng(0)
    for _ in range(3 if BACKEND.endswith("cpu") else 150):
        for name in NAMES:
            run(sets[0], name, 64, log, "A full, 1 thread")
    for _ in range(3 if BACKEND.endswith("cpu") else 150):
        for name in NAMES:
            run(sets[0], name, int(rng.choice(SIZES)), log, "B mixed, 1 thread")

    def runner(engines: dict[str, Any], tag: str, mixed: bool, seconds: float) -> None:
        local = np.random.default_rng(threading.get_ident() % 1000)
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            n = int(local.choice(SIZES)) if mixed else 64
            run(engines, NAMES[i % 2], n, log, tag)
            i += 1

    for tag, mixed in (("C full, 2 threads", False), ("D mixed, 2 threads", True)):
        threads = [
            threading.Thread(target=runner, args=(e, tag, mixed, SECONDS), name=f"runner-{i}")
            for i, e in enumerate(sets)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"{tag} done", flush=True)
    slow = [r for r in log if r[5] > 0.1]
    for r in slow:
        print(f"slow: {r[0]:<20} {r[1]:<11} n={r[2]:<3} {r[3]:<10} run {r[5] * 1e3:8.1f} ms")
    for tag in dict.fromkeys(r[0] for r in log):
        for name in NAMES:
            runs = np.array([r[5] for r in log if r[0] == tag and r[1] == name]) * 1e3
            if len(runs):
                print(
                    f"{tag:<20} {name:<11} n={len(runs):<4} median {quantile(runs, 0.5):7.2f} "
                    f"p99 {quantile(runs, 0.99):8.2f} max {runs.max():8.1f} ms"
                )
    Path(os.environ.get("OUT", "/tmp"), "run_tail.json").write_text(json.dumps(log))
    print(f"headline: {len(slow)} runs over 100 ms of {len(log)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
