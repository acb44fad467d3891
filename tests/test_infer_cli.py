"""`imaging-ai infer`: one study folder through both shipped models to labels and findings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydicom
import SimpleITK as sitk
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study


def test_infer_writes_labels_in_source_geometry_and_findings(tmp_path: Path) -> None:
    spec = PhantomSpec(
        slices=24,
        seed=31337,
        nodules=1,
        slice_thickness_mm=2.5,
        nodule_diameter_range_mm=(14.0, 16.0),
    )
    write_study(generate(spec), tmp_path / "study")
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "imaging_ai",
            "infer",
            str(tmp_path / "study" / "dicom"),
            "--out",
            str(out),
            "--backend",
            "onnxruntime-cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    labels = sitk.ReadImage(str(out / "labels.nii.gz"))
    files = sorted((tmp_path / "study" / "dicom").glob("*.dcm"))
    first = pydicom.dcmread(files[0], stop_before_pixels=True)
    assert labels.GetSize() == (first.Columns, first.Rows, len(files))
    assert np.allclose(labels.GetSpacing()[:2], [float(v) for v in first.PixelSpacing])
    array = sitk.GetArrayFromImage(labels)
    assert {1, 2} <= set(np.unique(array).tolist())
    findings = json.loads((out / "findings.json").read_text())
    assert findings["study_uid"] == first.StudyInstanceUID
    assert set(findings["organ_volumes_ml"]) == {"right lung", "left lung"}
    assert findings["organ_volumes_ml"]["right lung"] > 100
    assert {m["name"] for m in findings["models"].values()} == {
        "lung-seg",
        "nodule-det",
        "nodule-fpr",
    }
    for lesion in findings["lesions"]:
        assert lesion["long_axis_mm"] >= lesion["short_axis_mm"] > 0
        assert len(lesion["centre_mm"]) == 3
