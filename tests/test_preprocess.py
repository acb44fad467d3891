"""Tests for series → volume (imaging_ai.volume) and volume → model input (preprocess)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from numpy.typing import NDArray
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import UID, ExplicitVRLittleEndian, RLELossless, generate_uid

from imaging_ai.errors import (
    EngineError,
    GeometryError,
    InvalidDataset,
    ModelError,
    UnsupportedInput,
)
from imaging_ai.preprocess import (
    PreprocessSpec,
    context_indices,
    context_stride,
    prepare_array,
    prepare_slices,
    resize_back,
)
from imaging_ai.preprocess_gpu import GPU_TOLERANCE, compare_cpu_gpu, prepare_slices_gpu
from imaging_ai.volume import (
    CT_IMAGE_STORAGE,
    ENHANCED_CT_IMAGE_STORAGE,
    Volume,
    group_series,
    load_series,
    pick_series,
)

AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
# Rotated 20° about x then 10° about z: rows and columns both oblique.
_RX, _RZ = np.radians(20.0), np.radians(10.0)
OBLIQUE = (
    float(np.cos(_RZ)), float(np.sin(_RZ)), 0.0,
    float(-np.sin(_RZ) * np.cos(_RX)), float(np.cos(_RZ) * np.cos(_RX)), float(np.sin(_RX)),
)  # fmt: skip
Edit = Callable[[int, Dataset], None]


def stored_values(slices: int, rows: int, cols: int) -> NDArray[np.int16]:
    """Stored pixels whose value tells the slice (tens) and the row/column (units)."""
    k, r, c = np.meshgrid(np.arange(slices), np.arange(rows), np.arange(cols), indexing="ij")
    return (100 + 40 * k + (r + 2 * c) % 30).astype(np.int16)


def ct_slice(position: NDArray[np.float64], pixels: NDArray[Any], **attrs: Any) -> Dataset:
    """A minimal valid CT Image Storage dataset."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID = CT_IMAGE_STORAGE
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.Modality = "CT"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.ImagePositionPatient = [f"{v:.6f}" for v in position]
    ds.SliceThickness = "5.0"  # deliberately unlike the spacing of the positions
    ds.RescaleSlope, ds.RescaleIntercept = "1", "-1024"
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.PixelData = np.ascontiguousarray(pixels, dtype="<i2").tobytes()
    for key, value in attrs.items():
        setattr(ds, key, value)
    return ds


def write_series(
    directory: Path,
    *,
    slices: int = 20,
    size: tuple[int, int] = (64, 48),
    orientation: tuple[float, ...] = AXIAL,
    pixel_spacing: tuple[float, float] = (0.8, 0.7),
    step_mm: float = 2.5,
    origin: tuple[float, float, float] = (-120.0, -100.0, 40.0),
    edit: Edit | None = None,
) -> list[Path]:
    """Write a series with shuffled InstanceNumbers and file names; `edit(k, ds)` alters slice k."""
    directory.mkdir(parents=True, exist_ok=True)
    normal = np.cross(orientation[:3], orientation[3:])
    shared = {
        "StudyInstanceUID": generate_uid(),
        "SeriesInstanceUID": generate_uid(),
        "FrameOfReferenceUID": generate_uid(),
        "ImageOrientationPatient": [f"{v:.8f}" for v in orientation],
        "PixelSpacing": [str(v) for v in pixel_spacing],
    }
    pixels = stored_values(slices, *size)
    shuffle = np.random.default_rng(slices).permutation(slices)
    paths = []
    for k in range(slices):
        position = np.asarray(origin) + k * step_mm * normal
        ds = ct_slice(position, pixels[k], InstanceNumber=int(shuffle[k]) + 1, **shared)
        if edit is not None:
            edit(k, ds)
        paths.append(directory / f"{shuffle[k]:04d}.dcm")
        ds.save_as(paths[-1], enforce_file_format=True)
    return paths


def expected_hu(slices: int = 20, size: tuple[int, int] = (64, 48)) -> NDArray[np.float32]:
    return stored_values(slices, *size).astype(np.float32) - 1024.0


# --- series → volume ------------------------------------------------------------------------


def test_sorts_by_position_not_instance_number(tmp_path: Path) -> None:
    volume = load_series(write_series(tmp_path))
    np.testing.assert_array_equal(volume.hu, expected_hu())
    assert volume.hu.dtype == np.float32 and volume.hu.shape == (20, 64, 48)
    assert len(set(volume.sop_instance_uids)) == 20
    assert volume.frame_numbers == (1,) * 20


def test_geometry_from_positions(tmp_path: Path) -> None:
    volume = load_series(write_series(tmp_path, step_mm=1.25))
    assert volume.spacing_mm == pytest.approx((0.7, 0.8, 1.25))  # not SliceThickness (5.0)
    assert volume.origin_mm == pytest.approx((-120.0, -100.0, 40.0))
    np.testing.assert_allclose(volume.direction, np.eye(3), atol=1e-9)
    assert volume.voxel_volume_ml == pytest.approx(0.7 * 0.8 * 1.25 / 1000)
    corner = volume.index_to_lps([47, 63, 19])
    assert corner == pytest.approx([-120 + 47 * 0.7, -100 + 63 * 0.8, 40 + 19 * 1.25])
    np.testing.assert_allclose(volume.lps_to_index(corner), [47, 63, 19], atol=1e-9)


def test_descending_positions_start_at_lowest_along_normal(tmp_path: Path) -> None:
    volume = load_series(write_series(tmp_path, step_mm=-2.0, origin=(0.0, 0.0, 0.0)))
    assert volume.origin_mm == pytest.approx((0.0, 0.0, -38.0))
    assert volume.spacing_mm[2] == pytest.approx(2.0)
    np.testing.assert_array_equal(volume.hu, expected_hu()[::-1])


def test_hu_from_per_slice_rescale_and_masked_bits(tmp_path: Path) -> None:
    def edit(k: int, ds: Dataset) -> None:
        ds.RescaleSlope, ds.RescaleIntercept = str(1 + k % 2), str(-1000 - k)
        ds.BitsStored, ds.HighBit = 12, 11
        # Garbage above bit 11 must be ignored; 0xF000 set on a positive 12-bit value.
        raw = np.frombuffer(ds.PixelData, dtype="<i2") | np.int16(-4096)
        ds.PixelData = (raw & np.int16(0x0FFF) | np.int16(0x5000)).astype("<i2").tobytes()

    volume = load_series(write_series(tmp_path, edit=edit))
    k = np.arange(20, dtype=np.float32)[:, None, None]
    expected = stored_values(20, 64, 48) * (1 + k % 2) - 1000 - k
    np.testing.assert_array_equal(volume.hu, expected.astype(np.float32))


def test_compressed_transfer_syntax_falls_back_to_pydicom(tmp_path: Path) -> None:
    paths = write_series(tmp_path)
    for path in paths:
        ds = pydicom.dcmread(path)
        ds.compress(RLELossless)
        ds.save_as(path)
    np.testing.assert_array_equal(load_series(paths).hu, expected_hu())


def test_oblique_orientation(tmp_path: Path) -> None:
    volume = load_series(write_series(tmp_path, orientation=OBLIQUE))
    row, col = np.array(OBLIQUE[:3]), np.array(OBLIQUE[3:])
    np.testing.assert_allclose(volume.direction[:, 0], row, atol=1e-7)
    np.testing.assert_allclose(volume.direction[:, 1], col, atol=1e-7)
    np.testing.assert_allclose(volume.direction[:, 2], np.cross(row, col), atol=1e-7)
    assert volume.spacing_mm[2] == pytest.approx(2.5, abs=1e-5)
    lps = volume.index_to_lps([3, 5, 7])
    expected = np.array([-120.0, -100.0, 40.0]) + 3 * 0.7 * row + 5 * 0.8 * col
    np.testing.assert_allclose(lps, expected + 7 * 2.5 * np.cross(row, col), atol=1e-4)
    np.testing.assert_array_equal(volume.hu, expected_hu())


@pytest.mark.parametrize("orientation", [AXIAL, OBLIQUE], ids=["axial", "oblique"])
def test_agrees_with_simpleitk_series_reader(
    tmp_path: Path, orientation: tuple[float, ...]
) -> None:
    sitk = pytest.importorskip("SimpleITK")  # a dependency; absent only on the GPU test machine
    write_series(tmp_path, orientation=orientation, step_mm=-1.5)
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(tmp_path)))
    image = reader.Execute()
    volume = load_series(sorted(tmp_path.iterdir()))
    assert volume.origin_mm == pytest.approx(image.GetOrigin(), abs=1e-4)
    assert volume.spacing_mm == pytest.approx(image.GetSpacing(), abs=1e-4)
    np.testing.assert_allclose(volume.direction.ravel(), image.GetDirection(), atol=1e-6)
    np.testing.assert_allclose(volume.hu, sitk.GetArrayFromImage(image), atol=1e-3)
    ijk = (5, 9, 11)
    assert volume.index_to_lps(ijk) == pytest.approx(image.TransformIndexToPhysicalPoint(ijk))


def test_localizer_is_skipped(tmp_path: Path) -> None:
    paths = write_series(tmp_path / "axial")

    def scout(_: int, ds: Dataset) -> None:
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
        ds.SeriesInstanceUID = pydicom.dcmread(paths[0]).SeriesInstanceUID

    scout_paths = write_series(tmp_path / "scout", slices=1, orientation=(0, 1, 0, 0, 0, -1))
    ds = pydicom.dcmread(scout_paths[0])
    scout(0, ds)
    ds.save_as(scout_paths[0])
    np.testing.assert_array_equal(load_series(paths + scout_paths).hu, expected_hu())


def _set(**attrs: Any) -> Callable[[int], Edit]:
    """An edit that sets attributes on one slice (the one given to the returned factory)."""

    def for_slice(target: int) -> Edit:
        def edit(k: int, ds: Dataset) -> None:
            if k == target:
                for key, value in attrs.items():
                    setattr(ds, key, value)

        return edit

    return for_slice


def _drop_slice(paths: list[Path]) -> list[Path]:
    return [p for p in paths if pydicom.dcmread(p).ImagePositionPatient[2] != "55.000000"]


def _duplicate_position(k: int, ds: Dataset) -> None:
    if k == 7:
        ds.ImagePositionPatient = [f"{v:.6f}" for v in (-120.0, -100.0, 40.0 + 6 * 2.5)]


def _shear(k: int, ds: Dataset) -> None:
    # What a 10° gantry tilt does to positions: each slice shifts along y by step·tan(10°).
    ds.ImagePositionPatient = [-120.0, -100.0 + k * 2.5 * np.tan(np.radians(10)), 40 + k * 2.5]


REFUSALS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("mr", {"edit": _set(Modality="MR")(0)}, UnsupportedInput, "modality MR; only CT"),
    ("no-pixels", {"edit": lambda k, ds: delattr(ds, "PixelData")}, InvalidDataset,
     "no pixel data"),
    ("orientations", {"edit": _set(ImageOrientationPatient=[0, 1, 0, 0, 0, -1])(3)},
     GeometryError, "2 different image orientations"),
    ("duplicate", {"edit": _duplicate_position}, GeometryError, "2 images at repeated positions"),
    ("sizes", {"edit": _set(Rows=32, PixelData=b"\0" * 32 * 48 * 2)(4)}, GeometryError,
     "mixes image sizes (32×48, 64×48)"),
    ("spacing", {"edit": _set(PixelSpacing=[0.9, 0.7])(5)}, GeometryError, "mixes pixel spacings"),
    ("few", {"slices": 2}, GeometryError, "has 2 image(s); at least 3"),
    ("tilt-tag", {"edit": _set(GantryDetectorTilt=12.0)(0)}, GeometryError, "gantry tilt of 12°"),
    ("tilt-shear", {"edit": _shear}, GeometryError, "not stacked along the slice normal"),
    ("irregular", {"edit": lambda k, ds: setattr(
        ds, "ImagePositionPatient", [-120, -100, 40 + 2.5 * k + (0.6 if k == 9 else 0)])},
     GeometryError, "irregular slice spacing"),
    ("no-rescale", {"edit": lambda k, ds: delattr(ds, "RescaleSlope")}, InvalidDataset,
     "lacks the required attribute RescaleSlope"),
    ("frames", {"edit": _set(FrameOfReferenceUID="1.2.3")(2)}, GeometryError,
     "2 different frames of reference"),
    ("truncated", {"edit": _set(PixelData=b"\0" * 100)(1)}, InvalidDataset,
     "has truncated pixel data"),
    ("secondary-capture", {"edit": _set(SOPClassUID="1.2.840.10008.5.1.4.1.1.7")(0)},
     UnsupportedInput, "is a Secondary Capture Image Storage, not a CT image"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "error", "reason"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])  # fmt: skip
def test_refusals_say_why(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], reason: str
) -> None:
    paths = write_series(tmp_path, **options)
    with pytest.raises(error, match="^(series|instance) .*" + re.escape(reason)):
        load_series(paths, min_slices=3)


@pytest.mark.slow
def test_load_time_300_slices_of_512(tmp_path: Path) -> None:
    paths = write_series(tmp_path, slices=300, size=(512, 512), step_mm=1.0)
    started = time.perf_counter()
    volume = load_series(paths)
    elapsed = time.perf_counter() - started
    assert volume.hu.shape == (300, 512, 512)
    assert elapsed < 3.0, f"300 slices of 512×512 took {elapsed:.1f} s"


def test_missing_slice_is_refused_with_the_gap(tmp_path: Path) -> None:
    with pytest.raises(GeometryError, match=r"missing slices: a gap of 5\.00 mm .* 2\.50 mm"):
        load_series(_drop_slice(write_series(tmp_path)))


def test_files_of_two_series_are_refused(tmp_path: Path) -> None:
    paths = write_series(tmp_path / "a") + write_series(tmp_path / "b")
    with pytest.raises(UnsupportedInput, match="files of 2 different series"):
        load_series(paths)


def test_non_dicom_file_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.dcm"
    junk.write_bytes(b"not dicom at all")
    with pytest.raises(InvalidDataset, match=r"junk\.dcm is not a readable DICOM file"):
        load_series([junk])


def test_group_and_pick_series(tmp_path: Path) -> None:
    big = write_series(tmp_path / "big", slices=12)
    small = write_series(tmp_path / "small", slices=6)
    coronal = write_series(tmp_path / "coronal", slices=30, orientation=(1, 0, 0, 0, 0, -1))
    groups = group_series(small + coronal + big)
    assert sorted(map(len, groups.values())) == [6, 12, 30]
    chosen = pick_series(groups)
    assert groups[chosen] == big
    with pytest.raises(UnsupportedInput, match=r"no axial CT series.*non-axial CT, 30 files"):
        pick_series({k: v for k, v in groups.items() if v is coronal or len(v) == 30})


def write_enhanced(path: Path, slices: int = 20, size: tuple[int, int] = (64, 48)) -> list[int]:
    """One Enhanced CT file of the default series, frames shuffled; returns each frame's slice."""
    order = [int(k) for k in np.random.default_rng(1).permutation(slices)]
    ds = ct_slice(np.zeros(3), stored_values(slices, *size)[order].reshape(-1, size[1]))
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = UID(ENHANCED_CT_IMAGE_STORAGE)
    ds.Rows, ds.Columns, ds.NumberOfFrames = *size, slices
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.FrameOfReferenceUID = generate_uid()
    for keyword in ("ImagePositionPatient", "RescaleSlope", "RescaleIntercept", "SliceThickness"):
        delattr(ds, keyword)
    shared = Dataset()
    shared.PlaneOrientationSequence = [Dataset()]
    shared.PlaneOrientationSequence[0].ImageOrientationPatient = list(AXIAL)
    shared.PixelMeasuresSequence = [Dataset()]
    shared.PixelMeasuresSequence[0].PixelSpacing = [0.8, 0.7]
    shared.PixelValueTransformationSequence = [Dataset()]
    shared.PixelValueTransformationSequence[0].RescaleSlope = 1
    shared.PixelValueTransformationSequence[0].RescaleIntercept = -1024
    ds.SharedFunctionalGroupsSequence = [shared]
    ds.PerFrameFunctionalGroupsSequence = []
    for k in order:
        item = Dataset()
        item.PlanePositionSequence = [Dataset()]
        item.PlanePositionSequence[0].ImagePositionPatient = [-120.0, -100.0, 40.0 + 2.5 * k]
        ds.PerFrameFunctionalGroupsSequence.append(item)
    ds.save_as(path, enforce_file_format=True)
    return order


def test_enhanced_ct_multiframe(tmp_path: Path) -> None:
    order = write_enhanced(tmp_path / "enhanced.dcm")
    volume = load_series([tmp_path / "enhanced.dcm"])
    np.testing.assert_array_equal(volume.hu, expected_hu())
    assert volume.spacing_mm == pytest.approx((0.7, 0.8, 2.5))
    assert volume.origin_mm == pytest.approx((-120.0, -100.0, 40.0))
    assert len(set(volume.sop_instance_uids)) == 1
    assert [order[n - 1] for n in volume.frame_numbers] == list(range(20))


def test_enhanced_ct_per_frame_groups_override_shared(tmp_path: Path) -> None:
    path = tmp_path / "enhanced.dcm"
    order = write_enhanced(path)
    ds = pydicom.dcmread(path)
    item = ds.PerFrameFunctionalGroupsSequence[0]
    item.PixelValueTransformationSequence = [Dataset()]
    item.PixelValueTransformationSequence[0].RescaleSlope = 2
    item.PixelValueTransformationSequence[0].RescaleIntercept = -1000
    ds.save_as(path)
    hu = load_series([path]).hu
    expected = expected_hu()
    expected[order[0]] = stored_values(20, 64, 48)[order[0]] * 2.0 - 1000
    np.testing.assert_array_equal(hu, expected)


# --- volume → model input -------------------------------------------------------------------


def make_volume(hu: NDArray[Any], spacing: tuple[float, float, float] = (0.7, 0.8, 2.5)) -> Volume:
    return Volume(
        hu=np.asarray(hu, dtype=np.float32),
        origin_mm=(0.0, 0.0, 0.0),
        spacing_mm=spacing,
        direction=np.eye(3),
        sop_instance_uids=tuple(str(k) for k in range(len(hu))),
        series_instance_uid="1.2",
        study_instance_uid="1.1",
        frame_of_reference_uid="1.3",
    )


def spec(**changes: Any) -> PreprocessSpec:
    fields: dict[str, Any] = {
        "window_center": 40.0,
        "window_width": 400.0,
        "normalise": "minmax",
        "denoise": "none",
        "denoise_sigma_mm": 0.0,
        "input_size": (32, 24),
    }
    return PreprocessSpec(**(fields | changes))


def test_spec_refuses_bad_values_naming_them() -> None:
    with pytest.raises(ModelError, match=r"window_width must be > 0, not 0.*dtype must be"):
        spec(window_width=0, dtype="int8")
    with pytest.raises(ModelError, match="denoise_sigma_mm must be > 0"):
        spec(denoise="gaussian", denoise_sigma_mm=0)


def test_window_and_minmax() -> None:
    hu = np.linspace(-400, 500, 3 * 32 * 24).reshape(3, 32, 24)
    out = prepare_slices(make_volume(hu), spec())
    assert out.shape == (3, 1, 32, 24) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out[:, 0], np.clip((hu + 160) / 400, 0, 1), atol=1e-6)


def test_zscore_and_float16() -> None:
    hu = np.random.default_rng(0).normal(30, 50, (4, 32, 24))
    out = prepare_slices(make_volume(hu), spec(normalise="zscore", dtype="float16"))
    assert out.dtype == np.float16
    assert float(out.astype(np.float64).mean()) == pytest.approx(0, abs=1e-3)
    assert float(out.astype(np.float64).std()) == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize(
    "case",
    [spec(), spec(normalise="zscore"), spec(denoise="gaussian", denoise_sigma_mm=1.0)],
    ids=["minmax", "zscore", "gaussian"],
)
def test_threads_do_not_change_the_input(case: PreprocessSpec) -> None:
    hu = np.random.default_rng(2).normal(-300, 400, (21, 40, 36)).astype(np.float32)
    one = prepare_array(hu, (0.7, 0.8), case, np, chunk=4)
    many = prepare_array(hu, (0.7, 0.8), case, np, chunk=4, threads=3)
    np.testing.assert_array_equal(many, one)


def test_area_resize_averages_blocks_and_antialiases() -> None:
    hu = np.random.default_rng(1).uniform(-100, 100, (2, 64, 48))
    out = prepare_slices(make_volume(hu), spec(window_width=1000))[:, 0]
    blocks = ((hu + 460) / 1000).reshape(2, 32, 2, 24, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(out, blocks, atol=1e-6)
    checkerboard = np.indices((64, 48)).sum(axis=0) % 2 * 400.0 - 160  # window edges: 0 and 1
    shrunk = prepare_slices(make_volume(checkerboard[None]), spec(input_size=(24, 20)))
    assert shrunk.min() > 0.3 and shrunk.max() < 0.7  # point sampling would alias to 0 or 1
    assert float(shrunk.mean()) == pytest.approx(0.5, abs=1e-6)  # footprints tile the input


def test_linear_enlarge_keeps_a_ramp() -> None:
    ramp = np.broadcast_to(np.arange(16.0) * 10, (1, 8, 16))
    out = prepare_slices(make_volume(ramp), spec(input_size=(16, 32), window_width=1000))[0, 0]
    inner = out[:, 1:-1] * 1000 - 460  # back to HU; edge pixels are clamped
    np.testing.assert_allclose(np.diff(inner, axis=1), 5.0, atol=1e-3)


def test_gaussian_sigma_in_mm_per_axis() -> None:
    hu = np.zeros((1, 41, 41))
    hu[0, 20, 20] = 100
    options = {"window_center": 0, "window_width": 400, "input_size": (41, 41)}
    gaussian = spec(denoise="gaussian", denoise_sigma_mm=1.6, **options)
    out = prepare_slices(make_volume(hu, (0.8, 0.4, 1.0)), gaussian)
    response = (out[0, 0] - 0.5) * 400  # back to HU
    assert response.sum() == pytest.approx(100, rel=1e-4)
    offsets = np.arange(41) - 20
    var_y = (response.sum(axis=1) * offsets**2).sum() / 100
    var_x = (response.sum(axis=0) * offsets**2).sum() / 100
    assert var_y == pytest.approx((1.6 / 0.4) ** 2, rel=0.02)  # σ = 4 voxels along y
    assert var_x == pytest.approx((1.6 / 0.8) ** 2, rel=0.02)  # σ = 2 voxels along x


def test_median_removes_specks_and_keeps_edges() -> None:
    hu = np.where(np.arange(24) < 12, 0.0, 100.0) * np.ones((2, 32, 1))
    noisy = hu.copy()
    noisy[:, 5, 3], noisy[:, 20, 18] = 1000, -1000
    out = prepare_slices(make_volume(noisy), spec(denoise="median", denoise_sigma_mm=0.7))
    np.testing.assert_allclose(out[:, 0], (hu + 160) / 400, atol=1e-6)


def test_bilateral_smooths_noise_but_not_edges() -> None:
    rng = np.random.default_rng(2)
    edge = np.where(np.arange(48) < 24, 0.0, 200.0) * np.ones((3, 64, 1))
    noisy = edge + rng.normal(0, 10, edge.shape)
    options = {"denoise_sigma_mm": 1.4, "input_size": (64, 48), "window_width": 1000}
    bilateral = prepare_slices(make_volume(noisy), spec(denoise="bilateral", **options))
    gaussian = prepare_slices(make_volume(noisy), spec(denoise="gaussian", **options))
    flat = bilateral[:, 0, :, 4:20] * 1000
    assert flat.std() < 0.5 * noisy[:, :, 4:20].std()
    step = (bilateral[:, 0, :, 24] - bilateral[:, 0, :, 23]).mean() * 1000
    blurred = (gaussian[:, 0, :, 24] - gaussian[:, 0, :, 23]).mean() * 1000
    assert step > 180 and blurred < 120


@pytest.mark.parametrize(
    ("slice_mm", "context_mm", "stride"),
    [(1.0, 3.0, 3), (1.25, 3.0, 2), (2.0, 3.0, 2), (2.5, 3.0, 1), (5.0, 3.0, 1), (0.6, 0.0, 1)],
)
def test_context_stride_is_the_spacing_in_whole_slices(
    slice_mm: float, context_mm: float, stride: int
) -> None:
    assert context_stride(slice_mm, context_mm) == stride


def test_context_stacks_neighbours_as_channels_repeating_the_ends() -> None:
    hu = np.arange(7.0)[:, None, None] * 10 * np.ones((7, 32, 24))  # slice k is 10k HU
    single = prepare_slices(make_volume(hu, (0.7, 0.8, 1.0)), spec())
    stacked = prepare_slices(make_volume(hu, (0.7, 0.8, 1.0)), spec(context_slices=1))
    assert stacked.shape == (7, 3, 32, 24) and stacked.flags.c_contiguous
    np.testing.assert_array_equal(stacked[:, 1], single[:, 0])
    below, above = stacked[:, 0, 0, 0], stacked[:, 2, 0, 0]
    np.testing.assert_array_equal(below, single[[0, 0, 1, 2, 3, 4, 5], 0, 0, 0])
    np.testing.assert_array_equal(above, single[[1, 2, 3, 4, 5, 6, 6], 0, 0, 0])
    two_mm = spec(context_slices=2, context_spacing_mm=2.0, dtype="float16")
    wide = prepare_slices(make_volume(hu, (0.7, 0.8, 1.0)), two_mm)  # stride 2 at 1 mm
    assert wide.shape == (7, 5, 32, 24) and wide.dtype == np.float16
    np.testing.assert_array_equal(
        context_indices(7, 2, 2)[3],
        [0, 1, 3, 5, 6],  # 3 - 4 and 3 + 4 clip to the ends
    )
    np.testing.assert_array_equal(
        wide[3, :, 0, 0], single[[0, 1, 3, 5, 6], 0, 0, 0].astype(np.float16)
    )


def test_resize_back_probabilities_and_labels() -> None:
    volume = make_volume(np.zeros((3, 64, 48)))
    y, x = np.mgrid[0:32, 0:24]
    smooth = np.stack([np.sin(y / 6.0) * np.cos(x / 5.0)] * 3)[:, None].astype(np.float32)
    back = resize_back(smooth, volume)
    assert back.shape == (3, 1, 64, 48) and back.dtype == np.float32
    again = prepare_slices(make_volume(back[:, 0] * 100), spec(window_center=0, window_width=400))
    error = np.abs((again - 0.5) * 4 - smooth)  # linear up then area down blurs a little
    assert error.max() < 0.03 and error[..., 1:-1, 1:-1].max() < 0.01  # edges are clamped
    labels = np.kron(np.random.default_rng(3).integers(0, 4, (3, 16, 12)), np.ones((1, 4, 4)))
    labels = labels.astype(np.uint8)
    down = labels[:, 1::2, 1::2]  # what nearest sampling keeps when halving
    np.testing.assert_array_equal(resize_back(down, volume), labels)
    with pytest.raises(ModelError, match="expected 3 slices"):
        resize_back(np.zeros((2, 1, 32, 24), np.float32), volume)


def test_gpu_path_says_plainly_when_cupy_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(EngineError, match="needs CuPy, which is not installed"):
        prepare_slices_gpu(make_volume(np.zeros((3, 8, 8))), spec())


GPU_CASES = [
    spec(),
    spec(normalise="zscore", input_size=(224, 224)),
    spec(denoise="gaussian", denoise_sigma_mm=1.0, input_size=(256, 256)),
    spec(denoise="median", denoise_sigma_mm=0.7, dtype="float16"),
    spec(denoise="bilateral", denoise_sigma_mm=0.7, normalise="zscore", input_size=(160, 200)),
    spec(context_slices=1, context_spacing_mm=5.0, input_size=(256, 256)),
]


@pytest.mark.parametrize(
    "case", GPU_CASES, ids=lambda s: f"{s.denoise}-{s.normalise}-{2 * s.context_slices + 1}ch"
)
def test_gpu_matches_cpu(case: PreprocessSpec) -> None:
    pytest.importorskip("cupy")

    rng = np.random.default_rng(4)
    hu = rng.normal(-300, 400, (24, 512, 512)).clip(-1024, 3000)
    parity = compare_cpu_gpu(make_volume(hu), case)
    print(f"{case.denoise}/{case.normalise}: max|diff| {parity.max_abs_diff:.2e}")
    tolerance = 1e-3 if case.dtype == "float16" else GPU_TOLERANCE  # an fp16 ulp near 1
    assert parity.max_abs_diff <= tolerance
