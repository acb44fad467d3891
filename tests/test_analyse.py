"""The analysis path (imaging_ai.analyse): a model gets the input its card asks for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from imaging_ai.analyse import label_map, lung_labels, run_model
from imaging_ai.infer.base import LoadedModel
from imaging_ai.infer.ort import OrtBackend, OrtOptions
from imaging_ai.modelcard import load_model_card, validate_against_onnx
from imaging_ai.postprocess import LEFT_LUNG, LESION, RIGHT_LUNG, measure
from imaging_ai.preprocess import prepare_slices
from imaging_ai.volume import Volume
from tests.fakes.onnx_models import write_conv_softmax_onnx

CARD = """\
name = "context-seg"
version = "0.0.1"
task = "segmentation"
description = "1x1 convolution + softmax over a slice and its neighbours, for tests."

[input]
name = "image"
channels = {channels}
size = [16, 16]
{context}

[preprocess]
window_center = 0.0
window_width = 200.0
normalise = "minmax"

[output]
name = "probabilities"
kind = "softmax"
channels = 3

[[labels]]
value = 1
channel = 1
name = "Right lung"
threshold = 0.5
category = {{ code = "91723000", scheme = "SCT", meaning = "Anatomical Structure" }}
type = {{ code = "3341006", scheme = "SCT", meaning = "Right lung" }}

[[labels]]
value = 2
channel = 2
name = "Left lung"
threshold = 0.5
category = {{ code = "91723000", scheme = "SCT", meaning = "Anatomical Structure" }}
type = {{ code = "44029006", scheme = "SCT", meaning = "Left lung" }}

[quality]

[provenance]
training_data = "None: random weights, for tests only."
"""


def _volume(slices: int, slice_mm: float) -> Volume:
    """Slices of distinct, varying HU on a 16x16 grid (the model's own, so no resizing)."""
    rng = np.random.default_rng(7)
    hu = rng.uniform(-100, 100, (slices, 16, 16)) + 20 * np.arange(slices)[:, None, None]
    return Volume(
        hu=hu.astype(np.float32),
        origin_mm=(0.0, 0.0, 0.0),
        spacing_mm=(0.8, 0.8, slice_mm),
        direction=np.eye(3),
        sop_instance_uids=tuple(str(k) for k in range(slices)),
        series_instance_uid="1.2",
        study_instance_uid="1.1",
        frame_of_reference_uid="1.3",
    )


def _model(tmp_path: Path, context: int, spacing_mm: float) -> tuple[LoadedModel, np.ndarray]:
    folder = tmp_path / f"context-{context}"
    weight, bias = write_conv_softmax_onnx(
        folder / "model.onnx", in_channels=2 * context + 1, classes=3, size=(16, 16)
    )
    lines = [f"context_slices = {context}"] if context else []
    lines += [f"context_spacing_mm = {spacing_mm}"] if spacing_mm else []
    text = CARD.format(channels=2 * context + 1, context="\n".join(lines))
    (folder / "model.toml").write_text(text)
    card = load_model_card(folder)
    validate_against_onnx(card)
    engine = OrtBackend(OrtOptions(provider="cpu", intra_op_threads=1, max_batch_size=4)).load(card)
    return LoadedModel(card, engine), np.concatenate([weight, bias[:, None]], axis=1)


def _softmax_of_conv(x: np.ndarray, affine: np.ndarray) -> np.ndarray:
    logits = np.einsum("kc,nchw->nkhw", affine[:, :-1], x) + affine[:, -1][None, :, None, None]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("context", "spacing_mm", "stride"), [(1, 3.0, 3), (1, 0.0, 1), (2, 2.0, 2)]
)
def test_a_2_5d_model_gets_each_slice_with_its_neighbours(
    tmp_path: Path, context: int, spacing_mm: float, stride: int
) -> None:
    model, affine = _model(tmp_path, context, spacing_mm)
    volume = _volume(slices=9, slice_mm=1.0)  # more slices than the batch of 4
    single = prepare_slices(volume, replace(model.card.preprocess, context_slices=0))
    rows = np.clip(np.arange(9)[:, None] + stride * np.arange(-context, context + 1), 0, 8)
    expected = _softmax_of_conv(single[:, 0][rows], affine)
    got = np.concatenate([probs for _, probs in run_model(model, volume)])
    assert got.shape == (9, 3, 16, 16)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_a_single_slice_card_is_unchanged(tmp_path: Path) -> None:
    model, affine = _model(tmp_path, 0, 0.0)
    assert model.card.input_shape == (1, 16, 16)
    volume = _volume(slices=5, slice_mm=2.5)
    x = prepare_slices(volume, model.card.preprocess)
    assert x.shape == (5, 1, 16, 16)
    got = np.concatenate([probs for _, probs in run_model(model, volume)])
    np.testing.assert_allclose(got, _softmax_of_conv(x, affine), atol=1e-5)
    labels = lung_labels(model, volume)
    assert labels.shape == volume.hu.shape and set(np.unique(labels)) <= {0, 1, 2}


def test_lung_volumes_are_measured_over_the_lung_voxels_of_the_label_map() -> None:
    """The SEG's lung segment leaves the nodules out; the reported lung volume must too."""
    volume = _volume(4, 2.0)
    lungs = np.zeros((4, 16, 16), np.uint8)
    lungs[:, 2:8] = RIGHT_LUNG
    lungs[:, 9:15] = LEFT_LUNG
    nodule = np.argwhere(lungs[1:3, 3:5, 3:5] > 0) + np.array([1, 3, 3])  # 8 right-lung voxels
    lesion = measure(1, nodule, np.full(len(nodule), 0.9, np.float32), volume, lungs)
    labels, volumes = label_map(lungs, [lesion], volume)
    assert np.count_nonzero(labels == LESION) == 8
    voxel_ml = volume.voxel_volume_ml
    assert volumes["right lung"] == pytest.approx(np.count_nonzero(labels == RIGHT_LUNG) * voxel_ml)
    assert volumes["right lung"] == pytest.approx((4 * 6 * 16 - 8) * voxel_ml)
    assert volumes["left lung"] == pytest.approx(4 * 6 * 16 * voxel_ml)
