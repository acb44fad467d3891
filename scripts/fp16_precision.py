#!/usr/bin/env python3
"""Where FP16 moves a shipped model's outputs, on the CPU: the FP16 model with parts kept in FP32,
and the FP32 model with its input or first weights perturbed, each against FP32 on the CPU.

    .venv/bin/python scripts/fp16_precision.py [--model lung-seg] [--size 512] [--slices 4]

ONNX Runtime's CPU provider runs the FP16 model that `imaging_ai.infer.fp16` makes for the GPU
(on the H200 the daemon's FP16 lung-seg at 512x512 was 0.055 off the CPU on phantom slices; here
0.058). The slices are the phantom of tests/infer/test_fp16_agreement.py. Rows:
- the daemon's FP16 model; the same with the head and output activation, the decoder, the
  encoder, or only the first convolution kept in FP32 (the converter's node block list);
- FP32 with 1 HU of Gaussian noise on the input (the stated tolerance's limit, one draw), with
  uniform +-0.5 HU (the rounding of stored CT values), with the input and the first
  convolution's weights rounded to FP16's 10-bit mantissa (what TF32 does to an FP32 convolution).
docs/models.md ("FP16 and the GPU") has the table for lung-seg at 512x512.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devkit")]

from imaging_ai_devkit.phantom import PhantomSpec, generate  # noqa: E402

from imaging_ai.infer.agreement import Agreement, compare  # noqa: E402
from imaging_ai.modelcard import ModelCard, load_model_card  # noqa: E402
from tests.infer.test_fp16_agreement import at_size, model_slices  # noqa: E402

Run = Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]


def session(model: onnx.ModelProto) -> Run:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    s = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return lambda x: np.asarray(s.run(None, {name: x})[0])


def fp16(model: onnx.ModelProto, keep: list[str]) -> onnx.ModelProto:
    """The daemon's conversion (infer.fp16), with the nodes named in `keep` left in FP32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted: onnx.ModelProto = convert_float_to_float16(
        model, keep_io_types=True, node_block_list=keep
    )
    return converted


def nodes(model: onnx.ModelProto, *prefixes: str) -> list[str]:
    return [n.name for n in model.graph.node if n.name.startswith(prefixes)]


def first_conv_on_fp16_grid(model: onnx.ModelProto) -> onnx.ModelProto:
    """The FP32 model with the first convolution's weights rounded to FP16's mantissa."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weight = next(n for n in out.graph.node if n.op_type == "Conv").input[1]
    for i, t in enumerate(out.graph.initializer):
        if t.name == weight:
            w = numpy_helper.to_array(t).astype(np.float16).astype(np.float32)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(w, weight))
    return out


def rows(card: ModelCard, x: np.ndarray[Any, Any]) -> list[tuple[str, Agreement]]:
    model = onnx.load(str(card.onnx_path))
    net = "/detector" if card.name == "nodule-det" else ""
    fp32 = session(model)
    ref = fp32(x)
    hu = 1.0 / card.preprocess.window_width
    rng = np.random.default_rng(0)
    head = nodes(model, f"{net}/head", f"{net}/Softmax", f"{net}/Sigmoid")
    plan: list[tuple[str, Run, np.ndarray[Any, Any]]] = [
        ("fp16 (the daemon's)", session(fp16(model, [])), x),
        ("fp16, head + activation fp32", session(fp16(model, head)), x),
        (
            "fp16, decoder fp32",
            session(fp16(model, nodes(model, f"{net}/up", f"{net}/merge", f"{net}/Concat") + head)),
            x,
        ),
        ("fp16, encoder fp32", session(fp16(model, nodes(model, f"{net}/down", f"{net}/pool"))), x),
        ("fp16, first conv fp32", session(fp16(model, nodes(model, f"{net}/down.0/down.0.0"))), x),
        ("fp32, input + N(0, 1 HU)", fp32, x + rng.normal(0, hu, x.shape)),
        ("fp32, input + U(+-0.5 HU)", fp32, x + rng.uniform(-hu / 2, hu / 2, x.shape)),
        (
            "fp32, input + 1st weights on fp16 grid",
            session(first_conv_on_fp16_grid(model)),
            x.astype(np.float16).astype(np.float32),
        ),
    ]
    return [(name, compare(run(xx.astype(np.float32)), ref, card)) for name, run, xx in plan]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default="lung-seg", choices=("lung-seg", "nodule-det"))
    parser.add_argument("--size", type=int, default=0, help="run at this size (0: as shipped)")
    parser.add_argument("--slices", type=int, default=4)
    args = parser.parse_args()
    card = load_model_card(ROOT / "engines" / args.model)
    with tempfile.TemporaryDirectory() as tmp:
        if args.size:
            card = at_size(card, args.size, Path(tmp))
        spec = PhantomSpec(
            slices=40, seed=424_243, nodules=5, slice_thickness_mm=2.5,
            nodule_diameter_range_mm=(6.0, 14.0),
        )  # fmt: skip
        x = model_slices(generate(spec), card, args.slices)
        found = rows(card, x)
    print(f"{card.name} at {card.input.height}x{card.input.width}, {len(x)} phantom slices, CPU")
    print(f"{'against fp32 on the cpu':<42} {'max|d|':>7} {'p99.99':>7} {'labels differ':>13} Dice")
    for name, a in found:
        print(
            f"{name:<42} {a.max_abs_diff:7.4f} {a.p9999_abs_diff:7.4f} "
            f"{a.label_disagreement:13.2e} {a.dice_min:.5f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
