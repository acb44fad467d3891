#!/usr/bin/env python3
"""GPU check of imaging_ai.infer: real cuda_mem copies, ORT CUDA variants vs CPU, a torch baseline.

Run on the GPU machine from the repository root (imports only numpy, onnx, onnxruntime, torch,
cuda-python and the pydicom-free imaging_ai.infer modules):

    python3 benchmarks/device/engine_check.py                      # a generated 2-D U-Net, 512x512
    python3 benchmarks/device/engine_check.py --onnx engines/lung-seg/model.onnx --batches 1 8 32
    PYTHONPATH=/tmp/site python3 benchmarks/device/engine_check.py   # with onnxruntime-gpu carried

(a) cuda_mem: pinned and device buffers, H2D/D2H on a non-default stream, round-trip equality,
    and an impossible allocation reported as EngineError. (b) With onnxruntime-gpu: the model on
    the CPU provider as reference, then CUDA FP32 / FP16 / FP16+NHWC / +CUDA graphs / FP32+graphs
    through OrtBackend, slices/s per batch size and max |diff| against the CPU. (c) With torch
    and a GPU: PyTorch eager FP32 (and FP16 channels-last) on the same generated U-Net, with the
    same weights; with --onnx, on a generic U-Net of the same input size (labelled so).
Throughput is end to end from host numpy to host numpy, as the daemon runs it. A short table is
printed last; details go to $OUT/device_engine_check.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import FloatArray, sample_batch
from imaging_ai.infer.cuda_mem import CudaRuntime
from imaging_ai.infer.ort import OrtBackend, OrtOptions, available_providers, ort_errors
from imaging_ai.modelcard import (
    InputSpec,
    ModelCard,
    OutputSpec,
    Provenance,
    file_sha256,
    onnx_io_shapes,
)
from imaging_ai.preprocess import PreprocessSpec

Row = dict[str, Any]
Weights = dict[str, FloatArray]


# --- a generic 2-D U-Net, emitted both as ONNX and as PyTorch with the same weights ----------


def unet_weights(width: int, depth: int, classes: int, seed: int = 0) -> Weights:
    """He-initialised weights: encoder convs, transposed-conv upsampling, decoder, 1x1 head."""
    rng = np.random.default_rng(seed)
    chans = [width * 2**i for i in range(depth)]
    w: Weights = {}

    def add(name: str, shape: tuple[int, ...], fan_in: int) -> None:
        w[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        out_channels = shape[1] if name.startswith("up") else shape[0]
        w[name + ".b"] = (0.01 * rng.standard_normal(out_channels)).astype(np.float32)

    for i, c in enumerate(chans):
        cin = 1 if i == 0 else chans[i - 1]
        add(f"enc{i}a", (c, cin, 3, 3), cin * 9)
        add(f"enc{i}b", (c, c, 3, 3), c * 9)
    for i in reversed(range(depth - 1)):
        add(f"up{i}", (chans[i + 1], chans[i], 2, 2), chans[i + 1] * 4)
        add(f"dec{i}a", (chans[i], 2 * chans[i], 3, 3), 2 * chans[i] * 9)
        add(f"dec{i}b", (chans[i], chans[i], 3, 3), chans[i] * 9)
    add("head", (classes, chans[0], 1, 1), chans[0])
    return w


def unet_onnx(w: Weights, depth: int, size: int, path: Path) -> None:
    """Write the U-Net as ONNX (opset 17) with a dynamic batch axis named "batch"."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []

    def op(kind: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def conv_relu(x: str, name: str) -> str:
        y = op("Conv", [x, name, name + ".b"], name + ".y", pads=[1, 1, 1, 1])
        return op("Relu", [y], name + ".r")

    x, skips = "image", []
    for i in range(depth):
        x = conv_relu(conv_relu(x, f"enc{i}a"), f"enc{i}b")
        if i < depth - 1:
            skips.append(x)
            x = op("MaxPool", [x], f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
    for i in reversed(range(depth - 1)):
        x = op("ConvTranspose", [x, f"up{i}", f"up{i}.b"], f"up{i}.y", strides=[2, 2])
        x = op("Concat", [x, skips[i]], f"cat{i}", axis=1)
        x = conv_relu(conv_relu(x, f"dec{i}a"), f"dec{i}b")
    x = op("Conv", [x, "head", "head.b"], "logits")
    op("Softmax", [x], "probabilities", axis=1)
    classes = w["head"].shape[0]
    io = [
        helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, size, size]),
        helper.make_tensor_value_info(
            "probabilities", TensorProto.FLOAT, ["batch", classes, size, size]
        ),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    model = helper.make_model(
        helper.make_graph(nodes, "unet", io[:1], io[1:], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def unet_torch(w: Weights, depth: int, device: str, half: bool = False) -> Callable[[Any], Any]:
    """The same U-Net as a PyTorch function over the same weights (eager mode)."""
    import torch
    import torch.nn.functional as F

    dtype = torch.float16 if half else torch.float32
    t = {k: torch.from_numpy(v).to(device=device, dtype=dtype) for k, v in w.items()}
    if half:  # channels-last weights too, or cuDNN converts them on every call
        t = {
            k: v.to(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in t.items()
        }

    def conv_relu(x: Any, name: str) -> Any:
        return F.relu(F.conv2d(x, t[name], t[name + ".b"], padding=1))

    def forward(x: Any) -> Any:
        skips = []
        for i in range(depth):
            x = conv_relu(conv_relu(x, f"enc{i}a"), f"enc{i}b")
            if i < depth - 1:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for i in reversed(range(depth - 1)):
            x = F.conv_transpose2d(x, t[f"up{i}"], t[f"up{i}.b"], stride=2)
            x = conv_relu(conv_relu(torch.cat([x, skips[i]], 1), f"dec{i}a"), f"dec{i}b")
        return torch.softmax(F.conv2d(x, t["head"], t["head.b"]), dim=1)

    return forward


# --- measurement helpers -----------------------------------------------------------------------


def slices_per_second(run: Callable[[FloatArray], Any], batch: FloatArray, min_s: float) -> float:
    """Warm up, then run `batch` repeatedly for at least `min_s` seconds (and 3 runs)."""
    for _ in range(2):
        run(batch)
    runs, started = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - started < min_s:
        run(batch)
        runs += 1
    return float(batch.shape[0] * runs / (time.perf_counter() - started))


def card_for(onnx_path: Path, size: int | None) -> ModelCard:
    """A minimal in-memory card for an ONNX file with one 4-D input and one output."""
    inputs, outputs = onnx_io_shapes(onnx_path)
    (in_name, dims), (out_name, out_dims) = next(iter(inputs.items())), next(iter(outputs.items()))
    h = dims[2] if isinstance(dims[2], int) else size
    w = dims[3] if isinstance(dims[3], int) else size
    if h is None or w is None or not isinstance(dims[1], int) or not isinstance(out_dims[1], int):
        raise SystemExit(f"{onnx_path}: give --size; input {dims}, output {out_dims}")
    return ModelCard(
        name="device-check", version="0", task="segmentation", description="device check",
        input=InputSpec(in_name, dims[1], h, w),
        preprocess=PreprocessSpec(0.0, 1.0, "zscore", "none", 0.0, (h, w)),
        output=OutputSpec(out_name, "logits", out_dims[1]), labels=(),
        quality=MappingProxyType({}), provenance=Provenance("n/a"), folder=onnx_path.parent,
        sha256=file_sha256(onnx_path),
    )  # fmt: skip


# --- (a) cuda_mem --------------------------------------------------------------------------------


def check_cuda_mem(sizes_mib: list[int]) -> list[Row]:
    """Round trips through pinned and device buffers on a non-default stream, with GB/s."""
    cuda = CudaRuntime()
    gpu = cuda.device_info(0)
    rows: list[Row] = [{"variant": "gpu", "note": f"{gpu.name} cc {gpu.compute_capability}"}]
    stream = cuda.create_stream()
    for mib in sizes_mib:
        n = mib << 20
        src, dst, dev = cuda.alloc_pinned(n), cuda.alloc_pinned(n), cuda.alloc_device(n)
        data = np.random.default_rng(mib).integers(0, 256, n, dtype=np.uint8)
        src.array(np.uint8, (n,))[...] = data
        dst.array(np.uint8, (n,))[...] = 0
        t0 = time.perf_counter()
        cuda.copy_to_device(dev, src, n, stream)
        stream.synchronize()
        t1 = time.perf_counter()
        cuda.copy_to_host(dst, dev, n, stream)
        stream.synchronize()
        t2 = time.perf_counter()
        equal = bool(np.array_equal(dst.array(np.uint8, (n,)), data))
        note = "equal" if equal else "MISMATCH"
        h2d, d2h = n / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9
        rows.append(
            {"variant": f"cuda_mem {mib} MiB", "h2d_GBps": h2d, "d2h_GBps": d2h, "note": note}
        )
        for buf in (src, dst, dev):
            buf.close()
    stream.close()
    try:
        cuda.alloc_device(1 << 50)
        rows.append({"variant": "cuda_mem 1 PiB alloc", "note": "UNEXPECTEDLY SUCCEEDED"})
    except EngineError as exc:
        rows.append({"variant": "cuda_mem 1 PiB alloc", "note": f"EngineError: {exc}"})
    return rows


# --- (b) ONNX Runtime CUDA variants --------------------------------------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    "ort-cuda fp32": {},
    "ort-cuda fp16": {"precision": "fp16"},
    "ort-cuda fp16 nhwc": {"precision": "fp16", "prefer_nhwc": True},
    "ort-cuda fp16 nhwc graph": {"precision": "fp16", "prefer_nhwc": True, "cuda_graph": True},
    "ort-cuda fp32 graph": {"cuda_graph": True},
}


def check_ort(
    card: ModelCard, onnx_path: Path, batches: list[int], min_s: float
) -> tuple[list[Row], FloatArray, FloatArray]:
    """CPU reference and throughput, then every CUDA variant: load time, diff, slices/s."""
    import onnxruntime as ort

    errors: tuple[type[BaseException], ...] = (EngineError, *ort_errors(ort))
    ref_in = sample_batch(card, 4, seed=7)
    cpu = OrtBackend(OrtOptions(max_batch_size=max(batches))).load(card, onnx_path)
    ref_out = cpu.infer(ref_in)
    cpu_speed = slices_per_second(cpu.infer, sample_batch(card, batches[0]), min_s)
    rows: list[Row] = [{"variant": "ort-cpu fp32", "batch": batches[0], "slices_per_s": cpu_speed}]
    cpu.close()
    if "CUDAExecutionProvider" not in available_providers(ort):
        rows.append({"variant": "ort-cuda", "note": "skipped: onnxruntime has no CUDA provider"})
        return rows, ref_in, ref_out
    for name, extra in VARIANTS.items():
        options = OrtOptions(provider="cuda", max_batch_size=max(batches), **extra)
        try:
            started = time.perf_counter()
            engine = OrtBackend(options).load(card, onnx_path)
            load_s = time.perf_counter() - started
            diff = float(np.max(np.abs(engine.infer(ref_in) - ref_out)))
            for b in batches:
                speed = slices_per_second(engine.infer, sample_batch(card, b), min_s)
                row = {"variant": name, "batch": b, "slices_per_s": speed, "max_abs_diff": diff}
                rows.append(row | {"load_s": load_s})
            engine.close()
        except errors as exc:
            rows.append({"variant": name, "note": f"FAILED: {type(exc).__name__}: {exc}"})
    return rows, ref_in, ref_out


# --- (c) PyTorch eager baseline ------------------------------------------------------------------


def check_torch(
    w: Weights,
    depth: int,
    same_net: bool,
    ref: tuple[FloatArray, FloatArray],
    batches: list[int],
    min_s: float,
) -> list[Row]:
    """Eager FP32 and FP16 channels-last of the U-Net, host numpy in and out like the engines."""
    try:
        import torch
    except ImportError:
        return [{"variant": "torch", "note": "skipped: torch is not installed"}]
    if not torch.cuda.is_available():
        return [{"variant": "torch", "note": "skipped: torch sees no GPU"}]
    torch.backends.cudnn.benchmark = True
    label = "" if same_net else " (generic U-Net, not the given model)"
    rows: list[Row] = []
    for name, half in (("torch eager fp32", False), ("torch eager fp16 channels-last", True)):
        net = unet_torch(w, depth, "cuda", half)

        def run(batch: FloatArray, net: Any = net, half: bool = half) -> FloatArray:
            with torch.inference_mode():
                x = torch.from_numpy(batch).cuda()
                x = x.half().to(memory_format=torch.channels_last) if half else x
                return np.asarray(net(x).float().cpu().numpy())

        diff = float(np.max(np.abs(run(ref[0]) - ref[1]))) if same_net else float("nan")
        for b in batches:
            shape = (b, 1, *ref[0].shape[2:])
            batch = np.random.default_rng(b).standard_normal(shape, dtype=np.float32)
            speed = slices_per_second(run, batch, min_s)
            rows.append(
                {"variant": name + label, "batch": b, "max_abs_diff": diff, "slices_per_s": speed}
            )
    return rows


# --- main -----------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    """The short table printed last."""
    lines = [f"{'variant':<44} {'batch':>5} {'slices/s':>9} {'max|diff|':>10}  note"]
    for r in rows:
        speed = f"{r['slices_per_s']:9.1f}" if "slices_per_s" in r else " " * 9
        diff = f"{r['max_abs_diff']:10.2e}" if "max_abs_diff" in r else " " * 10
        note = r.get("note", "")
        if "h2d_GBps" in r:
            note = f"H2D {r['h2d_GBps']:.1f} GB/s, D2H {r['d2h_GBps']:.1f} GB/s, {note}"
        lines.append(f"{r['variant'][:44]:<44} {r.get('batch', ''):>5} {speed} {diff}  {note}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--onnx", type=Path, help="model to check (default: a generated U-Net)")
    parser.add_argument("--size", type=int, default=512, help="slice size of the generated U-Net")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--copy-mib", type=int, nargs="+", default=[1, 64, 256])
    args = parser.parse_args()
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    work = out_dir or Path("/tmp")
    weights = unet_weights(args.width, args.depth, args.classes)
    onnx_path = args.onnx
    if onnx_path is None:
        onnx_path = work / "device_check_unet.onnx"
        unet_onnx(weights, args.depth, args.size, onnx_path)
    card = card_for(onnx_path, args.size)
    params = sum(v.size for v in weights.values())
    print(f"model {onnx_path} input {card.input_shape}; U-Net params {params:,}", flush=True)
    try:
        rows = check_cuda_mem(args.copy_mib)
    except EngineError as exc:  # no cuda-python or no GPU: say so and carry on with the rest
        rows = [{"variant": "cuda_mem", "note": f"skipped: {exc}"}]
    ort_rows, ref_in, ref_out = check_ort(card, onnx_path, sorted(args.batches), args.min_seconds)
    rows += ort_rows
    same_net = args.onnx is None
    ref = (ref_in, ref_out)
    rows += check_torch(weights, args.depth, same_net, ref, sorted(args.batches), args.min_seconds)
    if out_dir is not None:
        details = {"model": str(onnx_path), "input": card.input_shape, "rows": rows}
        (out_dir / "device_engine_check.json").write_text(json.dumps(details, indent=2))
        if onnx_path.parent == out_dir:
            onnx_path.unlink()  # keep $OUT small; the script regenerates it
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
