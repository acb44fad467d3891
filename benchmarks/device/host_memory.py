#!/usr/bin/env python3
"""Where a worker's batch time goes: host memory kinds against a GPU, and the engine fed from each.

Run on the GPU machine from the repository root, with onnxruntime-gpu on PYTHONPATH:

    python3 benchmarks/device/host_memory.py [--slices PATH.npz]

(a) 32 MiB copies host->device and device->host (cuda-python, one stream, median of 5) from
    memory of each kind: cudaMallocHost; pageable numpy; shared memory (/dev/shm, as the
    arenas) page-locked with cudaHostRegister (flags 0 and 3) or not; anonymous memory
    page-locked; and what cudaPointerGetAttributes calls each. Also a host memcpy of 32 MiB.
(b) The daemon's engine (`make_backend` options, max batch 64) for each shipped model at batch
    64, fed like a worker: from page-locked host buffers, from a registered arena, from an
    unregistered arena, and staged (arena -> page-locked buffer -> GPU); each time split into
    copy in, run, copy out.
(c) With --slices (preprocessed phantom slices, float16 .npz from the repository's own
    preprocessing): the daemon's GPU engines against ONNX Runtime on the CPU on real-looking
    slices: max |diff| of the probabilities and arg-max agreement.
A table is printed last; $OUT/device_copy_check.json has the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from imaging_ai.arena import SliceArena  # noqa: E402
from imaging_ai.infer.cuda_mem import CudaRuntime  # noqa: E402
from imaging_ai.infer.ort import OrtBackend, OrtOptions  # noqa: E402
from imaging_ai.infer.select import make_backend  # noqa: E402
from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402

Row = dict[str, Any]
MIB = 1 << 20


def median_s(fn: Callable[[], Any], repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(statistics.median(times))


def host_kinds(cuda: CudaRuntime, n: int, keep: list[Any]) -> dict[str, np.ndarray]:
    """32 MiB host arrays of each kind (touched), registered as named."""
    kinds: dict[str, np.ndarray] = {}
    pinned = cuda.alloc_pinned(n)
    keep.append(pinned)
    kinds["cudaMallocHost"] = pinned.array(np.uint8, (n,))
    kinds["pageable numpy"] = np.ones(n, np.uint8)
    for name, flags in (("shm registered (0)", 0), ("shm registered (3)", 3), ("shm plain", None)):
        shm = SharedMemory(create=True, size=n)
        keep.append(shm)
        array = np.ndarray((n,), np.uint8, shm.buf)
        array[...] = 1
        if flags is not None:
            cuda.call("cudaHostRegister", cuda.rt.cudaHostRegister(array.ctypes.data, n, flags))
        kinds[name] = array
    anon = np.ones(n, np.uint8)
    cuda.host_register(anon.ctypes.data, n)
    kinds["anonymous registered"] = anon
    return kinds


def copy_rows(cuda: CudaRuntime) -> list[Row]:
    n = 32 * MIB
    keep: list[Any] = []
    stream = cuda.create_stream()
    device = cuda.alloc_device(n)
    rows = []
    try:
        for name, array in host_kinds(cuda, n, keep).items():
            try:
                rows.append(copy_row(cuda, name, array, device.ptr, stream))
            except Exception as exc:  # say so and go on with the other kinds
                rows.append({"what": f"copy {name}", "note": f"FAILED {exc}"})
        src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)
        memcpy = n / median_s(lambda: np.copyto(dst, src)) / 1e9
        rows.append({"what": "host memcpy 32 MiB (GB/s)", "h2d_GBps": memcpy})
    finally:
        for item in keep:
            if isinstance(item, SharedMemory):
                item.close()
                item.unlink()
    return rows


def copy_row(cuda: CudaRuntime, name: str, array: np.ndarray, device: int, stream: Any) -> Row:
    """H2D and D2H GB/s of one host array against a device buffer, and its pointer type."""
    n, ptr = array.nbytes, array.ctypes.data

    def h2d() -> None:
        cuda.copy_async(device, ptr, n, True, stream)
        stream.synchronize()

    def d2h() -> None:
        cuda.copy_async(ptr, device, n, False, stream)
        stream.synchronize()

    err, attrs = cuda.rt.cudaPointerGetAttributes(ptr)
    ok = err == cuda.rt.cudaError_t.cudaSuccess
    kind = str(getattr(attrs, "type", "?")) if ok else str(err)
    h2d_gbps, d2h_gbps = n / median_s(h2d) / 1e9, n / median_s(d2h) / 1e9
    return {"what": f"copy {name}", "h2d_GBps": h2d_gbps, "d2h_GBps": d2h_gbps, "note": kind}


def daemon_backend(max_batch: int) -> OrtBackend:
    """The ONNX Runtime CUDA backend as a worker makes it."""
    options = OrtOptions(precision="fp16", max_batch_size=max_batch)
    backend = make_backend("onnxruntime-cuda", Path("/tmp"), ort_gpu=options)
    assert isinstance(backend, OrtBackend)
    return backend


class Timed:
    """Wraps an engine's PieceCopier to time copy in, run and copy out."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.copier = engine, engine._copier
        self.t = {"in": 0.0, "run": 0.0, "out": 0.0}
        to_device, to_host = self.copier.to_device, self.copier.to_host

        def timed_in(*a: Any) -> None:
            t = time.perf_counter()
            to_device(*a)
            self.t["in"] += time.perf_counter() - t

        def timed_out(*a: Any) -> None:
            t = time.perf_counter()
            to_host(*a)
            self.t["out"] += time.perf_counter() - t

        self.copier.to_device, self.copier.to_host = timed_in, timed_out


def engine_rows(cuda: CudaRuntime, card: ModelCard, batch: int) -> list[Row]:
    backend = daemon_backend(batch)
    engine: Any = backend.load(card)
    out_dims = engine._out_dims
    timed = Timed(engine)
    x_shape, y_shape = (batch, *card.input_shape), (batch, *out_dims)
    pinned = [cuda.alloc_pinned(4 * int(np.prod(s))) for s in (x_shape, y_shape)]
    hx, hy = pinned[0].array(np.float32, x_shape), pinned[1].array(np.float32, y_shape)
    hx[...] = np.random.default_rng(0).random(x_shape, dtype=np.float32)
    arenas = []
    for register in (True, False):
        arena = SliceArena.create(4 * batch, card.input_shape, out_dims)
        arena.inputs[...] = 0.5
        arena.outputs[...] = 0.0
        if register:
            for view in (arena.inputs, arena.outputs):
                cuda.host_register(view.ctypes.data, view.nbytes)
        arenas.append(arena)
    # a batch in two runs of slots, as a worker usually gets it
    cut = batch // 3

    def feed(arena: SliceArena) -> Callable[[], None]:
        xs = [arena.inputs[0:cut], arena.inputs[2 * batch : 3 * batch - cut]]
        ys = [arena.outputs[0:cut], arena.outputs[2 * batch : 3 * batch - cut]]
        return lambda: engine.infer_into(xs, ys)

    def staged() -> None:
        arena = arenas[0]
        hx[:cut] = arena.inputs[0:cut]
        hx[cut:] = arena.inputs[2 * batch : 3 * batch - cut]
        engine.infer_into([hx], [hy])
        arena.outputs[0:cut] = hy[:cut]
        arena.outputs[2 * batch : 3 * batch - cut] = hy[cut:]

    ways = {
        "page-locked host": lambda: engine.infer_into([hx], [hy]),
        "registered arena": feed(arenas[0]),
        "unregistered arena": feed(arenas[1]),
        "staged via page-locked": staged,
    }
    rows = []
    for name, fn in ways.items():
        fn()
        timed.t = dict.fromkeys(timed.t, 0.0)
        reps, t0 = 10, time.perf_counter()
        for _ in range(reps):
            fn()
        total = (time.perf_counter() - t0) / reps
        split = {k: v / reps * 1e3 for k, v in timed.t.items()}
        rows.append(
            {
                "what": f"{card.name} b{batch} {name}",
                "ms": total * 1e3,
                "slices_per_s": batch / total,
                "note": f"in {split['in']:.2f} ms, out {split['out']:.2f} ms",
            }
        )
    for view in (arenas[0].inputs, arenas[0].outputs):
        cuda.host_unregister(view.ctypes.data)
    for arena in arenas:
        arena.close()
    for buffer in pinned:
        buffer.close()
    engine.close()
    return rows


def accuracy_rows(path: Path) -> list[Row]:
    """The daemon's GPU engines against ONNX Runtime on the CPU, on preprocessed phantom slices."""
    data = np.load(path)
    lung = load_model_card(ROOT / "engines" / "lung-seg")
    nodule = load_model_card(ROOT / "engines" / "nodule-det")
    plan = [("lung160", lung, None), ("nodule256", nodule, None), ("lung512", lung, 512)]
    rows = []
    for key, card, size in plan:
        x = np.ascontiguousarray(data[key].astype(np.float32))
        onnx_path = card.onnx_path
        if size:
            sys.path.insert(0, str(ROOT / "benchmarks" / "device"))
            from engine_variants import card_at, onnx_at_size

            onnx_path = Path("/tmp") / f"{card.name}-{size}.onnx"
            onnx_at_size(card.onnx_path, size, onnx_path)
            card = card_at(card, size)
        ref = OrtBackend(OrtOptions(max_batch_size=8)).load(card, onnx_path).infer(x)
        daemon = daemon_backend(8).options
        fp32 = replace(daemon, precision="fp32", prefer_nhwc=False)
        for name, options in (("daemon fp16", daemon), ("fp32 (tf32)", fp32)):
            out = OrtBackend(options).load(card, onnx_path).infer(x)
            diff = float(np.max(np.abs(out - ref)))
            if out.shape[1] > 1:
                agree = float(np.mean(out.argmax(1) == ref.argmax(1)))
            else:
                agree = float(np.mean((out > 0.5) == (ref > 0.5)))
            rows.append({"what": f"phantom {key} {name}", "max_abs_diff": diff, "agree": agree})
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'what':<46} {'H2D/ms':>9} {'D2H/sl/s':>9} {'diff':>8}  note"]
    for r in rows:
        a = " " * 9
        if "h2d_GBps" in r or "ms" in r:
            a = f"{r.get('h2d_GBps', r.get('ms')):9.2f}"
        b = " " * 9
        if "d2h_GBps" in r or "slices_per_s" in r:
            b = f"{r.get('d2h_GBps', r.get('slices_per_s')):9.1f}"
        c = f"{r['max_abs_diff']:8.1e}" if "max_abs_diff" in r else " " * 8
        note = r.get("note", "") or (f"agree {r['agree']:.5f}" if "agree" in r else "")
        lines.append(f"{r['what'][:46]:<46} {a} {b} {c}  {note}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--slices", type=Path)
    args = parser.parse_args()
    cuda = CudaRuntime()
    rows: list[Row] = []
    steps: list[Callable[[], list[Row]]] = [lambda: copy_rows(cuda)]
    for name in ("lung-seg", "nodule-det"):
        card = load_model_card(ROOT / "engines" / name)
        steps.append(lambda card=card: engine_rows(cuda, card, 64))
    if args.slices:
        steps.append(lambda: accuracy_rows(args.slices))
    for step in steps:
        try:
            rows += step()
        except Exception as exc:  # one failing step must not lose the others
            rows.append({"what": "FAILED", "note": f"{type(exc).__name__}: {exc}"})
        print(table(rows[-8:]), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "device_copy_check.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
