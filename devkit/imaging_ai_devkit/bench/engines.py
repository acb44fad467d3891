"""Takes the shipped models and gives slices/s and batch latency per backend and batch size,
against PyTorch eager FP32 running the same network and weights.

`imaging-ai bench engines --slices 128 --batches 1,8,16,32,64`: every backend this host has
(ONNX Runtime CPU always; ONNX Runtime CUDA FP32/FP16 with onnxruntime-gpu and a GPU; TensorRT
when it imports), each shipped model, each batch size; host numpy in, host numpy out, as a
worker runs it. The peer is PyTorch eager FP32 (`imaging_ai_devkit.bench.torch_onnx`) when torch
imports, on the GPU when there is one; otherwise the output says it was skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imaging_ai import progress as bars
from imaging_ai.infer.base import sample_batch
from imaging_ai.modelcard import ModelCard, discover_models
from imaging_ai.stats import quantile
from imaging_ai_devkit.bench.harness import ENGINES_DIR

Runner = Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]
TORCH = "PyTorch eager FP32"


@dataclass(frozen=True)
class Cell:
    """One measurement: a model on an engine at a batch size."""

    model: str
    engine: str
    batch: int
    slices_per_s: float
    latency_ms_p50: float
    latency_ms_p95: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `imaging-ai bench engines`."""
    parser.add_argument("--slices", type=int, default=128, help="slices per measurement")
    parser.add_argument("--batches", default="1,8,16,32,64", help="comma-separated batch sizes")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads")
    parser.add_argument("--models", default="", help="comma-separated model names (default all)")
    parser.add_argument("--plot", type=Path, help="write throughput vs batch size as PNG")
    bars.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print the table; the last line starts with headline:."""
    batches = sorted({int(b) for b in str(args.batches).split(",")})
    cards = [c for c in discover_models(ENGINES_DIR) if not args.models or c.name in args.models]
    cells: list[Cell] = []
    notes: list[str] = []
    # A bar of the cells measured on stderr; how many engines a model has is known only as
    # they load, so each one loaded adds its batch sizes to the total.
    bar = bars.progress(total=0, desc="engines", unit="cell", force=args.progress)
    with tempfile.TemporaryDirectory(prefix="imaging-ai-bench-engines-") as tmp, bar:
        for card in cards:
            for name, runner in _engines(card, max(batches), args.threads, Path(tmp), notes):
                bar.total += len(batches)
                for batch in batches:
                    bar.set_postfix_str(f"{card.name} {name} batch {batch}")
                    cells.append(measure(card, name, runner, batch, args.slices))
                    c = cells[-1]
                    bars.echo(
                        f"  {card.name} {name} batch {batch}: {c.slices_per_s:,.0f} slices/s, "
                        f"{c.latency_ms_p50:.1f} ms per batch"
                    )
                    bar.update()
    _print(cells, notes, args)
    if args.plot:
        from imaging_ai_devkit.bench.plots import throughput_vs_batch

        throughput_vs_batch(cells, args.plot, f"{args.threads} CPU threads")
        print(f"plot: {args.plot}")
    print(headline(cells))
    return 0


def measure(card: ModelCard, engine: str, runner: Runner, batch: int, slices: int) -> Cell:
    """Time ``slices`` slices (at least one batch) after one warm-up batch."""
    data = sample_batch(card, batch, seed=batch)
    runner(data)
    latencies = []
    done = 0
    start = time.perf_counter()
    while done < slices:
        t = time.perf_counter()
        runner(data)
        latencies.append(time.perf_counter() - t)
        done += batch
    seconds = time.perf_counter() - start
    ms = [x * 1000 for x in latencies]
    return Cell(card.name, engine, batch, done / seconds, quantile(ms, 0.5), quantile(ms, 0.95))


def _engines(
    card: ModelCard, max_batch: int, threads: int, tmp: Path, notes: list[str]
) -> Iterator[tuple[str, Runner]]:
    """(name, runner) for every engine this host can run, the PyTorch peer last."""
    from imaging_ai.infer.ort import OrtBackend, OrtOptions, available_providers

    cpu = OrtOptions(provider="cpu", intra_op_threads=threads, max_batch_size=max_batch)
    engine = OrtBackend(cpu).load(card)
    yield "ONNX Runtime CPU FP32", engine.infer
    engine.close()
    gpu = _gpu_count()
    if "CUDAExecutionProvider" in available_providers() and gpu:
        for precision in ("fp32", "fp16"):
            options = OrtOptions(provider="cuda", precision=precision, max_batch_size=max_batch)
            engine = OrtBackend(options).load(card)
            yield f"ONNX Runtime CUDA {precision.upper()}", engine.infer
            engine.close()
    else:
        _note(notes, "ONNX Runtime CUDA: not measured (no onnxruntime-gpu or no GPU here)")
    yield from _tensorrt(card, max_batch, tmp, gpu, notes)
    yield from _torch(card, threads, gpu, notes)


def _tensorrt(
    card: ModelCard, max_batch: int, tmp: Path, gpu: int, notes: list[str]
) -> Iterator[tuple[str, Runner]]:
    if importlib.util.find_spec("tensorrt") is None or not gpu:
        _note(notes, "TensorRT: not measured (tensorrt not installed or no GPU here)")
        return
    from imaging_ai.infer.tensorrt import TensorRTBackend, TensorRTOptions

    options = TensorRTOptions(max_batch_size=max_batch, opt_batch_size=min(16, max_batch))
    engine = TensorRTBackend(tmp, options).load(card)
    yield "TensorRT FP16", engine.infer
    engine.close()


def _torch(
    card: ModelCard, threads: int, gpu: int, notes: list[str]
) -> Iterator[tuple[str, Runner]]:
    if importlib.util.find_spec("torch") is None:
        _note(notes, f"{TORCH}: not measured (torch is not installed; pip install '.[train]')")
        return
    import torch

    from imaging_ai_devkit.bench.torch_onnx import TorchEager

    torch.set_num_threads(threads)
    device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    eager = TorchEager(card.onnx_path, device)
    yield f"{TORCH} ({device})", eager


def _gpu_count() -> int:
    from imaging_ai.infer.select import probe_environment

    return probe_environment().gpus


def _note(notes: list[str], text: str) -> None:
    if text not in notes:
        notes.append(text)


def _print(cells: list[Cell], notes: list[str], args: argparse.Namespace) -> None:
    print()
    print(
        f"engines: {args.slices} slices per cell, host numpy in and out, {args.threads} CPU "
        "threads; synthetic slices shaped as each model's input"
    )
    header = ("model", "engine", "batch", "slices/s", "ms/batch p50", "p95")
    print("{:<11} {:<34} {:>5} {:>9} {:>12} {:>8}".format(*header))
    for c in cells:
        print(
            f"{c.model:<11} {c.engine:<34} {c.batch:>5} {c.slices_per_s:>9,.0f} "
            f"{c.latency_ms_p50:>12.1f} {c.latency_ms_p95:>8.1f}"
        )
    for note in notes:
        print(f"note: {note}")


def headline(cells: list[Cell]) -> str:
    """Per model: the best engine's slices/s, and against PyTorch eager's best."""
    parts = []
    for model in dict.fromkeys(c.model for c in cells):
        mine = [c for c in cells if c.model == model and not c.engine.startswith(TORCH)]
        peer = [c for c in cells if c.model == model and c.engine.startswith(TORCH)]
        best = max(mine, key=lambda c: c.slices_per_s)
        text = f"{model} {best.slices_per_s:,.0f} slices/s ({best.engine}, batch {best.batch})"
        if peer:
            top = max(peer, key=lambda c: c.slices_per_s)
            text += f" = {best.slices_per_s / top.slices_per_s:.2f}x {TORCH}"
        else:
            text += f", no {TORCH} peer"
        parts.append(text)
    return "headline: " + "; ".join(parts)
