"""evaluate.metrics against hand-computed cases: Dice, hits, false positives, FROC and CPM."""

from __future__ import annotations

import numpy as np
import pytest

from imaging_ai.evaluate.metrics import (
    Detection,
    Outcome,
    ReferenceLesion,
    dice,
    froc_curve,
    hits,
    match,
    size_class,
)
from tests.evaluate.helpers import make_volume

VOLUME = make_volume((40, 40, 40))


def at(x: float, y: float, z: float, score: float = 0.5, reported: bool = True) -> Detection:
    return Detection(centre_mm=(x, y, z), score=score, reported=reported)


def lesion(
    centre: tuple[float, float, float],
    diameter: float,
    voxels: list[tuple[int, int, int]] | None = None,
    relevant: bool = True,
) -> ReferenceLesion:
    idx = np.asarray(voxels or [], np.intp).reshape(-1, 3)
    return ReferenceLesion("x", centre, diameter, idx, relevant=relevant)


def test_dice_by_hand() -> None:
    ref = np.zeros((4, 4), bool)
    pred = np.zeros((4, 4), bool)
    ref[0, :] = True  # 4 voxels
    pred[0, :2] = True  # 2 overlap
    pred[1, :4] = True  # plus 4 elsewhere
    assert dice(ref, pred) == pytest.approx(2 * 2 / (4 + 6))
    assert dice(ref, ref) == 1.0
    assert dice(np.zeros((2, 2), bool), ref[:2, :2]) is None


def test_hit_within_the_lesion_radius() -> None:
    big = lesion((20, 20, 20), 20.0)  # radius 10 mm
    assert hits(at(29, 20, 20), big, VOLUME)
    assert not hits(at(31, 20, 20), big, VOLUME)


def test_hit_radius_is_at_least_5_mm() -> None:
    small = lesion((20, 20, 20), 4.0)  # radius 2 mm, so 5 mm counts
    assert hits(at(20, 24.9, 20), small, VOLUME)
    assert not hits(at(20, 25.1, 20), small, VOLUME)


def test_hit_anywhere_in_the_lesion_mask() -> None:
    # An elongated lesion: its far end is 15 mm from its centre, beyond its 5 mm radius.
    voxels = [(20, 20, i) for i in range(5, 36)]  # (slice, row, col): x from 5 to 35 mm
    long = lesion((20, 20, 20), 10.0, voxels)
    assert hits(at(34.6, 20.2, 19.8), long, VOLUME)
    assert not hits(at(34.6, 22.0, 20), long, VOLUME)


def test_match_counts_each_lesion_once_and_ignores_irrelevant_findings() -> None:
    a = lesion((10, 10, 10), 8.0)
    b = lesion((30, 30, 30), 8.0)
    small = lesion((10, 30, 10), 0.0, relevant=False)
    found = [
        at(10, 10, 11, score=0.6),  # on a, but not its best
        at(11, 10, 10, score=0.9),  # a's hit
        at(10, 31, 10, score=0.99),  # on the irrelevant finding
        at(20, 20, 20, score=0.7),  # nothing there
        at(0, 0, 0, score=0.1),  # nothing there
    ]
    m = match(found, [a, b, small], VOLUME)
    assert m.found_by == (1, None)
    assert m.outcomes == (
        Outcome.IGNORED,
        Outcome.HIT,
        Outcome.IGNORED,
        Outcome.FALSE_POSITIVE,
        Outcome.FALSE_POSITIVE,
    )
    assert (m.found, m.false_positives) == (1, 2)


def test_froc_and_cpm_by_hand() -> None:
    # Two scans, two lesions. Ranked: 0.9 hit, 0.8 FP, 0.6 FP, 0.5 hit, 0.3 FP, 0.2 FP.
    # Points (FP per scan, sensitivity): (0, 0) (0, .5) (.5, .5) (1, .5) (1, 1) (1.5, 1) (2, 1).
    curve = froc_curve([0.9, 0.5], [0.8, 0.6, 0.3, 0.2], lesions_total=2, scans=2)
    assert curve.fps.tolist() == [0, 0, 0.5, 1, 1, 1.5, 2]
    assert curve.sensitivity.tolist() == [0, 0.5, 0.5, 0.5, 1, 1, 1]
    assert curve.points() == {
        "1/8": 0.5,
        "1/4": 0.5,
        "1/2": 0.5,
        "1": 1.0,
        "2": 1.0,
        "4": 1.0,
        "8": 1.0,
    }
    assert curve.cpm() == pytest.approx((3 * 0.5 + 4 * 1.0) / 7)


def test_froc_interpolates_linearly_between_points() -> None:
    # A hit and a false positive at the same score: one step from (0, 0) to (1, 1) on one scan.
    curve = froc_curve([0.7], [0.7], lesions_total=1, scans=1)
    assert curve.at(0.125) == pytest.approx(0.125)
    assert curve.at(0.5) == pytest.approx(0.5)
    assert curve.at(8) == 1.0


def test_froc_with_a_missed_lesion_and_no_detections() -> None:
    curve = froc_curve([0.9], [], lesions_total=2, scans=1)
    assert curve.cpm() == pytest.approx(0.5)
    assert froc_curve([], [], lesions_total=1, scans=1).cpm() == 0.0


def test_size_classes() -> None:
    names = [size_class(d) for d in (3.0, 6.0, 9.99, 10.0, 19.9, 20.0, 45.0)]
    assert names == ["<6 mm", "6-10 mm", "6-10 mm", "10-20 mm", "10-20 mm", ">=20 mm", ">=20 mm"]
