"""Takes a CASES folder and the configured models; gives each case's scores and the overall ones.

Every case goes through the daemon's own analysis (:func:`analyse_volume`: the same
preprocessing, engines and postprocessing as a study received over DICOM), then is scored
against its references (:mod:`imaging_ai.evaluate.metrics`) and drawn
(:mod:`imaging_ai.evaluate.report`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from imaging_ai import progress as bars
from imaging_ai.analyse import Analysis, Models, analyse
from imaging_ai.evaluate.cases import Case, find_cases, load_case
from imaging_ai.evaluate.metrics import (
    SIZE_CLASSES,
    Detection,
    FrocCurve,
    Match,
    Outcome,
    ReferenceLesion,
    dice,
    froc_curve,
    match,
    size_class,
)
from imaging_ai.postprocess import LEFT_LUNG, RIGHT_LUNG
from imaging_ai.volume import Volume


def analyse_volume(volume: Volume, models: Models) -> Analysis:
    """The daemon's analysis of one volume (the one place that calls it here)."""
    return analyse(volume, models.lungs, models.nodules, models.candidates)


def detections_of(analysis: Analysis) -> list[Detection]:
    """Every candidate (or, where the analysis lists none, every reported lesion), scored by
    the classifier's probability or else the detector's highest probability."""
    found = analysis.candidates or analysis.lesions
    return [
        Detection(
            centre_mm=lesion.centre_mm,
            score=lesion.max_probability if lesion.probability is None else lesion.probability,
            reported=lesion.reported,
            long_axis_mm=lesion.long_axis_mm,
            voxels=lesion.voxel_index,
        )
        for lesion in found
    ]


def predicted_lungs(analysis: Analysis) -> NDArray[np.uint8]:
    """The analysis's lung map with lesion voxels given back to their lung's side (the label
    map marks reported lesions over the lungs; a lung reference includes its nodules)."""
    labels = analysis.labels.copy()
    code = {"right": RIGHT_LUNG, "left": LEFT_LUNG}
    for lesion in analysis.lesions:
        labels[tuple(lesion.voxel_index.T)] = code.get(lesion.side, 0)
    labels[(labels != RIGHT_LUNG) & (labels != LEFT_LUNG)] = 0
    return labels


@dataclass(frozen=True, eq=False)
class CaseResult:
    """One case scored: what summary.json, the table and the FROC need of it."""

    name: str
    slices: int
    spacing_mm: tuple[float, float, float]
    seconds: float
    dice_right: float | None
    dice_left: float | None
    lesions: tuple[ReferenceLesion, ...]
    detections: tuple[Detection, ...]
    at_operating_point: Match  # the reported detections against the lesions
    all_candidates: Match  # every detection against the lesions (for the FROC)

    @property
    def reported(self) -> list[Detection]:
        """The detections the analysis reported."""
        return [d for d in self.detections if d.reported]

    @property
    def relevant(self) -> list[ReferenceLesion]:
        """The lesions scored (irrelevant findings left out)."""
        return [lesion for lesion in self.lesions if lesion.relevant]

    def froc_scores(self) -> tuple[list[float], list[float]]:
        """Scores of the credited hits and of the false positives, over every candidate."""
        m = self.all_candidates
        hit = [self.detections[d].score for d in m.found_by if d is not None]
        fps = [
            self.detections[i].score
            for i, o in enumerate(m.outcomes)
            if o is Outcome.FALSE_POSITIVE
        ]
        return hit, fps


def score_case(case: Case, analysis: Analysis, seconds: float) -> CaseResult:
    """Score one analysed case against its references."""
    detections = tuple(detections_of(analysis))
    lesions = case.lesions or ()
    right = left = None
    if case.lungs is not None:
        mine = predicted_lungs(analysis)
        right = dice(case.lungs == RIGHT_LUNG, mine == RIGHT_LUNG)
        left = dice(case.lungs == LEFT_LUNG, mine == LEFT_LUNG)
    return CaseResult(
        name=case.name,
        slices=int(case.volume.hu.shape[0]),
        spacing_mm=case.volume.spacing_mm,
        seconds=seconds,
        dice_right=right,
        dice_left=left,
        lesions=tuple(lesions),
        detections=detections,
        at_operating_point=match_reported(detections, lesions, case.volume),
        all_candidates=match(detections, lesions, case.volume),
    )


def match_reported(
    detections: Sequence[Detection], lesions: Sequence[ReferenceLesion], volume: Volume
) -> Match:
    """The reported detections against the lesions, indexed as ``detections`` (the others
    count as ignored)."""
    index = [i for i, d in enumerate(detections) if d.reported]
    m = match([detections[i] for i in index], lesions, volume)
    outcomes = [Outcome.IGNORED] * len(detections)
    for j, i in enumerate(index):
        outcomes[i] = m.outcomes[j]
    return Match(tuple(None if d is None else index[d] for d in m.found_by), tuple(outcomes))


def evaluate_folder(
    cases_dir: Path, models: Models, out: Path, *, progress: bool | None = None
) -> list[CaseResult]:
    """Analyse and score every case under ``cases_dir``; draw each case's PNGs under ``out``.

    ``progress``: a bar on stderr (True), none (False), or one when stderr is a terminal (None).
    """
    from imaging_ai.evaluate.report import draw_case

    results = []
    folders = find_cases(cases_dir)
    bar = bars.progress(folders, desc="evaluate", unit="case", force=progress)
    for folder in bar:
        bar.set_postfix_str(folder.name)
        case = load_case(folder)
        t = time.perf_counter()
        analysis = analyse_volume(case.volume, models)
        result = score_case(case, analysis, time.perf_counter() - t)
        draw_case(case, predicted_lungs(analysis), result, out / "cases" / case.name)
        results.append(result)
    return results


def sensitivity_by_size(
    lesions: Sequence[ReferenceLesion], found: Sequence[bool]
) -> dict[str, dict[str, Any]]:
    """Found / total / sensitivity per size class (by the reference's long axis)."""
    out: dict[str, dict[str, Any]] = {}
    for name, _, _ in SIZE_CLASSES:
        picks = [
            f
            for lesion, f in zip(lesions, found, strict=True)
            if size_class(lesion.diameter_mm) == name
        ]
        out[name] = {
            "found": sum(picks),
            "total": len(picks),
            "sensitivity": sum(picks) / len(picks) if picks else None,
        }
    return out


def case_summary(result: CaseResult) -> dict[str, Any]:
    """One case's entry in summary.json."""
    op = result.at_operating_point
    found = [d is not None for d in op.found_by]
    hit, fps = result.froc_scores()
    curve = froc_curve(hit, fps, len(result.relevant), 1)
    return {
        "name": result.name,
        "slices": result.slices,
        "spacing_mm": [round(s, 3) for s in result.spacing_mm],
        "seconds": round(result.seconds, 2),
        "dice_right": _round(result.dice_right),
        "dice_left": _round(result.dice_left),
        "lesions_found": op.found,
        "lesions_total": len(result.relevant),
        "reported": len(result.reported),
        "false_positives": op.false_positives,
        "fp_per_scan": float(op.false_positives),
        "sensitivity": sensitivity_by_size(result.relevant, found),
        "froc": {k: round(v, 4) for k, v in curve.points().items()},
        "cpm": round(curve.cpm(), 4),
        "lesions": [
            _lesion_json(lesion, f) for lesion, f in zip(result.relevant, found, strict=True)
        ],
        "irrelevant_findings": sum(not lesion.relevant for lesion in result.lesions),
        "detections": [
            _detection_json(d, op.outcomes[i], result.all_candidates.outcomes[i])
            for i, d in enumerate(result.detections)
        ],
    }


def froc_of(results: Sequence[CaseResult]) -> FrocCurve:
    """The FROC curve over all cases' candidates."""
    hits: list[float] = []
    fps: list[float] = []
    for result in results:
        h, f = result.froc_scores()
        hits += h
        fps += f
    lesions = sum(len(r.relevant) for r in results)
    return froc_curve(hits, fps, lesions, len(results))


def overall_summary(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The scores over all cases (Dice: the mean of the cases that have a lung reference)."""
    lesions = [lesion for r in results for lesion in r.relevant]
    found = [d is not None for r in results for d in r.at_operating_point.found_by]
    false_positives = sum(r.at_operating_point.false_positives for r in results)
    curve = froc_of(results)
    return {
        "cases": len(results),
        "dice_right": _mean([r.dice_right for r in results]),
        "dice_left": _mean([r.dice_left for r in results]),
        "lesions_found": sum(found),
        "lesions_total": len(lesions),
        "reported": sum(len(r.reported) for r in results),
        "false_positives": false_positives,
        "fp_per_scan": round(false_positives / max(len(results), 1), 4),
        "sensitivity": sensitivity_by_size(lesions, found),
        "froc": {k: round(v, 4) for k, v in curve.points().items()},
        "cpm": round(curve.cpm(), 4),
        "seconds": round(sum(r.seconds for r in results), 2),
    }


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(float(np.mean(present)), 4) if present else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _lesion_json(lesion: ReferenceLesion, found: bool) -> dict[str, Any]:
    return {
        "name": lesion.name,
        "centre_mm": [round(c, 1) for c in lesion.centre_mm],
        "long_axis_mm": round(lesion.diameter_mm, 1),
        "size_class": size_class(lesion.diameter_mm),
        "readers": lesion.readers,
        "found": found,
    }


def _detection_json(d: Detection, at_op: Outcome, over_all: Outcome) -> dict[str, Any]:
    return {
        "centre_mm": [round(c, 1) for c in d.centre_mm],
        "score": round(d.score, 4),
        "long_axis_mm": round(d.long_axis_mm, 1),
        "reported": d.reported,
        "outcome": str(at_op if d.reported else over_all),
    }
