"""A small chest-like analysis with four findings (two reported, two candidates not reported),
its findings JSON and its key images drawn by the daemon's own code, for the study page."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from imaging_ai.analyse import Analysis
from imaging_ai.outputs.keyimages import render_key_images
from imaging_ai.postprocess import LEFT_LUNG, LESION, RIGHT_LUNG, Lesion
from imaging_ai.volume import Volume

SIZE, SLICES = 256, 24
SPACING = (0.9, 0.9, 5.0)
CAVEAT = (
    "Slices are 5.0 mm thick: nodule detection is limited on such slices (nodules under "
    "about 6 mm may be missed); lung volumes are not affected."
)
# (number, centre slice/row/col, radii in voxels (slice, row, col), probability, reported)
FINDINGS = (
    (1, (12, 100, 74), (1, 8, 8), 0.94, True),
    (2, (9, 150, 186), (0, 4, 4), 0.81, True),
    (3, (14, 112, 150), (1, 3, 9), 0.12, False),  # a vessel beside the mediastinum
    (4, (17, 175, 62), (0, 3, 3), 0.31, False),
)


def findings_analysis(study_uid: str) -> Analysis:
    """The analysis: body, lungs, spine, vessels, noise and the four findings."""
    rng = np.random.default_rng(17)
    rows, cols = np.mgrid[:SIZE, :SIZE]
    body = _ellipse(rows, cols, (128, 128), (95, 122))
    right = _ellipse(rows, cols, (122, 76), (72, 42))
    left = _ellipse(rows, cols, (122, 180), (72, 40))
    plane = np.where(body, 40.0, -1000.0)
    plane[right | left] = -860.0
    plane[_ellipse(rows, cols, (208, 128), (14, 14))] = 700.0
    hu = np.repeat(plane[None].astype(np.float32), SLICES, axis=0)
    _vessels(hu, right | left, rng)
    labels = np.zeros(hu.shape, np.uint8)
    labels[:, right], labels[:, left] = RIGHT_LUNG, LEFT_LUNG
    lesions = [_lesion(hu, labels, *spec) for spec in FINDINGS]
    hu += rng.normal(0.0, 18.0, hu.shape).astype(np.float32)
    for lesion in lesions:
        labels[tuple(lesion.voxel_index.T)] = LESION
    volume = Volume(
        hu=hu,
        origin_mm=(-115.0, -115.0, -120.0),
        spacing_mm=SPACING,
        direction=np.eye(3),
        sop_instance_uids=tuple(f"{study_uid}.{k}" for k in range(SLICES)),
        series_instance_uid=f"{study_uid}.1",
        study_instance_uid=study_uid,
        frame_of_reference_uid=f"{study_uid}.2",
    )
    return Analysis(
        volume=volume,
        labels=labels,
        lesions=tuple(x for x in lesions if x.reported),
        organ_volumes_ml={"right lung": 2410.0, "left lung": 2135.0},
        models={"lung-seg": {"name": "lung-seg", "version": "0.1.0", "sha256": ""}},
        candidates=tuple(lesions),
        caveats=(CAVEAT,),
    )


def write_findings(data_dir: Path, study_uid: str, job_id: int) -> dict[str, Any]:
    """Key images into the job's result folder; the report's findings JSON naming it."""
    findings, images = _rendered(study_uid)
    folder = data_dir / "results" / study_uid / str(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in images:
        (folder / name).write_bytes(data)
    return {**findings, "files": {"folder": str(folder.relative_to(data_dir))}}


@cache
def _rendered(study_uid: str) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The findings JSON and the key images as the daemon draws them, once per test run."""
    analysis = findings_analysis(study_uid)
    return analysis.findings_json(), render_key_images(analysis)


def _ellipse(
    rows: np.ndarray, cols: np.ndarray, centre: tuple[int, int], radii: tuple[int, int]
) -> np.ndarray:
    inside: np.ndarray = ((rows - centre[0]) / radii[0]) ** 2 + (
        (cols - centre[1]) / radii[1]
    ) ** 2 <= 1
    return inside


def _vessels(hu: np.ndarray, lungs: np.ndarray, rng: np.random.Generator) -> None:
    """Thin branching-looking lines of soft tissue in the lungs (what a key image shows)."""
    for _ in range(250):
        k = int(rng.integers(0, SLICES))
        r, c = rng.integers(40, 210), rng.integers(30, 226)
        angle, length = rng.uniform(0, np.pi), rng.integers(8, 30)
        t = np.arange(length)
        rr = np.clip((r + t * np.sin(angle)).astype(int), 0, SIZE - 1)
        cc = np.clip((c + t * np.cos(angle)).astype(int), 0, SIZE - 1)
        keep = lungs[rr, cc]
        hu[k, rr[keep], cc[keep]] = 20.0


def _lesion(
    hu: np.ndarray,
    labels: np.ndarray,
    number: int,
    centre: tuple[int, int, int],
    radii: tuple[int, int, int],
    probability: float,
    reported: bool,
) -> Lesion:
    """An ellipsoid of 30 HU painted into ``hu``, measured plainly from its radii."""
    grid = np.mgrid[: hu.shape[0], : hu.shape[1], : hu.shape[2]]
    inside = sum(((g - c) / (r + 0.5)) ** 2 for g, c, r in zip(grid, centre, radii, strict=True))
    idx = np.argwhere(inside <= 1)
    hu[tuple(idx.T)] = 30.0
    long_mm = 2 * (max(radii[1:]) + 0.5) * SPACING[0]
    short_mm = 2 * (min(radii[1:]) + 0.5) * SPACING[0]
    k, r, c = centre
    lesion = Lesion(
        number=number,
        centre_mm=(-115.0 + c * SPACING[0], -115.0 + r * SPACING[1], -120.0 + k * SPACING[2]),
        long_axis_mm=long_mm,
        short_axis_mm=short_mm,
        volume_ml=len(idx) * SPACING[0] * SPACING[1] * SPACING[2] / 1000,
        mean_hu=30.0,
        max_hu=60.0,
        max_probability=0.9,
        side="right" if labels[k, r, c] == RIGHT_LUNG else "left",
        slices=(int(idx[:, 0].min()), int(idx[:, 0].max())),
        voxels=len(idx),
        voxel_index=idx,
    )
    return replace(lesion, probability=probability, reported=reported)
