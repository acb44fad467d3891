#!/usr/bin/env python3
"""Throughput of the daemon's batching and worker pool on one GPU and on two, same run.

Run on a GPU machine from the repository root with onnxruntime-gpu on PYTHONPATH:

    python3 benchmarks/device/multi_gpu.py --studies 96 --clients 16 --slices 300 --batch 64 \
        --configs graphs=0,conc=1,depth=2 graphs=0,conc=2,depth=3

It uses the daemon's own pieces: `WorkerPool` (one worker process per GPU, ONNX Runtime CUDA as
the daemon configures it, batches as slots of shared-memory arenas) and one `Batcher` per
shipped model; `--configs` varies CUDA graphs, how many batches a GPU worker runs at once
(`WorkerSpec.concurrency`) and how many it holds in all (`depth`, running ones included).
`--clients` threads each take studies off a list and send their preprocessed slices through both
models with `BatchingEngine`, as the processor does. Each pool first runs a short warm-up load
(arenas mapped and page-locked, kernels chosen), then the timed load. Reported per run: slices/s
through both models (a slice counts once per model), the scaling from one GPU to two, each
worker's busy fraction over the timed window (time with at least one batch running), each GPU's
utilisation from `nvidia-smi` sampled every 100 ms (time a kernel was running), and the daemon
process's CPU use, to show where the limit is. With `--backend onnxruntime-cpu` (and `--gpus 1
2` meaning CPU workers) it is a dry run anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from imaging_ai.batch import Batcher, BatchingEngine  # noqa: E402
from imaging_ai.batch_policy import BatchingConfig  # noqa: E402
from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402
from imaging_ai.worker_pool import WorkerPool  # noqa: E402
from imaging_ai.workers import PoolConfig, WorkerSpec  # noqa: E402

INPUT_SETS = 4  # distinct inputs, so the parent's copies do not run from the CPU cache
SMI_FIELDS = "index,utilization.gpu,clocks.sm,power.draw"
CHECK_EVERY = 8  # slices of a study's outputs checked for routing and finite values


@contextmanager
def gpu_sampler(out: dict[int, list[list[float]]]) -> Iterator[None]:
    """Per GPU: [utilisation %, SM clock MHz, power W] every 100 ms while the block runs.

    Nothing is sampled (and `out` stays empty) where nvidia-smi is missing.
    """
    cmd = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.Popen(
            [*cmd, "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
    except OSError:
        yield
        return
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        yield
    finally:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        reader.join(5)
    for line in lines:  # a field the driver does not report reads "[N/A]": NaN here
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            out.setdefault(int(parts[0]), []).append([_number(p) for p in parts[1:]])


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def gpu_util(samples: list[list[float]]) -> float:
    """Mean utilisation (fraction) of one GPU's samples; NaN where none was reported."""
    known = [row[0] for row in samples if not np.isnan(row[0])]
    return round(float(np.mean(known)) / 100, 3) if known else float("nan")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_studies(
    batchers: dict[str, Batcher],
    cards: list[ModelCard],
    inputs: list[dict[str, Any]],
    studies: int,
    clients: int,
) -> tuple[float, float]:
    """`studies` studies through both models on `clients` threads; (seconds, max spread).

    The spread is the largest |difference| between a study's outputs and those of the first
    study with the same inputs: batches mix studies differently, so this checks the routing.
    """
    todo = list(range(studies))
    lock = threading.Lock()
    first: dict[tuple[int, str], Any] = {}
    spread = [0.0]
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                k = todo.pop(0)
            try:
                for card in cards:
                    engine = BatchingEngine(batchers[card.name], 1, time.time() + k, study=f"s{k}")
                    out = engine.infer(inputs[k % len(inputs)][card.name])
                    check(k % len(inputs), card.name, out)
            except BaseException as exc:
                errors.append(exc)
                return

    def check(which: int, model: str, out: Any) -> None:
        # Every 8th slice: a slice routed to the wrong study shows there as well, and checking
        # all of them read more memory on the client threads than the daemon's copies did.
        out = out[::CHECK_EVERY]
        if not np.isfinite(out).all():
            raise RuntimeError(f"{model}: non-finite outputs")
        with lock:
            ref = first.setdefault((which, model), out)
        if ref is not out:
            spread[0] = max(spread[0], float(np.max(np.abs(out - ref))))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started, spread[0]


def parse_config(text: str) -> dict[str, int]:
    """`graphs=0,conc=1,depth=2` as a dict (CUDA graphs, batches at once per GPU, depth)."""
    config = {"graphs": 0, "conc": 1, "depth": 2, "staged": 0}
    for item in text.split(","):
        key, value = item.split("=")
        if key not in config:
            raise SystemExit(f"--configs: unknown key {key!r} in {text!r}")
        config[key] = int(value)
    return config


def run_load(gpus: int, args: argparse.Namespace, config: dict[str, int]) -> dict[str, Any]:
    """Warm up, then the timed load on `gpus` GPUs; figures of the timed window."""
    cards = [load_model_card(ROOT / "engines" / name) for name in ("lung-seg", "nodule-det")]
    spec = WorkerSpec(
        model_dirs=tuple(c.folder for c in cards),
        backend=args.backend,
        data_dir=Path("/tmp/imaging-ai-data"),
        precision="fp16",
        max_batch_size=args.batch,
        cuda_graphs=bool(config["graphs"]),
        concurrency=config["conc"],
        staged_copies=bool(config["staged"]),
    )
    on_cpu = args.backend == "onnxruntime-cpu"  # a dry run on a machine without a GPU
    # `depth` here counts every batch in flight on a GPU worker, the ones it runs at once too.
    depth = max(1, config["depth"] - config["conc"] + 1)
    pool_config = PoolConfig(gpus=0 if on_cpu else gpus, cpu_workers=gpus, depth=depth)
    pool = WorkerPool(spec, pool_config)
    t0 = time.perf_counter()
    pool.start()
    knobs = BatchingConfig(
        max_batch_size=args.batch, max_queue_delay_ms=2.0, max_pending=args.max_pending
    )
    batchers = {c.name: Batcher(c.name, knobs, pool) for c in cards}
    try:
        for b in batchers.values():
            b.start()
        start_s = time.perf_counter() - t0
        figures = timed(pool, batchers, cards, args)
        return figures | {"gpus": gpus, "start_s": round(start_s, 1), "config": config}
    finally:
        for b in batchers.values():
            b.stop()
        pool.stop()


def timed(
    pool: WorkerPool, batchers: dict[str, Batcher], cards: list[ModelCard], args: argparse.Namespace
) -> dict[str, Any]:
    """The warm-up load, then the timed one, with its figures."""
    rng = np.random.default_rng(len(pool.status()))
    inputs = [
        {c.name: rng.random((args.slices, *c.input_shape), dtype=np.float32) for c in cards}
        for _ in range(INPUT_SETS)
    ]
    run_studies(batchers, cards, inputs, min(args.clients, args.studies), args.clients)
    before = {w.index: (w.busy_s, w.batches_done, w.pid) for w in pool.status()}
    cpu0, samples = self_cpu_s(), dict[int, list[list[float]]]()
    worker_cpu0 = {i: proc_cpu_s(p[2]) for i, p in before.items() if p[2]}
    with gpu_sampler(samples):
        seconds, spread = run_studies(batchers, cards, inputs, args.studies, args.clients)
    parent_cpu = (self_cpu_s() - cpu0) / seconds
    workers = []
    for w in pool.status():
        busy0, batches0, pid = before[w.index]
        cpu = (proc_cpu_s(pid) - worker_cpu0[w.index]) / seconds if pid else float("nan")
        workers.append(
            {
                "device": w.device,
                "backend": w.backend,
                "busy": round((w.busy_s - busy0) / seconds, 3),
                "batches": w.batches_done - batches0,
                "batch_sizes": w.batch_sizes,
                "cpu_cores": round(cpu, 2),
            }
        )
    return {
        "batch": args.batch,
        "studies": args.studies,
        "slices": args.slices,
        "seconds": round(seconds, 3),
        "slices_per_s": round(args.studies * args.slices * len(cards) / seconds, 1),
        "parent_cpu_cores": round(parent_cpu, 2),
        "gpu_util": [gpu_util(samples[g]) for g in sorted(samples)],
        "gpu_util_samples": [len(samples[g]) for g in sorted(samples)],
        "max_spread": spread,
        "workers": workers,
    }


def label(config: dict[str, int]) -> str:
    graphs = "on" if config["graphs"] else "off"
    staged = ", staged" if config.get("staged") else ""
    return f"graphs {graphs}, {config['conc']} at once, depth {config['depth']}{staged}"


def table(rows: list[dict[str, Any]]) -> str:
    """Slices/s, parent CPU, busy and utilisation per run; the scaling per configuration."""
    lines = [f"{'configuration':<42} {'GPUs':>4} {'s':>6} {'slices/s':>9} {'parent':>6}  workers"]
    for r in rows:
        util = r["gpu_util"] or ["-"] * len(r["workers"])
        busy = ", ".join(
            f"{w['device']} busy {w['busy']:.0%} util {u if isinstance(u, str) else f'{u:.0%}'}"
            for w, u in zip(r["workers"], util, strict=False)
        )
        lines.append(
            f"{label(r['config']):<42} {r['gpus']:>4} {r['seconds']:>6.2f} "
            f"{r['slices_per_s']:>9.0f} {r['parent_cpu_cores']:>6.2f}  {busy}"
        )
    for key in dict.fromkeys(label(r["config"]) for r in rows):
        same = [r for r in rows if label(r["config"]) == key]
        if len(same) >= 2:
            ratio = same[-1]["slices_per_s"] / same[0]["slices_per_s"]
            lines.append(f"headline ({key}): {same[-1]['gpus']} GPUs at {ratio:.2f}x 1 GPU")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--studies", type=int, default=96)
    parser.add_argument("--clients", type=int, default=16, help="studies in flight at once")
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-pending", type=int, default=1024)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["graphs=0,conc=1,depth=2"],
        help="graphs=0|1 (CUDA graphs), conc=N (batches at once per GPU), depth=N (in flight), "
        "staged=0|1 (copies through the worker's page-locked buffers)",
    )
    parser.add_argument("--backend", default="onnxruntime-cuda")
    args = parser.parse_args()
    rows = []
    out = os.environ.get("OUT")
    for text in args.configs:
        config = parse_config(text)
        for g in args.gpus:
            try:
                rows.append(run_load(g, args, config))
            except Exception as exc:  # e.g. a model that cannot be captured in a CUDA graph
                print(f"{g} GPU(s), {text}: FAILED {type(exc).__name__}: {exc}", flush=True)
                continue
            print(json.dumps(rows[-1]), flush=True)
            if out:
                Path(out, "device_multi_gpu.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
