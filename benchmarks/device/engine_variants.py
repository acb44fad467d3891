#!/usr/bin/env python3
"""The shipped models on one GPU: PyTorch eager FP32 against the daemon's ONNX Runtime engines.

Run on the GPU machine from the repository root, with onnxruntime-gpu on PYTHONPATH:

    python3 benchmarks/device/engine_variants.py

Models: lung-seg as shipped (160x160), the same network and weights at 512x512 (the ONNX
graph with its spatial sizes changed: the U-Net has only convolutions, pooling and
concatenation, so nothing else depends on them), and nodule-det as shipped (256x256).

Variants, each timed host to host as a worker runs it (slices/s, median of three windows):
- PyTorch eager FP32: the ONNX graph run node by node with `torch.nn.functional` calls on the
  ONNX weights (`TorchFromOnnx`), `torch.from_numpy(x).cuda()` in, `.cpu().numpy()` out, cuDNN
  autotuning on. This is the baseline users would otherwise run.
- ONNX Runtime CUDA through `OrtBackend`: `session.run` on numpy (what the daemon ran before);
  IO binding with the batch copied from page-locked host memory straight into the bound
  device input and the outputs straight back into page-locked host memory (`infer_into`, what
  a worker does with its shared slots) in FP32, FP16, FP16+NHWC (the daemon's default, made by
  `make_backend`), and FP16+NHWC with CUDA graphs.
"device" columns time the same engines with the data already on the GPU (no copies).
Outputs are checked against ONNX Runtime on the CPU on 5 fresh slices (so a padded batch of 8),
into outputs poisoned with NaN: max |diff| of the probabilities and the share of pixels whose
arg-max class agrees. A short table is printed last; $OUT/device_lungseg_bench.json has it all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from imaging_ai.infer.base import FloatArray, sample_batch  # noqa: E402
from imaging_ai.infer.cuda_mem import CudaRuntime, PinnedBuffer  # noqa: E402
from imaging_ai.infer.ort import OrtBackend, OrtOptions, gpu_tuned  # noqa: E402
from imaging_ai.infer.select import make_backend  # noqa: E402
from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402

Row = dict[str, Any]
TOLERANCE = 0.02  # max |difference| of a probability against the CPU, the stated tolerance


# --- PyTorch eager from the ONNX graph ----------------------------------------------------------


class TorchFromOnnx:
    """An ONNX graph of the shipped U-Nets run node by node as PyTorch eager calls."""

    def __init__(self, path: Path, device: str = "cuda") -> None:
        import onnx
        import torch
        from onnx import numpy_helper

        graph = onnx.load(str(path)).graph
        self.torch, self.f = torch, torch.nn.functional
        self.weights = {
            t.name: torch.from_numpy(np.array(numpy_helper.to_array(t))).to(device)
            for t in graph.initializer
        }
        self.input, self.output = graph.input[0].name, graph.output[0].name
        attrs = onnx.helper.get_attribute_value
        self.nodes = [
            (n.op_type, list(n.input), n.output[0], {a.name: attrs(a) for a in n.attribute})
            for n in graph.node
        ]
        for op, _, out, k in self.nodes:
            if op == "Constant":
                value = np.array(numpy_helper.to_array(k["value"]))
                self.weights[out] = torch.from_numpy(value).to(device)

    def __call__(self, x: Any) -> Any:
        values = dict(self.weights)
        values[self.input] = x
        for op, inputs, out, attrs in self.nodes:
            if op != "Constant":
                values[out] = self._op(op, [values[i] if i else None for i in inputs], attrs)
        return values[self.output]

    def _op(self, op: str, a: list[Any], k: dict[str, Any]) -> Any:
        t, f = self.torch, self.f
        pad = int(next(iter(k.get("pads", [0]))))
        if op in ("Conv", "ConvTranspose"):
            fn = f.conv2d if op == "Conv" else f.conv_transpose2d
            stride = tuple(k.get("strides", (1, 1)))
            return fn(a[0], a[1], a[2] if len(a) > 2 else None, stride=stride, padding=pad)
        if op in ("MaxPool", "AveragePool"):
            fn = f.max_pool2d if op == "MaxPool" else f.avg_pool2d
            kernel = tuple(k["kernel_shape"])
            return fn(a[0], kernel, stride=tuple(k.get("strides", kernel)), padding=pad)
        simple: dict[str, Callable[[], Any]] = {
            "Relu": lambda: t.relu(a[0]),
            "Sigmoid": lambda: t.sigmoid(a[0]),
            "Softmax": lambda: t.softmax(a[0], dim=int(k.get("axis", -1))),
            "Concat": lambda: t.cat(a, dim=int(k["axis"])),
            "Add": lambda: a[0] + a[1],
            "Sub": lambda: a[0] - a[1],
            "Mul": lambda: a[0] * a[1],
            "Resize": lambda: f.interpolate(
                a[0], scale_factor=tuple(a[2].tolist()[2:]), mode="nearest"
            ),
            "Slice": lambda: self._slice(a),
        }
        if op not in simple:
            raise ValueError(f"operator {op} is not supported here")
        return simple[op]()

    @staticmethod
    def _slice(a: list[Any]) -> Any:
        starts, ends = a[1].tolist(), a[2].tolist()
        axes = a[3].tolist() if len(a) > 3 and a[3] is not None else list(range(len(starts)))
        index = [slice(None)] * a[0].dim()
        for axis, start, end in zip(axes, starts, ends, strict=True):
            index[axis] = slice(start, min(end, a[0].shape[axis]))
        return a[0][tuple(index)]


def onnx_at_size(src: Path, size: int, dst: Path) -> None:
    """The same graph and weights with input and output height/width set to `size`."""
    import onnx

    model = onnx.load(str(src))
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        dims[2].dim_value = dims[3].dim_value = size
    del model.graph.value_info[:]
    onnx.save(model, str(dst))


# --- measurement --------------------------------------------------------------------------------


def rate(run: Callable[[int], Any], n: int, min_s: float) -> float:
    """Slices/s of `run(n)`: warm up, then the median of three windows of >= min_s/3 each."""
    for _ in range(3):
        run(n)
    rates = []
    for _ in range(3):
        runs, started = 0, time.perf_counter()
        while runs < 2 or time.perf_counter() - started < min_s / 3:
            run(n)
            runs += 1
        rates.append(n * runs / (time.perf_counter() - started))
    return float(statistics.median(rates))


def agreement(out: FloatArray, ref: FloatArray) -> dict[str, Any]:
    """max/mean |diff|, arg-max agreement, and whether every output element was written."""
    finite = bool(np.isfinite(out).all())
    diff = np.abs(out - ref)
    agree = float(np.mean(out.argmax(1) == ref.argmax(1))) if out.shape[1] > 1 else float("nan")
    if out.shape[1] == 1:  # a heat map: agreement of the 0.5 threshold
        agree = float(np.mean((out > 0.5) == (ref > 0.5)))
    return {
        "written": finite,
        "max_abs_diff": float(np.nanmax(diff)) if finite else float("inf"),
        "mean_abs_diff": float(np.nanmean(diff)),
        "agree": agree,
    }


class Host:
    """Page-locked host buffers (cudaMallocHost; numpy without a GPU) for a batch's I/O."""

    def __init__(
        self, cuda: CudaRuntime | None, card: ModelCard, out_dims: tuple[int, ...], n: int
    ) -> None:
        self.buffers: list[PinnedBuffer] = []
        self.x = self._array(cuda, (n, *card.input_shape))
        self.y = self._array(cuda, (n, *out_dims))
        self.x[...] = sample_batch(card, n, seed=11)

    def _array(self, cuda: CudaRuntime | None, shape: tuple[int, ...]) -> FloatArray:
        if cuda is None:
            return np.empty(shape, np.float32)
        buffer = cuda.alloc_pinned(4 * int(np.prod(shape)))
        self.buffers.append(buffer)
        array: FloatArray = buffer.array(np.float32, shape)
        return array

    def close(self) -> None:
        for buffer in self.buffers:
            buffer.close()


def torch_rows(
    path: Path,
    card: ModelCard,
    ref: tuple[FloatArray, FloatArray],
    batches: list[int],
    min_s: float,
    device: str,
) -> list[Row]:
    """PyTorch eager FP32, host to host and on the device."""
    import torch

    torch.backends.cudnn.benchmark = True
    net = TorchFromOnnx(path, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def host(x: FloatArray) -> FloatArray:
        with torch.inference_mode():
            return np.asarray(net(torch.from_numpy(x).to(device)).float().cpu().numpy())

    check = agreement(host(ref[0]), ref[1])
    rows = []
    for b in batches:
        x = sample_batch(card, b, seed=b)
        xd = torch.from_numpy(x).to(device)

        def resident(n: int, xd: Any = xd) -> None:
            with torch.inference_mode():
                net(xd)
            sync()

        e2e, on_device = rate(lambda n, x=x: host(x), b, min_s), rate(resident, b, min_s)
        row = {"variant": "torch eager fp32", "batch": b, "e2e": e2e, "device": on_device}
        rows.append(row | check)
        print(f"{card.name} torch eager fp32 batch {b}: {e2e:.0f} slices/s", flush=True)
        del xd
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def ort_variants(card: ModelCard, max_batch: int, dry: bool) -> list[tuple[str, OrtOptions]]:
    if dry:  # the same plumbing on ONNX Runtime's CPU provider
        cpu = OrtOptions(max_batch_size=max_batch)
        return [("ort cpu session.run", cpu), ("ort cpu bound", replace(cpu, io_binding=True))]
    base = OrtOptions(provider="cuda", max_batch_size=max_batch)
    fp16 = replace(base, precision="fp16")
    daemon = make_backend("onnxruntime-cuda", Path("/tmp"), ort_gpu=fp16)
    assert isinstance(daemon, OrtBackend)
    return [
        ("ort session.run fp16 nhwc", replace(fp16, prefer_nhwc=True)),
        ("ort bound fp32", gpu_tuned(base)),
        ("ort bound fp16", replace(gpu_tuned(fp16), prefer_nhwc=False)),
        ("ort bound fp16 nhwc [daemon]", daemon.options),
        ("ort bound fp16 nhwc graphs", replace(daemon.options, cuda_graph=True)),
    ]


def ort_rows(
    path: Path,
    card: ModelCard,
    ref: tuple[FloatArray, FloatArray],
    batches: list[int],
    min_s: float,
    only: set[str] | None,
    cuda: CudaRuntime | None,
) -> list[Row]:
    """Every ONNX Runtime CUDA variant: load time, outputs against the CPU, slices/s."""
    rows: list[Row] = []
    for name, options in ort_variants(card, max(*batches, 8), cuda is None):
        if only is not None and name not in only:
            continue
        try:
            rows += ort_variant(cuda, name, options, path, card, ref, batches, min_s)
        except Exception as exc:  # one variant failing must not lose the others
            rows.append({"variant": name, "note": f"FAILED: {type(exc).__name__}: {exc}"})
            print(f"{card.name} {name}: FAILED {exc}", flush=True)
    return rows


def ort_variant(
    cuda: CudaRuntime | None,
    name: str,
    options: OrtOptions,
    path: Path,
    card: ModelCard,
    ref: tuple[FloatArray, FloatArray],
    batches: list[int],
    min_s: float,
) -> list[Row]:
    started = time.perf_counter()
    engine: Any = OrtBackend(options).load(card, path)
    load_s = time.perf_counter() - started
    bound = hasattr(engine, "infer_into")
    out = np.full((len(ref[0]), *ref[1].shape[1:]), np.nan, np.float32)
    if bound:
        engine.infer_into([ref[0]], [out])
    else:
        out = engine.infer(ref[0])
    check = agreement(out, ref[1])
    host = Host(cuda, card, ref[1].shape[1:], max(batches))
    rows = []
    try:
        for b in batches:
            if bound:
                e2e = rate(lambda n: engine.infer_into([host.x[:n]], [host.y[:n]]), b, min_s)
                device = rate(engine.run_on_device, b, min_s) if cuda else float("nan")
            else:
                x = sample_batch(card, b, seed=b)
                e2e, device = rate(lambda n, x=x: engine.infer(x), b, min_s), float("nan")
            row = {"variant": name, "batch": b, "e2e": e2e, "device": device, "load_s": load_s}
            rows.append(row | check)
            print(f"{card.name} {name} batch {b}: {e2e:.0f} slices/s", flush=True)
    finally:
        host.close()
        engine.close()
    return rows


def model_rows(
    label: str,
    path: Path,
    card: ModelCard,
    batches: list[int],
    args: Any,
    cuda: CudaRuntime | None,
) -> list[Row]:
    """Torch and ONNX Runtime rows of one model, checked against ONNX Runtime on the CPU."""
    cpu = OrtBackend(OrtOptions(max_batch_size=8)).load(card, path)
    x = np.random.default_rng(sum(map(ord, label))).random((5, *card.input_shape), np.float32)
    ref = (x, cpu.infer(x))
    cpu.close()
    only = None
    if label.startswith("nodule-det") and cuda is not None:
        only = {"ort bound fp16 nhwc [daemon]", "ort bound fp16 nhwc graphs"}
    device, min_s = ("cuda" if cuda else "cpu"), args.min_seconds
    rows = []
    if only is None and not args.no_torch:
        rows += torch_rows(path, card, ref, batches, min_s, device)
    rows += ort_rows(path, card, ref, batches, min_s, only, cuda)
    return [r | {"model": label} for r in rows]


def card_at(card: ModelCard, size: int) -> ModelCard:
    """The card of the same model at another slice size."""
    return replace(
        card,
        input=replace(card.input, height=size, width=size),
        preprocess=replace(card.preprocess, input_size=(size, size)),
    )


def table(rows: list[Row]) -> str:
    lines = [
        f"{'model':<15} {'variant':<30} {'batch':>5} {'e2e/s':>8} {'device/s':>9} "
        f"{'max|diff|':>9} {'agree':>7} note"
    ]
    for r in rows:
        e2e = f"{r['e2e']:8.0f}" if "e2e" in r else " " * 8
        dev = f"{r['device']:9.0f}" if "device" in r and r["device"] == r["device"] else " " * 9
        diff = f"{r['max_abs_diff']:9.1e}" if "max_abs_diff" in r else " " * 9
        agree = f"{r['agree']:7.4f}" if "agree" in r else " " * 7
        note = r.get("note", "") or ("" if r.get("written", True) else "UNWRITTEN OUTPUT")
        lines.append(
            f"{r['model']:<15} {r['variant'][:30]:<30} {r.get('batch', ''):>5} {e2e} {dev} "
            f"{diff} {agree} {note}"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """ONNX Runtime (the daemon's engine) against PyTorch eager FP32, per batch and best."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and "e2e" in r]
        torch = {r["batch"]: r["e2e"] for r in mine if r["variant"] == "torch eager fp32"}
        if not torch:
            continue
        for name in ("ort bound fp16 nhwc [daemon]", "ort bound fp16 nhwc graphs"):
            ort = {r["batch"]: r for r in mine if r["variant"] == name}
            if not ort:
                continue
            per = ", ".join(f"{b}: {ort[b]['e2e'] / t:.2f}x" for b, t in torch.items() if b in ort)
            best = max(r["e2e"] for r in ort.values()) / max(torch.values())
            ok = all(r["max_abs_diff"] <= TOLERANCE for r in ort.values())
            lines.append(
                f"{model}: {name} vs torch eager fp32 per batch {per}; best vs best {best:.2f}x; "
                f"outputs within {TOLERANCE}: {ok}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--min-seconds", type=float, default=0.45)
    parser.add_argument("--batches-160", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--batches-512", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--batches-256", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="CPU only, to check the script")
    args = parser.parse_args()
    import onnxruntime

    lung = load_model_card(ROOT / "engines" / "lung-seg")
    nodule = load_model_card(ROOT / "engines" / "nodule-det")
    cuda = None if args.dry_run else CudaRuntime()
    gpu = "cpu (dry run)" if cuda is None else cuda.device_info(0).name
    print(f"{gpu}; onnxruntime {onnxruntime.__version__} {onnxruntime.get_available_providers()}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        at_512 = Path(tmp) / "lung-seg-512.onnx"
        onnx_at_size(lung.onnx_path, 512, at_512)
        plan = [
            ("lung-seg 160", lung.onnx_path, lung, args.batches_160),
            ("lung-seg 512", at_512, card_at(lung, 512), args.batches_512),
            ("nodule-det 256", nodule.onnx_path, nodule, args.batches_256),
        ]
        for label, path, card, batches in plan:
            rows += model_rows(label, path, card, batches, args, cuda)
            print(table([r for r in rows if r["model"] == label]), flush=True)
            out = os.environ.get("OUT")
            if out:
                text = json.dumps({"gpu": gpu, "rows": rows}, indent=1, default=str)
                Path(out, "device_lungseg_bench.json").write_text(text)
    print(table(rows))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
