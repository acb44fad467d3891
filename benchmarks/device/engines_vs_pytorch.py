#!/usr/bin/env python3
"""Issue 3 on one GPU: both shipped models through the daemon's engines against PyTorch eager FP32,
and what FP16 changes against FP32 on the CPU.

On the GPU machine, from the repository root, with onnxruntime-gpu on PYTHONPATH
(`source benchmarks/device/setup_ort.sh`) and the phantom slices carried (`.whl-parts/phantom`):

    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/device/engines_vs_pytorch.py \
        --slices .whl-parts/phantom/issue3.npz

The slices are made here first, because the phantom generator needs pydicom, which that machine
lacks: `.venv/bin/python benchmarks/device/engines_vs_pytorch.py --make-slices
.whl-parts/phantom/issue3.npz`.
`--dry-run` runs every step on ONNX Runtime's CPU provider and PyTorch on the CPU, at small sizes,
to check the script here.

Models: lung-seg 1.0.0 as shipped (160x160), the same network and weights at 512x512 (the ONNX
graph with its spatial sizes changed), and nodule-det 2.0.0 (256x256, the slice and its two
neighbours as channels).

Speed (slices/s, median of three windows, host to host as a worker runs it; in brackets the same
with the data already on the GPU):
- PyTorch eager FP32: the ONNX graph node by node (`imaging_ai_devkit.bench.torch_onnx.TorchEager`,
  the engines benchmark's peer), cuDNN autotuning on, TF32 as PyTorch defaults on this GPU;
- ONNX Runtime CUDA with IO binding from page-locked host memory (`infer_into`, as a worker
  runs it): FP32, FP16, and FP16+NHWC, the daemon's engine (`make_backend`).

Agreement with ONNX Runtime FP32 on the CPU, on preprocessed phantom slices (and on uniform
random slices, which no scan looks like), by `imaging_ai.infer.agreement`: the largest and the
99.99th-percentile |difference| of the probabilities, the share of pixels whose label differs (the
daemon's rule: arg-max and threshold for lung-seg, the card's 0.98 for nodule-det) and the worst
label's Dice; "within" is the stated tolerance: no further from the CPU than the CPU's own FP32
outputs move under 1 HU of noise on the input (the "limit" rows). A row for ONNX Runtime FP32
without TF32 tells how much of a difference TF32, PyTorch's and ONNX Runtime's default, makes.

A table is printed last, then a `headline:` line; $OUT/device_issue3.json has every row. A step
that fails is reported in its row and the others still run; measuring stops early, saying so,
when the wall-clock budget (--budget-s, 150 s) would be passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "devkit")]
sys.path.insert(0, str(ROOT / "benchmarks" / "device"))

from engine_variants import Host, card_at, onnx_at_size, rate  # noqa: E402

from imaging_ai.infer.agreement import compare, hu_sensitivity  # noqa: E402
from imaging_ai.infer.base import FloatArray, sample_batch  # noqa: E402
from imaging_ai.infer.cuda_mem import CudaRuntime  # noqa: E402
from imaging_ai.infer.ort import OrtBackend, OrtOptions, gpu_tuned  # noqa: E402
from imaging_ai.infer.select import make_backend  # noqa: E402
from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402

Row = dict[str, Any]
TORCH = "torch eager fp32"
DAEMON = "ort bound fp16 nhwc [daemon]"
DRY = "ort cpu bound fp32 [daemon, dry run]"


@dataclass(frozen=True)
class Model:
    """One model as measured: label, ONNX file, card, batch sizes, and its phantom slices."""

    label: str
    path: Path
    card: ModelCard
    batches: tuple[int, ...]
    slices: FloatArray | None


# --- phantom slices (made here, on the CPU machine) ---------------------------------------------


def make_slices(dest: Path) -> None:
    """Preprocessed slices of two phantoms (1.25 and 5 mm), as the daemon feeds each model.

    float32, as the daemon's preprocessing gives them (float16 would put the inputs on FP16's
    grid and hide the rounding of the input); slices feet to head, as a series is loaded.
    """
    from imaging_ai_devkit.phantom import PhantomSpec, generate

    from imaging_ai.preprocess import add_context, context_stride, prepare_array

    lung = load_model_card(ROOT / "engines" / "lung-seg")
    nodule = load_model_card(ROOT / "engines" / "nodule-det")
    parts: dict[str, list[FloatArray]] = {"lung160": [], "lung512": [], "nodule256": []}
    for seed, slices, thickness in ((431001, 200, 1.25), (431002, 56, 5.0)):
        spec = PhantomSpec(slices=slices, seed=seed, nodules=8, slice_thickness_mm=thickness)
        vol = generate(spec)
        xy, hu = (vol.spacing_mm[0], vol.spacing_mm[1]), vol.hu[::-1]
        lungs = np.flatnonzero(vol.lung_labels[::-1].any(axis=(1, 2)))
        nodules = np.flatnonzero(vol.nodule_mask[::-1].any(axis=(1, 2)))
        both = np.unique(np.concatenate([lungs[:: max(1, len(lungs) // 8)], nodules]))
        pick = both[np.linspace(0, len(both) - 1, min(len(both), 12)).astype(int)]
        lung_spec = lung.preprocess
        parts["lung160"].append(prepare_array(hu[pick], xy, lung_spec, np))
        big = replace(lung_spec, input_size=(512, 512))
        parts["lung512"].append(prepare_array(hu[pick[::3]], xy, big, np))
        nodule_spec = nodule.preprocess
        stack = prepare_array(hu, xy, nodule_spec, np)
        stride = context_stride(vol.spacing_mm[2], nodule_spec.context_spacing_mm)
        parts["nodule256"].append(add_context(stack, stride, nodule_spec.context_slices, np)[pick])
    arrays = {k: np.concatenate(v).astype(np.float32) for k, v in parts.items()}
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **arrays)  # type: ignore[arg-type]
    shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
    print(f"{dest}: {shapes}; {dest.stat().st_size / 1e6:.1f} MB")


def load_slices(path: Path | None) -> dict[str, FloatArray]:
    """The phantom slices by key, or none (with a message) when the file is not there."""
    if path is None or not path.exists():
        print(f"no phantom slices ({path}): agreement on random slices only", flush=True)
        return {}
    with np.load(path) as data:
        return {k: np.ascontiguousarray(data[k], dtype=np.float32) for k in data.files}


# --- agreement ---------------------------------------------------------------------------------


def agreement_rows(
    model: Model, name: str, run: Callable[[FloatArray], FloatArray], refs: dict[str, Any]
) -> list[Row]:
    """`run` against ONNX Runtime FP32 on the CPU, on each kind of slices, and the verdict."""
    rows = []
    for kind, (x, ref, limit) in refs.items():
        out = np.concatenate([run(x[i : i + 8]) for i in range(0, len(x), 8)])
        row = {"model": model.label, "variant": name, "slices": f"{kind} {len(x)}"}
        try:
            got = compare(out, ref, model.card)
        except ValueError as exc:  # NaN or an unwritten output
            rows.append(row | {"note": f"FAILED: {exc}"})
            continue
        rows.append(row | asdict(got) | {"within": got.within(limit)})
    return rows


def references(model: Model, max_batch: int) -> dict[str, Any]:
    """ONNX Runtime FP32 on the CPU: outputs, and what 1 HU of noise does to them (the limit)."""
    cpu = OrtBackend(OrtOptions(max_batch_size=max_batch)).load(model.card, model.path)

    def run(x: FloatArray) -> FloatArray:
        return np.concatenate([cpu.infer(x[i : i + 8]) for i in range(0, len(x), 8)])

    seed = sum(map(ord, model.label))
    shape = (8, *model.card.input_shape)
    inputs = {"random": np.random.default_rng(seed).random(shape, dtype=np.float32)}
    if model.slices is not None:
        inputs["phantom"] = model.slices
    refs = {}
    for kind, raw in inputs.items():
        x: FloatArray = np.ascontiguousarray(raw, dtype=np.float32)
        ref = run(x)
        refs[kind] = (x, ref, hu_sensitivity(run, x, ref, model.card))
    cpu.close()
    return refs


def limit_rows(model: Model, refs: dict[str, Any]) -> list[Row]:
    """The tolerance itself: FP32 on the CPU with 1 HU of noise on its input."""
    return [
        {"model": model.label, "variant": "limit: cpu fp32 + 1 HU noise"}
        | {"slices": f"{kind} {len(x)}"}
        | asdict(limit)
        for kind, (x, _, limit) in refs.items()
    ]


# --- PyTorch eager, the peer --------------------------------------------------------------------


def torch_peer(path: Path, device: str) -> Any:
    """`TorchEager` with its constants made once on `device`, callable on device tensors."""
    from imaging_ai_devkit.bench.torch_onnx import TorchEager

    class OnDevice(TorchEager):
        def __init__(self) -> None:
            super().__init__(path, device)
            for op, _, outputs, attrs in self.nodes:
                if op == "Constant":
                    self.values[outputs[0]] = self.ops[op]([], attrs).to(device)
            self.nodes = [n for n in self.nodes if n[0] != "Constant"]

        def run(self, x: Any) -> Any:
            values = dict(self.values)
            values[self.input] = x
            for op, inputs, outputs, attrs in self.nodes:
                values[outputs[0]] = self.ops[op]([values[i] if i else None for i in inputs], attrs)
            return values[self.output]

    return OnDevice()


def torch_rows(model: Model, refs: dict[str, Any], args: Any, device: str) -> list[Row]:
    """PyTorch eager FP32: agreement (TF32 as defaulted, and off), then speed."""
    import torch

    torch.backends.cudnn.benchmark = True
    net = torch_peer(model.path, device)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def host(x: FloatArray) -> FloatArray:
        with torch.inference_mode():
            return np.asarray(net.run(torch.from_numpy(x).to(device)).float().cpu().numpy())

    rows = agreement_rows(model, TORCH, host, refs)
    if device == "cuda":
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        rows += agreement_rows(model, "torch eager fp32, tf32 off", host, refs)
        torch.backends.cudnn.allow_tf32 = tf32
    for b in model.batches:
        x = sample_batch(model.card, b, seed=b)
        xd = torch.from_numpy(x).to(device)

        def resident(n: int, xd: Any = xd) -> None:
            with torch.inference_mode():
                net.run(xd)
            sync()

        def on_host(n: int, x: FloatArray = x) -> None:
            host(x)

        e2e = rate(on_host, b, args.min_seconds)
        rows.append(
            {"model": model.label, "variant": TORCH, "batch": b, "e2e": e2e}
            | {"device": rate(resident, b, args.min_seconds)}
        )
        print(f"{model.label} {TORCH} batch {b}: {e2e:.0f} slices/s", flush=True)
        del xd
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


# --- ONNX Runtime -------------------------------------------------------------------------------


def ort_variants(max_batch: int, dry: bool) -> list[tuple[str, OrtOptions]]:
    """(name, options): the daemon's engine last; on the CPU (dry run) the same plumbing."""
    if dry:
        cpu = OrtOptions(max_batch_size=max_batch, io_binding=True)
        return [(DRY, cpu)]
    base = OrtOptions(provider="cuda", max_batch_size=max_batch)
    fp16 = replace(base, precision="fp16")
    daemon = make_backend("onnxruntime-cuda", Path("/tmp"), ort_gpu=fp16)
    assert isinstance(daemon, OrtBackend)
    return [
        ("ort bound fp32", gpu_tuned(base)),
        ("ort bound fp16", replace(gpu_tuned(fp16), prefer_nhwc=False)),
        (DAEMON, daemon.options),
        ("ort bound fp16 nhwc graphs", replace(daemon.options, cuda_graph=True)),
    ]


def ort_rows(
    model: Model, refs: dict[str, Any], args: Any, cuda: CudaRuntime | None, clock: Clock
) -> list[Row]:
    rows: list[Row] = []
    for name, options in ort_variants(max(*model.batches, 8), cuda is None):
        if clock.over():
            rows.append({"model": model.label, "variant": name, "note": clock.note})
            continue
        try:
            rows += ort_variant(model, name, options, refs, args, cuda)
        except Exception as exc:  # one variant failing must not lose the others
            rows.append({"model": model.label, "variant": name, "note": f"FAILED: {exc!r}"})
            print(f"{model.label} {name}: FAILED {exc!r}", flush=True)
    return rows


def ort_variant(
    model: Model,
    name: str,
    options: OrtOptions,
    refs: dict[str, Any],
    args: Any,
    cuda: CudaRuntime | None,
) -> list[Row]:
    started = time.perf_counter()
    engine: Any = OrtBackend(options).load(model.card, model.path)
    load_s = time.perf_counter() - started

    def run(x: FloatArray) -> FloatArray:
        out = np.full((len(x), *refs["random"][1].shape[1:]), np.nan, np.float32)
        engine.infer_into([x], [out])
        return out

    rows = agreement_rows(model, name, run, refs)
    host = Host(cuda, model.card, refs["random"][1].shape[1:], max(model.batches))
    try:
        for b in model.batches:
            e2e = rate(lambda n: engine.infer_into([host.x[:n]], [host.y[:n]]), b, args.min_seconds)
            on_device = rate(engine.run_on_device, b, args.min_seconds)
            row = {"model": model.label, "variant": name, "batch": b, "e2e": e2e}
            rows.append(row | {"device": on_device, "load_s": load_s})
            print(f"{model.label} {name} batch {b}: {e2e:.0f} slices/s", flush=True)
    finally:
        host.close()
        engine.close()
    return rows


def precision_rows(model: Model, refs: dict[str, Any], dry: bool) -> list[Row]:
    """Where a difference comes from: ONNX Runtime FP32 on the GPU without TF32."""
    if dry:
        return []
    import onnxruntime as ort

    cuda = ("CUDAExecutionProvider", {"use_tf32": "0", "cudnn_conv_algo_search": "DEFAULT"})
    session = ort.InferenceSession(str(model.path), providers=[cuda, "CPUExecutionProvider"])

    def run(x: FloatArray) -> FloatArray:
        (out,) = session.run([model.card.output.name], {model.card.input.name: x})
        return np.asarray(out, np.float32)

    return agreement_rows(model, "ort fp32, tf32 off", run, refs)


# --- the run ------------------------------------------------------------------------------------


class Clock:
    """The wall-clock budget: measuring stops, saying so, before it would be passed."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget_s = time.monotonic(), budget_s
        self.note = f"not measured: the {budget_s:.0f} s budget was used up"

    def over(self, reserve_s: float = 12.0) -> bool:
        return time.monotonic() - self.start > self.budget_s - reserve_s


def models(slices: dict[str, FloatArray], tmp: Path, args: Any) -> Iterator[Model]:
    lung = load_model_card(ROOT / "engines" / "lung-seg")
    nodule = load_model_card(ROOT / "engines" / "nodule-det")
    big = 64 if args.dry_run else 512
    at_big = tmp / f"lung-seg-{big}.onnx"
    onnx_at_size(lung.onnx_path, big, at_big)
    lung_big = slices.get("lung512")
    if lung_big is not None and args.dry_run:
        lung_big = lung_big[:, :, ::8, ::8]
    lung_slices, nodule_slices = slices.get("lung160"), slices.get("nodule256")
    yield Model("lung-seg 160", lung.onnx_path, lung, tuple(args.batches_160), lung_slices)
    label = f"nodule-det {nodule.version}"
    yield Model(label, nodule.onnx_path, nodule, tuple(args.batches_256), nodule_slices)
    yield Model(f"lung-seg {big}", at_big, card_at(lung, big), tuple(args.batches_512), lung_big)


def measure(model: Model, args: Any, cuda: CudaRuntime | None, clock: Clock) -> list[Row]:
    if clock.over():
        return [{"model": model.label, "variant": "all", "note": clock.note}]
    refs = references(model, 8)
    steps: list[tuple[str, Callable[[], list[Row]]]] = [
        ("limit", lambda: limit_rows(model, refs)),
        ("precision", lambda: precision_rows(model, refs, args.dry_run)),
        ("ort", lambda: ort_rows(model, refs, args, cuda, clock)),
    ]
    if not args.no_torch:
        device = "cpu" if cuda is None else "cuda"
        steps.insert(0, (TORCH, lambda: torch_rows(model, refs, args, device)))
    rows: list[Row] = []
    for name, step in steps:
        if clock.over():
            rows.append({"model": model.label, "variant": name, "note": clock.note})
            continue
        try:
            rows += step()
        except Exception as exc:  # e.g. torch missing: the other steps still run
            rows.append({"model": model.label, "variant": name, "note": f"FAILED: {exc!r}"})
            print(f"{model.label} {name}: FAILED {exc!r}", flush=True)
    return rows


def speed_table(rows: list[Row]) -> str:
    lines = [f"{'model':<17} {'variant':<30} {'batch':>5} {'slices/s':>9} {'on GPU':>8}"]
    for r in rows:
        if "e2e" in r:
            dev = f"{r['device']:8.0f}" if r.get("device") == r.get("device") else " " * 8
            lines.append(
                f"{r['model']:<17} {r['variant'][:30]:<30} {r['batch']:>5} {r['e2e']:9.0f} {dev}"
            )
        elif "note" in r:
            lines.append(f"{r['model']:<17} {r['variant'][:30]:<30} {r['note']}")
    return "\n".join(lines)


def agreement_table(rows: list[Row]) -> str:
    lines = [
        f"{'model':<17} {'against cpu fp32':<30} {'slices':<11} {'max|d|':>7} {'p99.99':>7} "
        f"{'labels differ':>13} {'Dice min':>8}  within"
    ]
    for r in rows:
        if "max_abs_diff" in r:
            within = {True: "yes", False: "NO"}.get(bool(r["within"])) if "within" in r else ""
            lines.append(
                f"{r['model']:<17} {r['variant'][:30]:<30} {r['slices']:<11} "
                f"{r['max_abs_diff']:7.4f} {r['p9999_abs_diff']:7.4f} "
                f"{r['label_disagreement']:13.2e} {r['dice_min']:8.5f}  {within}"
            )
    return "\n".join(lines)


def headline(rows: list[Row]) -> str:
    """Per model: the daemon's engine against PyTorch eager FP32, best vs best, and whether its
    outputs on the phantom slices are within the stated tolerance."""
    parts = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        best = {
            v: max((r["e2e"] for r in mine if r["variant"] == v and "e2e" in r), default=0.0)
            for v in (TORCH, DAEMON, DRY)
        }
        ours = best[DAEMON] or best[DRY]
        text = model
        if best[TORCH] and ours:
            text += f" {ours / best[TORCH]:.2f}x {TORCH}"
        for r in mine:
            if r["variant"] in (DAEMON, DRY) and r.get("slices", "").startswith("phantom"):
                verdict = "within" if r.get("within") else "NOT within"
                text += f", fp16 {verdict} the 1-HU tolerance (max|d| {r['max_abs_diff']:.3f})"
        parts.append(text)
    return "headline: " + "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--slices", type=Path, help="phantom slices (.npz from --make-slices)")
    parser.add_argument("--make-slices", type=Path, metavar="NPZ", help="make them and stop")
    parser.add_argument("--min-seconds", type=float, default=0.3)
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--batches-160", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batches-512", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--batches-256", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="CPU only, small, to check it")
    args = parser.parse_args()
    if args.make_slices:
        make_slices(args.make_slices)
        return 0
    clock = Clock(args.budget_s)
    import onnxruntime

    try:
        cuda = None if args.dry_run else CudaRuntime()
        gpu = "cpu (dry run)" if cuda is None else cuda.device_info(0).name
    except Exception as exc:  # no GPU or no cuda-python: say so instead of a traceback
        print(f"no GPU to measure on ({exc!r}); --dry-run checks the script on the CPU")
        return 1
    print(f"{gpu}; onnxruntime {onnxruntime.__version__} {onnxruntime.get_available_providers()}")
    slices = load_slices(args.slices)
    rows: list[Row] = []
    out = os.environ.get("OUT")
    with tempfile.TemporaryDirectory() as tmp:
        for model in models(slices, Path(tmp), args):
            rows += measure(model, args, cuda, clock)
            print(agreement_table([r for r in rows if r["model"] == model.label]), flush=True)
            if out:
                text = json.dumps({"gpu": gpu, "rows": rows}, indent=1, default=str)
                Path(out, "device_issue3.json").write_text(text)
    print(f"\n{gpu}, {time.monotonic() - clock.start:.0f} s")
    print(speed_table(rows))
    print(agreement_table(rows))
    print(headline(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
