#!/usr/bin/env python3
"""Lesion measurements against phantom nodules of known size, per slice thickness.

For each slice thickness, phantom slabs of the chest are generated with nodules of 5 to 25 mm
(the generator averages 1 mm planes over each slice's thickness), the shipped models run on
them through the daemon's path (``lung-seg``, ``nodule-det``, :func:`detect_lesions`), and each
nodule that a lesion hits is measured twice: as the heat map's component ("before") and as the
lesion segmented from the HU around it ("after", what the daemon reports). ``--detector truth``
seeds the measurement with the phantom's nodule mask instead of the heat map.

Errors are against each nodule's continuous body (:mod:`imaging_ai_devkit.phantom.sizes`): the long
axis in in-plane voxels (pixel spacing), the volume in per cent. Nodules touching the pleura
are left out (the pleura clips their bodies, so the known sizes do not hold), as are those the
slab cuts.

    .venv/bin/python scripts/measure_by_thickness.py                   # the docs' table
    .venv/bin/python scripts/measure_by_thickness.py --studies 2 --thickness 3
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/, for the training package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # imaging_ai without installing
sys.path.insert(2, str(Path(__file__).resolve().parents[1] / "devkit"))  # the development kit

from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate
from training.evaluation import as_loaded, load_models, phantom_volume

from imaging_ai.analyse import lung_labels, model_outputs
from imaging_ai.postprocess import Lesion, detect_lesions
from imaging_ai.volume import Volume

THICKNESSES_MM = (1.0, 2.5, 3.0, 5.0)
SLAB_MM = 90.0
CLASSES_MM = ((5.0, 6.0), (6.0, 10.0), (10.0, 20.0), (20.0, 30.0))
SEED_BASE = 500000  # never used in training, calibration or the reference models' test set


@dataclass(frozen=True)
class Error:
    """One nodule's measurement errors: long axis in voxels, volume in per cent."""

    thickness_mm: float
    diameter_mm: float
    long_voxels: float
    volume_pct: float


def spec(seed: int, thickness: float) -> PhantomSpec:
    """A slab of the mid chest with six nodules of 5 to 25 mm."""
    return PhantomSpec(
        slices=math.ceil(SLAB_MM / thickness),
        seed=seed,
        nodules=6,
        slice_thickness_mm=thickness,
        nodule_diameter_range_mm=(5.0, 25.0),
    )


def measurable(pv: PhantomVolume, volume: Volume) -> list[int]:
    """Nodules whose body the slab holds whole and the pleura does not clip."""
    out = []
    lungs = as_loaded(pv.lung_labels)
    z = pv.positions_mm[:, 2]
    for n, nodule in enumerate(pv.nodules):
        if not (z.min() < nodule.bounds[4] and nodule.bounds[5] < z.max()):
            continue
        centre = volume.lps_to_index(nodule.centre)[::-1]
        reach = nodule.reach + 1.0
        grid = np.indices(volume.hu.shape, sparse=True)
        spacing = volume.spacing_mm[::-1]
        d2 = sum(((g - c) * s) ** 2 for g, c, s in zip(grid, centre, spacing, strict=True))
        if np.all(lungs[d2 <= reach**2] > 0):
            out.append(n)
    return out


def errors(pv: PhantomVolume, volume: Volume, lesions: list[Lesion]) -> list[Error]:
    """Errors of the lesion nearest each measurable nodule, where one hits it."""
    out = []
    pixel = volume.spacing_mm[0]
    for n in measurable(pv, volume):
        nodule, size = pv.nodules[n], pv.nodule_sizes[n]
        hits = [
            les
            for les in lesions
            if math.dist(les.centre_mm, nodule.centre) <= max(5.0, nodule.diameter / 2)
        ]
        if not hits:
            continue
        lesion = min(hits, key=lambda les: math.dist(les.centre_mm, nodule.centre))
        out.append(
            Error(
                thickness_mm=pv.geometry.thickness,
                diameter_mm=nodule.diameter,
                long_voxels=(lesion.long_axis_mm - size.long_axis_mm) / pixel,
                volume_pct=100.0 * (lesion.volume_ml / size.volume_ml - 1.0),
            )
        )
    return out


def run(args: argparse.Namespace) -> dict[str, list[Error]]:
    """Both measurements of every hit nodule, and the time the refinement took."""
    lung_model, nodule_model = load_models(args.engines, threads=2)
    found: dict[str, list[Error]] = {"before": [], "after": []}
    refine_s, plain_s, candidates = 0.0, 0.0, 0
    for thickness in args.thickness:
        for i in range(args.studies):
            pv = generate(spec(SEED_BASE + i, thickness), workers=2)
            volume = phantom_volume(pv)
            if args.detector == "truth":
                lungs = as_loaded(pv.lung_labels)
                outputs = as_loaded(pv.nodule_mask).astype(np.float32)[:, None]
            else:
                lungs = lung_labels(lung_model, volume)
                outputs = model_outputs(nodule_model, volume)
            card = nodule_model.card
            t = time.process_time()
            before = detect_lesions(outputs, card, volume, lungs, refine=False)
            plain_s += time.process_time() - t
            t = time.process_time()
            after = detect_lesions(outputs, card, volume, lungs)
            refine_s += time.process_time() - t
            candidates += len(after)
            found["before"] += errors(pv, volume, before)
            found["after"] += errors(pv, volume, after)
    print(
        f"detect_lesions CPU time over all studies: {plain_s:.2f} s without the segmentation, "
        f"{refine_s:.2f} s with it ({candidates} candidates)"
    )
    return found


def table(found: dict[str, list[Error]], thicknesses: list[float]) -> str:
    """Markdown table: thickness x size class, before -> after."""
    lines = [
        "| slices | nodules | n | long axis, median (voxels) | long axis, worst | "
        "volume, median | volume, worst |",
        "|---|---|---|---|---|---|---|",
    ]
    for thickness in thicknesses:
        for lo, hi in CLASSES_MM:
            pair = [
                [e for e in found[k] if e.thickness_mm == thickness and lo <= e.diameter_mm < hi]
                for k in ("before", "after")
            ]
            if not pair[1]:
                continue
            cells = []
            for field, unit in (("long_voxels", ""), ("volume_pct", " %")):
                values = [np.array([getattr(e, field) for e in part]) for part in pair]
                med = [f"{np.median(v):+.1f}" if v.size else "-" for v in values]
                worst = [f"{v[np.argmax(np.abs(v))]:+.1f}" if v.size else "-" for v in values]
                cells += [f"{med[0]} → **{med[1]}**{unit}", f"{worst[0]} → **{worst[1]}**{unit}"]
            lines.append(
                f"| {thickness:g} mm | {lo:g}–{hi:g} mm | {len(pair[1])} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--thickness", type=float, nargs="+", default=list(THICKNESSES_MM))
    parser.add_argument("--studies", type=int, default=4, help="phantoms per thickness")
    parser.add_argument("--detector", choices=("model", "truth"), default="model")
    parser.add_argument("--engines", type=Path, default=Path(__file__).parents[1] / "engines")
    args = parser.parse_args()
    print(table(run(args), args.thickness))


if __name__ == "__main__":
    main()
