"""The SR class per PACS: Comprehensive SR carries the same TID 1500 tree under its own UID,
passes dciodvfy and dsrdump; write_results gives each PACS the class it takes."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import highdicom as hd
import pydicom
import pytest
from pydicom.uid import Comprehensive3DSRStorage, ComprehensiveSRStorage

from imaging_ai.config import Config, OutputsConfig, PacsDestination, StorageConfig
from imaging_ai.outputs.files import write_results
from imaging_ai.outputs.seg import encode_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.sr.classes import sr_instance_uid
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Built, Study, dciodvfy

JOB_TIME = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def comprehensive(study: Study, tmp_path_factory: pytest.TempPathFactory) -> Path:
    seg = encode_segmentation(study.analysis, study.headers, ALGORITHM, study.uids, created=CREATED)
    sr = build_measurement_report(
        study.analysis,
        study.headers,
        seg,
        ALGORITHM,
        study.uids,
        impression=IMPRESSION,
        created=CREATED,
        sr_class="comprehensive",
    )
    path = tmp_path_factory.mktemp("sr") / "sr-comprehensive.dcm"
    sr.save_as(path, enforce_file_format=True)
    return path


def value_types(items: pydicom.Sequence) -> set[str]:
    found: set[str] = set()
    for item in items:
        found.add(str(item.ValueType))
        if "ContentSequence" in item:
            found |= value_types(item.ContentSequence)
    return found


def test_comprehensive_sr_is_the_same_tree_under_its_own_uid(
    study: Study, built: Built, comprehensive: Path
) -> None:
    ds, three_d = pydicom.dcmread(comprehensive), pydicom.dcmread(built.sr_path)
    assert ds.SOPClassUID == ComprehensiveSRStorage
    assert three_d.SOPClassUID == Comprehensive3DSRStorage
    assert ds.SOPInstanceUID == sr_instance_uid(study.uids, "comprehensive")
    assert ds.SOPInstanceUID != three_d.SOPInstanceUID
    assert ds.SeriesInstanceUID == three_d.SeriesInstanceUID
    assert "SCOORD3D" not in value_types(ds.ContentSequence)
    assert ds.ContentSequence == three_d.ContentSequence
    report = hd.sr.srread(comprehensive).content
    assert isinstance(report, hd.sr.MeasurementReport)
    assert len(report.get_volumetric_roi_measurement_groups()) == len(
        hd.sr.srread(built.sr_path).content.get_volumetric_roi_measurement_groups()
    )


def test_comprehensive_sr_passes_dciodvfy_and_dsrdump(comprehensive: Path) -> None:
    errors, _ = dciodvfy(comprehensive)
    assert errors == [], errors
    if shutil.which("dsrdump") is None:
        pytest.skip("needs DCMTK's dsrdump")
    run = subprocess.run(["dsrdump", str(comprehensive)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert "Comprehensive SR Document" in run.stdout
    assert "Imaging Measurement Report" in run.stdout


def test_unknown_sr_class_is_refused(study: Study) -> None:
    with pytest.raises(ValueError, match="unknown SR class"):
        sr_instance_uid(study.uids, "enhanced")


def test_each_pacs_gets_the_sr_class_it_takes(study: Study, tmp_path: Path) -> None:
    pacs = (
        PacsDestination("A", "127.0.0.1", 104),
        PacsDestination("B", "127.0.0.1", 105, sr="comprehensive"),
        PacsDestination("C", "127.0.0.1", 106, results=("seg",), sr="comprehensive"),
    )
    config = Config(storage=StorageConfig(data_dir=str(tmp_path)), outputs=OutputsConfig(pacs=pacs))
    files = write_results(
        study.analysis, study.paths, 7, JOB_TIME, IMPRESSION, config, headers=study.headers
    )
    srs = {p.destination: p for p in files.payloads if p.kind == "sr"}
    assert set(srs) == {pacs[0].key, pacs[1].key}  # C takes no SR
    assert srs[pacs[0].key].path.name == "sr.dcm"
    assert srs[pacs[1].key].path.name == "sr-comprehensive.dcm"
    for payload, sop_class in ((srs[pacs[0].key], Comprehensive3DSRStorage),
                               (srs[pacs[1].key], ComprehensiveSRStorage)):  # fmt: skip
        ds = pydicom.dcmread(payload.path, stop_before_pixels=True)
        assert (ds.SOPClassUID, ds.SOPInstanceUID) == (sop_class, payload.object_uid)
    [seg] = [p for p in files.payloads if p.kind == "seg"]
    assert seg.destination == ""  # every PACS that takes SEG


def test_without_another_class_one_sr_for_every_pacs(study: Study, tmp_path: Path) -> None:
    config = Config(
        storage=StorageConfig(data_dir=str(tmp_path)),
        outputs=OutputsConfig(pacs=(PacsDestination("A", "127.0.0.1", 104),)),
    )
    files = write_results(
        study.analysis, study.paths, 8, JOB_TIME, IMPRESSION, config, headers=study.headers
    )
    [sr] = [p for p in files.payloads if p.kind == "sr"]
    assert (sr.destination, sr.path.name) == ("", "sr.dcm")
    assert not (files.folder / "sr-comprehensive.dcm").exists()
