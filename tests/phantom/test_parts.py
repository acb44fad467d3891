"""Pieces of the phantom's negatives, one at a time: spec draws, contrast, kernels, labels."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from imaging_ai_devkit.phantom import PhantomSpec
from imaging_ai_devkit.phantom.canvas import Grid
from imaging_ai_devkit.phantom.cli import add_arguments, spec_from_args
from imaging_ai_devkit.phantom.contrast import UNENHANCED, enhancement
from imaging_ai_devkit.phantom.diaphragm import Dome
from imaging_ai_devkit.phantom.patient import draw_patient, drawn_spec
from imaging_ai_devkit.phantom.scanner import Scanner
from imaging_ai_devkit.phantom.structures import BOWEL, DIAPHRAGM, NONE, combine, structure_of
from imaging_ai_devkit.phantom.trees import Tree, lumen


def test_unset_options_are_drawn_per_seed_and_set_ones_kept() -> None:
    drawn = [drawn_spec(PhantomSpec(seed=s)) for s in range(60)]
    assert {d.contrast for d in drawn} == {True, False}
    assert {d.kernel for d in drawn} == {"soft", "standard", "sharp"}
    assert {d.atelectasis for d in drawn} == {True, False}
    assert {d.dense_contrast for d in drawn if d.contrast} == {True, False}
    assert not any(d.dense_contrast for d in drawn if not d.contrast)
    assert drawn_spec(PhantomSpec(seed=3)) == drawn_spec(PhantomSpec(seed=3))
    fixed = PhantomSpec(seed=3, contrast=False, kernel="soft", atelectasis=False)
    assert drawn_spec(fixed) == PhantomSpec(
        seed=3, contrast=False, kernel="soft", atelectasis=False, dense_contrast=False
    )
    with pytest.raises(ValueError, match="dense_contrast"):
        PhantomSpec(contrast=False, dense_contrast=True)


def test_contrast_phases_enhance_blood_to_150_400_hu_and_plain_studies_stay_plain() -> None:
    for seed in range(30):
        plain = draw_patient(PhantomSpec(seed=seed, contrast=False))
        assert enhancement(plain) == UNENHANCED
        enh = enhancement(draw_patient(PhantomSpec(seed=seed, contrast=True)))
        for hu in (enh.systemic, enh.pulmonary, enh.venous):
            assert 150 <= hu <= 400


def _edge_and_noise(kernel: str, boost: float) -> tuple[float, float]:
    """Overshoot (HU) of a 1000 HU step, and the lag-1 noise correlation, for a kernel."""
    grid = Grid(128, 0.7, -45.0, -45.0)
    step = np.where(np.arange(128)[None, :] < 64, 0.0, 1000.0).repeat(128, 0).astype(np.float32)
    scanner = Scanner(grid, kernel, 0.0, 0.0, boost=boost)  # type: ignore[arg-type]
    body = np.full_like(step, 2.0)
    image = scanner.reconstruct(step.copy(), body, np.random.default_rng(0))
    noise = Scanner(grid, kernel, 1.0, 0.0, boost=boost)._noise(  # type: ignore[arg-type]
        Scanner(grid, kernel, 1.0, 0.0, boost=boost)._filters[1], np.random.default_rng(1)
    )
    corr = float(np.mean(noise[:, 1:] * noise[:, :-1]) / np.mean(noise * noise))
    return float(image[64, 60:80].max() - 1000.0), corr


def test_sharp_kernels_overshoot_edges_and_soft_ones_give_coarse_noise() -> None:
    sharp_overshoot, sharp_corr = _edge_and_noise("sharp", 2.0)
    soft_overshoot, soft_corr = _edge_and_noise("soft", 0.0)
    assert sharp_overshoot > 30.0
    assert soft_overshoot <= 1.0
    assert soft_corr > sharp_corr + 0.2  # soft noise is blotchy, sharp noise fine-grained


def test_bronchial_walls_are_1_to_2_mm_near_the_hila_and_thinner_beyond() -> None:
    r = np.array([6.0, 4.0, 3.0, 1.5, 1.0])
    pts = np.zeros((5, 3))
    inner = lumen(Tree(pts, pts + 1.0, r, np.zeros(5, dtype=int))).r
    wall = r - inner
    assert np.all((wall[:3] >= 1.0) & (wall[:3] <= 2.0))
    assert np.all((wall >= 0.3) & (inner > 0))


def test_a_hump_raises_the_diaphragm_where_it_sits() -> None:
    flat = Dome((0.0, 0.0, 0.0), (150.0, 0.0, -10.0), 100.0, 90.0, 100.0, 80.0, 75.0)
    humped = Dome(*(getattr(flat, f) for f in ("right", "left", "depth", "wx", "wy_front",
                  "wy_back", "midline")), bumps=((-40.0, -30.0, 12.0, 15.0),))  # fmt: skip
    rise = flat.sdf(-40.0, -30.0, 0.0) - humped.sdf(-40.0, -30.0, 0.0)
    assert 8.0 < float(rise) < 13.0  # the surface is 12 mm higher (distance along the normal)
    assert float(flat.sdf(-40.0, 60.0, 0.0) - humped.sdf(-40.0, 60.0, 0.0)) < 0.1
    assert humped.top == pytest.approx(12.0)


def test_thick_slice_labels_go_to_a_class_covering_a_third_of_the_planes() -> None:
    planes = np.zeros((5, 2, 2), dtype=np.uint8)
    planes[:2, 0, 0] = DIAPHRAGM  # the top of the dome in two of five planes
    planes[:1, 0, 1] = DIAPHRAGM  # one plane is not enough
    planes[:2, 1, 0], planes[2:5, 1, 0] = DIAPHRAGM, BOWEL
    out = combine(planes)
    assert out[0, 0] == DIAPHRAGM and out[0, 1] == NONE and out[1, 0] == BOWEL
    assert structure_of("colon gas") == BOWEL and structure_of("table core") == NONE


def test_cli_leaves_drawn_options_to_the_seed_and_sets_slice_thickness() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(["out", "--slice-thickness", "5"]))
    assert spec.slice_thickness_mm == 5.0
    assert (spec.contrast, spec.kernel, spec.dense_contrast, spec.atelectasis) == (None,) * 4
    args = ["out", "--no-contrast", "--kernel", "sharp", "--atelectasis"]
    spec = spec_from_args(parser.parse_args(args))
    assert (spec.contrast, spec.kernel, spec.atelectasis) == (False, "sharp", True)
