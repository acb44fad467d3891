"""Whole studies: every instance a CT study holds is stored (Success once durable), and the
series that are not analysed say why: at receipt (not CT, our own result) and when the study is
analysed (a localizer, not axial, another series chosen)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SegmentationStorage, generate_uid
from pynetdicom import AE, StoragePresentationContexts
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.config import DicomConfig
from imaging_ai.db.models import Instance, Series
from imaging_ai.dicom.dataset_head import needed_bytes
from imaging_ai.receive import Receiver
from imaging_ai.site import MANUFACTURER
from imaging_ai.volume import choose_series, group_series
from tests.dicom_factory import ct_series, dose_sr, localizer
from tests.test_receive import CALLED, start_receiver


def our_seg(path: Path, of: Dataset, frames: int = 3) -> Path:
    """A binary SEG as we write them: 1 bit a pixel, frames packed, our Manufacturer."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SegmentationStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta, ds.SOPClassUID = meta, SegmentationStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = of.StudyInstanceUID, generate_uid()
    ds.Modality, ds.Manufacturer, ds.SeriesNumber = "SEG", MANUFACTURER, 99
    ds.Rows = ds.Columns = 10  # 300 bits: 38 bytes (the old check wanted 300)
    ds.NumberOfFrames, ds.SamplesPerPixel = frames, 1
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 1, 1, 0, 0
    ds.PhotometricInterpretation = "MONOCHROME2"
    bits = np.zeros(10 * 10 * frames, dtype=np.uint8)
    bits[::7] = 1
    packed = np.packbits(bits, bitorder="little").tobytes()
    ds.PixelData = packed + b"\0" * (len(packed) % 2)
    ds.save_as(path, enforce_file_format=True)
    return path


def mr_image(path: Path, of: Dataset) -> Path:
    ds = pydicom.dcmread(localizer(path, of, series_number=50))
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.4"
    ds.Modality, ds.ImageType = "MR", ["ORIGINAL", "PRIMARY"]
    ds.save_as(path, enforce_file_format=True)
    return path


def study(tmp_path: Path) -> dict[str, list[Path]]:
    ct = ct_series(tmp_path / "ct", slices=4, size=16)
    first = pydicom.dcmread(ct[0])
    return {
        "ct": ct,
        "dose": [dose_sr(tmp_path / "dose.dcm", first)],
        "localizer": [localizer(tmp_path / "scout.dcm", first)],
        "seg": [our_seg(tmp_path / "seg.dcm", first)],
        "mr": [mr_image(tmp_path / "mr.dcm", first)],
    }


def send_all(port: int, files: list[Path]) -> list[int]:
    ae = AE(ae_title="PACS")
    ae.requested_contexts = StoragePresentationContexts[:120]  # 128 at most per association
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED)
    assert assoc.is_established
    try:
        return [int(assoc.send_c_store(pydicom.dcmread(p)).Status) for p in files]
    finally:
        assoc.release()


def test_every_instance_of_a_whole_study_is_success(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    files = study(tmp_path)
    statuses = send_all(receiver.port, [p for paths in files.values() for p in paths])
    assert statuses == [0x0000] * sum(len(p) for p in files.values())
    with Session(sqlite_engine) as s:
        reasons = {
            row.modality + ("-scout" if row.series_number == 998 else ""): row.not_analysed
            for row in s.scalars(select(Series))
        }
        assert len(s.scalars(select(Instance)).all()) == 8
    assert reasons == {
        "CT": "",
        "CT-scout": "",  # a CT image: whether it is a volume is decided at analysis
        "SR": "not CT: X-Ray Radiation Dose SR Storage",
        "SEG": "our own result",
        "MR": "not CT: MR Image Storage",
    }
    stored = receiver.spool.root / next(receiver.spool.walk())
    assert stored.exists()


def test_a_configured_list_offers_only_its_classes(sqlite_engine: Engine, tmp_path: Path) -> None:
    receiver = start_receiver(sqlite_engine, tmp_path)
    receiver.stop()
    config = DicomConfig(ae_title=CALLED, storage_sop_classes=("CTImageStorage",))
    only_ct = Receiver(config, receiver.spool, receiver.catalog, ())
    assert [str(c.abstract_syntax) for c in only_ct.contexts] == [
        "1.2.840.10008.5.1.4.1.1.2",
        "1.2.840.10008.1.1",
    ]
    assert len(receiver.contexts) > 150  # "all": every Storage SOP class, and Verification


def test_a_packed_binary_seg_needs_a_bit_a_pixel() -> None:
    seg = {"Rows": 10, "Columns": 10, "NumberOfFrames": 3, "BitsAllocated": 1}
    assert needed_bytes(seg) == 38
    assert needed_bytes({**seg, "BitsAllocated": 16}) == 600


def test_the_analysed_series_and_why_the_others_are_not(tmp_path: Path) -> None:
    files = study(tmp_path)
    thick = ct_series(
        tmp_path / "thick",
        slices=2,
        size=16,
        study_uid=str(pydicom.dcmread(files["ct"][0]).StudyInstanceUID),
        SeriesNumber=3,
    )
    groups = group_series([p for paths in files.values() for p in paths] + thick)
    choice = choose_series(groups)
    ct_uid = str(pydicom.dcmread(files["ct"][0]).SeriesInstanceUID)
    assert choice.uid == ct_uid

    def uid(name: str) -> str:
        return str(pydicom.dcmread(files[name][0]).SeriesInstanceUID)

    thick_uid = str(pydicom.dcmread(thick[0]).SeriesInstanceUID)
    assert choice.not_analysed == {
        uid("localizer"): "localizer",
        uid("dose"): "not CT: SR 1.2.840.10008.5.1.4.1.1.88.67",
        uid("seg"): "not CT: SEG 1.2.840.10008.5.1.4.1.1.66.4",
        uid("mr"): "not CT: MR 1.2.840.10008.5.1.4.1.1.4",
        thick_uid: "too few images for a volume",
    }


def test_migration_0008_goes_down_and_up_again(engine: Engine, tmp_path: Path) -> None:
    """On SQLite and PostgreSQL, with rows in series and instances (their foreign key)."""
    from alembic import command
    from sqlalchemy import inspect

    from imaging_ai.db.session import alembic_config
    from tests.test_retention import node_spool, seed_study

    seed_study(engine, node_spool(tmp_path / "spool"), 1)
    with Session(engine) as s, s.begin():
        s.scalars(select(Series)).one().not_analysed = "localizer"
    config = alembic_config(engine)
    command.downgrade(config, "0007")
    assert "not_analysed" not in {c["name"] for c in inspect(engine).get_columns("series")}
    command.upgrade(config, "head")
    with Session(engine) as s:
        assert s.scalars(select(Series)).one().not_analysed == ""  # may be analysed again
        assert s.scalars(select(Instance)).all() != []
