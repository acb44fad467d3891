"""Fixtures: a phantom study on disk, an Analysis from its ground truth, and the job's UIDs."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import highdicom as hd
import numpy as np
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pydicom.dataset import Dataset

from imaging_ai.analyse import Analysis, label_map
from imaging_ai.modelcard import parse_model_card
from imaging_ai.outputs.common import Algorithm, ModelId, read_headers
from imaging_ai.outputs.seg import encode_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.uids import OutputUids, output_uids
from imaging_ai.postprocess import detect_lesions
from imaging_ai.volume import Volume, load_series

CREATED = datetime(2026, 11, 30, 10, 15, 0, tzinfo=UTC)
IMPRESSION = "2 lung nodule(s) detected; largest 7.6 mm in the right lung. AI-generated."
ALGORITHM = Algorithm(
    lungs=ModelId("lung-seg", "0.1.0", "ab" * 32),
    nodules=ModelId("nodule-det", "0.2.0", "cd" * 32),
    device_serial_number="node-1",
    institution_name="Test Hospital",
)
DETECTION_CARD = parse_model_card(
    {
        "name": "nodule-det",
        "version": "0.2.0",
        "task": "detection",
        "description": "ground truth standing in for a model",
        "input": {"name": "image", "size": [256, 256]},
        "preprocess": {"window_center": -600.0, "window_width": 1500.0, "normalise": "minmax"},
        "output": {"name": "p", "kind": "sigmoid", "channels": 1},
        "labels": [
            {
                "value": 1,
                "channel": 0,
                "name": "Nodule",
                "threshold": 0.5,
                "min_volume_mm3": 5.0,
                "category": {"code": "49755003", "scheme": "SCT", "meaning": "M"},
                "type": {"code": "27925004", "scheme": "SCT", "meaning": "Nodule"},
            }
        ],
        "quality": {},
        "provenance": {"training_data": "synthetic", "shipped": False},
    },
    source=Path("card.toml"),
)


@dataclass(frozen=True)
class Study:
    """A phantom study: its files, headers, analysis (from truth) and the job's UIDs."""

    paths: list[Path]
    headers: list[Dataset]
    analysis: Analysis
    uids: OutputUids


def truth_analysis(volume: Volume, lungs: np.ndarray, nodules: np.ndarray) -> Analysis:
    """What a perfect model would have found: truth lungs and truth nodules, measured."""
    probabilities = nodules[:, None].astype(np.float32)
    lesions = detect_lesions(probabilities, DETECTION_CARD, volume, lungs)
    labels, lung_volumes = label_map(lungs, lesions, volume)  # as analyse() makes them
    return Analysis(
        volume=volume,
        labels=labels,
        lesions=tuple(lesions),
        organ_volumes_ml=lung_volumes,
        models={
            "lung-seg": {"name": "lung-seg", "version": "0.1.0", "sha256": "ab" * 32},
            "nodule-det": {"name": "nodule-det", "version": "0.2.0", "sha256": "cd" * 32},
        },
    )


@pytest.fixture(scope="session")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    phantom = generate(PhantomSpec(slices=12, seed=1, nodules=2), workers=1)
    root = write_study(phantom, tmp_path_factory.mktemp("phantom"), workers=1)
    paths = sorted((root / "dicom").glob("*.dcm"))
    volume = load_series(paths)
    # The volume runs along the slice normal; the phantom from head to feet: match by z.
    z = np.array([volume.index_to_lps([0, 0, k])[2] for k in range(volume.hu.shape[0])])
    order = [int(np.argmin(np.abs(phantom.positions_mm[:, 2] - zk))) for zk in z]
    analysis = truth_analysis(
        volume, phantom.lung_labels[order], phantom.nodule_mask[order].astype(bool)
    )
    assert len(analysis.lesions) == 2, "the fixture needs two nodules in the slab"
    return Study(paths, read_headers(paths), analysis, output_uids(volume.study_instance_uid, 41))


@dataclass(frozen=True)
class Built:
    """The study's SEG and SR, built once and written to disk."""

    seg_path: Path
    sr_path: Path
    seg: hd.seg.Segmentation
    sr: hd.sr.Comprehensive3DSR


@pytest.fixture(scope="session")
def built(study: Study, tmp_path_factory: pytest.TempPathFactory) -> Built:
    # As write_results builds them: the SEG's frames and the SR's references encoded.
    seg = encode_segmentation(study.analysis, study.headers, ALGORITHM, study.uids, created=CREATED)
    sr = build_measurement_report(
        study.analysis,
        study.headers,
        seg,
        ALGORITHM,
        study.uids,
        impression=IMPRESSION,
        created=CREATED,
    )
    folder = tmp_path_factory.mktemp("results")
    seg.dataset.save_as(folder / "seg.dcm", enforce_file_format=True)
    sr.save_as(folder / "sr.dcm", enforce_file_format=True)
    # What the tests query is the SEG read back, as a receiver would read it.
    return Built(folder / "seg.dcm", folder / "sr.dcm", hd.seg.segread(folder / "seg.dcm"), sr)


def dciodvfy(path: Path) -> tuple[list[str], list[str]]:
    """(errors, warnings) that dicom3tools' dciodvfy reports for a file."""
    if shutil.which("dciodvfy") is None:
        pytest.skip("needs dicom3tools' dciodvfy (make deps-system)")
    run = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True, timeout=60)
    lines = (run.stdout + run.stderr).splitlines()
    return [x for x in lines if x.startswith("Error")], [
        x for x in lines if x.startswith("Warning")
    ]
