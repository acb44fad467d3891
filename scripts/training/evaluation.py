"""Evaluation through the daemon's own path: takes the shipped models and phantom seeds, gives
lung Dice, nodule sensitivity and false positives per study, CPU timing and the cards' quality.

Models load as the daemon loads them (:func:`imaging_ai.modelcard.load_model_card`, the card
check, ONNX Runtime on the CPU with two intra-op threads) and run through
:func:`imaging_ai.analyse.analyse`: the card's preprocessing, batching, resizing back to the
source grid, softmax argmax with the label thresholds, and the detection postprocess (threshold,
26-connected 3-D components, minimum volume). Ground truth comes from the phantom on the same
source grid.

A detection is a hit when its centre lies within max(5 mm, radius) of a true nodule's centre; a
nodule counts as found when some detection hits it; a detection that hits no nodule is a false
positive. Further detections of a nodule already found are neither hits nor false positives.
"""

from __future__ import annotations

import pickle
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate

from imaging_ai.analyse import analyse, detection_probabilities, lung_labels
from imaging_ai.infer.base import LoadedModel
from imaging_ai.infer.ort import OrtBackend, OrtOptions
from imaging_ai.modelcard import ModelCard, load_model_card, validate_against_onnx
from imaging_ai.postprocess import LEFT_LUNG, RIGHT_LUNG, connected_components
from imaging_ai.volume import Volume
from training.data import generate_study

F64 = npt.NDArray[np.float64]
SIZE_BINS_MM = ((0.0, 4.0), (4.0, 6.0), (6.0, 10.0), (10.0, 20.0), (20.0, 99.0))
HIT_MIN_MM = 5.0
THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)
MIN_VOLUMES_MM3 = (0.0, 10.0, 20.0, 30.0, 45.0, 60.0, 80.0, 100.0, 130.0)
"""The detection settings calibration chooses among (and the operating-point table shows)."""


def phantom_volume(pv: PhantomVolume) -> Volume:
    """The :class:`Volume` that :func:`imaging_ai.volume.load_series` reads from the phantom's
    DICOM files, built in memory: HU rounded as stored, slices sorted along the slice normal
    (feet to head, the reverse of the phantom's order), identity direction.

    Writing and reading the files gives the same array and geometry; skipping them saves time.
    Truth arrays of the phantom need :func:`as_loaded` to line up with it.
    """
    n = len(pv.indices)
    last = pv.positions_mm[-1]
    return Volume(
        hu=as_loaded(np.rint(pv.hu)),
        origin_mm=(float(last[0]), float(last[1]), float(last[2])),
        spacing_mm=pv.spacing_mm,
        direction=np.eye(3),
        sop_instance_uids=tuple(f"2.25.{pv.spec.seed}.{k}" for k in range(n)),
        series_instance_uid=f"2.25.{pv.spec.seed}.1",
        study_instance_uid=f"2.25.{pv.spec.seed}.2",
        frame_of_reference_uid=f"2.25.{pv.spec.seed}.3",
    )


def as_loaded(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A phantom array (slices head to feet) in the loaded volume's slice order (feet to head)."""
    return np.ascontiguousarray(array[::-1])


def load_models(engines: Path, threads: int = 2) -> tuple[LoadedModel, LoadedModel]:
    """Load ``engines/lung-seg`` and ``engines/nodule-det`` as the daemon does (CPU, ORT).

    Raises
    ------
    imaging_ai.errors.ModelError
        A card is invalid or does not match its ONNX file.
    """
    backend = OrtBackend(OrtOptions(provider="cpu", intra_op_threads=threads))
    loaded = []
    for name in ("lung-seg", "nodule-det"):
        card = load_model_card(engines / name)
        validate_against_onnx(card)
        loaded.append(LoadedModel(card, backend.load(card)))
    return loaded[0], loaded[1]


def match(centres: F64, nodule_centres: F64, diameters: F64) -> tuple[npt.NDArray[np.bool_], int]:
    """Which nodules some detection hits, and how many detections hit none.

    Parameters
    ----------
    centres : ndarray
        Detection centres ``(M, 3)``, LPS mm.
    nodule_centres, diameters : ndarray
        True nodules ``(K, 3)`` and ``(K,)``, mm.
    """
    if len(centres) == 0 or len(nodule_centres) == 0:
        return np.zeros(len(nodule_centres), bool), len(centres)
    dist = np.linalg.norm(centres[:, None, :] - nodule_centres[None, :, :], axis=2)
    hits = dist <= np.maximum(HIT_MIN_MM, diameters / 2.0)[None, :]
    return hits.any(axis=0), int((~hits.any(axis=1)).sum())


@dataclass(frozen=True)
class StudyResult:
    """What the daemon's path found in one phantom study."""

    seed: int
    slices: int
    thickness_mm: float
    dice_right: float
    dice_left: float
    overlap: tuple[int, int, int, int]  # 2|A∩B| and |A|+|B|, right then left, for pooling
    diameters_mm: tuple[float, ...]
    kinds: tuple[str, ...]
    found: tuple[bool, ...]
    false_positives: int
    seconds: float


def evaluate_study(seed: int, lung: LoadedModel, nodule: LoadedModel) -> StudyResult:
    """Generate held-out phantom ``seed`` and run the daemon's analysis on it.

    Nodules come from :func:`imaging_ai.analyse.analyse`. Dice is scored on the map of
    :func:`imaging_ai.analyse.lung_labels`, which ``analyse`` computes the same way but then
    paints lesions over; scoring the painted map would mix the two models.
    """
    pv = generate_study(seed)
    vol = phantom_volume(pv)
    start = time.perf_counter()
    result = analyse(vol, lung, nodule)
    seconds = time.perf_counter() - start
    lungs = lung_labels(lung, vol)
    overlap = []
    for value in (RIGHT_LUNG, LEFT_LUNG):
        pred, truth = lungs == value, as_loaded(pv.lung_labels) == value
        overlap += [2 * int((pred & truth).sum()), int(pred.sum()) + int(truth.sum())]
    centres = np.array([lesion.centre_mm for lesion in result.lesions]).reshape(-1, 3)
    found, fps = match(centres, pv.nodule_centres_mm, pv.nodule_diameters_mm)
    return StudyResult(
        seed=seed,
        slices=len(pv.indices),
        thickness_mm=pv.geometry.thickness,
        dice_right=_ratio(overlap[0], overlap[1]),
        dice_left=_ratio(overlap[2], overlap[3]),
        overlap=(overlap[0], overlap[1], overlap[2], overlap[3]),
        diameters_mm=tuple(float(d) for d in pv.nodule_diameters_mm),
        kinds=tuple(n.kind for n in pv.nodules),
        found=tuple(bool(f) for f in found),
        false_positives=fps,
        seconds=seconds,
    )


def _ratio(num: int, den: int) -> float:
    """Dice from its counts (1.0 when both masks are empty)."""
    return 1.0 if den == 0 else num / den


def summarise(results: Sequence[StudyResult]) -> dict[str, Any]:
    """Card-ready figures: Dice per lung (pooled, mean, worst), sensitivity per size, FP/study."""
    diam = np.concatenate([r.diameters_mm for r in results])
    found = np.concatenate([r.found for r in results]).astype(bool)
    fps = np.array([r.false_positives for r in results])
    pooled = np.sum([r.overlap for r in results], axis=0)
    out: dict[str, Any] = {
        "dice_right_lung": float(pooled[0] / pooled[1]),
        "dice_left_lung": float(pooled[2] / pooled[3]),
        "dice_right_lung_mean": statistics.fmean(r.dice_right for r in results),
        "dice_left_lung_mean": statistics.fmean(r.dice_left for r in results),
        "dice_right_lung_min": min(r.dice_right for r in results),
        "dice_left_lung_min": min(r.dice_left for r in results),
    }
    big = diam >= 6.0
    out["sensitivity_6mm_plus"] = float(found[big].mean()) if big.any() else float("nan")
    out["nodules_6mm_plus"] = int(big.sum())
    for lo, hi in SIZE_BINS_MM:
        inside = (diam >= lo) & (diam < hi)
        key = f"sensitivity_{lo:g}_{hi:g}mm" if hi < 99 else f"sensitivity_{lo:g}mm_plus"
        out[key] = float(found[inside].mean()) if inside.any() else float("nan")
        out[key.replace("sensitivity", "nodules")] = int(inside.sum())
    out["false_positives_per_study"] = float(fps.mean())
    out["false_positives_max_study"] = int(fps.max())
    out["studies"] = len(results)
    out["slices"] = sum(r.slices for r in results)
    return out


def evaluate(
    seeds: Iterable[int],
    lung: LoadedModel,
    nodule: LoadedModel,
    progress: Callable[[StudyResult], None] | None = None,
) -> list[StudyResult]:
    """Run :func:`evaluate_study` on each seed, reporting each result as it comes."""
    results = []
    for seed in seeds:
        result = evaluate_study(seed, lung, nodule)
        if progress:
            progress(result)
        results.append(result)
    return results


@dataclass(frozen=True)
class Candidates:
    """Detection centres and sizes of one validation study for every threshold tried."""

    by_threshold: dict[float, tuple[F64, npt.NDArray[np.int_]]]
    voxel_ml: float
    nodule_centres: F64
    diameters: F64


def detection_candidates(seed: int, nodule: LoadedModel, thresholds: Sequence[float]) -> Candidates:
    """Run the detector once on a validation phantom; group its heat map at every threshold.

    Components and centres are those :func:`imaging_ai.postprocess.detect_lesions` forms (the
    same connected components on the same grid, centre = mean voxel index mapped to LPS), so the
    minimum volume can be applied afterwards without running the models again.
    """
    pv = generate_study(seed)
    vol = phantom_volume(pv)
    probs = detection_probabilities(nodule, vol)[:, nodule.card.labels[0].channel]
    by_threshold = {}
    for t in thresholds:
        components = connected_components(probs >= t, vol, 1)
        centres = [vol.index_to_lps(idx[:, ::-1].mean(axis=0)) for idx in components]
        sizes = np.array([len(idx) for idx in components], dtype=np.int64)
        by_threshold[t] = (np.array(centres).reshape(-1, 3), sizes)
    return Candidates(
        by_threshold, vol.voxel_volume_ml, pv.nodule_centres_mm, pv.nodule_diameters_mm
    )


def cached_candidates(
    seed: int, nodule: LoadedModel, thresholds: Sequence[float], cache: Path | None
) -> Candidates:
    """:func:`detection_candidates`, kept under ``cache/<model sha256>/<seed>.pkl`` if given.

    Re-running calibration (another false-positive target, another table) then reads what the
    model gave instead of running it again; the file is keyed by the ONNX file's digest, so
    other weights never read it.
    """
    path = None if cache is None else cache / nodule.card.sha256[:16] / f"{seed}.pkl"
    if path is not None and path.exists():
        with path.open("rb") as f:
            found: Candidates = pickle.load(f)
        if set(found.by_threshold) >= set(thresholds):
            return found
    result = detection_candidates(seed, nodule, thresholds)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(result, f)
    return result


def operating_point(
    candidates: Sequence[Candidates], threshold: float, min_volume_mm3: float
) -> tuple[float, float, float]:
    """(sensitivity ≥ 6 mm, sensitivity overall, false positives per study) at one setting."""
    found_big, found_all, fps = [], [], []
    for c in candidates:
        centres, sizes = c.by_threshold[threshold]
        # The daemon's rule (postprocess.detect_lesions): at least this many voxels.
        min_voxels = max(1, int(min_volume_mm3 / (c.voxel_ml * 1000.0)))
        found, fp = match(centres[sizes >= min_voxels], c.nodule_centres, c.diameters)
        found_big.append(found[c.diameters >= 6.0])
        found_all.append(found)
        fps.append(fp)
    big = np.concatenate(found_big)
    return float(big.mean()), float(np.concatenate(found_all).mean()), float(np.mean(fps))


def operating_table(
    candidates: Sequence[Candidates], thresholds: Sequence[float], volumes: Sequence[float]
) -> list[tuple[float, float, float, float, float]]:
    """(threshold, min volume, sensitivity ≥ 6 mm, sensitivity overall, FP/study) per setting."""
    return [(t, v, *operating_point(candidates, t, v)) for t in thresholds for v in volumes]


def format_table(
    table: Sequence[tuple[float, float, float, float, float]], mark: tuple[float, float] | None
) -> str:
    """The operating-point table as text, the card's setting marked."""
    lines = ["threshold  min_mm3  sens>=6mm  sens_all  FP/study"]
    for r in table:
        tag = "  <- card" if mark is not None and r[:2] == mark else ""
        lines.append(f"  {r[0]:.2f}    {r[1]:6.1f}    {r[2]:.3f}     {r[3]:.3f}    {r[4]:.2f}{tag}")
    return "\n".join(lines)


def choose_operating_point(
    candidates: Sequence[Candidates],
    thresholds: Sequence[float],
    min_volumes_mm3: Sequence[float],
    max_fp_per_study: float,
) -> tuple[float, float, list[tuple[float, float, float, float, float]]]:
    """Pick the threshold and minimum volume for the card on validation phantoms.

    Among settings with at most ``max_fp_per_study`` false positives per study, take the highest
    sensitivity for nodules ≥ 6 mm, then the highest overall, then the fewest false positives,
    then the higher threshold (the more conservative). If none meets the target, the setting
    with the fewest false positives.

    Returns
    -------
    tuple
        (threshold, min_volume_mm3, table of (threshold, min volume, sens ≥ 6, sens all, FP)).
    """
    table = operating_table(candidates, thresholds, min_volumes_mm3)
    allowed = [row for row in table if row[4] <= max_fp_per_study]
    if not allowed:  # nothing meets the target: the fewest false positives, then sensitivity
        best = min(table, key=lambda r: (r[4], -r[2], -r[3]))
    else:
        best = max(allowed, key=lambda r: (r[2], r[3], -r[4], r[0]))
    return best[0], best[1], table


def time_study(
    lung: LoadedModel, nodule: LoadedModel, repeats: int, seed: int = 399_999
) -> tuple[list[float], dict[str, float]]:
    """Seconds for ``analyse`` on a 300-slice 512x512 phantom, each repeat, and the best run's
    stage timings (preprocessing is inside each model's figure, postprocessing on its own)."""
    pv = generate(PhantomSpec(slices=300, seed=seed, nodules=5, slice_thickness_mm=1.0))
    vol = phantom_volume(pv)
    seconds, stages = [], {}
    for _ in range(repeats):
        start = time.perf_counter()
        result = analyse(vol, lung, nodule)
        seconds.append(time.perf_counter() - start)
        if seconds[-1] == min(seconds):
            stages = dict(result.timings_s)
    return seconds, stages


def rewrite_quality(card: ModelCard | Path, table: str) -> None:
    """Replace the ``[quality]`` table of a card file with ``table`` (TOML text)."""
    path = card.folder / "model.toml" if isinstance(card, ModelCard) else card
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r"^\[quality\][^\n]*\n(?:(?!\[)[^\n]*\n)*", re.MULTILINE)
    if not pattern.search(text):
        raise ValueError(f"{path}: no [quality] table to replace")
    body = table if table.endswith("\n") else table + "\n"
    path.write_text(pattern.sub(lambda _: body + "\n", text, count=1).replace("\n\n\n", "\n\n"))


def with_detection_setting(card: ModelCard, threshold: float, min_volume_mm3: float) -> ModelCard:
    """The card with its detection label's threshold and minimum volume replaced (in memory)."""
    label = replace(card.labels[0], threshold=threshold, min_volume_mm3=min_volume_mm3)
    return replace(card, labels=(label, *card.labels[1:]))
