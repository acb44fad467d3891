"""Takes a received data set and its C-STORE request; gives it kept, or its refusal's status.

The store path of the storage SCP (`imaging_ai.receive.Receiver.store`), run in each
association's thread. `InstanceStore.keep` checks the data set (its header read on the way in by
`imaging_ai.receive_incoming`, else its spooled file): required attributes, value
representations, Pixel Data complete, UIDs as the C-STORE request announced them; then lands the
file in the spool (flush to disk, rename, directory fsync) and commits its row, side by side when
the association is alone in its process. `store_status` is the one place an exception from here
becomes a C-STORE status (`refuse` logs it): storage and database failures 0xA700 (the sender
retries), a UID already in another study 0x0111, a SOP Class that is not the request's 0xA900,
anything else 0xC000.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydicom import Dataset, dcmread
from pydicom.uid import UID
from sqlalchemy.exc import SQLAlchemyError

from imaging_ai.catalog import CATALOG_KEYWORDS, Catalog, InstanceMeta, meta_from_dataset
from imaging_ai.dicom import codec, dataset_head
from imaging_ai.dicom.association import Peer
from imaging_ai.dicom.dataset_head import HeadValues, PixelFacts, needed_bytes
from imaging_ai.dicom.dimse import Command
from imaging_ai.errors import DuplicateSOPInstance, InvalidDataset, SOPClassMismatch, StorageError
from imaging_ai.receive_contexts import UNCOMPRESSED_SYNTAXES
from imaging_ai.redact import exception_text
from imaging_ai.spool import Spool

log = logging.getLogger(__name__)

# DICOM PS3.4 Annex B status codes for the Storage service class.
STATUS_SUCCESS = 0x0000
# PS3.7 Annex C: the SOP Instance UID is already registered (here: under another study).
STATUS_DUPLICATE_SOP_INSTANCE = 0x0111
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_SOP_CLASS_MISMATCH = 0xA900
STATUS_CANNOT_UNDERSTAND = 0xC000
PIXEL_DATA_TAG = codec.PIXEL_DATA
UNDEFINED_LENGTH = codec.UNDEFINED_LENGTH
_INFLATE_CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredInstance:
    """Notification payload: an instance that was answered Success."""

    meta: InstanceMeta
    relative_path: str
    size_bytes: int
    late: bool
    received_at: datetime


@dataclass(frozen=True)
class Header:
    """A data set's attributes up to Pixel Data, read before its last fragment arrived."""

    pixel: PixelFacts
    meta: InstanceMeta | InvalidDataset  # what the catalog keeps, or why it cannot
    size: int  # bytes of the whole data set (Pixel Data's position counts from its start)
    meta_length: int = 0  # bytes before the data set in its file: preamble and file meta


def store_status(exc: BaseException) -> Dataset:
    """Map an exception from the store path to a C-STORE response (the one place it is done)."""
    # Storage and database failures are transient: 0xA700 makes PACS retry later.
    if isinstance(exc, StorageError | SQLAlchemyError):
        code = STATUS_OUT_OF_RESOURCES
    elif isinstance(exc, DuplicateSOPInstance):
        code = STATUS_DUPLICATE_SOP_INSTANCE
    elif isinstance(exc, SOPClassMismatch):
        code = STATUS_SOP_CLASS_MISMATCH
    else:
        code = STATUS_CANNOT_UNDERSTAND
    status = Dataset()
    status.Status = code
    # Error Comment is LO: at most 64 characters.
    status.ErrorComment = _error_comment(exc)[:64]
    return status


def _error_comment(exc: BaseException) -> str:
    if isinstance(exc, SQLAlchemyError):
        return "database unavailable; instance not kept, please retry"
    return str(exc) or exc.__class__.__name__


def refuse(exc: BaseException) -> Dataset:
    """Log why an instance is not kept and give the C-STORE failure status."""
    status = store_status(exc)
    expected = isinstance(exc, InvalidDataset | StorageError)
    log.log(
        logging.WARNING if isinstance(exc, InvalidDataset) else logging.ERROR,
        "C-STORE refused with status 0x%04X: %s",
        status.Status,
        exc,
        exc_info=not expected,
    )
    return status


class InstanceStore:
    """Keeps received instances: checked, landed in the spool, catalogued.

    Parameters
    ----------
    spool : Spool
        Where the files land.
    catalog : Catalog
        Where their rows are committed.
    routing_tags : tuple[str, ...]
        Attributes the priority rules read, kept with each instance.
    associations : callable
        The associations open now in this process: alone, an association's file lands on
        another thread while its row commits.
    threads : int
        Threads that land files beside the rows (one per association at most).
    """

    def __init__(
        self,
        spool: Spool,
        catalog: Catalog,
        routing_tags: tuple[str, ...],
        associations: Callable[[], int],
        threads: int,
    ) -> None:
        self.spool = spool
        self.catalog = catalog
        self.routing_tags = routing_tags
        self.head_reader = dataset_head.Reader(CATALOG_KEYWORDS + routing_tags)
        self._associations = associations
        self._adopter = ThreadPoolExecutor(threads, "dicom-adopt")
        # Study Instance UIDs each open association delivered, by its thread (an association
        # runs its C-STOREs in its own thread): the senders the catalog counts per study.
        self._sending: dict[int, set[str]] = {}

    def released(self) -> set[str]:
        """The studies this thread's association delivered, forgotten (it ended)."""
        return self._sending.pop(threading.get_ident(), set())

    def close(self) -> None:
        """Wait for the files landing now; land no more."""
        self._adopter.shutdown(wait=True)

    def keep(
        self,
        path: Path,
        command: Command | Dataset,
        syntax: str,
        peer: Peer,
        header: Header | None = None,
        synced: bool = False,
        flush: Callable[[], None] | None = None,
    ) -> StoredInstance:
        """Check a received data set's file, land it in the spool and commit its row.

        ``header`` was read from the data set's first bytes (without it the file is read);
        ``synced``: the file is already flushed to disk; else ``flush`` flushes it (and
        may run beside the row's transaction), or the spool does. Run in the association's
        thread: the studies it delivered are counted per association (``released``).

        Raises
        ------
        InvalidDataset, SOPClassMismatch, DuplicateSOPInstance, StorageError, SQLAlchemyError
            The instance is not kept (`refuse` gives its C-STORE status).
        """
        self.spool.ensure_space()
        if header is None:
            ds = self._read_file(path)
            dataset_head.check_vrs(ds)
            _check_pixel_data_complete(pixel_facts(ds), _read_size(path, ds, syntax), syntax)
            meta = self.header_meta(ds, syntax, peer.calling_ae)
        else:
            _check_pixel_data_complete(header.pixel, header.size, syntax)
            if isinstance(header.meta, InvalidDataset):
                raise header.meta
            meta = header.meta
        _check_command_uids(meta, command)
        relative = self.spool.relative_path(meta.study_uid, meta.series_uid, meta.sop_uid)
        size = path.stat().st_size if header is None else header.size + header.meta_length
        at = datetime.now(UTC)
        if self._associations() > 1:
            # With more than one association in this process the cores are the limit, and
            # handing the flush to another thread cost more CPU (thread switches) than the
            # overlap hid: 1.9-2.3 -> 1.7 ms of receiver CPU per image with four.
            replacing = self.spool.exists(relative)
            self._land(path, meta, synced, flush, size)
            try:
                late = self._record(meta, relative, size, at)
            except DuplicateSOPInstance:
                self._drop_refused(relative, replacing)
                raise
        else:
            late = self._record_beside_landing(path, meta, relative, synced, flush, size, at)
        if late:
            log.warning("late instance kept and flagged for an already completed study")
        return StoredInstance(meta, relative, size, late, at)

    def _record_beside_landing(
        self,
        path: Path,
        meta: InstanceMeta,
        relative: str,
        synced: bool,
        flush: Callable[[], None] | None,
        size: int,
        at: datetime,
    ) -> bool:
        """Land the file on the adopting thread while this one commits the row; both finish.

        The peer waits for the flush to disk, the rename into the spool and its directory
        fsync, and for the row: side by side they cost it the longer, not the sum. A row
        whose file then fails to land is deleted again (a replaced instance keeps its
        row: its earlier file is untouched).
        """
        replacing = self.spool.exists(relative)
        adopting = self._adopter.submit(self._land, path, meta, synced, flush, size)
        try:
            late = self._record(meta, relative, size, at)
        except DuplicateSOPInstance:
            wait([adopting])
            self._drop_refused(relative, replacing)
            raise
        except Exception:
            wait([adopting])  # the file may land without a row: a resend or reconcile adds it
            raise
        try:
            adopting.result()
        except Exception:
            if not replacing:
                self.catalog.forget(meta.sop_uid, at)
            raise
        return late

    def _drop_refused(self, relative: str, replacing: bool) -> None:
        """Remove the file of an instance refused after it landed (its UID is another study's).

        A file that was already there before this one (``replacing``) is left alone.
        """
        if replacing:
            return
        try:
            self.spool.remove(relative)
        except StorageError as exc:  # the refusal stands; reconcile will name the file
            log.error("refused instance's file not removed: %s", exc)

    def _record(self, meta: InstanceMeta, relative: str, size: int, at: datetime) -> bool:
        """Commit the instance's row; True if it is late. Counts this association as a sender."""
        sent = self._sending.setdefault(threading.get_ident(), set())
        new_sender = meta.study_uid not in sent
        late = self.catalog.record(meta, relative, size, at, new_sender)
        if new_sender and not late:
            sent.add(meta.study_uid)
        return late

    def _land(
        self,
        path: Path,
        meta: InstanceMeta,
        synced: bool,
        flush: Callable[[], None] | None,
        size: int,
    ) -> None:
        if flush is not None:
            flush()
            synced = True
        self.spool.adopt(path, meta.study_uid, meta.series_uid, meta.sop_uid, synced, size)

    @staticmethod
    def _read_file(path: Path) -> Dataset:
        try:
            # Values over 1 KB (Pixel Data) are not read, only located.
            return dcmread(path, defer_size=1024)
        except Exception as exc:
            raise InvalidDataset(f"dataset cannot be decoded: {exception_text(exc)}") from exc

    def header_meta(self, ds: Dataset | HeadValues, syntax: str, calling_ae: str) -> InstanceMeta:
        """What the catalog keeps of a data set's header.

        Raises
        ------
        InvalidDataset
            A required attribute is missing or cannot be decoded.
        """
        try:
            return meta_from_dataset(ds, syntax, calling_ae, self.routing_tags)
        except InvalidDataset:
            raise
        except Exception as exc:
            raise InvalidDataset(f"dataset cannot be decoded: {exception_text(exc)}") from exc


def pixel_facts(ds: Dataset) -> PixelFacts:
    """Pixel Data's position and length in a data set read by pydicom, and what it needs."""
    elem = ds.get_item(PIXEL_DATA_TAG, keep_deferred=True)
    length = getattr(elem, "length", None)
    return PixelFacts(getattr(elem, "value_tell", None), length, needed_bytes(ds))


def _read_size(path: Path, ds: Dataset, syntax: str) -> int:
    """The length of what pydicom read, in the coordinates of its elements' positions.

    The file's size, but for deflate the inflated data set's: pydicom inflates the data set
    and its positions count from the inflated stream's start, so the compressed file's size
    would make a complete data set look truncated (every deflated C-STORE refused 0xC000).
    """
    if not UID(syntax).is_deflated:
        return path.stat().st_size
    start = _dataset_start(path, ds)
    with path.open("rb") as f:
        f.seek(start)
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        size = 0
        while chunk := f.read(_INFLATE_CHUNK):
            size += len(inflater.decompress(chunk))
        return size + len(inflater.flush())


def _dataset_start(path: Path, ds: Dataset) -> int:
    """Where the data set starts in a Part-10 file: after the preamble and File Meta."""
    group_length = ds.file_meta.get("FileMetaInformationGroupLength")
    if group_length is None:
        raise InvalidDataset("deflated data set without File Meta Information Group Length")
    # Preamble and 'DICM', then the group length element (12 bytes) and the group it counts.
    return codec.PREAMBLE_BYTES + 12 + int(group_length)


def _check_command_uids(meta: InstanceMeta, command: Command | Dataset) -> None:
    """Refuse a data set whose SOP Class or Instance UID is not the C-STORE request's.

    The UIDs are not in the reason: it goes back to the sender and into the log.
    """
    if meta.sop_class_uid != str(command.get("AffectedSOPClassUID", "")):
        raise SOPClassMismatch("dataset SOP Class UID differs from the C-STORE request")
    if meta.sop_uid != str(command.get("AffectedSOPInstanceUID", "")):
        # The file's meta (the command's UID) and the spool's path (the data set's) would
        # name two different instances.
        raise InvalidDataset("SOP Instance UID differs from the C-STORE request's")


def _check_pixel_data_complete(pixel: PixelFacts, size: int, syntax: str) -> None:
    """Refuse native Pixel Data of undefined length, shorter than its image attributes need,
    or past the end.

    ``size`` is the length of what was read, in the coordinates of the element's position.
    Only the element's position and length are read, never the pixels.
    """
    length, tell = pixel.length, pixel.value_tell
    if length == UNDEFINED_LENGTH and syntax in UNCOMPRESSED_SYNTAXES:
        # Encapsulated (compressed) pixels on an uncompressed transfer syntax.
        raise InvalidDataset("Pixel Data of undefined length on an uncompressed syntax")
    if length is None or length == UNDEFINED_LENGTH:
        return
    if tell is not None and tell + length > size:
        raise InvalidDataset(f"Pixel Data truncated: {size - tell} of {length} bytes received")
    if length < pixel.needed:
        raise InvalidDataset(
            f"Pixel Data truncated: {length} bytes, the image needs {pixel.needed}"
        )
