"""Real development scans' false candidates as negatives for the candidate classifier.

Takes a CASES folder of development scans (``scripts/fetch_real_ct.py``'s ``dev/``: never the
evaluation-only cases) and gives HU patches of every detector candidate that lies more than
``EXCLUDE_MM`` from any reference mark: any LIDC reader's nodule contour, small-nodule centre or
non-nodule mark, or any point of an RTSTRUCT's contours. What is near a mark is left out, not
used as a positive: real lesions stay for calibration and evaluation.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pydicom

from imaging_ai.analyse import load_models, lung_labels, model_outputs
from imaging_ai.candidates import candidate_centres
from imaging_ai.config import load_config
from imaging_ai.postprocess import detect_lesions
from imaging_ai.progress import echo, progress
from imaging_ai.volume import Volume, group_series, load_series, pick_series
from training.candidates import volume_patches

EXCLUDE_MM = 15.0


def lidc_marks(xml: Path, volume: Volume) -> npt.NDArray[np.float64]:
    """Every LIDC reader mark (contour points, small-nodule and non-nodule loci) in LPS mm."""
    points = []
    for roi in ET.parse(xml).getroot().iter():
        tag = roi.tag.rsplit("}", 1)[-1]
        if tag not in ("roi", "locus"):
            continue
        z_text = _child(roi, "imageZposition")
        if z_text is None:
            continue
        for edge in [roi] if tag == "locus" else [e for e in roi if e.tag.endswith("edgeMap")]:
            x, y = _child(edge, "xCoord"), _child(edge, "yCoord")
            if x is not None and y is not None:
                lps = volume.index_to_lps([float(x), float(y), 0.0])
                points.append([lps[0], lps[1], float(z_text)])
    return np.asarray(points, np.float64).reshape(-1, 3)


def _child(node: ET.Element, name: str) -> str | None:
    for child in node:
        if child.tag.rsplit("}", 1)[-1] == name:
            return child.text
    return None


def rtstruct_marks(path: Path) -> npt.NDArray[np.float64]:
    """Every contour point of every ROI of an RTSTRUCT, LPS mm."""
    ds = pydicom.dcmread(path)
    points = [
        np.asarray(c.ContourData, np.float64).reshape(-1, 3)
        for roi in ds.ROIContourSequence
        for c in getattr(roi, "ContourSequence", [])
    ]
    return np.concatenate(points) if points else np.zeros((0, 3))


def case_negatives(case: Path, models: object, threshold: float) -> npt.NDArray[np.float16]:
    """HU patches of one development case's candidates away from every reference mark."""
    series = group_series(sorted((case / "image").rglob("*.dcm")))
    volume = load_series(series[pick_series(series)])
    marks = (
        lidc_marks(case / "lesions.xml", volume)
        if (case / "lesions.xml").exists()
        else rtstruct_marks(case / "rtstruct.dcm")
    )
    lungs = lung_labels(models.lungs, volume)  # type: ignore[attr-defined]
    nodules = models.nodules  # type: ignore[attr-defined]
    card = nodules.card
    card = replace(card, labels=(replace(card.labels[0], threshold=threshold), *card.labels[1:]))
    found = detect_lesions(model_outputs(nodules, volume), card, volume, lungs)
    centres = candidate_centres(found)
    lps = volume.index_to_lps(centres[:, ::-1])
    dist = np.linalg.norm(lps[:, None, :] - marks[None, :, :], axis=2).min(axis=1)
    keep = centres[dist > EXCLUDE_MM]
    echo(f"{case.name}: {len(found)} candidates at {threshold}, {len(keep)} kept as negatives")
    return volume_patches(volume.hu, volume.spacing_mm, keep)


def stage_real(args: argparse.Namespace) -> None:
    """Write the development scans' negatives to ``args.real_out``."""
    config = load_config(Path("deploy/imaging-ai.dev.toml"))
    models = load_models(config.engines, Path("var"))
    cases = sorted(p for p in Path(args.cases).iterdir() if (p / "image").is_dir())
    if any("pycerr" in c.name for c in cases):
        raise SystemExit("pycerr cases are for evaluation only; pass the dev/ folder")
    bar = progress(cases, desc="real", unit="case", force=args.progress)
    patches = np.concatenate([case_negatives(c, models, args.real_threshold) for c in bar])
    Path(args.real_out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.real_out, patches=patches)
    print(f"{len(patches)} real negatives -> {args.real_out}")
