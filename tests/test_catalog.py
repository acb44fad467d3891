"""Catalog on SQLite and PostgreSQL: rows per instance, duplicates, late instances, reconcile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pydicom
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from imaging_ai.catalog import Catalog, InstanceMeta, meta_from_dataset
from imaging_ai.db.models import Instance, Series, Study
from imaging_ai.spool import Spool
from tests.dicom_factory import ct_series

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def meta(sop: str, series: str = "1.3", study: str = "1.2") -> InstanceMeta:
    return InstanceMeta(
        study,
        series,
        sop,
        "1.2.840.10008.5.1.4.1.1.2",
        "1.2.840.10008.1.2.1",
        accession_number="A1",
        calling_ae="PACS",
        routing={"RequestedProcedurePriority": "STAT"},
    )


def make_catalog(engine: Engine, tmp_path: Path) -> Catalog:
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    return Catalog(engine, spool)


def test_instances_make_study_and_series_rows(engine: Engine, tmp_path: Path) -> None:
    catalog = make_catalog(engine, tmp_path)
    for i in range(3):
        assert catalog.record(meta(f"1.4.{i}"), f"p{i}", 10, T0 + timedelta(seconds=i)) is False
    with Session(engine) as s:
        study = s.scalars(select(Study)).one()
        assert study.state == "receiving"
        assert study.accession_number == "A1"
        assert study.calling_ae == "PACS"
        assert study.routing == {"RequestedProcedurePriority": "STAT"}
        assert study.received_at == T0
        assert study.last_instance_at == T0 + timedelta(seconds=2)
        assert s.scalars(select(Series)).one().last_instance_at == T0 + timedelta(seconds=2)
        assert len(s.scalars(select(Instance)).all()) == 3


def test_duplicate_sop_instance_replaces_row(engine: Engine, tmp_path: Path) -> None:
    catalog = make_catalog(engine, tmp_path)
    catalog.record(meta("1.4.1"), "old", 10, T0)
    catalog.record(meta("1.4.1"), "new", 20, T0 + timedelta(seconds=1))
    with Session(engine) as s:
        instance = s.scalars(select(Instance)).one()
        assert (instance.path, instance.size_bytes) == ("new", 20)


def test_late_instance_is_kept_and_flagged(engine: Engine, tmp_path: Path) -> None:
    catalog = make_catalog(engine, tmp_path)
    catalog.record(meta("1.4.1"), "a", 10, T0)
    with Session(engine) as s, s.begin():
        s.scalars(select(Study)).one().state = "queued"
    assert catalog.record(meta("1.4.2"), "b", 10, T0 + timedelta(minutes=5)) is True
    with Session(engine) as s:
        study = s.scalars(select(Study)).one()
        assert study.late_instances == 1
        assert study.last_instance_at == T0
        late = s.scalars(select(Instance).where(Instance.sop_instance_uid == "1.4.2")).one()
        assert late.late is True


def test_reconcile_registers_orphans_and_marks_missing(engine: Engine, tmp_path: Path) -> None:
    catalog = make_catalog(engine, tmp_path)
    files = ct_series(tmp_path / "src", slices=2)
    datasets = [pydicom.dcmread(f) for f in files]
    # One file reached the spool but not the database (a crash between the two).
    orphan = datasets[0]
    catalog.spool.store(
        files[0].read_bytes(),
        orphan.StudyInstanceUID,
        orphan.SeriesInstanceUID,
        orphan.SOPInstanceUID,
    )
    # One row whose file has gone.
    gone = meta_from_dataset(datasets[1], "1.2.840.10008.1.2.1", "PACS", ())
    catalog.record(gone, "1.2/1.3/1.4.dcm", 10, T0)
    assert catalog.reconcile(()) == (1, 1)
    with Session(engine) as s:
        rows = {i.sop_instance_uid: i for i in s.scalars(select(Instance))}
        assert rows[str(orphan.SOPInstanceUID)].missing is False
        assert rows[str(datasets[1].SOPInstanceUID)].missing is True
    assert catalog.reconcile(()) == (0, 0)


def test_meta_reads_routing_from_request_attributes() -> None:
    ds = pydicom.Dataset()
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID = "1.2", "1.3", "1.4"
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    item = pydicom.Dataset()
    item.RequestedProcedurePriority = "STAT"
    ds.RequestAttributesSequence = [item]
    ds.AdmissionID = ""
    m = meta_from_dataset(
        ds, "1.2.840.10008.1.2", "CT1", ("RequestedProcedurePriority", "AdmissionID")
    )
    assert m.routing == {"RequestedProcedurePriority": "STAT"}


def test_row_written_on_the_dbapi_connection_reads_back_typed(
    engine: Engine, tmp_path: Path
) -> None:
    # The hot path writes plain SQL; every column must read back as the ORM writes it.
    catalog = make_catalog(engine, tmp_path)
    catalog.record(meta("1.4.1"), "1.2/1.3/1.4.1.dcm", 526306, T0, new_sender=True)
    with Session(engine) as s:
        instance = s.scalars(select(Instance)).one()
        assert instance.series.series_instance_uid == "1.3"
        assert instance.sop_class_uid == "1.2.840.10008.5.1.4.1.1.2"
        assert instance.transfer_syntax_uid == "1.2.840.10008.1.2.1"
        assert (instance.path, instance.size_bytes) == ("1.2/1.3/1.4.1.dcm", 526306)
        assert instance.received_at == T0 and instance.received_at.tzinfo is not None
        assert (instance.late, instance.missing) == (False, False)
        study = s.scalars(select(Study)).one()
        assert (study.senders, study.released_at) == (1, None)


def test_database_error_on_the_row_is_sqlalchemys(engine: Engine, tmp_path: Path) -> None:
    # The C-STORE handler answers 0xA700 for SQLAlchemy errors only.
    catalog = make_catalog(engine, tmp_path)
    catalog.record(meta("1.4.1"), "a", 10, T0)
    catalog._sql.touch_series = "UPDATE no_such_table SET x = 1"
    with pytest.raises(SQLAlchemyError):
        catalog.record(meta("1.4.2"), "b", 10, T0)
    catalog._sql = type(catalog._sql)(engine.dialect)
    assert catalog.record(meta("1.4.2"), "b", 10, T0) is False
    with Session(engine) as s:
        assert len(s.scalars(select(Instance)).all()) == 2


def test_a_database_that_cannot_be_reached_is_sqlalchemys_error(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # When the server has gone, the pool's reconnect raises the driver's own error (psycopg's
    # "connection failed", seen in tests/reliability/test_outages.py); the C-STORE handler must
    # still get SQLAlchemy's, which it answers with 0xA700.
    catalog = make_catalog(engine, tmp_path)
    catalog.record(meta("1.4.1"), "a", 10, T0)  # the study's and series' rows are known now

    def gone() -> None:
        raise engine.dialect.loaded_dbapi.OperationalError("connection failed")

    monkeypatch.setattr(engine, "raw_connection", gone)
    with pytest.raises(SQLAlchemyError):
        catalog.record(meta("1.4.2"), "b", 10, T0)
