"""Lesion grouping and measurement in patient millimetres, on volumes of known geometry."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from imaging_ai.modelcard import parse_model_card
from imaging_ai.postprocess import (
    LEFT_LUNG,
    RIGHT_LUNG,
    axial_diameters,
    connected_components,
    detect_lesions,
    organ_volumes_ml,
    segment_labels,
)
from imaging_ai.volume import Volume

SPACING = (0.7, 0.7, 1.25)
ORIGIN = (-180.0, -150.0, 40.0)


def make_volume(shape: tuple[int, int, int] = (48, 96, 96)) -> Volume:
    return Volume(
        hu=np.full(shape, -850.0, dtype=np.float32),
        origin_mm=ORIGIN,
        spacing_mm=SPACING,
        direction=np.eye(3),
        sop_instance_uids=tuple(f"1.2.{i}" for i in range(shape[0])),
        series_instance_uid="1.3",
        study_instance_uid="1.2",
        frame_of_reference_uid="1.4",
    )


def sphere(
    shape: tuple[int, int, int], centre_mm: tuple[float, float, float], diameter_mm: float
) -> np.ndarray:
    s, r, c = np.indices(shape)
    x = ORIGIN[0] + c * SPACING[0]
    y = ORIGIN[1] + r * SPACING[1]
    z = ORIGIN[2] + s * SPACING[2]
    d2 = (x - centre_mm[0]) ** 2 + (y - centre_mm[1]) ** 2 + (z - centre_mm[2]) ** 2
    return d2 <= (diameter_mm / 2) ** 2


DETECTION_CARD = parse_model_card(
    {
        "name": "nodule-det",
        "version": "1",
        "task": "detection",
        "description": "t",
        "input": {"name": "image", "size": [256, 256]},
        "preprocess": {
            "window_center": -600.0,
            "window_width": 1500.0,
            "normalise": "minmax",
            "denoise": "none",
        },
        "output": {"name": "p", "kind": "sigmoid", "channels": 1},
        "labels": [
            {
                "value": 1,
                "channel": 0,
                "name": "Nodule",
                "threshold": 0.5,
                "min_volume_mm3": 5.0,
                "category": {"code": "49755003", "scheme": "SCT", "meaning": "M"},
                "type": {"code": "27925004", "scheme": "SCT", "meaning": "Nodule"},
            }
        ],
        "quality": {},
        "provenance": {"training_data": "synthetic", "shipped": False},
    },
    source=Path("card.toml"),
)


@pytest.mark.parametrize("diameter", [6.0, 10.0, 22.0])
def test_sphere_measured_within_one_voxel(diameter: float) -> None:
    volume = make_volume()
    centre = (-180 + 50 * 0.7, -150 + 40 * 0.7, 40 + 24 * 1.25)
    ball = sphere(volume.hu.shape, centre, diameter)
    volume.hu[ball] = 30.0
    lungs = np.zeros(volume.hu.shape, np.uint8)
    lungs[:, :, 48:] = LEFT_LUNG  # columns at larger x: patient's left
    prob = ball.astype(np.float32)[:, None]
    [lesion] = detect_lesions(prob, DETECTION_CARD, volume, lungs)
    assert lesion.long_axis_mm == pytest.approx(diameter, abs=SPACING[0])
    assert lesion.short_axis_mm == pytest.approx(diameter, abs=SPACING[0])
    assert np.allclose(lesion.centre_mm, centre, atol=max(SPACING))
    true_ml = math.pi / 6 * diameter**3 / 1000
    assert lesion.volume_ml == pytest.approx(true_ml, rel=0.2)
    assert lesion.mean_hu == pytest.approx(30.0)
    assert lesion.side == "left"


def _on_slice(rows: range, cols: range) -> np.ndarray:
    return np.array([(1, r, c) for r in rows for c in cols])


def test_elongated_lesion_long_and_short_axis() -> None:
    """A 20 × 6 voxel rectangle (centres 13.3 × 3.5 mm apart). Its outline runs through the
    midpoints of its edges: the pixel-edge rectangle, 14.0 × 4.2 mm, with the corners cut by
    half a pixel. The longest chord joins the midpoints of two opposite end edges at opposite
    corners (14.0 × 3.5 mm apart); the outline is centrally symmetric, so the longest chord
    perpendicular to it runs through the centre and leaves through the long sides."""
    volume = make_volume((3, 64, 64))
    long_axis, short_axis = axial_diameters(_on_slice(range(10, 16), range(5, 25)), volume)
    assert long_axis == pytest.approx(math.hypot(14.0, 3.5), abs=1e-6)
    assert short_axis == pytest.approx(4.2 / math.cos(math.atan2(3.5, 14.0)), abs=1e-6)


def test_a_line_and_a_voxel_measure_their_length_and_one_voxel() -> None:
    volume = make_volume((3, 64, 64))
    assert axial_diameters(_on_slice(range(10, 11), range(5, 25)), volume) == pytest.approx(
        (14.0, 0.7)
    )
    assert axial_diameters(_on_slice(range(10, 11), range(5, 6)), volume) == pytest.approx(
        (0.7, 0.7)
    )


def test_components_are_separated_and_small_ones_dropped() -> None:
    volume = make_volume((10, 40, 40))
    mask = np.zeros(volume.hu.shape, bool)
    mask[2:5, 5:10, 5:10] = True  # 75 voxels
    mask[6:8, 20:30, 20:30] = True  # 200 voxels
    mask[9, 39, 39] = True  # 1 voxel: noise
    comps = connected_components(mask, volume, min_voxels=5)
    assert [len(c) for c in comps] == [200, 75]


def test_segment_labels_softmax_thresholds() -> None:
    probs = np.zeros((1, 3, 2, 2), np.float32)
    probs[0, 0] = [[0.9, 0.2], [0.3, 0.1]]
    probs[0, 1] = [[0.05, 0.7], [0.3, 0.1]]
    probs[0, 2] = [[0.05, 0.1], [0.4, 0.8]]
    seg_card = parse_model_card(
        {
            "name": "lung-seg",
            "version": "1",
            "task": "segmentation",
            "description": "t",
            "input": {"name": "image", "size": [2, 2]},
            "preprocess": {
                "window_center": -600.0,
                "window_width": 1500.0,
                "normalise": "minmax",
                "denoise": "none",
            },
            "output": {"name": "p", "kind": "softmax", "channels": 3},
            "labels": [
                {
                    "value": 1,
                    "channel": 1,
                    "name": "Right lung",
                    "threshold": 0.5,
                    "category": {"code": "91723000", "scheme": "SCT", "meaning": "A"},
                    "type": {"code": "3341006", "scheme": "SCT", "meaning": "Right lung"},
                },
                {
                    "value": 2,
                    "channel": 2,
                    "name": "Left lung",
                    "threshold": 0.5,
                    "category": {"code": "91723000", "scheme": "SCT", "meaning": "A"},
                    "type": {"code": "44029006", "scheme": "SCT", "meaning": "Left lung"},
                },
            ],
            "quality": {},
            "provenance": {"training_data": "synthetic", "shipped": False},
        },
        source=Path("card.toml"),
    )
    labels = segment_labels(probs, seg_card)
    # (1,0): class 2 is most probable (0.4) but under its 0.5 threshold.
    assert labels[0].tolist() == [[0, RIGHT_LUNG], [0, LEFT_LUNG]]


def test_organ_volumes() -> None:
    volume = make_volume((4, 10, 10))
    labels = np.zeros((4, 10, 10), np.uint8)
    labels[:, :5] = RIGHT_LUNG
    labels[:2, 5:] = LEFT_LUNG
    vols = organ_volumes_ml(labels, volume)
    voxel = 0.7 * 0.7 * 1.25 / 1000
    assert vols["right lung"] == pytest.approx(200 * voxel)
    assert vols["left lung"] == pytest.approx(100 * voxel)


def test_organ_volumes_counted_by_slabs_match_a_plain_count() -> None:
    # More slices than one slab (16), and a last slab that is not full.
    volume = make_volume((41, 10, 10))
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, size=(41, 10, 10)).astype(np.uint8)
    vols = organ_volumes_ml(labels, volume)
    voxel = 0.7 * 0.7 * 1.25 / 1000
    assert vols["right lung"] == pytest.approx(np.count_nonzero(labels == RIGHT_LUNG) * voxel)
    assert vols["left lung"] == pytest.approx(np.count_nonzero(labels == LEFT_LUNG) * voxel)
