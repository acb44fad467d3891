"""A 300-slice 512×512 study: SEG and SR build in seconds, not minutes, and stay valid."""

from __future__ import annotations

import time
from pathlib import Path

import pydicom

from imaging_ai.outputs.seg import build_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.uids import output_uids
from tests.outputs.conftest import ALGORITHM, CREATED, dciodvfy
from tests.outputs.scale import large_study

# Measured about 2 s (SEG) and 0.5 s (SR) on a 2-core machine; the bound catches a regression
# to the minutes a per-frame Python loop would take, with room for a slow CI machine.
BOUND_S = 60.0


def test_300_slices(tmp_path: Path) -> None:
    analysis, headers = large_study(slices=300, size=512, lesions=6)
    uids = output_uids(analysis.volume.study_instance_uid, 1)
    started = time.perf_counter()
    seg = build_segmentation(analysis, headers, ALGORITHM, uids, created=CREATED)
    seg_s = time.perf_counter() - started
    started = time.perf_counter()
    sr = build_measurement_report(analysis, headers, seg, ALGORITHM, uids, created=CREATED)
    sr_s = time.perf_counter() - started
    seg.save_as(tmp_path / "seg.dcm")
    sr.save_as(tmp_path / "sr.dcm")
    print(f"300x512x512: SEG {seg_s:.2f} s ({seg.NumberOfFrames} frames), SR {sr_s:.2f} s")
    assert seg_s < BOUND_S and sr_s < BOUND_S
    lung_slices = 300 * 5 // 6 - 300 // 6
    assert seg.NumberOfFrames == 2 * lung_slices + 6 * 4
    assert dciodvfy(tmp_path / "seg.dcm")[0] == []
    assert dciodvfy(tmp_path / "sr.dcm")[0] == []
    assert pydicom.dcmread(tmp_path / "sr.dcm").CompletionFlag == "PARTIAL"
