"""Mapping model outputs back in part gives what mapping them back whole gives, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imaging_ai.mapback import MapBack
from imaging_ai.modelcard import ModelCard, parse_model_card
from imaging_ai.postprocess import (
    LEFT_LUNG,
    RIGHT_LUNG,
    connected_components,
    detect_lesions,
    labels_on_volume_grid,
    measure,
    segment_labels,
)
from imaging_ai.preprocess import resize_back
from imaging_ai.volume import Volume

# (model grid, source grid): enlarging by a whole and a fractional factor (lung-seg's 160 to
# 512 is 3.2), shrinking, and the same size.
GRIDS = [((16, 16), (32, 32)), ((10, 12), (32, 37)), ((24, 20), (16, 15)), ((20, 20), (20, 20))]


def make_volume(slices: int, size: tuple[int, int]) -> Volume:
    rng = np.random.default_rng(5)
    return Volume(
        hu=rng.uniform(-900, 100, (slices, *size)).astype(np.float32),
        origin_mm=(-100.0, -80.0, 20.0),
        spacing_mm=(0.7, 0.7, 1.25),
        direction=np.eye(3),
        sop_instance_uids=tuple(f"1.2.{i}" for i in range(slices)),
        series_instance_uid="1.3",
        study_instance_uid="1.2",
        frame_of_reference_uid="1.4",
    )


def smooth(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Random fields with structure at a few pixels, so that labels have edges and plateaus."""
    coarse = rng.normal(0, scale, (*shape[:-2], shape[-2] // 3 + 2, shape[-1] // 3 + 2))
    return np.kron(coarse, np.ones((3, 3)))[..., : shape[-2], : shape[-1]]


def card(kind: str, labels: list[tuple[int, int, float]], channels: int) -> ModelCard:
    return parse_model_card(
        {
            "name": "m",
            "version": "1",
            "task": "segmentation",
            "description": "t",
            "input": {"name": "image", "size": [8, 8]},
            "preprocess": {"window_center": 0.0, "window_width": 1.0, "normalise": "minmax"},
            "output": {"name": "p", "kind": kind, "channels": channels},
            "labels": [
                {
                    "value": value,
                    "channel": channel,
                    "name": f"L{value}",
                    "threshold": threshold,
                    "min_volume_mm3": 1.0,
                    "category": {"code": "91723000", "scheme": "SCT", "meaning": "A"},
                    "type": {"code": "3341006", "scheme": "SCT", "meaning": "Right lung"},
                }
                for value, channel, threshold in labels
            ],
            "quality": {},
            "provenance": {"training_data": "synthetic", "shipped": False},
        },
        source=Path("card.toml"),
    )


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize(("model", "source"), GRIDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_window_and_voxels_equal_the_whole_map(
    model: tuple[int, int], source: tuple[int, int], dtype: Any
) -> None:
    rng = np.random.default_rng(1)
    outputs = rng.random((4, 3, *model)).astype(dtype)
    volume = make_volume(4, source)
    whole = resize_back(outputs, volume)
    back = MapBack.of(outputs, volume)
    rows, cols = slice(source[0] // 3, source[0] - 2), slice(1, source[1] // 2)
    window = back.window(outputs[1:3], rows, cols)
    assert window.dtype == whole.dtype
    np.testing.assert_array_equal(window, whole[1:3, :, rows, cols])
    s, r, c = (rng.integers(0, n, 200) for n in (4, *source))
    np.testing.assert_array_equal(back.at(outputs, s, r, c), whole[s, :, r, c])


@pytest.mark.parametrize(("model", "source"), GRIDS)
def test_span_holds_every_voxel_that_reads_the_pixels(
    model: tuple[int, int], source: tuple[int, int]
) -> None:
    volume = make_volume(1, source)
    back = MapBack.of(np.zeros((1, 1, *model), np.float32), volume)
    for axis in (0, 1):
        for first in range(model[axis]):
            for last in range(first, model[axis]):
                outputs = np.zeros((1, 1, *model), np.float32)
                hit = (slice(None), slice(None)) + (
                    (slice(first, last + 1), slice(None))
                    if axis == 0
                    else (slice(None), slice(first, last + 1))
                )
                outputs[hit] = 1.0
                touched = np.flatnonzero(resize_back(outputs, volume)[0, 0].any(axis=1 - axis))
                span = back.span(first, last, axis)
                assert span.start <= touched[0] and touched[-1] < span.stop


LABELLINGS = {
    "softmax, one label per class": ("softmax", [(1, 1, 0.5), (2, 2, 0.5)], 3),
    "softmax, thresholds below a half": ("softmax", [(1, 1, 0.3), (2, 2, 0.45)], 3),
    "softmax, four classes": ("softmax", [(1, 1, 0.3), (3, 2, 0.5), (2, 3, 0.2)], 4),
    "sigmoid, overlapping labels": ("sigmoid", [(1, 0, 0.5), (2, 1, 0.3), (3, 2, 0.9)], 3),
    "logits": ("logits", [(1, 0, 0.5), (2, 1, 0.7)], 2),
}


@pytest.mark.parametrize("labelling", LABELLINGS, ids=str)
@pytest.mark.parametrize(("model", "source"), GRIDS)
def test_labels_equal_labelling_the_whole_map(
    labelling: str, model: tuple[int, int], source: tuple[int, int]
) -> None:
    kind, labels, channels = LABELLINGS[labelling]
    seg = card(kind, labels, channels)
    rng = np.random.default_rng(len(labelling))
    logits = smooth(rng, (6, channels, *model), 3.0)
    outputs = softmax(logits) if kind == "softmax" else logits.astype(np.float32)
    if kind == "sigmoid":
        outputs = (1.0 / (1.0 + np.exp(-outputs))).astype(np.float32)
    # Plateaus exactly on a threshold, and ties between classes.
    outputs[0, :, : model[0] // 2] = 0.5
    outputs[1, 0, :, :3] = outputs[1, 1, :, :3]
    volume = make_volume(6, source)
    expected = segment_labels(resize_back(outputs, volume), seg)
    got = labels_on_volume_grid(outputs, seg, volume)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, expected)
    halved = labels_on_volume_grid(outputs.astype(np.float16), seg, volume)  # mapped whole
    np.testing.assert_array_equal(
        halved, segment_labels(resize_back(outputs.astype(np.float16), volume), seg)
    )


DETECTION = card("sigmoid", [(1, 0, 0.9)], 1)


def lesions_over_the_whole_map(
    probabilities: np.ndarray, volume: Volume, lungs: np.ndarray
) -> list[Any]:
    """What detect_lesions gave before it mapped back only around candidates."""
    prob = resize_back(probabilities, volume)[:, 0]
    label = DETECTION.labels[0]
    min_voxels = max(1, int(label.min_volume_mm3 / (volume.voxel_volume_ml * 1000.0)))
    components = connected_components(prob >= label.threshold, volume, min_voxels)
    return [
        measure(n, idx, prob[tuple(idx.T)], volume, lungs)
        for n, idx in enumerate(components, start=1)
    ]


@pytest.mark.parametrize(("model", "source"), GRIDS[:3])
def test_lesions_equal_grouping_the_whole_map(
    model: tuple[int, int], source: tuple[int, int]
) -> None:
    slices = 12
    probabilities = np.zeros((slices, 1, *model), np.float32)
    # Blobs of several sizes and equal twins (ties are numbered by their first voxel), on
    # shared and separate slices, one under the threshold, and single pixels.
    blobs = [(1, 2, 2, 3, 0.97), (1, 2, 8, 3, 0.97), (5, 6, 6, 2, 0.95), (7, 1, 1, 4, 0.99)]
    for k, r, c, size, value in [*blobs, (9, 6, 10, 2, 0.88)]:
        probabilities[k : k + size, 0, r : r + size, c : c + size] = value
    probabilities[3, 0, -1, -1] = 0.95
    probabilities[11, 0, 0, -2] = 0.9 - 5e-5
    volume = make_volume(slices, source)
    lungs = np.zeros(volume.hu.shape, np.uint8)
    lungs[:, :, : source[1] // 2] = RIGHT_LUNG
    lungs[:, 2:, source[1] // 2 :] = LEFT_LUNG
    expected = lesions_over_the_whole_map(probabilities, volume, lungs)
    got = detect_lesions(probabilities, DETECTION, volume, lungs)
    assert len(got) == len(expected) >= 4
    for ours, theirs in zip(got, expected, strict=True):
        assert ours == theirs  # every field but the voxel list, which comes next
        np.testing.assert_array_equal(ours.voxel_index, theirs.voxel_index)


def test_nothing_near_the_threshold_gives_no_lesion() -> None:
    volume = make_volume(3, (32, 32))
    lungs = np.zeros(volume.hu.shape, np.uint8)
    quiet = np.full((3, 1, 16, 16), 0.5, np.float32)
    assert detect_lesions(quiet, DETECTION, volume, lungs) == []
