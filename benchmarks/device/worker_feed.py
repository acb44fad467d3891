#!/usr/bin/env python3
"""Issue 4, fourth session: where a GPU idles under the batchers' load, and what feeds it better.

Run on nvidia-h200-x2 from the repository root, after `source benchmarks/device/setup_ort.sh`:

    timeout 240 python3 benchmarks/device/worker_feed.py

The load of `benchmarks/device/worker_load.py` (16 client threads, 96 studies of 300 preprocessed
slices through lung-seg and nodule-det 2.0.0, batch 64, ONNX Runtime CUDA FP16 in the daemon's
`WorkerPool`), on one GPU and on two, in variants of how the daemon feeds the workers:
`depth` (batches queued per worker beyond the ones running), the parent's GIL switch interval,
and the number of runner threads per GPU worker. For every load: the figures of
`worker_load.timed_load` plus each batch's raw trace (`raw`), and, every 2 ms, the batches in
flight per worker and the slices queued in the batchers, so that the JSON says whether a GPU
idled for want of batches (the feed) or with batches waiting in its worker (the worker).
Writes `$OUT/issue4_feed.json` after every step; prints a table and `headline:` last.
`--cpu` is a reduced dry run on CPU workers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "device"))

from worker_load import INPUT_SETS, NAMES, Budget, Pool, timed_load  # noqa: E402

from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402

Row = dict[str, Any]
# (label, GPUs, depth, parent switch interval s, runner threads per GPU worker)
VARIANTS = (
    ("1 GPU", 1, 2, 0.005, 2),
    ("2 GPUs", 2, 2, 0.005, 2),
    ("1 GPU, depth 4", 1, 4, 0.005, 2),
    ("2 GPUs, depth 4", 2, 4, 0.005, 2),
    ("1 GPU, switch 0.5 ms", 1, 2, 0.0005, 2),
    ("1 GPU, 3 runners, depth 4", 1, 4, 0.005, 3),
)


def sample_feed(p: Pool, stop: threading.Event, out: list[list[int]]) -> None:
    """Every 2 ms: batches in flight per worker, then slices queued per batcher."""
    while not stop.wait(0.002):
        inflight = [len(w.inflight) for w in p.pool._workers]  # a probe of the pool's state
        out.append(inflight + [b.pending for b in p.batchers.values()])


def feed_figures(samples: list[list[int]], workers: int) -> Row:
    """Mean batches in flight per worker; how often a worker had none while slices queued."""
    if not samples:
        return {}
    a = np.array(samples)
    inflight, queued = a[:, :workers], a[:, workers:].sum(axis=1)
    return {
        "inflight_mean": [round(float(v), 2) for v in inflight.mean(axis=0)],
        "idle_with_queue": [round(float(((c == 0) & (queued > 0)).mean()), 3) for c in inflight.T],
        "queued_mean": round(float(queued.mean())),
        "queue_empty": round(float((queued == 0).mean()), 3),
    }


def run_variant(
    args: argparse.Namespace, cards: list[ModelCard], inputs: list[Row], variant: tuple[Any, ...]
) -> Row:
    label, gpus, depth, switch, runners = variant
    p = Pool(gpus, args, cards, concurrency=runners)
    try:
        p.pool.config = replace(p.pool.config, depth=depth)
        before = sys.getswitchinterval()
        sys.setswitchinterval(switch)
        samples: list[list[int]] = []
        stop = threading.Event()
        probe = threading.Thread(target=sample_feed, args=(p, stop, samples), daemon=True)
        try:
            probe.start()
            row = timed_load(p, inputs, args)
        finally:
            stop.set()
            probe.join()
            sys.setswitchinterval(before)
    finally:
        p.stop()
    return (
        {"label": label, "depth": depth, "switch_s": switch, "runners": runners}
        | row
        | {"feed": feed_figures(samples, gpus)}
    )


def table(rows: list[Row]) -> list[str]:
    lines = [
        f"{'variant':<27} {'slices/s':>8} {'inflight':>11} {'idle+queue':>11} {'queue0':>6} "
        "busy; GPU util"
    ]
    for r in rows:
        f = r["feed"]
        inflight = "/".join(f"{v:.1f}" for v in f.get("inflight_mean", []))
        idle = "/".join(f"{v:.0%}" for v in f.get("idle_with_queue", []))
        busy = "/".join(f"{w['busy']:.0%}" for w in r["workers"])
        util = "/".join(f"{g['util']:.0%}" for g in r["gpu"]) or "-"
        lines.append(
            f"{r['label']:<27} {r['slices_per_s']:>8.0f} {inflight:>11} {idle:>11} "
            f"{f.get('queue_empty', 0):>6.0%} {busy}; {util}"
        )
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--studies", type=int, default=96)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--max-pending", type=int, default=1024)
    parser.add_argument("--backend", default="onnxruntime-cuda")
    parser.add_argument("--only", default="", help="comma-separated variant numbers (1-based)")
    parser.add_argument("--cpu", action="store_true", help="reduced dry run on CPU workers")
    args = parser.parse_args()
    if args.cpu:
        args.backend, args.studies, args.clients, args.slices = "onnxruntime-cpu", 4, 4, 16
        args.batch, args.max_pending = 8, 64
    return args


def main() -> int:
    args = parse_args()
    budget = Budget(args.budget_s)
    cards = [load_model_card(ROOT / "engines" / n) for n in NAMES]
    rng = np.random.default_rng(1)
    inputs = [
        {c.name: rng.random((args.slices, *c.input_shape), dtype=np.float32) for c in cards}
        for _ in range(INPUT_SETS)
    ]
    chosen = [VARIANTS[int(i) - 1] for i in args.only.split(",") if i] or list(VARIANTS)
    out = Path(os.environ.get("OUT", "/tmp"), "issue4_feed.json")
    rows: list[Row] = []
    needs = 45.0
    for variant in chosen:
        if not budget.allows(variant[0], needs):
            continue
        t0 = time.monotonic()
        try:
            rows.append(run_variant(args, cards, inputs, variant))
        except Exception as exc:  # keep what the other variants measure
            print(f"{variant[0]} FAILED: {exc!r}", flush=True)
            continue
        needs = max(needs, time.monotonic() - t0 + 5)
        print(f"{variant[0]}: {time.monotonic() - t0:.1f} s", flush=True)
        out.write_text(json.dumps(rows))
    print("\n".join(table(rows)))
    best = max(
        rows, key=lambda r: min(g["util"] for g in r["gpu"]) if r["gpu"] else 0, default=None
    )
    if best is None or not best["gpu"]:
        print("headline: no GPU figures (a load failed or nvidia-smi is missing)")
    else:
        util = "/".join(f"{g['util']:.0%}" for g in best["gpu"])
        rate = f"{best['slices_per_s']:,.0f} slices/s"
        print(f"headline: best GPU util {util} with {best['label']} ({rate})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
