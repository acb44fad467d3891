"""The synthetic chest CT phantom (imaging_ai_devkit.phantom): DICOM, geometry, truth, HU."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pydicom
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate, write_study
from imaging_ai_devkit.phantom.cli import main as phantom_main
from pydicom.dataset import FileDataset

CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
SPEC = PhantomSpec(slices=32, seed=3, nodules=3, slice_thickness_mm=2.5)


@pytest.fixture(scope="module")
def volume() -> PhantomVolume:
    """A 32-slice, 80 mm slab of mid chest, generated once for the module."""
    return generate(SPEC)


@pytest.fixture(scope="module")
def study(volume: PhantomVolume, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The volume written as an urgent study."""
    return write_study(volume, tmp_path_factory.mktemp("phantom"), priority="urgent")


@pytest.fixture(scope="module")
def datasets(study: Path) -> list[FileDataset]:
    """Every file of the study, in InstanceNumber order."""
    files = [pydicom.dcmread(p) for p in sorted((study / "dicom").glob("*.dcm"))]
    return sorted(files, key=lambda ds: int(ds.InstanceNumber))


@pytest.fixture(scope="module")
def truth(study: Path) -> dict[str, np.ndarray]:
    """Arrays of truth.npz."""
    with np.load(study / "truth.npz") as npz:
        return {key: npz[key] for key in npz.files}


def _voxel(truth: dict[str, np.ndarray], point: np.ndarray) -> tuple[int, int, int]:
    """(slice, row, column) of the voxel holding an LPS point."""
    origin, spacing = truth["origin_mm"], truth["spacing_mm"]
    col = round((point[0] - origin[0]) / spacing[0])
    row = round((point[1] - origin[1]) / spacing[1])
    k = round((origin[2] - point[2]) / spacing[2])
    return k, row, col


def test_files_are_ct_part10_with_required_tags(datasets: list[FileDataset]) -> None:
    assert len(datasets) == SPEC.slices
    for ds in datasets:
        assert ds.file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
        assert ds.file_meta.MediaStorageSOPClassUID == CT_IMAGE_STORAGE == ds.SOPClassUID
        assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID
        assert ds.Modality == "CT" and ds.BodyPartExamined == "CHEST"
        assert ds.Manufacturer == "imaging-ai phantom"
        assert (ds.Rows, ds.Columns) == (512, 512)
        assert (ds.BitsAllocated, ds.BitsStored, ds.PixelRepresentation) == (16, 16, 1)
        assert ds.RescaleSlope == 1 and ds.RescaleType == "HU"
        assert str(ds.PatientName).startswith("PHANTOM^S")
        assert ds.PatientSex in ("M", "F") and len(ds.PatientBirthDate) == 8
        assert ds.KVP and ds.StudyDate and ds.StudyTime and ds.StudyID and ds.SeriesNumber
        assert ds.AccessionNumber == "PH0000000003"
        assert len(ds.WindowCenter) == len(ds.WindowWidth) == 2
    uids = {(ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID) for ds in datasets}
    assert len(uids) == 1
    assert len({ds.SOPInstanceUID for ds in datasets}) == SPEC.slices
    assert [int(ds.InstanceNumber) for ds in datasets] == list(range(1, SPEC.slices + 1))


def test_pixels_decode_to_hu(datasets: list[FileDataset], volume: PhantomVolume) -> None:
    ds = datasets[10]
    hu = ds.pixel_array.astype(np.float32) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    assert np.array_equal(hu, volume.hu[10])
    assert hu[0, 0] == -3024  # padding outside the reconstruction circle
    assert int(ds.PixelPaddingValue) == ds.pixel_array[0, 0]


def test_geometry_steps_along_the_normal(datasets: list[FileDataset]) -> None:
    positions = np.array([[float(v) for v in ds.ImagePositionPatient] for ds in datasets])
    for ds in datasets:
        assert [float(v) for v in ds.ImageOrientationPatient] == [1, 0, 0, 0, 1, 0]
        assert float(ds.PixelSpacing[0]) == float(ds.PixelSpacing[1])
        assert 0.55 <= float(ds.PixelSpacing[0]) <= 0.95
    assert np.allclose(positions[:, :2], positions[0, :2])
    steps = np.diff(positions[:, 2])
    thickness = float(datasets[0].SliceThickness)
    assert np.allclose(steps, -thickness, atol=1e-3)  # head first: superior to inferior
    assert float(datasets[0].SpacingBetweenSlices) == thickness
    assert np.allclose([float(ds.SliceLocation) for ds in datasets], positions[:, 2], atol=1e-3)


def test_truth_arrays(truth: dict[str, np.ndarray], datasets: list[FileDataset]) -> None:
    shape = (SPEC.slices, 512, 512)
    assert truth["lung_labels"].shape == truth["nodule_mask"].shape == shape
    assert truth["lung_labels"].dtype == truth["nodule_mask"].dtype == np.uint8
    assert set(np.unique(truth["lung_labels"])) == {0, 1, 2}
    assert set(np.unique(truth["nodule_mask"])) <= {0, 1}
    assert truth["nodule_centres_mm"].shape == (SPEC.nodules, 3)
    assert truth["nodule_diameters_mm"].shape == (SPEC.nodules,)
    positions = np.array([[float(v) for v in ds.ImagePositionPatient] for ds in datasets])
    assert np.allclose(truth["image_positions_mm"], positions, atol=1e-3)
    assert np.allclose(truth["origin_mm"], positions[0], atol=1e-3)
    spacing = [float(datasets[0].PixelSpacing[1]), float(datasets[0].PixelSpacing[0])]
    assert np.allclose(truth["spacing_mm"], [*spacing, float(datasets[0].SliceThickness)])


def test_nodules_sit_inside_lungs_and_their_mask(truth: dict[str, np.ndarray]) -> None:
    diameters = truth["nodule_diameters_mm"]
    assert np.all((diameters >= 4.0) & (diameters <= 30.0))
    for centre in truth["nodule_centres_mm"]:
        k, row, col = _voxel(truth, centre)
        assert truth["lung_labels"][k, row, col] > 0
        assert truth["nodule_mask"][k, row, col] == 1
    # Every nodule voxel belongs to a lung.
    assert np.all(truth["lung_labels"][truth["nodule_mask"] > 0] > 0)


def test_right_lung_is_on_the_patients_right(truth: dict[str, np.ndarray]) -> None:
    labels = truth["lung_labels"]
    cols = np.arange(labels.shape[2])
    x = truth["origin_mm"][0] + truth["spacing_mm"][0] * cols
    right, left = (labels == 1).sum(axis=(0, 1)), (labels == 2).sum(axis=(0, 1))
    # LPS: +x is the patient's left, so the right lung has the smaller x.
    assert (right * x).sum() / right.sum() < 0 < (left * x).sum() / left.sum()
    assert right.sum() > left.sum()  # the heart sits on the left


def test_tissue_attenuation_is_realistic(volume: PhantomVolume) -> None:
    hu, lungs = volume.hu, volume.lung_labels > 0
    parenchyma = hu[lungs & (volume.nodule_mask == 0)]
    assert -900 <= np.median(parenchyma) <= -800
    body = hu[(hu > -500) & ~lungs]
    fat = np.mean((body > -140) & (body < -60))
    soft = np.mean((body > 20) & (body < 80))
    assert fat > 0.1 and soft > 0.2  # fat about -100 HU, muscle and blood about +40
    assert np.mean(body > 200) > 0.005  # bone
    air = hu[(hu > -1100) & (hu < -900) & ~lungs]
    assert -1010 <= np.median(air) <= -985
    assert 5.0 <= volume.noise_hu <= 40.0


def test_priority_tags(volume: PhantomVolume, tmp_path: Path) -> None:
    part = replace(
        volume,
        indices=volume.indices[:1],
        hu=volume.hu[:1],
        lung_labels=volume.lung_labels[:1],
        nodule_mask=volume.nodule_mask[:1],
    )
    got = {}
    for priority in ("urgent", "inpatient", "outpatient"):
        out = write_study(part, tmp_path / priority, priority=priority, accession="ACC42")
        got[priority] = pydicom.dcmread(next((out / "dicom").glob("*.dcm")))
    urgent, inpatient, outpatient = got["urgent"], got["inpatient"], got["outpatient"]
    assert urgent.RequestedProcedurePriority == "STAT"
    item = urgent.RequestAttributesSequence[0]
    assert item.RequestedProcedurePriority == "STAT"
    assert item.RequestedProcedureID and item.ScheduledProcedureStepID
    assert "AdmissionID" not in urgent and "CurrentPatientLocation" not in urgent
    assert inpatient.RequestedProcedurePriority == "ROUTINE"
    assert inpatient.AdmissionID and inpatient.CurrentPatientLocation == "WARD 5B"
    assert outpatient.RequestedProcedurePriority == "ROUTINE"
    assert "AdmissionID" not in outpatient and "CurrentPatientLocation" not in outpatient
    assert urgent.AccessionNumber == "ACC42"
    assert urgent.StudyInstanceUID == inpatient.StudyInstanceUID == outpatient.StudyInstanceUID


def test_same_seed_gives_same_uids_and_pixels(volume: PhantomVolume, tmp_path: Path) -> None:
    again = generate(SPEC, slices=[5, 20], workers=1)
    assert np.array_equal(again.hu, volume.hu[[5, 20]])
    assert np.array_equal(again.lung_labels, volume.lung_labels[[5, 20]])
    a = write_study(again, tmp_path / "a")
    b = write_study(generate(SPEC, slices=[5, 20], workers=1), tmp_path / "b")
    for name in ("CT000006.dcm", "CT000021.dcm"):
        da, db = pydicom.dcmread(a / "dicom" / name), pydicom.dcmread(b / "dicom" / name)
        assert da.SOPInstanceUID == db.SOPInstanceUID
        assert da.StudyInstanceUID == db.StudyInstanceUID
        assert da.PixelData == db.PixelData
    other = write_study(generate(SPEC, slices=[5], workers=1), tmp_path / "c", accession="X1")
    assert pydicom.dcmread(next((other / "dicom").glob("*.dcm"))).StudyInstanceUID != (
        pydicom.dcmread(a / "dicom" / "CT000006.dcm").StudyInstanceUID
    )


def test_seeds_differ() -> None:
    a = generate(PhantomSpec(slices=8, seed=1, nodules=1, slice_thickness_mm=5.0), [4])
    b = generate(PhantomSpec(slices=8, seed=2, nodules=1, slice_thickness_mm=5.0), [4])
    assert not np.array_equal(a.lung_labels, b.lung_labels)
    assert not np.allclose(a.nodule_centres_mm, b.nodule_centres_mm)


def test_spec_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="slices"):
        PhantomSpec(slices=0)
    with pytest.raises(ValueError, match="nodule_diameter_range_mm"):
        PhantomSpec(nodule_diameter_range_mm=(10.0, 5.0))


def test_cli_writes_a_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(tmp_path), "--slices", "6", "--seed", "11", "--nodules", "1",
            "--slice-thickness", "5", "--priority", "inpatient", "--accession", "A77"]  # fmt: skip
    assert phantom_main(args) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "A77" in line and "PHANTOM" not in line
    assert len(list((tmp_path / "dicom").glob("CT*.dcm"))) == 6
    assert (tmp_path / "truth.npz").is_file()
    assert phantom_main([str(tmp_path / "bad"), "--slices", "0"]) == 2


@pytest.mark.skipif(shutil.which("dcmdump") is None, reason="DCMTK dcmdump not installed")
def test_dcmdump_reads_a_file(datasets: list[FileDataset], study: Path) -> None:
    path = next((study / "dicom").glob("*.dcm"))
    run = subprocess.run(["dcmdump", "-E", str(path)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "RequestedProcedurePriority" in run.stdout and "E:" not in run.stderr
