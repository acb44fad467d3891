"""Takes spooled instances and records them as study, series and instance rows; reconciles.

A series that will never be analysed is marked so from its first instance, with the reason
(`not_analysed`): not a CT image (a dose SR, a secondary capture), or our own earlier result.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import pydicom
from pydicom.uid import UID
from sqlalchemy import Dialect, Engine, delete, select, update
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from imaging_ai.db.models import Instance, Series, Study, UTCDateTime
from imaging_ai.dicom.dataset_head import HeadValues
from imaging_ai.errors import DuplicateSOPInstance, InvalidDataset
from imaging_ai.receive_contexts import ANALYSED_SOP_CLASSES
from imaging_ai.site import MANUFACTURER
from imaging_ai.spool import Spool
from imaging_ai.states import StudyState

log = logging.getLogger(__name__)

_ID_CACHE_SIZE = 10_000
_REQUIRED = ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "SOPClassUID")
# Every attribute meta_from_dataset reads (besides the routing tags).
CATALOG_KEYWORDS = (
    *_REQUIRED,
    "Modality",
    "SeriesNumber",
    "AccessionNumber",
    "PatientName",
    "PatientID",
    "StudyDate",
    "Manufacturer",
)
_Row = TypeVar("_Row", Study, Series)


@dataclass(frozen=True)
class InstanceMeta:
    """What the catalog keeps of one received instance (header attributes only)."""

    study_uid: str
    series_uid: str
    sop_uid: str
    sop_class_uid: str
    transfer_syntax_uid: str
    modality: str = ""
    series_number: int | None = None
    accession_number: str = ""
    patient_name: str = ""
    patient_id: str = ""
    study_date: str = ""
    calling_ae: str = ""
    routing: dict[str, Any] = field(default_factory=dict, compare=False)
    manufacturer: str = ""


def meta_from_dataset(
    ds: pydicom.Dataset | HeadValues,
    transfer_syntax_uid: str,
    calling_ae: str,
    routing_tags: tuple[str, ...],
) -> InstanceMeta:
    """Read the attributes the catalog needs; never touches Pixel Data.

    Raises
    ------
    InvalidDataset
        When a UID the spool is keyed by is missing.
    """
    missing = [k for k in _REQUIRED if not ds.get(k)]
    if missing:
        raise InvalidDataset(f"dataset lacks {', '.join(missing)}")
    study_uid = str(ds.StudyInstanceUID)
    series_uid = str(ds.SeriesInstanceUID)
    sop_uid = str(ds.SOPInstanceUID)
    sop_class = str(ds.SOPClassUID)
    series_number = ds.get("SeriesNumber")
    return InstanceMeta(
        study_uid=study_uid,
        series_uid=series_uid,
        sop_uid=sop_uid,
        sop_class_uid=sop_class,
        transfer_syntax_uid=transfer_syntax_uid,
        modality=str(ds.get("Modality", "")),
        series_number=int(series_number) if series_number not in (None, "") else None,
        accession_number=str(ds.get("AccessionNumber", "")),
        patient_name=str(ds.get("PatientName", "")),
        patient_id=str(ds.get("PatientID", "")),
        study_date=str(ds.get("StudyDate", "")),
        calling_ae=calling_ae,
        routing=routing_values(ds, routing_tags),
        manufacturer=str(ds.get("Manufacturer", "") or ""),
    )


def not_analysed(meta: InstanceMeta) -> str:
    """Why the series of this instance is kept but never analysed; "" where it may be.

    Our own SEG and SR carry our Manufacturer (`imaging_ai.site.MANUFACTURER`), which no
    scanner writes; anything that is not a CT image is named by its SOP class. Which CT
    series is analysed (not a localizer, axial, enough slices) is decided when the study is
    (`imaging_ai.volume.choose_series`).
    """
    if meta.manufacturer == MANUFACTURER:
        return "our own result"
    if meta.sop_class_uid not in ANALYSED_SOP_CLASSES:
        return f"not CT: {UID(meta.sop_class_uid).name}"
    if meta.modality != "CT":
        return f"not CT: modality {meta.modality or 'not given'}"
    return ""


def routing_values(ds: pydicom.Dataset | HeadValues, tags: tuple[str, ...]) -> dict[str, str]:
    """Values of the tags that priority rules read, top level or in Request Attributes."""
    values: dict[str, str] = {}
    requests = ds.get("RequestAttributesSequence") or []
    for tag in tags:
        value = ds.get(tag)
        if value in (None, ""):
            value = next((item.get(tag) for item in requests if item.get(tag)), None)
        if value not in (None, ""):
            values[tag] = str(value).strip()
    return values


class Catalog:
    """Database rows for received instances; one short transaction per instance.

    The hot path is plain SQL on the DBAPI connection (`_RowSQL`): an instance costs one
    UPDATE of its study (which also tells whether it is late), one of its series and one
    upsert.
    """

    def __init__(self, engine: Engine, spool: Spool) -> None:
        self.engine = engine
        self.spool = spool
        self._ids: dict[str, tuple[int, int]] = {}
        self._ids_lock = threading.Lock()
        self._sql = _RowSQL(engine.dialect)
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error

    def record(
        self,
        meta: InstanceMeta,
        relative: str,
        size_bytes: int,
        at: datetime,
        new_sender: bool = False,
    ) -> bool:
        """Record an instance that is already durable in the spool; return True if it is late.

        A late instance belongs to a study already past receiving: it is kept and flagged.
        ``new_sender``: the first instance of the study on its association, which then counts
        as a sender of the study until it releases (`released`).
        """
        study_id, series_id = self._ensure_rows(meta, at)
        sql = self._sql
        instance = (
            series_id,
            meta.sop_uid,
            meta.sop_class_uid,
            meta.transfer_syntax_uid,
            relative,
            size_bytes,
            sql.timestamp(at),
            self.spool.node,
        )

        def row(cursor: DBAPICursor) -> bool:
            cursor.execute(sql.touch_study, (sql.timestamp(at), study_id))
            late = cursor.rowcount == 0
            if late:
                cursor.execute(sql.count_late, (study_id,))
            else:
                cursor.execute(sql.touch_series, (sql.timestamp(at), series_id))
                if new_sender:
                    cursor.execute(sql.open_sender, (study_id,))
            cursor.execute(sql.upsert_instance, (*instance, late, False, None, study_id))
            if cursor.rowcount == 0:
                raise DuplicateSOPInstance(
                    f"UID already in another study: SOP Instance UID {meta.sop_uid}"
                )
            return late

        late = self._in_transaction(row)
        return late

    def _in_transaction(self, work: Callable[[DBAPICursor], bool]) -> bool:
        """Run ``work`` in one transaction on a pooled DBAPI connection and commit.

        A database error is raised as SQLAlchemy's (the C-STORE handler maps those to
        0xA700); a connection the error shows to be broken is dropped from the pool.
        """
        try:
            # The pool's own connect: unlike a Connection's, its errors are the driver's.
            raw = self.engine.raw_connection()
        except self._dbapi_error as exc:
            raise DBAPIError.instance(
                "connecting for the catalog row of an instance",
                None,
                exc,
                self._dbapi_error,
                connection_invalidated=True,
                dialect=self.engine.dialect,
            ) from exc
        try:
            cursor = raw.cursor()
            try:
                result = work(cursor)
                raw.commit()
                return result
            except self._dbapi_error as exc:
                dialect = self.engine.dialect
                broken = dialect.is_disconnect(cast(Any, exc), raw.dbapi_connection, cursor)
                if broken:
                    raw.invalidate(exc)
                else:
                    with contextlib.suppress(self._dbapi_error):
                        raw.rollback()
                raise DBAPIError.instance(
                    "catalog row of an instance",
                    None,
                    exc,
                    self._dbapi_error,
                    connection_invalidated=broken,
                    dialect=dialect,
                ) from exc
            except Exception:
                with contextlib.suppress(self._dbapi_error):
                    raw.rollback()
                raise
            finally:
                if raw.is_valid:
                    cursor.close()
        finally:
            raw.close()

    def released(self, study_uids: Iterable[str], at: datetime) -> None:
        """An association that delivered instances of these studies released normally."""
        with self.engine.begin() as conn:
            conn.execute(
                update(Study)
                .where(
                    Study.study_instance_uid.in_(list(study_uids)),
                    Study.state == StudyState.RECEIVING,
                )
                .values(senders=Study.senders - 1, released_at=at)
            )

    def forget(self, sop_uid: str, received_at: datetime) -> None:
        """Delete an instance's row recorded at ``received_at`` whose file never landed."""
        with self.engine.begin() as conn:
            conn.execute(
                delete(Instance).where(
                    Instance.sop_instance_uid == sop_uid, Instance.received_at == received_at
                )
            )

    def _ensure_rows(self, meta: InstanceMeta, at: datetime) -> tuple[int, int]:
        with self._ids_lock:
            cached = self._ids.get(meta.series_uid)
        if cached is not None:
            return cached
        with Session(self.engine) as s, s.begin():
            study = self._study(s, meta, at)
            series = self._series(s, study, meta, at)
            ids = (study.id, series.id)
        with self._ids_lock:
            if len(self._ids) > _ID_CACHE_SIZE:
                self._ids.clear()
            self._ids[meta.series_uid] = ids
        return ids

    def _study(self, s: Session, meta: InstanceMeta, at: datetime) -> Study:
        query = select(Study).where(Study.study_instance_uid == meta.study_uid)
        study = s.scalars(query).first()
        if study is not None:
            return study
        study = Study(
            study_instance_uid=meta.study_uid,
            accession_number=meta.accession_number,
            patient_name=meta.patient_name,
            patient_id=meta.patient_id,
            study_date=meta.study_date,
            calling_ae=meta.calling_ae,
            routing=meta.routing,
            state=StudyState.RECEIVING,
            received_at=at,
            last_instance_at=at,
        )
        return _insert_or_get(s, study, query)

    def _series(self, s: Session, study: Study, meta: InstanceMeta, at: datetime) -> Series:
        query = select(Series).where(Series.series_instance_uid == meta.series_uid)
        series = s.scalars(query).first()
        if series is not None:
            return series
        series = Series(
            study_id=study.id,
            series_instance_uid=meta.series_uid,
            modality=meta.modality,
            series_number=meta.series_number,
            last_instance_at=at,
            not_analysed=not_analysed(meta),
        )
        return _insert_or_get(s, series, query)

    def reconcile(self, routing_tags: tuple[str, ...]) -> tuple[int, int]:
        """Register spool files without a row and mark rows without a file missing.

        Returns
        -------
        tuple[int, int]
            (files registered, rows marked missing)
        """
        with self.engine.connect() as conn:
            known = {p: m for p, m in conn.execute(select(Instance.path, Instance.missing))}
        on_disk = set(self.spool.walk())
        registered = sum(self._register(p, routing_tags) for p in sorted(on_disk - set(known)))
        gone = [p for p, missing in known.items() if not missing and p not in on_disk]
        if gone:
            with self.engine.begin() as conn:
                conn.execute(update(Instance).where(Instance.path.in_(gone)).values(missing=True))
            log.error("%d instance file(s) recorded in the database are missing", len(gone))
        return registered, len(gone)

    def _register(self, relative: str, routing_tags: tuple[str, ...]) -> bool:
        path = self.spool.root / relative
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            meta = meta_from_dataset(ds, str(ds.file_meta.TransferSyntaxUID), "", routing_tags)
        except (InvalidDataset, pydicom.errors.InvalidDicomError, OSError, AttributeError) as exc:
            log.error("spool file %s cannot be registered: %s", relative, exc)
            return False
        at = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        try:
            self.record(meta, relative, path.stat().st_size, at)
        except DuplicateSOPInstance as exc:
            log.error("spool file %s is not registered: %s", relative, exc)
            return False
        return True


class _RowSQL:
    """The hot path's SQL as text for the DBAPI connection, built once per dialect.

    Executing a Core statement through SQLAlchemy cost ~0.1 ms of Python each, more than
    SQLite took to run it; an instance's row (three statements and a commit) runs on the
    pooled DBAPI connection instead. The SQL is the same on SQLite (3.24+) and PostgreSQL;
    only the parameter marker differs.
    """

    def __init__(self, dialect: Dialect) -> None:
        p = "?" if dialect.paramstyle == "qmark" else "%s"
        # Timestamps are bound as SQLAlchemy would (UTC; naive text on SQLite).
        self.timestamp: Callable[[datetime], Any] = UTCDateTime().bind_processor(dialect) or (
            lambda value: value
        )
        studies, series = Study.__tablename__, Series.__tablename__
        # The UPDATE's row count also says whether the study is still receiving (else late).
        self.touch_study = (
            f"UPDATE {studies} SET last_instance_at = {p} "
            f"WHERE id = {p} AND state = '{StudyState.RECEIVING}'"
        )
        self.count_late = f"UPDATE {studies} SET late_instances = late_instances + 1 WHERE id = {p}"
        # An association's first instance of a study; until it releases, the study is not
        # complete by release (an aborted association never releases: idle timers decide).
        self.open_sender = (
            f"UPDATE {studies} SET senders = senders + 1, released_at = NULL WHERE id = {p}"
        )
        self.touch_series = (
            f"UPDATE {series} SET last_instance_at = {p}, completed_at = NULL WHERE id = {p}"
        )
        replaced = [c for c in _INSTANCE_COLUMNS if c not in _NOT_REPLACED]
        instances = Instance.__tablename__
        # The same SOP Instance UID sent again replaces the earlier copy, but only within its
        # study: a UID reused by another study would otherwise move the instance there (the
        # victim study one instance short, its file orphaned). Then no row changes (row count
        # 0) and the caller refuses the instance; decided in the statement, so two receivers
        # racing with the same UID cannot both win.
        self.upsert_instance = (
            f"INSERT INTO {instances} ({', '.join(_INSTANCE_COLUMNS)}) "
            f"VALUES ({', '.join([p] * len(_INSTANCE_COLUMNS))}) "
            "ON CONFLICT (sop_instance_uid) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in replaced)
            + f" WHERE {instances}.series_id IN (SELECT id FROM {series} WHERE study_id = {p})"
        )


# In the order record() binds them.
_INSTANCE_COLUMNS = (
    "series_id",
    "sop_instance_uid",
    "sop_class_uid",
    "transfer_syntax_uid",
    "path",
    "size_bytes",
    "received_at",
    "node",
    "late",
    "missing",
    # A copy received again after retention deleted the file is a new file: no longer purged.
    "purge_id",
)
_NOT_REPLACED = {"id", "sop_instance_uid"}


def _insert_or_get(s: Session, row: _Row, query: Any) -> _Row:
    """Insert a row; if another writer inserted the same key first, return theirs."""
    try:
        with s.begin_nested():
            s.add(row)
    except IntegrityError:
        existing: _Row | None = s.scalars(query).first()
        if existing is None:
            raise
        return existing
    return row
