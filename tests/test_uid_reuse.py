"""A SOP Instance UID already catalogued under another study is refused (issue 18 item 7).

Before the fix the upsert replaced the row by UID alone: the instance moved to the other
patient's study (the victim one instance short) and the victim's file was orphaned.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from imaging_ai.catalog import Catalog, InstanceMeta
from imaging_ai.db.models import Instance, Series, Study
from imaging_ai.errors import DuplicateSOPInstance
from imaging_ai.receive import Receiver
from imaging_ai.receive_store import STATUS_DUPLICATE_SOP_INSTANCE
from imaging_ai.spool import Spool
from tests.dicom_factory import ct_series
from tests.test_receive import associate, start_receiver

CT = "1.2.840.10008.5.1.4.1.1.2"
SYNTAX = "1.2.840.10008.1.2.1"


def _meta(study: str, series: str, sop: str) -> InstanceMeta:
    return InstanceMeta(study, series, sop, CT, SYNTAX, modality="CT")


def _study_of(engine: Engine, sop_uid: str) -> str:
    with Session(engine) as s:
        query = (
            select(Study.study_instance_uid)
            .join(Series, Series.study_id == Study.id)
            .join(Instance, Instance.series_id == Series.id)
            .where(Instance.sop_instance_uid == sop_uid)
        )
        return s.scalars(query).one()


def test_catalog_refuses_a_uid_of_another_study_and_keeps_the_victims_row(
    engine: Engine, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    catalog = Catalog(engine, spool)
    at = datetime.now(UTC)
    sop = generate_uid()
    victim = _meta(generate_uid(), generate_uid(), sop)
    catalog.record(victim, "a/x.dcm", 10, at)
    with pytest.raises(DuplicateSOPInstance, match=sop):
        catalog.record(_meta(generate_uid(), generate_uid(), sop), "b/x.dcm", 20, at)
    assert _study_of(engine, sop) == victim.study_uid
    with Session(engine) as s:
        row = s.scalars(select(Instance).where(Instance.sop_instance_uid == sop)).one()
        assert (row.path, row.size_bytes) == ("a/x.dcm", 10)
    # A re-send into the same study still replaces, also from another series of it.
    catalog.record(victim, "a/x.dcm", 11, at)
    moved = _meta(victim.study_uid, generate_uid(), sop)
    catalog.record(moved, "a/y.dcm", 12, at)
    with Session(engine) as s:
        row = s.scalars(select(Instance).where(Instance.sop_instance_uid == sop)).one()
        assert (row.path, row.size_bytes) == ("a/y.dcm", 12)


def test_a_reused_uid_from_another_patient_is_refused_over_dicom(
    sqlite_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = [pydicom.dcmread(p) for p in ct_series(tmp_path / "a", slices=20)]
    other = [
        pydicom.dcmread(p)
        for p in ct_series(
            tmp_path / "b", slices=2, PatientName="OTHER^PERSON", PatientID="OTHER-ID-9"
        )
    ]
    reused = victim[4].SOPInstanceUID
    other[0].SOPInstanceUID = other[0].file_meta.MediaStorageSOPInstanceUID = reused
    receiver: Receiver = start_receiver(sqlite_engine, tmp_path)
    try:
        assoc = associate(receiver.port)
        for ds in victim:
            assert assoc.send_c_store(ds).Status == 0x0000  # type: ignore[attr-defined]
        with Session(sqlite_engine) as s:
            path = s.scalars(select(Instance.path).where(Instance.sop_instance_uid == reused)).one()
        before = (receiver.spool.root / path).read_bytes()
        with caplog.at_level(logging.WARNING, logger="imaging_ai.receive_store"):
            refused = assoc.send_c_store(other[0])  # type: ignore[attr-defined]
        assert refused.Status == STATUS_DUPLICATE_SOP_INSTANCE
        assert refused.ErrorComment.startswith("UID already in another study")
        # The association carries on: the other study's next instance is kept.
        assert assoc.send_c_store(other[1]).Status == 0x0000  # type: ignore[attr-defined]
        assoc.release()  # type: ignore[attr-defined]
    finally:
        receiver.stop()
    victim_uid = victim[0].StudyInstanceUID
    with Session(sqlite_engine) as s:
        count = (
            select(func.count())
            .select_from(Instance)
            .join(Series, Series.id == Instance.series_id)
            .join(Study, Study.id == Series.study_id)
            .where(Study.study_instance_uid == victim_uid)
        )
        assert s.scalar(count) == 20
    assert _study_of(sqlite_engine, reused) == victim_uid
    assert (receiver.spool.root / path).read_bytes() == before
    intruder = receiver.spool.relative_path(
        other[0].StudyInstanceUID, other[0].SeriesInstanceUID, reused
    )
    assert not receiver.spool.exists(intruder), "the refused instance's file was kept"
    lines = [r.getMessage() for r in caplog.records]
    assert any("0x0111" in line and reused in line for line in lines), lines
    assert not any("OTHER" in line for line in lines)


def test_reconcile_does_not_register_a_spool_file_whose_uid_is_another_studys(
    sqlite_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    catalog = Catalog(sqlite_engine, spool)
    victim = pydicom.dcmread(ct_series(tmp_path / "a", slices=1)[0])
    other = pydicom.dcmread(ct_series(tmp_path / "b", slices=1)[0])
    other.SOPInstanceUID = other.file_meta.MediaStorageSOPInstanceUID = victim.SOPInstanceUID
    for ds in (victim, other):
        path = tmp_path / "f.dcm"
        ds.save_as(path, enforce_file_format=True)
        spool.adopt(path, ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID)
        if ds is victim:
            assert catalog.reconcile(()) == (1, 0)
    with caplog.at_level(logging.ERROR, logger="imaging_ai.catalog"):
        assert catalog.reconcile(()) == (0, 0)
    assert _study_of(sqlite_engine, victim.SOPInstanceUID) == victim.StudyInstanceUID
    assert any("another study" in r.getMessage() for r in caplog.records)
