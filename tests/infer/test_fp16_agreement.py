"""The daemon's FP16 models against FP32 on the CPU, on preprocessed phantom slices: within the
stated tolerance (`imaging_ai.infer.agreement`, docs/models.md "FP16 and the GPU").

ONNX Runtime's CPU provider runs the FP16 model that `infer.fp16` makes for the GPU (FP16 tensors
between operators), so the conversion and the tolerance are checked here; on the H200 its
differences were within a few per cent of these (benchmarks/device/engines_vs_pytorch.py checks
the GPU itself).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate

from imaging_ai.infer.agreement import compare, hu_sensitivity, label_map
from imaging_ai.infer.fp16 import fp16_model_bytes
from imaging_ai.infer.ort import OrtBackend, OrtOptions
from imaging_ai.modelcard import ModelCard, load_model_card
from imaging_ai.postprocess import segment_labels
from imaging_ai.preprocess import add_context, context_stride, prepare_array

ENGINES = Path(__file__).resolve().parents[2] / "engines"
# At the shipped input sizes FP16 also stays within these. nodule-det's was 0.02 on the phantoms
# of before issue 17; on today's (contrast, dense-contrast streaks, sharper kernels drawn at
# random) its largest difference is 0.030-0.035 on this seed, far inside the 1-HU tolerance
# (0.25), and on the H200 it was 0.047 (docs/models.md).
SHIPPED_MAX_ABS_DIFF = {"lung-seg": 0.02, "nodule-det": 0.04}


@pytest.fixture(scope="module")
def phantom() -> PhantomVolume:
    """A chest the models never saw, with nodules of 6-14 mm, 2.5 mm slices."""
    spec = PhantomSpec(
        slices=40, seed=424_243, nodules=5, slice_thickness_mm=2.5,
        nodule_diameter_range_mm=(6.0, 14.0),
    )  # fmt: skip
    return generate(spec)


def model_slices(vol: PhantomVolume, card: ModelCard, count: int) -> np.ndarray[Any, Any]:
    """`count` preprocessed slices through the lungs and nodules, as the daemon feeds `card`
    (slices feet to head, as a series is loaded)."""
    spec = card.preprocess
    stack = prepare_array(vol.hu[::-1], (vol.spacing_mm[0], vol.spacing_mm[1]), spec, np)
    if spec.context_slices:
        stride = context_stride(vol.spacing_mm[2], spec.context_spacing_mm)
        stack = add_context(stack, stride, spec.context_slices, np)
    lungs = np.flatnonzero(vol.lung_labels[::-1].any(axis=(1, 2)))
    nodules = np.flatnonzero(vol.nodule_mask[::-1].any(axis=(1, 2)))
    pick = np.unique(np.concatenate([nodules, lungs]))
    pick = pick[np.linspace(0, len(pick) - 1, count).astype(int)]
    return np.ascontiguousarray(stack[pick], dtype=np.float32)


def at_size(card: ModelCard, size: int, tmp: Path) -> ModelCard:
    """The same network and weights with its spatial sizes set to `size` (only convolutions,
    pooling and concatenation depend on them)."""
    model = onnx.load(str(card.onnx_path))
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        dims[2].dim_value = dims[3].dim_value = size
    del model.graph.value_info[:]
    onnx.save(model, str(tmp / "model.onnx"))
    (tmp / "model.toml").write_text((card.folder / "model.toml").read_text())
    resized = load_model_card(tmp)
    return replace(
        resized,
        input=replace(resized.input, height=size, width=size),
        preprocess=replace(resized.preprocess, input_size=(size, size)),
    )


@pytest.mark.parametrize(
    ("name", "size", "count"),
    [("lung-seg", None, 16), ("nodule-det", None, 16), ("lung-seg", 512, 3)],
)
def test_fp16_is_within_the_stated_tolerance(
    phantom: PhantomVolume, tmp_path: Path, name: str, size: int | None, count: int
) -> None:
    card = load_model_card(ENGINES / name)
    if size is not None:  # a size it was never trained at: probabilities near ties, sensitive
        card = at_size(card, size, tmp_path)
    x = model_slices(phantom, card, count)
    fp32 = OrtBackend(OrtOptions(intra_op_threads=2, max_batch_size=16)).load(card)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    fp16 = ort.InferenceSession(fp16_model_bytes(card.onnx_path), so, ["CPUExecutionProvider"])
    ref = fp32.infer(x)
    (out,) = fp16.run([card.output.name], {card.input.name: x})
    limit = hu_sensitivity(fp32.infer, x, ref, card)
    got = compare(np.asarray(out), ref, card)
    print(f"\n{name} {size or 'as shipped'}:\n  fp16 {got}\n  1 HU {limit}")
    assert got.within(limit), (got, limit)
    if size is None:
        assert got.max_abs_diff <= SHIPPED_MAX_ABS_DIFF[name]
    # The check has teeth: masks moved by three pixels are not within it.
    assert not compare(np.roll(ref, 3, axis=-1), ref, card).within(limit)


@pytest.mark.parametrize("name", ["lung-seg", "nodule-det"])
def test_label_map_is_the_daemons(name: str) -> None:
    card = load_model_card(ENGINES / name)
    rng = np.random.default_rng(5)
    probabilities = rng.random((2, card.output.channels, 24, 24)).astype(np.float32)
    if card.output.kind == "softmax":
        probabilities /= probabilities.sum(axis=1, keepdims=True)
    else:
        probabilities = 0.95 + 0.05 * probabilities  # around the card's 0.98
    np.testing.assert_array_equal(
        label_map(probabilities, card), segment_labels(probabilities, card)
    )
