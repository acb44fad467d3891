"""`imaging-ai evaluate` end to end on one phantom case: summary.json, froc.png, PNGs, table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from PIL import Image

from imaging_ai.cli import main
from imaging_ai.evaluate.cases import load_image
from imaging_ai.volume import Volume

ROOT = Path(__file__).resolve().parents[2]


def on_volume_grid(array: np.ndarray, volume: Volume) -> sitk.Image:
    image = sitk.GetImageFromArray(array.astype(np.uint8))
    image.SetOrigin(volume.origin_mm)
    image.SetSpacing(volume.spacing_mm)
    image.SetDirection(tuple(volume.direction.ravel()))
    return image


@pytest.fixture(scope="module")
def phantom_case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One case from ``imaging-ai phantom OUT --slices 60 --seed 3``, its truth as NIfTI."""
    made = tmp_path_factory.mktemp("phantom", numbered=False)
    assert main(["phantom", str(made), "--slices", "60", "--seed", "3"]) == 0
    case = tmp_path_factory.mktemp("cases", numbered=False) / "phantom-3"
    case.mkdir()
    (made / "dicom").rename(case / "image")
    volume = load_image(case)
    truth = np.load(made / "truth.npz")
    # truth.npz runs in InstanceNumber order; put each slice where its position is.
    order = np.rint(volume.lps_to_index(truth["image_positions_mm"])[:, 2]).astype(int)
    lungs = np.zeros(volume.hu.shape, np.uint8)
    lesions = np.zeros(volume.hu.shape, np.uint8)
    lungs[order] = truth["lung_labels"]
    lesions[order] = truth["nodule_mask"]
    sitk.WriteImage(on_volume_grid(lungs, volume), str(case / "lungs.nii.gz"))
    sitk.WriteImage(on_volume_grid(lesions, volume), str(case / "lesions.nii.gz"))
    return case.parent


def test_evaluate_writes_summary_froc_pngs_and_table(
    phantom_case: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[engines]\ndir = "{ROOT / "engines"}"\nbackend = "onnxruntime-cpu"\n'
        f'[storage]\ndata_dir = "{tmp_path / "var"}"\n'
    )
    out = tmp_path / "out"
    args = ["evaluate", str(phantom_case), "--out", str(out), "--config", str(config)]
    assert main([*args, "--no-progress"]) == 0

    summary = json.loads((out / "summary.json").read_text())
    (case,) = summary["cases"]
    assert case["name"] == "phantom-3"
    truth = np.load(phantom_case.parent / "phantom" / "truth.npz")
    assert case["lesions_total"] == len(truth["nodule_long_axes_mm"]) == 3
    measured = sorted(x["long_axis_mm"] for x in case["lesions"])
    assert measured == pytest.approx(sorted(truth["nodule_long_axes_mm"]), abs=1.5)
    assert sum(c["total"] for c in case["sensitivity"].values()) == 3
    assert sum(c["found"] for c in case["sensitivity"].values()) == case["lesions_found"]
    assert case["dice_right"] > 0.8 and case["dice_left"] > 0.8
    assert list(case["froc"]) == ["1/8", "1/4", "1/2", "1", "2", "4", "8"]
    assert case["cpm"] == pytest.approx(np.mean(list(case["froc"].values())), abs=1e-3)
    hits = [d for d in case["detections"] if d["outcome"] == "hit"]
    assert len(hits) == case["lesions_found"]
    false = [d for d in case["detections"] if d["outcome"] == "false positive" and d["reported"]]
    assert len(false) == case["false_positives"] == summary["overall"]["false_positives"]
    overall = summary["overall"]
    assert overall["cases"] == 1 and overall["lesions_total"] == 3

    with Image.open(out / "froc.png") as froc:
        assert froc.size == (640, 440)
    pictures = sorted((out / "cases" / "phantom-3").glob("*.png"))
    assert pictures
    with Image.open(pictures[0]) as first:
        assert first.size == (512, 512)
    printed = capsys.readouterr().out
    assert "phantom-3" in printed and "all (1)" in printed
