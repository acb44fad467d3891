"""Source headers read for SEG and SR: the plain-file reader gives what pydicom's dcmread gives,
and every other file is read by dcmread."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset, FileDataset
from pydicom.sequence import Sequence
from pydicom.uid import ImplicitVRLittleEndian

from imaging_ai.dicom.file_headers import HEAD_BYTES, read_headers, read_plain
from imaging_ai.errors import InvalidDataset
from tests.dicom_factory import ct_series
from tests.outputs.conftest import Study


def assert_same(mine: FileDataset, path: Path) -> None:
    theirs = pydicom.dcmread(path, stop_before_pixels=True)
    assert mine.preamble == theirs.preamble
    assert mine.file_meta == theirs.file_meta
    assert mine.original_encoding == theirs.original_encoding
    assert mine.original_character_set == theirs.original_character_set
    assert mine.filename == theirs.filename
    assert list(mine.keys()) == list(theirs.keys())
    for element in theirs:
        assert mine[element.tag].VR == element.VR, element.keyword
        assert mine[element.tag].value == element.value, element.keyword
    assert mine == theirs


def test_phantom_headers_equal_pydicoms(study: Study) -> None:
    for path in study.paths:
        mine = read_plain(path)
        assert mine is not None, f"{path.name} should be read as a plain file"
        assert_same(mine, path)


def test_text_in_the_files_character_set(tmp_path: Path) -> None:
    paths = ct_series(
        tmp_path, slices=1, SpecificCharacterSet="ISO_IR 192", PatientName="Müller^Jürgen"
    )
    mine = read_plain(paths[0])
    assert mine is not None
    assert_same(mine, paths[0])
    assert str(mine.PatientName) == "Müller^Jürgen"


def test_defined_length_sequences_are_read_as_pydicom_reads_them(tmp_path: Path) -> None:
    item = Dataset()
    item.ReferencedSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    item.ReferencedSOPInstanceUID = "1.2.3.4"
    paths = ct_series(tmp_path, slices=1, ReferencedImageSequence=Sequence([item]))
    mine = read_plain(paths[0])
    assert mine is not None
    assert_same(mine, paths[0])
    assert mine.ReferencedImageSequence[0].ReferencedSOPInstanceUID == "1.2.3.4"


def undefined_length_sequence(tmp_path: Path) -> Path:
    item = Dataset()
    item.CodeValue = "1"
    sequence = Sequence([item])
    sequence.is_undefined_length = True
    path = ct_series(tmp_path, slices=1, ProcedureCodeSequence=sequence)[0]
    ds = pydicom.dcmread(path)
    ds["ProcedureCodeSequence"].is_undefined_length = True
    ds.save_as(path)
    return path


def implicit_vr(tmp_path: Path) -> Path:
    path = ct_series(tmp_path, slices=1)[0]
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian
    ds.save_as(path, implicit_vr=True, little_endian=True)
    return path


def long_header(tmp_path: Path) -> Path:
    # Two texts within their VR's limit, together longer than the bytes read.
    half = HEAD_BYTES // 2 + 100
    return ct_series(tmp_path, slices=1, ImageComments="x" * half, PatientComments="y" * half)[0]


@pytest.mark.parametrize(
    "make", [undefined_length_sequence, implicit_vr, long_header], ids=lambda f: f.__name__
)
def test_other_files_are_left_to_pydicom(tmp_path: Path, make: object) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    assert read_plain(path) is None
    (header,) = read_headers([path])
    assert header == pydicom.dcmread(path, stop_before_pixels=True)


def test_a_file_that_is_not_dicom_is_named(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not an image")
    with pytest.raises(InvalidDataset, match=r"notes\.txt"):
        read_headers([path])
