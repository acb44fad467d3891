"""Takes a study's files and the loaded models; gives label maps, lesions, volumes, timings."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import SimpleITK as sitk
from numpy.typing import NDArray

from imaging_ai.candidates import classify_candidates
from imaging_ai.config import EnginesConfig
from imaging_ai.errors import ModelError, UnsupportedInput
from imaging_ai.infer.base import LoadedModel
from imaging_ai.infer.ort import OrtOptions
from imaging_ai.infer.select import load_engine, make_backend
from imaging_ai.inputcheck import input_caveats
from imaging_ai.lungs import lungs_only
from imaging_ai.modelcard import ModelCard, discover_models
from imaging_ai.postprocess import (
    LEFT_LUNG,
    LESION,
    RIGHT_LUNG,
    Lesion,
    detect_lesions,
    labels_on_volume_grid,
    organ_volumes_ml,
    segment_reported,
)
from imaging_ai.preprocess import prepare_slices, resize_back
from imaging_ai.volume import Volume, choose_series, group_series, load_series

RIGHT_LUNG_CODE = "3341006"
LEFT_LUNG_CODE = "44029006"
# Slices mapped back to the source grid at once: bounds memory for 512×512 probabilities.
_SLAB = 32


@dataclass(frozen=True)
class Analysis:
    """What the models found in one volume."""

    volume: Volume
    labels: NDArray[np.uint8]
    lesions: tuple[Lesion, ...]
    organ_volumes_ml: dict[str, float]
    models: dict[str, dict[str, str]]
    timings_s: dict[str, float] = field(default_factory=dict)
    # Every candidate the detector proposed, reported or not (``lesions`` holds the reported
    # ones), and plain-words limits of the input (thick slices, gaps) for every report.
    candidates: tuple[Lesion, ...] = ()
    caveats: tuple[str, ...] = ()
    # The study's other series, by Series Instance UID: why each was not analysed.
    not_analysed: dict[str, str] = field(default_factory=dict)

    def findings_json(self) -> dict[str, Any]:
        """The findings as JSON: lesions, organ volumes, model versions, timings."""
        return {
            "study_uid": self.volume.study_instance_uid,
            "series_uid": self.volume.series_instance_uid,
            "lesions": [lesion.as_json() for lesion in self.lesions],
            "candidates": [lesion.as_json() for lesion in self.candidates],
            "caveats": list(self.caveats),
            "organ_volumes_ml": {k: round(v, 1) for k, v in self.organ_volumes_ml.items()},
            "models": self.models,
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
            "coordinates": "DICOM patient coordinates (LPS), millimetres",
        }


def model_outputs(model: LoadedModel, volume: Volume) -> NDArray[np.float32]:
    """Run a model over every slice; its outputs on the model's grid, (slices, C, h, w)."""
    inputs = prepare_slices(volume, model.card.preprocess)
    batch = model.engine.max_batch_size
    parts = [model.engine.infer(inputs[i : i + batch]) for i in range(0, len(inputs), batch)]
    # The daemon's engines take a whole study at once: no copy of its outputs (up to 90 MB).
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def run_model(model: LoadedModel, volume: Volume) -> Iterator[tuple[slice, NDArray[Any]]]:
    """Run a model over every slice; yield (slices, outputs on the source grid) by slab."""
    outputs = model_outputs(model, volume)
    for start in range(0, len(outputs), _SLAB):
        part = slice(start, min(start + _SLAB, len(outputs)))
        sub = replace(volume, hu=volume.hu[part], sop_instance_uids=volume.sop_instance_uids[part])
        yield part, resize_back(outputs[part], sub)


def lung_labels(model: LoadedModel, volume: Volume) -> NDArray[np.uint8]:
    """Right/left lung map (RIGHT_LUNG, LEFT_LUNG) from a segmentation model, by SNOMED code,
    without the central airways (:func:`imaging_ai.lungs.lungs_only`)."""
    by_code = {RIGHT_LUNG_CODE: RIGHT_LUNG, LEFT_LUNG_CODE: LEFT_LUNG}
    remap = np.zeros(256, np.uint8)
    for label in model.card.labels:
        if label.type.code in by_code:
            remap[label.value] = by_code[label.type.code]
    if not remap.any():
        raise ModelError(f"model {model.card.name} has no right or left lung label")
    labels = labels_on_volume_grid(model_outputs(model, volume), model.card, volume, remap)
    return lungs_only(labels, volume)


def detection_probabilities(model: LoadedModel, volume: Volume) -> NDArray[np.float32]:
    """A detection model's output on the source grid, (slices, C, rows, cols); for evaluation
    scripts (the analysis maps back only around the voxels that can pass)."""
    channels = model.card.output.channels
    out = np.zeros((volume.hu.shape[0], channels, *volume.hu.shape[1:]), np.float32)
    for part, probs in run_model(model, volume):
        out[part] = probs
    return out


def label_map(
    lungs: NDArray[np.uint8], lesions: Sequence[Lesion], volume: Volume
) -> tuple[NDArray[np.uint8], dict[str, float]]:
    """The label map (lungs, each lesion's voxels marked LESION over them) and each lung's
    volume in mL, measured over the lung voxels of that map: nodules apart, as the SEG's lung
    segments are, which the SR's lung volume groups reference (TID 1411 measures the region
    its group references), so that SEG, SR, HL7 and FHIR all mean the same region."""
    labels = lungs.copy()
    for lesion in lesions:
        labels[tuple(lesion.voxel_index.T)] = LESION
    return labels, organ_volumes_ml(labels, volume)


def analyse(
    volume: Volume,
    lungs_model: LoadedModel,
    nodule_model: LoadedModel,
    candidate_model: LoadedModel | None = None,
) -> Analysis:
    """Segment the lungs, detect candidate nodules, decide on each with the candidate classifier
    (when there is one), measure them, and time each step."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    lungs = lung_labels(lungs_model, volume)
    timings[lungs_model.card.name] = time.perf_counter() - t
    t = time.perf_counter()
    outputs = model_outputs(nodule_model, volume)
    timings[nodule_model.card.name] = time.perf_counter() - t
    t = time.perf_counter()
    found = detect_lesions(outputs, nodule_model.card, volume, lungs, refine=False)
    del outputs
    timings["postprocess"] = time.perf_counter() - t
    t = time.perf_counter()
    candidates = classify_candidates(found, volume, lungs, candidate_model)
    if candidate_model is not None:
        timings[candidate_model.card.name] = time.perf_counter() - t
    t = time.perf_counter()
    candidates = segment_reported(candidates, volume, lungs)
    timings["postprocess"] += time.perf_counter() - t
    lesions = tuple(c for c in candidates if c.reported)
    labels, lung_volumes = label_map(lungs, lesions, volume)
    used = (lungs_model, nodule_model, *([candidate_model] if candidate_model else []))
    return Analysis(
        volume=volume,
        labels=labels,
        lesions=lesions,
        organ_volumes_ml=lung_volumes,
        models={m.card.name: _model_id(m.card) for m in used},
        timings_s=timings,
        candidates=tuple(candidates),
        caveats=input_caveats(volume),
    )


def _model_id(card: ModelCard) -> dict[str, str]:
    return {"name": card.name, "version": card.version, "sha256": card.sha256}


@dataclass(frozen=True)
class Models:
    """The models the analysis uses, loaded on the selected backend."""

    lungs: LoadedModel
    nodules: LoadedModel
    backend: str
    candidates: LoadedModel | None = None


@dataclass(frozen=True)
class Cards:
    """The cards of the models the analysis uses: lungs, nodule candidates, and the candidate
    classifier (None when ``[engines] candidate_model`` is empty)."""

    lungs: ModelCard
    nodules: ModelCard
    candidates: ModelCard | None = None

    def all(self) -> tuple[ModelCard, ...]:
        """Every card in use, in the order the analysis runs them."""
        return (self.lungs, self.nodules, *([self.candidates] if self.candidates else []))


_TASKS = {"lung_model": "segmentation", "nodule_model": "detection"}


def discover_cards(config: EnginesConfig) -> Cards:
    """Validate every model folder; return the cards the analysis uses.

    Raises
    ------
    ModelError
        A card is invalid, does not match its ONNX, a configured model is missing, or a
        configured model's card has another task than its key asks for.
    """
    cards = {card.name: card for card in discover_models(Path(config.dir))}
    wanted = {"lung_model": config.lung_model, "nodule_model": config.nodule_model}
    if config.candidate_model:
        wanted["candidate_model"] = config.candidate_model
    missing = [n for n in wanted.values() if n not in cards]
    if missing:
        raise ModelError(
            f"model(s) {', '.join(missing)} not found in engines.dir {config.dir}; "
            f"found: {', '.join(sorted(cards)) or 'none'}"
        )
    for key, name in wanted.items():
        task = _TASKS.get(key, "classification")
        if cards[name].task != task:
            raise ModelError(
                f"[engines] {key} = {name!r}: its card's task is {cards[name].task!r}, "
                f"expected {task!r}"
            )
    extra = cards.get(config.candidate_model) if config.candidate_model else None
    return Cards(cards[config.lung_model], cards[config.nodule_model], extra)


def load_models(config: EnginesConfig, data_dir: Path) -> Models:
    """The models loaded in this process (``imaging-ai infer``; the daemon uses workers)."""
    cards = discover_cards(config)
    cpu = OrtOptions(intra_op_threads=config.cpu_threads, max_batch_size=config.max_batch_size)
    gpu = replace(cpu, precision="fp16" if config.precision == "fp16" else "fp32")
    backend = make_backend(config.backend, data_dir, ort_cpu=cpu, ort_gpu=gpu)

    def load(card: ModelCard) -> LoadedModel:
        return LoadedModel(card, load_engine(backend, card, cpu=cpu))

    extra = load(cards.candidates) if cards.candidates else None
    return Models(load(cards.lungs), load(cards.nodules), backend.name, extra)


def analyse_study(files: list[Path], models: Models) -> Analysis:
    """Pick the study's CT series, build its volume and analyse it."""
    t = time.perf_counter()
    series = group_series(files)
    if not series:
        raise UnsupportedInput("no DICOM image series in the study")
    choice = choose_series(series)
    volume = load_series(series[choice.uid])
    loaded = time.perf_counter() - t
    result = analyse(volume, models.lungs, models.nodules, models.candidates)
    timings = {"load": loaded, **result.timings_s}
    return replace(result, timings_s=timings, not_analysed=choice.not_analysed)


def write_outputs(analysis: Analysis, out: Path) -> None:
    """Write ``labels.nii.gz`` (in the source geometry) and ``findings.json``."""
    out.mkdir(parents=True, exist_ok=True)
    v = analysis.volume
    image = sitk.GetImageFromArray(analysis.labels)
    # SimpleITK's wrappers carry no annotations.
    image.SetSpacing(v.spacing_mm)  # type: ignore[no-untyped-call]
    image.SetOrigin(v.origin_mm)  # type: ignore[no-untyped-call]
    image.SetDirection(tuple(float(x) for x in v.direction.ravel()))  # type: ignore[no-untyped-call]
    sitk.WriteImage(image, str(out / "labels.nii.gz"), useCompression=True)
    findings = {
        **analysis.findings_json(),
        "labels": {"1": "right lung", "2": "left lung", "3": "lesion"},
    }
    (out / "findings.json").write_text(json.dumps(findings, indent=2) + "\n")
