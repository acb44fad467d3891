"""Takes a volume and the loaded models and gives label maps, lesions, organ volumes and timings."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from imaging_ai.errors import ModelError
from imaging_ai.infer.base import Engine
from imaging_ai.modelcard import ModelCard
from imaging_ai.postprocess import (
    LEFT_LUNG,
    LESION,
    RIGHT_LUNG,
    Lesion,
    detect_lesions,
    organ_volumes_ml,
    segment_labels,
)
from imaging_ai.preprocess import PreprocessSpec, prepare_slices, resize_back
from imaging_ai.volume import Volume

RIGHT_LUNG_CODE = "3341006"
LEFT_LUNG_CODE = "44029006"
# Slices mapped back to the source grid at once: bounds memory for 512×512 probabilities.
_SLAB = 32


@dataclass(frozen=True)
class LoadedModel:
    """A model card with its engine, ready to run."""

    card: ModelCard
    engine: Engine


@dataclass(frozen=True)
class Analysis:
    """What the models found in one volume."""

    volume: Volume
    labels: NDArray[np.uint8]
    lesions: tuple[Lesion, ...]
    organ_volumes_ml: dict[str, float]
    models: dict[str, dict[str, str]]
    timings_s: dict[str, float] = field(default_factory=dict)

    def findings_json(self) -> dict[str, Any]:
        """The findings as JSON: lesions, organ volumes, model versions, timings."""
        return {
            "study_uid": self.volume.study_instance_uid,
            "series_uid": self.volume.series_instance_uid,
            "lesions": [lesion.as_json() for lesion in self.lesions],
            "organ_volumes_ml": {k: round(v, 1) for k, v in self.organ_volumes_ml.items()},
            "models": self.models,
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
            "coordinates": "DICOM patient coordinates (LPS), millimetres",
        }


def spec_from_card(card: ModelCard) -> PreprocessSpec:
    """The preprocessing a card asks for."""
    p = card.preprocess
    return PreprocessSpec(
        window_center=p.window_center,
        window_width=p.window_width,
        normalise=p.normalise,
        denoise=p.denoise,
        denoise_sigma_mm=p.denoise_sigma_mm,
        input_size=(card.input.height, card.input.width),
    )


def run_model(model: LoadedModel, volume: Volume) -> Iterator[tuple[slice, NDArray[Any]]]:
    """Run a model over every slice; yield (slices, outputs on the source grid) by slab."""
    inputs = prepare_slices(volume, spec_from_card(model.card))
    batch = model.engine.max_batch_size
    outputs = np.concatenate(
        [model.engine.infer(inputs[i : i + batch]) for i in range(0, len(inputs), batch)]
    )
    for start in range(0, len(outputs), _SLAB):
        part = slice(start, min(start + _SLAB, len(outputs)))
        sub = replace(volume, hu=volume.hu[part], sop_instance_uids=volume.sop_instance_uids[part])
        yield part, resize_back(outputs[part], sub)


def lung_labels(model: LoadedModel, volume: Volume) -> NDArray[np.uint8]:
    """Right/left lung map (RIGHT_LUNG, LEFT_LUNG) from a segmentation model, by SNOMED code."""
    by_code = {RIGHT_LUNG_CODE: RIGHT_LUNG, LEFT_LUNG_CODE: LEFT_LUNG}
    remap = np.zeros(256, np.uint8)
    for label in model.card.labels:
        if label.type.code in by_code:
            remap[label.value] = by_code[label.type.code]
    if not remap.any():
        raise ModelError(f"model {model.card.name} has no right or left lung label")
    out = np.zeros(volume.hu.shape, np.uint8)
    for part, probs in run_model(model, volume):
        out[part] = remap[segment_labels(probs, model.card)]
    return out


def detection_probabilities(model: LoadedModel, volume: Volume) -> NDArray[np.float32]:
    """A detection model's output on the source grid, (slices, C, rows, cols)."""
    channels = model.card.output.channels
    out = np.zeros((volume.hu.shape[0], channels, *volume.hu.shape[1:]), np.float32)
    for part, probs in run_model(model, volume):
        out[part] = probs
    return out


def analyse(volume: Volume, lungs_model: LoadedModel, nodule_model: LoadedModel) -> Analysis:
    """Segment the lungs, detect nodules, measure them, and time each step."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    lungs = lung_labels(lungs_model, volume)
    timings[lungs_model.card.name] = time.perf_counter() - t
    t = time.perf_counter()
    probs = detection_probabilities(nodule_model, volume)
    timings[nodule_model.card.name] = time.perf_counter() - t
    t = time.perf_counter()
    lesions = detect_lesions(probs, nodule_model.card, volume, lungs)
    del probs
    labels = lungs.copy()
    for lesion in lesions:
        labels[tuple(lesion.voxel_index.T)] = LESION
    timings["postprocess"] = time.perf_counter() - t
    return Analysis(
        volume=volume,
        labels=labels,
        lesions=tuple(lesions),
        organ_volumes_ml=organ_volumes_ml(lungs, volume),
        models={m.card.name: _model_id(m.card) for m in (lungs_model, nodule_model)},
        timings_s=timings,
    )


def _model_id(card: ModelCard) -> dict[str, str]:
    return {"name": card.name, "version": card.version, "sha256": card.sha256}
