#!/usr/bin/env python3
"""Throughput of the daemon's batching and worker pool on one GPU and on two, same run.

Run on a GPU machine from the repository root with onnxruntime-gpu on PYTHONPATH:

    python3 scripts/device_multi_gpu.py --studies 16 --slices 300

It uses the daemon's own pieces: `WorkerPool` (one worker process per GPU, ONNX Runtime CUDA,
FP16, shared-memory batches, two batches deep) and one `Batcher` per shipped model; each study
is a thread that sends its preprocessed slices through both models with `BatchingEngine`, as the
processor does. Reported: slices/s through both models (a slice counts once per model), the
scaling from one GPU to two, and each worker's busy fraction.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imaging_ai.batch import Batcher, BatchingConfig, BatchingEngine  # noqa: E402
from imaging_ai.modelcard import load_model_card  # noqa: E402
from imaging_ai.workers import PoolConfig, WorkerPool, WorkerSpec  # noqa: E402


def run_load(gpus: int, studies: int, slices: int, batch: int, backend: str) -> dict[str, Any]:
    """Every study at once through both models on `gpus` GPUs; slices/s and busy fractions."""
    cards = [load_model_card(ROOT / "engines" / name) for name in ("lung-seg", "nodule-det")]
    spec = WorkerSpec(
        model_dirs=tuple(c.folder for c in cards),
        backend=backend,
        data_dir=Path("/tmp/imaging-ai-data"),
        precision="fp16",
        max_batch_size=batch,
    )
    on_cpu = backend == "onnxruntime-cpu"  # a dry run on a machine without a GPU
    pool = WorkerPool(spec, PoolConfig(gpus=0 if on_cpu else gpus, cpu_workers=gpus, depth=2))
    pool.start()
    knobs = BatchingConfig(
        max_batch_size=batch, max_queue_delay_ms=2.0, max_pending=4 * batch * gpus
    )
    batchers = {c.name: Batcher(c.name, knobs, pool) for c in cards}
    for b in batchers.values():
        b.start()
    inputs = {
        c.name: np.random.default_rng(0).random(
            (slices, 1, c.input.height, c.input.width), dtype=np.float32
        )
        for c in cards
    }

    def study(i: int) -> None:
        for card in cards:
            BatchingEngine(batchers[card.name], 1, time.time() + i, study=f"s{i}").infer(
                inputs[card.name]
            )

    threads = [threading.Thread(target=study, args=(i,)) for i in range(studies)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    status = [
        {
            "device": w.device,
            "backend": w.backend,
            "busy": round(w.busy_fraction, 3),
            "batches": w.batches_done,
        }
        for w in pool.status()
    ]
    for b in batchers.values():
        b.stop()
    pool.stop()
    return {
        "gpus": gpus,
        "seconds": round(seconds, 3),
        "slices_per_s": round(studies * slices * len(cards) / seconds, 1),
        "workers": status,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--studies", type=int, default=16)
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--backend", default="onnxruntime-cuda")
    args = parser.parse_args()
    rows = [run_load(g, args.studies, args.slices, args.batch, args.backend) for g in args.gpus]
    out = os.environ.get("OUT")
    if out:
        Path(out, "device_multi_gpu.json").write_text(json.dumps(rows, indent=1))
    print(f"{'GPUs':>4} {'seconds':>8} {'slices/s':>9}  worker busy fractions")
    for r in rows:
        busy = ", ".join(f"{w['device']} {w['busy']:.0%}" for w in r["workers"])
        print(f"{r['gpus']:>4} {r['seconds']:>8.2f} {r['slices_per_s']:>9.1f}  {busy}")
    if len(rows) >= 2:
        ratio = rows[-1]["slices_per_s"] / rows[0]["slices_per_s"]
        print(f"headline: {rows[-1]['gpus']} GPUs at {ratio:.2f}x {rows[0]['gpus']} GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
