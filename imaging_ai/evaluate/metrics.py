"""Takes detections and reference findings; gives Dice, hits, false positives, FROC and CPM.

The rules follow the LUNA16 challenge's evaluation (Setio et al., Med Image Anal 2017):

- a detection hits a reference lesion when its centre lies within the lesion's mask, or within
  max(5 mm, the lesion's radius) of the lesion's centre (radius: half its long axis);
- each lesion is counted once: the highest-scoring detection that hits it is the hit, other
  detections on it are neither hits nor false positives;
- a detection that hits only irrelevant findings (LIDC nodules < 3 mm, non-nodules) is ignored;
- every other detection is a false positive;
- the FROC curve joins the (false positives per scan, sensitivity) points reached as the score
  threshold falls; sensitivity at a given rate is interpolated linearly between them, and the
  CPM is the mean sensitivity at 1/8, 1/4, 1/2, 1, 2, 4 and 8 false positives per scan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from imaging_ai.postprocess import axial_diameters
from imaging_ai.volume import Volume

MIN_HIT_RADIUS_MM = 5.0
FROC_RATES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# Size classes by the reference's long axis (mm): name, lower bound (inclusive), upper bound.
SIZE_CLASSES = (
    ("<6 mm", 0.0, 6.0),
    ("6-10 mm", 6.0, 10.0),
    ("10-20 mm", 10.0, 20.0),
    (">=20 mm", 20.0, math.inf),
)


def _no_voxels() -> NDArray[np.intp]:
    return np.zeros((0, 3), np.intp)


@dataclass(frozen=True, eq=False)
class ReferenceLesion:
    """One reference finding on the image's grid.

    ``voxels`` are (slice, row, column) indices, empty for a finding marked by a point only.
    ``relevant`` is False for findings a detection is neither credited nor blamed for;
    ``readers`` counts the LIDC readers who marked it as a nodule >= 3 mm (0 elsewhere).
    """

    name: str
    centre_mm: tuple[float, float, float]
    diameter_mm: float
    voxels: NDArray[np.intp] = field(default_factory=_no_voxels, repr=False)
    relevant: bool = True
    readers: int = 0

    @property
    def hit_radius_mm(self) -> float:
        """How far from the centre a detection still hits: max(5 mm, the lesion's radius)."""
        return max(MIN_HIT_RADIUS_MM, self.diameter_mm / 2.0)


@dataclass(frozen=True, eq=False)
class Detection:
    """One candidate or reported lesion from the analysis, with the score it is ranked by."""

    centre_mm: tuple[float, float, float]
    score: float
    reported: bool
    long_axis_mm: float = 0.0
    voxels: NDArray[np.intp] = field(default_factory=_no_voxels, repr=False)


class Outcome(StrEnum):
    """What a detection counted as."""

    HIT = "hit"
    FALSE_POSITIVE = "false positive"
    # On a lesion another detection already hit, or on an irrelevant finding.
    IGNORED = "ignored"


@dataclass(frozen=True)
class Match:
    """How one case's detections met its lesions.

    ``found_by`` holds, per relevant lesion, the index of the detection credited with it (or
    None); ``outcomes`` holds each detection's outcome.
    """

    found_by: tuple[int | None, ...]
    outcomes: tuple[Outcome, ...]

    @property
    def found(self) -> int:
        """Relevant lesions hit."""
        return sum(d is not None for d in self.found_by)

    @property
    def false_positives(self) -> int:
        """Detections that hit nothing."""
        return sum(o is Outcome.FALSE_POSITIVE for o in self.outcomes)


def reference_from_voxels(
    name: str, idx: NDArray[np.intp], volume: Volume, *, relevant: bool = True, readers: int = 0
) -> ReferenceLesion:
    """A reference lesion from its voxels (slice, row, col): centroid and long axis."""
    centre = volume.index_to_lps(idx[:, ::-1].mean(axis=0))
    long_axis, _ = axial_diameters(idx, volume)
    return ReferenceLesion(
        name=name,
        centre_mm=(float(centre[0]), float(centre[1]), float(centre[2])),
        diameter_mm=long_axis,
        voxels=idx,
        relevant=relevant,
        readers=readers,
    )


def hits(detection: Detection, lesion: ReferenceLesion, volume: Volume) -> bool:
    """Whether the detection's centre is in the lesion's mask or within its hit radius."""
    gap = np.linalg.norm(np.subtract(detection.centre_mm, lesion.centre_mm))
    if gap <= lesion.hit_radius_mm:
        return True
    if not len(lesion.voxels):
        return False
    kji = np.rint(volume.lps_to_index(detection.centre_mm)).astype(np.intp)[::-1]
    return bool(np.all(lesion.voxels == kji, axis=1).any())


def match(
    detections: Sequence[Detection], lesions: Sequence[ReferenceLesion], volume: Volume
) -> Match:
    """Score detections against lesions by the rules in the module's docstring."""
    relevant = [lesion for lesion in lesions if lesion.relevant]
    irrelevant = [lesion for lesion in lesions if not lesion.relevant]
    found_by: list[int | None] = [None] * len(relevant)
    on_lesion: list[bool] = []
    for d, detection in enumerate(detections):
        hit = [n for n, lesion in enumerate(relevant) if hits(detection, lesion, volume)]
        for n in hit:
            best = found_by[n]
            if best is None or detection.score > detections[best].score:
                found_by[n] = d
        on_lesion.append(bool(hit) or any(hits(detection, x, volume) for x in irrelevant))
    credited = {d for d in found_by if d is not None}
    outcomes = tuple(
        Outcome.HIT if d in credited else Outcome.IGNORED if near else Outcome.FALSE_POSITIVE
        for d, near in enumerate(on_lesion)
    )
    return Match(tuple(found_by), outcomes)


def dice(reference: NDArray[np.bool_], predicted: NDArray[np.bool_]) -> float | None:
    """Dice overlap of two masks; None when the reference is empty (nothing to score)."""
    ref = int(np.count_nonzero(reference))
    if ref == 0:
        return None
    both = int(np.count_nonzero(reference & predicted))
    return 2.0 * both / (ref + int(np.count_nonzero(predicted)))


def size_class(diameter_mm: float) -> str:
    """The size class a lesion's long axis falls in."""
    return next(name for name, low, high in SIZE_CLASSES if low <= diameter_mm < high)


@dataclass(frozen=True)
class FrocCurve:
    """The FROC curve's points in the order reached: false positives per scan, sensitivity."""

    fps: NDArray[np.float64]
    sensitivity: NDArray[np.float64]

    def at(self, rate: float) -> float:
        """Sensitivity at ``rate`` false positives per scan, interpolated linearly.

        Between the last point at or below the rate (the highest sensitivity reached there) and
        the next point; beyond the curve's end, its last sensitivity (as LUNA16's script does).
        """
        j = int(np.searchsorted(self.fps, rate, side="right")) - 1
        if j >= len(self.fps) - 1:
            return float(self.sensitivity[-1])
        f0, f1 = self.fps[j], self.fps[j + 1]
        s0, s1 = self.sensitivity[j], self.sensitivity[j + 1]
        return float(s0 + (s1 - s0) * (rate - f0) / (f1 - f0))

    def points(self) -> dict[str, float]:
        """Sensitivity at each of LUNA16's seven rates, keyed by the rate as text."""
        return {_rate_key(rate): self.at(rate) for rate in FROC_RATES}

    def cpm(self) -> float:
        """The competition performance metric: mean sensitivity at LUNA16's seven rates."""
        return float(np.mean([self.at(rate) for rate in FROC_RATES]))


def _rate_key(rate: float) -> str:
    return {0.125: "1/8", 0.25: "1/4", 0.5: "1/2"}.get(rate, f"{rate:g}")


def froc_curve(
    hit_scores: Sequence[float], fp_scores: Sequence[float], lesions_total: int, scans: int
) -> FrocCurve:
    """The FROC curve over all cases' scored detections.

    Parameters
    ----------
    hit_scores
        The score of each lesion's credited detection (one per lesion found).
    fp_scores
        The score of each false positive.
    lesions_total
        Relevant lesions over all cases (the sensitivity's denominator).
    scans
        Cases (the false positive rate's denominator).
    """
    scores = np.asarray([*hit_scores, *fp_scores], np.float64)
    is_hit = np.r_[np.ones(len(hit_scores)), np.zeros(len(fp_scores))]
    order = np.argsort(-scores, kind="stable")
    scores, is_hit = scores[order], is_hit[order]
    # One point per distinct score: everything at or above it is called positive.
    last = np.r_[np.flatnonzero(np.diff(scores) != 0), len(scores) - 1].astype(np.intp)
    last = last[last >= 0]
    hits_so_far = np.cumsum(is_hit)[last]
    fps_so_far = np.cumsum(1.0 - is_hit)[last]
    return FrocCurve(
        fps=np.r_[0.0, fps_so_far / max(scans, 1)],
        sensitivity=np.r_[0.0, hits_so_far / max(lesions_total, 1)],
    )
