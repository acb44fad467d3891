"""The candidate classifier stage: patches, probabilities, the operating point, the lung margin."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from imaging_ai.candidates import (
    LUNG_MARGIN_MM,
    candidate_centres,
    candidate_patches,
    classify_candidates,
    extract_patch,
    near_lungs,
    normalise_patches,
    probabilities,
)
from imaging_ai.errors import ModelError
from imaging_ai.infer.base import LoadedModel
from imaging_ai.modelcard import load_model_card
from imaging_ai.postprocess import Lesion
from imaging_ai.volume import Volume

ENGINES = Path(__file__).resolve().parent.parent / "engines"


def volume(hu: np.ndarray, spacing: tuple[float, float, float]) -> Volume:
    n = hu.shape[0]
    return Volume(
        hu=hu.astype(np.float32),
        origin_mm=(0.0, 0.0, 0.0),
        spacing_mm=spacing,
        direction=np.eye(3),
        sop_instance_uids=tuple(f"1.2.3.{k}" for k in range(n)),
        series_instance_uid="1.2.3",
        study_instance_uid="1.2",
        frame_of_reference_uid="1.2.4",
    )


def lesion(number: int, at: tuple[int, int, int], voxels: int = 10) -> Lesion:
    idx = np.array([at], np.intp)
    return Lesion(
        number=number, centre_mm=(0.0, 0.0, 0.0), long_axis_mm=5.0, short_axis_mm=4.0,
        volume_ml=0.1, mean_hu=20.0, max_hu=40.0, max_probability=1.0, side="right",
        slices=(at[0], at[0]), voxels=voxels, voxel_index=idx,
    )  # fmt: skip


def test_patch_at_the_volumes_own_spacing_is_the_voxels_themselves() -> None:
    hu = np.random.default_rng(0).normal(size=(20, 30, 40)).astype(np.float32)
    patch = extract_patch(hu, (1.0, 1.0, 1.0), np.array([10.0, 15.0, 20.0]), (4, 6, 8), 1.0)
    # 4 samples centred on 10 are 8.5..11.5: halfway between voxels, so neighbours' means.
    want = hu[8:13, 12:19, 16:25]
    want = (want[:-1] + want[1:]) / 2
    want = (want[:, :-1] + want[:, 1:]) / 2
    want = (want[:, :, :-1] + want[:, :, 1:]) / 2
    np.testing.assert_allclose(patch, want, rtol=1e-5, atol=1e-5)


def test_patch_resamples_to_millimetres_and_clamps_at_the_edge() -> None:
    # A linear ramp along the slices (z, 2.5 mm apart): resampling is exact on it.
    hu = np.broadcast_to(np.arange(10, dtype=np.float32)[:, None, None] * 100, (10, 8, 8))
    patch = extract_patch(np.ascontiguousarray(hu), (0.5, 0.5, 2.5), np.array([2.0, 4, 4]),
                          (5, 1, 1), 1.25)  # fmt: skip
    # Samples 1.25 mm = half a slice apart, from slice 1.0 to 3.0.
    np.testing.assert_allclose(patch[:, 0, 0], [100, 150, 200, 250, 300], atol=1e-3)
    edge = extract_patch(np.ascontiguousarray(hu), (0.5, 0.5, 2.5), np.array([0.0, 4, 4]),
                         (5, 1, 1), 2.5)  # fmt: skip
    np.testing.assert_allclose(edge[:, 0, 0], [0, 0, 0, 100, 200], atol=1e-3)


def test_patches_are_windowed_and_normalised_as_the_card_says() -> None:
    card = load_model_card(ENGINES / "nodule-fpr")
    p = card.preprocess
    low = p.window_center - p.window_width / 2
    hu = np.array([low - 500, low, low + p.window_width / 2, low + p.window_width + 9], np.float32)
    got = normalise_patches(hu.reshape(1, 1, 4).copy(), card)
    np.testing.assert_allclose(got.ravel(), [0.0, 0.0, 0.5, 1.0])
    z = normalise_patches(
        hu.reshape(1, 1, 4).copy(), replace(card, preprocess=replace(p, normalise="zscore"))
    )
    assert abs(float(z.mean())) < 1e-6 and abs(float(z.std()) - 1.0) < 1e-3


def test_patches_have_the_cards_shape_and_refuse_a_card_without_patch() -> None:
    card = load_model_card(ENGINES / "nodule-fpr")
    v = volume(np.zeros((40, 64, 64)), (0.7, 0.7, 2.5))
    out = candidate_patches(v, np.array([[20.0, 32, 32], [0, 0, 0]]), card)
    assert out.shape == (2, *card.input_shape) and out.dtype == np.float32
    with pytest.raises(ModelError, match="not a candidate classifier"):
        candidate_patches(v, np.zeros((1, 3)), load_model_card(ENGINES / "nodule-det"))


def test_near_lungs_is_the_margin_in_millimetres() -> None:
    lungs = np.zeros((20, 50, 50), np.uint8)
    lungs[:, :, :10] = 1
    v = volume(np.zeros(lungs.shape), (1.0, 1.0, 2.0))
    centres = np.array([[10, 25, 5], [10, 25, 9 + LUNG_MARGIN_MM], [10, 25, 10 + LUNG_MARGIN_MM]])
    assert near_lungs(centres.astype(float), lungs, v, LUNG_MARGIN_MM).tolist() == [
        True, True, False,
    ]  # fmt: skip


class FixedEngine:
    """Answers each patch with the probability written in its first voxel (test double)."""

    max_batch_size = 2

    def __init__(self) -> None:
        self.batches: list[int] = []

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self.batches.append(len(batch))
        return batch[:, 0, 0, 0, :1].copy()


def test_classifier_decides_by_threshold_and_lung_margin_and_numbers_reported_first() -> None:
    card = load_model_card(ENGINES / "nodule-fpr")
    lungs = np.zeros((30, 60, 60), np.uint8)
    lungs[:, 10:50, 10:30] = 1
    v = volume(np.zeros(lungs.shape), (1.0, 1.0, 1.0))
    found = [lesion(1, (15, 20, 20), 50), lesion(2, (15, 30, 25), 40), lesion(3, (15, 30, 58), 30)]
    engine = FixedEngine()
    wanted = {(15, 20, 20): 0.1, (15, 30, 25): 0.9, (15, 30, 58): 0.99}

    def patches(vol: Volume, centres: np.ndarray, c: object) -> np.ndarray:
        out = np.zeros((len(centres), *card.input_shape), np.float32)
        for n, centre in enumerate(centres):
            out[n, 0, 0, 0, 0] = wanted[tuple(int(x) for x in centre)]
        return out

    import imaging_ai.candidates as module

    original = module.candidate_patches
    module.candidate_patches = patches  # type: ignore[assignment]
    try:
        decided = classify_candidates(found, v, lungs, LoadedModel(card, engine))  # type: ignore[arg-type]
    finally:
        module.candidate_patches = original
    assert engine.batches == [2, 1]
    by_voxels = {d.voxels: d for d in decided}
    assert by_voxels[50].probability == pytest.approx(0.1) and not by_voxels[50].reported
    assert by_voxels[40].reported and by_voxels[40].number == 1
    # 0.99, but 28 mm outside the lungs: never reported.
    assert by_voxels[30].probability == pytest.approx(0.99) and not by_voxels[30].reported
    assert [d.number for d in decided] == [1, 2, 3]


def test_without_a_classifier_every_candidate_near_the_lungs_is_reported() -> None:
    lungs = np.zeros((30, 60, 60), np.uint8)
    lungs[:, 10:50, 10:30] = 1
    v = volume(np.zeros(lungs.shape), (1.0, 1.0, 1.0))
    decided = classify_candidates(
        [lesion(1, (15, 20, 20)), lesion(2, (15, 30, 58))], v, lungs, None
    )
    assert [(d.reported, d.probability) for d in decided] == [(True, None), (False, None)]


def test_classifier_looks_at_the_detectors_centre_not_the_segmented_mask() -> None:
    les = replace(lesion(1, (3, 4, 5)), detection_index=(10.0, 11.0, 12.0))
    assert candidate_centres([les]).tolist() == [[10.0, 11.0, 12.0]]
    assert candidate_centres([lesion(1, (3, 4, 5))]).tolist() == [[3.0, 4.0, 5.0]]


def test_probabilities_from_logits_and_sigmoid_outputs() -> None:
    card = load_model_card(ENGINES / "nodule-fpr")
    assert probabilities(np.array([[0.25]]), card).tolist() == [0.25]
    logits = replace(card, output=replace(card.output, kind="logits"))
    assert probabilities(np.array([[0.0]]), logits).tolist() == [0.5]
