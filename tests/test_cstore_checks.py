"""C-STORE data sets that are not what their command and context say are refused (issue 18 item 5).

Each case is sent over real DICOM by pynetdicom, which sends a crafted file's data set bytes
unchanged (``STORE_SEND_CHUNKED_DATASET``): its file meta gives the command's UIDs and the
presentation context. Nothing of a refused instance may be kept, and the association goes on.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import FileMetaDataset
from pydicom.filebase import DicomBytesIO
from pydicom.filereader import read_file_meta_info
from pydicom.filewriter import write_dataset, write_file_meta_info
from pydicom.uid import (
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    generate_uid,
)
from pynetdicom import AE, _config
from pynetdicom.sop_class import CTImageStorage, MRImageStorage  # type: ignore[attr-defined]
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Instance
from imaging_ai.receive import Receiver
from tests.dicom_factory import ct_dataset
from tests.test_receive import CALLED

SYNTAXES = (ImplicitVRLittleEndian, ExplicitVRLittleEndian, ExplicitVRBigEndian)
PIXEL_DATA_TAG = (0x7FE0, 0x0010)
SERIES_UID_TAG = (0x0020, 0x000E)


@pytest.fixture(autouse=True)
def send_file_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynetdicom sends a file's data set as it is, without decoding and re-encoding it."""
    monkeypatch.setattr(_config, "STORE_SEND_CHUNKED_DATASET", True)


def encoded(ds: pydicom.Dataset, syntax: str) -> bytes:
    """The data set as a C-STORE carries it in ``syntax``."""
    fp = DicomBytesIO()
    fp.is_little_endian = syntax != ExplicitVRBigEndian
    fp.is_implicit_VR = syntax == ImplicitVRLittleEndian
    write_dataset(fp, ds)
    return fp.getvalue()


def tag_bytes(tag: tuple[int, int], syntax: str) -> bytes:
    return struct.pack(">HH" if syntax == ExplicitVRBigEndian else "<HH", *tag)


def crafted(
    path: Path,
    data: bytes,
    syntax: str,
    sop_class: str = CTImageStorage,
    sop_uid: str | None = None,
) -> Path:
    """A file whose file meta says (``sop_class``, ``sop_uid``, ``syntax``), then ``data``."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_uid or generate_uid()
    meta.TransferSyntaxUID = syntax
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_file_meta_info(fp, meta)
    path.write_bytes(b"\0" * 128 + b"DICM" + fp.getvalue() + data)
    return path


def good_file(path: Path, syntax: str = ExplicitVRLittleEndian) -> Path:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    return crafted(path, encoded(ds, syntax), syntax, sop_uid=ds.SOPInstanceUID)


def associate(port: int) -> object:
    """An association with one CT context per syntax, so each is picked by the file's syntax."""
    ae = AE(ae_title="PACS")
    for syntax in SYNTAXES:
        ae.add_requested_context(CTImageStorage, [syntax])
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED)
    assert assoc.is_established
    return assoc


def assert_refused_then_good_stored(
    receiver: Receiver,
    engine: Engine,
    tmp_path: Path,
    bad: Path,
    status: int,
    reason: str,
) -> None:
    """``bad`` is answered ``status`` with ``reason`` and not kept; a good one after it is."""
    syntax = str(read_file_meta_info(bad).TransferSyntaxUID)
    assoc = associate(receiver.port)
    try:
        answer = assoc.send_c_store(bad)  # type: ignore[attr-defined]
        assert answer.Status == status
        assert reason in answer.ErrorComment
        assert list(receiver.spool.walk()) == []
        assert [p for p in receiver.spool.tmp_dir.iterdir() if p.stat().st_size] == []
        with Session(engine) as s:
            assert s.scalars(select(Instance)).all() == []
        good = good_file(tmp_path / "good.dcm", syntax)
        assert assoc.send_c_store(good).Status == 0x0000  # type: ignore[attr-defined]
    finally:
        assoc.release()  # type: ignore[attr-defined]
    assert len(list(receiver.spool.walk())) == 1
    with Session(engine) as s:
        assert len(s.scalars(select(Instance)).all()) == 1


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_data_set_starting_with_preamble_and_dicm_is_refused(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path, syntax: str
) -> None:
    # A sender that put the whole Part-10 file (preamble, 'DICM', file meta) in the data set.
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    ds.file_meta.TransferSyntaxUID = syntax
    part10 = DicomBytesIO()
    ds.save_as(
        part10,
        enforce_file_format=True,
        implicit_vr=syntax == ImplicitVRLittleEndian,
        little_endian=syntax != ExplicitVRBigEndian,
    )
    bad = crafted(tmp_path / "bad.dcm", part10.getvalue(), syntax, sop_uid=ds.SOPInstanceUID)
    assert_refused_then_good_stored(
        receiver, sqlite_engine, tmp_path, bad, 0xC000, "preamble and 'DICM'"
    )


def undefined_length_pixel_data(ds: pydicom.Dataset, syntax: str) -> bytes:
    """The data set with its Pixel Data in undefined length: one item, then a delimiter."""
    pixels = ds.PixelData
    del ds.PixelData
    pack = struct.Struct(">L" if syntax == ExplicitVRBigEndian else "<L").pack
    header = tag_bytes(PIXEL_DATA_TAG, syntax)
    header += pack(0xFFFFFFFF) if syntax == ImplicitVRLittleEndian else b"OW\0\0" + pack(0xFFFFFFFF)
    item = tag_bytes((0xFFFE, 0xE000), syntax)
    items = item + pack(0) + item + pack(len(pixels)) + pixels
    delimiter = tag_bytes((0xFFFE, 0xE0DD), syntax) + pack(0)
    return encoded(ds, syntax) + header + items + delimiter


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_native_pixel_data_of_undefined_length_is_refused(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path, syntax: str
) -> None:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    data = undefined_length_pixel_data(ds, syntax)
    bad = crafted(tmp_path / "bad.dcm", data, syntax, sop_uid=ds.SOPInstanceUID)
    assert_refused_then_good_stored(
        receiver, sqlite_engine, tmp_path, bad, 0xC000, "undefined length"
    )


@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ExplicitVRBigEndian])
@pytest.mark.parametrize(
    ("tag", "vr", "garbage"),
    [
        (SERIES_UID_TAG, b"UI", b"ZZ"),  # read for the catalog: pydicom cannot decode it
        (SERIES_UID_TAG, b"UI", b"\x00\x07"),  # not even ASCII
        ((0x0028, 0x0004), b"CS", b"Q1"),  # Photometric Interpretation: not read here
    ],
)
def test_unknown_vr_bytes_are_refused_naming_the_tag(
    receiver: Receiver,
    sqlite_engine: Engine,
    tmp_path: Path,
    syntax: str,
    tag: tuple[int, int],
    vr: bytes,
    garbage: bytes,
) -> None:
    # Little endian goes through the fast header reader, big endian through pydicom: both refuse.
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    data = encoded(ds, syntax)
    at = data.index(tag_bytes(tag, syntax) + vr) + 4
    data = data[:at] + garbage + data[at + 2 :]
    bad = crafted(tmp_path / "bad.dcm", data, syntax, sop_uid=ds.SOPInstanceUID)
    assert_refused_then_good_stored(
        receiver, sqlite_engine, tmp_path, bad, 0xC000, f"({tag[0]:04X},{tag[1]:04X})"
    )


def test_sop_instance_uid_differing_from_the_command_is_refused(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    data = encoded(ds, ExplicitVRLittleEndian)
    bad = crafted(tmp_path / "bad.dcm", data, ExplicitVRLittleEndian, sop_uid=generate_uid())
    assert_refused_then_good_stored(
        receiver, sqlite_engine, tmp_path, bad, 0xC000, "SOP Instance UID differs"
    )


def test_mr_data_set_under_a_ct_command_is_refused(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    ds.SOPClassUID = MRImageStorage
    ds.Modality = "MR"
    data = encoded(ds, ExplicitVRLittleEndian)
    bad = crafted(tmp_path / "bad.dcm", data, ExplicitVRLittleEndian, sop_uid=ds.SOPInstanceUID)
    assert_refused_then_good_stored(
        receiver, sqlite_engine, tmp_path, bad, 0xA900, "SOP Class UID differs"
    )


@pytest.mark.parametrize(
    ("bytes_syntax", "context_syntax", "reason"),
    [
        (ExplicitVRLittleEndian, ImplicitVRLittleEndian, "explicit VR but the transfer syntax"),
        (ImplicitVRLittleEndian, ExplicitVRLittleEndian, "implicit VR but the transfer syntax"),
        (ImplicitVRLittleEndian, ExplicitVRBigEndian, "implicit VR but the transfer syntax"),
    ],
)
def test_vr_encoding_other_than_the_transfer_syntax_is_refused(
    receiver: Receiver,
    sqlite_engine: Engine,
    tmp_path: Path,
    bytes_syntax: str,
    context_syntax: str,
    reason: str,
) -> None:
    ds = ct_dataset(generate_uid(), generate_uid(), 0)
    data = encoded(ds, bytes_syntax)
    bad = crafted(tmp_path / "bad.dcm", data, context_syntax, sop_uid=ds.SOPInstanceUID)
    assert_refused_then_good_stored(receiver, sqlite_engine, tmp_path, bad, 0xC000, reason)


def test_data_set_shorter_than_a_preamble_is_checked_too(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    # Under 132 bytes: its first bytes are checked when the last fragment is in.
    ds = pydicom.Dataset()
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = generate_uid()
    data = encoded(ds, ImplicitVRLittleEndian)
    assert len(data) < 132
    bad = crafted(tmp_path / "bad.dcm", data, ExplicitVRLittleEndian, sop_uid=ds.SOPInstanceUID)
    assert_refused_then_good_stored(
        receiver, sqlite_engine, tmp_path, bad, 0xC000, "implicit VR but the transfer syntax"
    )
