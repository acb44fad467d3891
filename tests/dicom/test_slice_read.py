"""The fast CT reader (imaging_ai.dicom.slice_read) against pydicom: identical volumes, and
pydicom's path for every file that is not the plain case."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pytest
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import ImplicitVRLittleEndian, RLELossless

from imaging_ai import volume as volume_module
from imaging_ai.dicom.slice_read import read_plain, series_uid
from imaging_ai.volume import Volume, group_series, load_series
from tests.dicom_factory import ct_series

Edit = Callable[[Dataset, int], None]


def _pydicom_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume_module, "read_plain", lambda path: None)
    monkeypatch.setattr(volume_module, "series_uid", lambda path: None)


def _assert_same(fast: Volume, slow: Volume) -> None:
    assert fast.hu.dtype == slow.hu.dtype and np.array_equal(fast.hu, slow.hu)
    assert fast.origin_mm == slow.origin_mm and fast.spacing_mm == slow.spacing_mm
    assert np.array_equal(fast.direction, slow.direction)
    for field in ("sop_instance_uids", "series_instance_uid", "study_instance_uid"):
        assert getattr(fast, field) == getattr(slow, field)
    assert fast.frame_of_reference_uid == slow.frame_of_reference_uid
    assert fast.frame_numbers == slow.frame_numbers


def _both(paths: list[Path], monkeypatch: pytest.MonkeyPatch) -> tuple[Volume, Volume]:
    fast = load_series(paths)
    with monkeypatch.context() as m:
        _pydicom_only(m)
        slow = load_series(paths)
    return fast, slow


def _rewrite(paths: list[Path], edit: Edit) -> list[Path]:
    for i, path in enumerate(paths):
        ds = pydicom.dcmread(path)
        edit(ds, i)
        ds.save_as(path, enforce_file_format=True)
    return paths


def test_phantom_loads_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_study(generate(PhantomSpec(slices=12, seed=5, nodules=2), workers=1), tmp_path, workers=1)
    paths = sorted((tmp_path / "dicom").glob("*.dcm"))
    assert all(read_plain(p) is not None for p in paths)  # the phantom is the plain case
    fast, slow = _both(paths, monkeypatch)
    _assert_same(fast, slow)
    groups = group_series(paths)
    with monkeypatch.context() as m:
        _pydicom_only(m)
        assert group_series(paths) == groups == {fast.series_instance_uid: paths}


def _implicit(ds: Dataset, i: int) -> None:
    ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian


def _twelve_bits_unsigned(ds: Dataset, i: int) -> None:
    # High bits set as an overlay would: they must be cleared, not read as values.
    ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 12, 11, 0
    values = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) | 0xF000
    ds.PixelData = values.tobytes()


def _twelve_bits_signed(ds: Dataset, i: int) -> None:
    ds.BitsStored, ds.HighBit = 12, 11
    values = (np.arange(64 * 64, dtype=np.int16) - 2048).reshape(64, 64)
    ds.PixelData = (values & 0x0FFF | 0x7000).astype(np.uint16).tobytes()


def _eight_bits(ds: Dataset, i: int) -> None:
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = (np.arange(64 * 64) % 251).astype(np.uint8).tobytes()


def _rescaled(ds: Dataset, i: int) -> None:
    ds.RescaleSlope, ds.RescaleIntercept = "2.5", "-1024.3"
    ds.GantryDetectorTilt = "0.0"


def _padded_numbers(ds: Dataset, i: int) -> None:
    # Decimal strings written with spaces and many digits, as some scanners do.
    ds["ImagePositionPatient"].value = [" -100.000001", "-99.5 ", f"{-2.5 * i:.6f}"]
    ds["PixelSpacing"].value = ["0.70000", " 0.7"]


def _longer_pixel_data(ds: Dataset, i: int) -> None:
    ds.PixelData = ds.PixelData + b"\0\0"


def _defined_sequence(ds: Dataset, i: int) -> None:
    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = "1", "99X", "x"
    ds.ProcedureCodeSequence = Sequence([item])


@pytest.mark.parametrize(
    "edit",
    [
        _implicit,
        _twelve_bits_unsigned,
        _twelve_bits_signed,
        _eight_bits,
        _rescaled,
        _padded_numbers,
        _longer_pixel_data,
        _defined_sequence,
    ],
)
def test_odd_but_plain_files_load_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Edit
) -> None:
    paths = _rewrite(ct_series(tmp_path, slices=4), edit)
    assert all(read_plain(p) is not None for p in paths)
    fast, slow = _both(paths, monkeypatch)
    _assert_same(fast, slow)


def _rle(ds: Dataset, i: int) -> None:
    ds.compress(RLELossless)


def _localizer(ds: Dataset, i: int) -> None:
    if i == 0:
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]


def _undefined_sequence(ds: Dataset, i: int) -> None:
    _defined_sequence(ds, i)
    ds["ProcedureCodeSequence"].is_undefined_length = True


def _multi_valued_slope(ds: Dataset, i: int) -> None:
    ds["RescaleSlope"].value = ["1", "2"]


@pytest.mark.parametrize("edit", [_rle, _localizer, _undefined_sequence])
def test_unusual_files_go_to_pydicom_and_load_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Edit
) -> None:
    paths = _rewrite(ct_series(tmp_path, slices=5), edit)
    assert read_plain(paths[0]) is None
    fast, slow = _both(paths, monkeypatch)
    _assert_same(fast, slow)


@pytest.mark.parametrize(
    "edit",
    [
        _multi_valued_slope,
        lambda ds, i: delattr(ds, "FrameOfReferenceUID"),
        lambda ds, i: setattr(ds, "Modality", "MR"),
        lambda ds, i: setattr(ds, "PixelData", ds.PixelData[:100]),
    ],
)
def test_bad_files_are_refused_as_pydicom_refuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Edit
) -> None:
    paths = _rewrite(ct_series(tmp_path, slices=4), edit)
    with pytest.raises(Exception) as fast:
        load_series(paths)
    with monkeypatch.context() as m, pytest.raises(Exception) as slow:
        _pydicom_only(m)
        load_series(paths)
    assert type(fast.value) is type(slow.value) and str(fast.value) == str(slow.value)


def test_series_uid_from_the_first_bytes(tmp_path: Path) -> None:
    paths = ct_series(tmp_path, slices=2, series_uid="1.2.3.4")
    assert series_uid(paths[0]) == "1.2.3.4"
    (tmp_path / "not.dcm").write_bytes(b"nonsense")
    assert series_uid(tmp_path / "not.dcm") is None


def _meta_end(data: bytes) -> int:
    # File meta group length (0002,0000), UL, follows the preamble and "DICM".
    return 144 + int.from_bytes(data[140:144], "little")


def test_a_file_whose_meta_says_explicit_but_is_implicit_goes_to_pydicom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = ct_series(tmp_path / "explicit", slices=4)
    implicit = _rewrite(ct_series(tmp_path / "implicit", slices=4), _implicit)
    for e, i in zip(explicit, implicit, strict=True):
        meta, data = e.read_bytes(), i.read_bytes()
        e.write_bytes(meta[: _meta_end(meta)] + data[_meta_end(data) :])
    assert read_plain(explicit[0]) is None
    fast, slow = _both(explicit, monkeypatch)
    _assert_same(fast, slow)
