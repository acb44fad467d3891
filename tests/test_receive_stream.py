"""The streamed C-STORE path: Part-10 header, header read ahead of Pixel Data, fragments."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Instance
from imaging_ai.dicom import dul, part10
from imaging_ai.dicom.association import Peer
from imaging_ai.errors import OutOfResources
from imaging_ai.receive import Receiver
from imaging_ai.receive_incoming import HEAD_BYTES, read_header
from tests.dicom_factory import ct_series
from tests.test_receive import CALLED

PEER = Peer("PACS", CALLED, "127.0.0.1")


def encoded(ds: pydicom.Dataset, syntax: str = ExplicitVRLittleEndian) -> bytes:
    """The data set as it travels in a C-STORE (no preamble, no file meta)."""
    fp = DicomBytesIO()
    fp.is_little_endian = True
    fp.is_implicit_VR = syntax == ImplicitVRLittleEndian
    write_dataset(fp, ds)
    return fp.getvalue()


def command_for(ds: pydicom.Dataset) -> pydicom.Dataset:
    command = pydicom.Dataset()
    command.AffectedSOPClassUID = ds.SOPClassUID
    command.AffectedSOPInstanceUID = ds.SOPInstanceUID
    return command


def test_part10_header_reads_back_with_pydicom(tmp_path: Path) -> None:
    # An odd-length UID is padded with NUL, as PS3.5 requires.
    header = part10.part10_header(CTImageStorage, "1.2.3.45", ExplicitVRLittleEndian, "PACS")
    ds = pydicom.Dataset()
    ds.SOPInstanceUID = "1.2.3.45"
    path = tmp_path / "x.dcm"
    path.write_bytes(header + encoded(ds))
    read = pydicom.dcmread(path)
    meta = read.file_meta
    assert meta.MediaStorageSOPClassUID == CTImageStorage
    assert meta.MediaStorageSOPInstanceUID == "1.2.3.45"
    assert meta.TransferSyntaxUID == ExplicitVRLittleEndian
    assert meta.ImplementationClassUID == dul.IMPLEMENTATION_CLASS_UID
    assert meta.ImplementationVersionName == dul.IMPLEMENTATION_VERSION
    assert meta.SourceApplicationEntityTitle == "PACS"
    assert meta.FileMetaInformationGroupLength == len(header) - 132 - 12
    assert read.SOPInstanceUID == "1.2.3.45"


@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian])
def test_header_is_read_from_the_first_bytes(tmp_path: Path, syntax: str) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path, slices=1, size=256)[0])
    data = encoded(ds, syntax)
    head = read_header(data[:HEAD_BYTES], syntax)
    assert head is not None
    assert head.StudyInstanceUID == ds.StudyInstanceUID
    pixels = head.get_item(0x7FE00010, keep_deferred=True)
    assert pixels.length == 256 * 256 * 2
    assert pixels.value_tell + pixels.length == len(data)
    # Cut before Pixel Data: not yet.
    cut = data.index(b"\xe0\x7f\x10\x00")
    assert read_header(data[:cut], syntax) is None
    assert read_header(data[: cut // 2], syntax) is None
    # Deflate needs the whole file.
    assert read_header(data, DeflatedExplicitVRLittleEndian) is None


@pytest.mark.parametrize("fragment", [1000, 16384, 131072])
def test_fragments_of_any_size_store_the_exact_bytes(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path, fragment: int
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1, size=256)[0])
    data = encoded(ds)
    incoming = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    for start in range(0, len(data), fragment):
        incoming.write(memoryview(data)[start : start + fragment])
    assert incoming.finish().Status == 0x0000
    with Session(sqlite_engine) as s:
        row = s.scalars(select(Instance)).one()
    stored = (receiver.spool.root / row.path).read_bytes()
    assert stored.endswith(data)
    assert pydicom.dcmread(io.BytesIO(stored)).SOPInstanceUID == ds.SOPInstanceUID
    assert list(receiver.spool.tmp_dir.iterdir()) == []


def test_header_longer_than_the_head_is_read_from_the_file(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    block = ds.private_block(0x0029, "IMAGING_AI TEST", create=True)
    block.add_new(0x10, "OB", bytes(HEAD_BYTES + 1000))  # before Pixel Data
    data = encoded(ds)
    assert read_header(data[:HEAD_BYTES], ExplicitVRLittleEndian) is None
    incoming = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    for start in range(0, len(data), 16384):
        incoming.write(memoryview(data)[start : start + 16384])
    assert incoming.finish().Status == 0x0000
    with Session(sqlite_engine) as s:
        row = s.scalars(select(Instance)).one()
    assert (receiver.spool.root / row.path).read_bytes().endswith(data)


def test_truncated_pixel_data_is_refused_on_the_streamed_path(
    receiver: Receiver, tmp_path: Path
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1, size=256)[0])
    data = encoded(ds)[:-5000]
    incoming = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    incoming.write(memoryview(data))
    status = incoming.finish()
    assert status.Status == 0xC000
    assert "Pixel Data truncated" in status.ErrorComment
    assert list(receiver.spool.walk()) == []
    assert list(receiver.spool.tmp_dir.iterdir()) == []


@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian])
def test_an_undecodable_image_attribute_is_refused_with_its_reason(
    receiver: Receiver, tmp_path: Path, syntax: str
) -> None:
    # Found by the fuzz test: a multi-valued Number of Frames once escaped as an exception
    # from the header's decoding and broke the association instead of refusing the instance.
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    ds.NumberOfFrames = [1, 2]
    incoming = receiver.begin_store(command_for(ds), syntax, PEER)
    incoming.write(memoryview(encoded(ds, syntax)))
    status = incoming.finish()
    assert status.Status == 0xC000
    assert "cannot be decoded" in status.ErrorComment
    assert list(receiver.spool.walk()) == []
    assert list(receiver.spool.tmp_dir.iterdir()) == []


def test_invalid_uid_in_the_command_is_refused_and_the_data_dropped(
    receiver: Receiver, tmp_path: Path
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    command = command_for(ds)
    command.AffectedSOPInstanceUID = "1.2.../../etc"
    incoming = receiver.begin_store(command, ExplicitVRLittleEndian, PEER)
    incoming.write(memoryview(encoded(ds)))
    status = incoming.finish()
    assert status.Status == 0xC000
    assert "SOP Instance UID" in status.ErrorComment
    assert list(receiver.spool.tmp_dir.iterdir()) == []


def test_a_transfer_cut_off_leaves_nothing(receiver: Receiver, tmp_path: Path) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    incoming = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    incoming.write(memoryview(encoded(ds))[:3000])
    incoming.discard()
    assert list(receiver.spool.tmp_dir.iterdir()) == []
    assert list(receiver.spool.walk()) == []


def test_implicit_vr_over_the_network_keeps_the_pixels(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1, size=128)[0])
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage, [ImplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", receiver.port, ae_title=CALLED)
    assert assoc.send_c_store(ds).Status == 0x0000
    assoc.release()
    with Session(sqlite_engine) as s:
        row = s.scalars(select(Instance)).one()
    assert row.transfer_syntax_uid == ImplicitVRLittleEndian
    stored = pydicom.dcmread(receiver.spool.root / row.path)
    assert stored.file_meta.TransferSyntaxUID == ImplicitVRLittleEndian
    assert stored.file_meta.SourceApplicationEntityTitle == "PACS"
    assert np.array_equal(stored.pixel_array, ds.pixel_array)


def test_a_file_that_fails_to_land_leaves_no_row(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OutOfResources("disk full while writing a received instance")

    monkeypatch.setattr(receiver.spool, "adopt", disk_full)
    incoming = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    incoming.write(memoryview(encoded(ds)))
    status = incoming.finish()
    assert status.Status == 0xA700
    with Session(sqlite_engine) as s:
        assert s.scalars(select(Instance)).all() == []
    assert list(receiver.spool.tmp_dir.iterdir()) == []


def test_a_replacement_that_fails_to_land_keeps_the_earlier_copy(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    first = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    first.write(memoryview(encoded(ds)))
    assert first.finish().Status == 0x0000

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OutOfResources("disk full while writing a received instance")

    monkeypatch.setattr(receiver.spool, "adopt", disk_full)
    ds.InstanceNumber = 77
    second = receiver.begin_store(command_for(ds), ExplicitVRLittleEndian, PEER)
    second.write(memoryview(encoded(ds)))
    assert second.finish().Status == 0xA700
    with Session(sqlite_engine) as s:
        row = s.scalars(select(Instance)).one()
    kept = pydicom.dcmread(receiver.spool.root / row.path)
    assert kept.InstanceNumber != 77
