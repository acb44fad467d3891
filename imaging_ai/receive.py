"""Takes DICOM associations from PACS (C-ECHO, C-STORE) and gives spooled, catalogued instances."""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
import socket
import socketserver
import ssl
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydicom import Dataset, dcmread
from pydicom.filereader import read_dataset
from pydicom.pixels.decoders.base import get_decoder
from pydicom.uid import (
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    RLELossless,
)
from pynetdicom.presentation import PresentationContext, build_context
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    CTImageStorage,
    EnhancedCTImageStorage,
    Verification,
)
from sqlalchemy.exc import SQLAlchemyError

from imaging_ai.admission import Gate, Places, Ticket
from imaging_ai.catalog import CATALOG_KEYWORDS, Catalog, InstanceMeta, meta_from_dataset
from imaging_ai.config import DicomConfig
from imaging_ai.dicom import codec, dataset_head, part10
from imaging_ai.dicom.association import Association, Peer
from imaging_ai.dicom.dataset_head import HeadValues, PixelFacts, needed_bytes
from imaging_ai.dicom.dimse import Command
from imaging_ai.dicom.negotiation import REJECT_BUSY, REJECT_CALLED_AE, REJECT_CALLING_AE
from imaging_ai.durable import write_all
from imaging_ai.errors import (
    DuplicateSOPInstance,
    InvalidDataset,
    SOPClassMismatch,
    StartupError,
    StorageError,
)
from imaging_ai.redact import exception_text
from imaging_ai.spool import Spool, check_uid, start_writeback, storage_error

log = logging.getLogger(__name__)

STORAGE_SOP_CLASSES = (CTImageStorage, EnhancedCTImageStorage)
UNCOMPRESSED_SYNTAXES = (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
)
LOSSLESS_SYNTAXES = (JPEGLSLossless, JPEG2000Lossless, RLELossless, JPEGLosslessSV1)

# DICOM PS3.4 Annex B status codes for the Storage service class.
STATUS_SUCCESS = 0x0000
# PS3.7 Annex C: the SOP Instance UID is already registered (here: under another study).
STATUS_DUPLICATE_SOP_INSTANCE = 0x0111
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_SOP_CLASS_MISMATCH = 0xA900
STATUS_CANNOT_UNDERSTAND = 0xC000
PIXEL_DATA_TAG = codec.PIXEL_DATA
UNDEFINED_LENGTH = codec.UNDEFINED_LENGTH
# The first bytes of a data set are kept in memory to read its header while the rest
# (Pixel Data) is still arriving; a header longer than this is read from the file instead.
HEAD_BYTES = codec.DATASET_HEAD_BYTES
HEAD_SYNTAXES = (ExplicitVRLittleEndian, ImplicitVRLittleEndian)
PIXEL_DATA_MARK = b"\xe0\x7f\x10\x00"  # (7FE0,0010) little endian
# Empty temporary files each receiver process keeps created ahead (Spool.keep_spares).
SPARE_FILES = 8


class ReceiverStats:
    """Counters shared by every receiver process (multiprocessing shared memory)."""

    FIELDS = ("stored", "late", "refused", "active")

    def __init__(self, context: Any = None) -> None:
        ctx = context or multiprocessing.get_context("spawn")
        self._values = {name: ctx.Value("q", 0) for name in self.FIELDS}

    def add(self, **deltas: int) -> None:
        """Add to counters by name."""
        for name, delta in deltas.items():
            value = self._values[name]
            with value.get_lock():
                value.value += delta

    def snapshot(self) -> dict[str, int]:
        """Current value of every counter."""
        return {name: int(v.value) for name, v in self._values.items()}


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


def accepted_transfer_syntaxes() -> list[UID]:
    """Uncompressed syntaxes, plus the lossless ones whose decoder is installed.

    Refusing an undecodable syntax at negotiation makes PACS fall back to an
    uncompressed one instead of sending something that would fail later.
    """
    usable = [uid for uid in LOSSLESS_SYNTAXES if _decoder_available(uid)]
    return [*UNCOMPRESSED_SYNTAXES, *usable]


def _decoder_available(uid: UID) -> bool:
    try:
        return bool(get_decoder(uid).is_available)
    except (NotImplementedError, ValueError):
        return False


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


class Receiver:
    """The storage SCP: whitelist, C-ECHO, C-STORE into the spool and catalog.

    Each association runs in its own thread (:class:`~imaging_ai.dicom.association.Association`);
    ``admit`` and ``store`` are the interventions whose answers go back to the peer.
    """

    def __init__(
        self,
        config: DicomConfig,
        spool: Spool,
        catalog: Catalog,
        routing_tags: tuple[str, ...],
        stats: ReceiverStats | None = None,
        places: Places | None = None,
    ) -> None:
        """``places``: the daemon's shared count of connections (default: this receiver's)."""
        self.config = config
        self.spool = spool
        self.catalog = catalog
        self.routing_tags = routing_tags
        self.stats = stats or ReceiverStats()
        self.observers: list[Callable[[StoredInstance], None]] = []
        # Notified after an association that delivered instances released normally.
        self.release_observers: list[Callable[[], None]] = []
        self.ae_title = config.ae_title
        self.max_pdu = config.max_pdu
        self.contexts = supported_contexts()
        self.head_reader = dataset_head.Reader(CATALOG_KEYWORDS + routing_tags)
        self._server: _Server | None = None
        self._adopter = ThreadPoolExecutor(config.max_associations, "dicom-adopt")
        self._active = 0
        self._active_lock = threading.Lock()
        self.places = places or Places()
        self.gate = Gate(self.places, config.max_pending_connections, config.negotiation_timeout_s)
        # Study Instance UIDs each open association delivered, by its thread (an association
        # runs its C-STOREs in its own thread): the senders the catalog counts per study.
        self._sending: dict[int, set[str]] = {}

    def start(self) -> None:
        """Listen in this process; refuse to start with a hint if the port cannot be bound.

        The daemon uses :class:`~imaging_ai.receive_pool.ReceiverPool` instead, which
        listens once and hands connections to receiver processes (``serve_socket``).
        """
        try:
            self._server = _Server(self)
        except OSError as exc:
            raise StartupError(
                f"cannot listen for DICOM on {self.config.bind}:{self.config.port}: "
                f"{exc.strerror}; change dicom.port or stop the other program"
            ) from exc
        threading.Thread(
            target=self._server.serve_forever, name="dicom-acceptor", daemon=True
        ).start()
        log.info(
            "DICOM storage SCP %s listening on %s:%d", self.ae_title, self.config.bind, self.port
        )

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        return int(self._server.server_address[1]) if self._server else self.config.port

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop accepting associations; give open ones ``grace_s`` to finish."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        deadline = time.monotonic() + grace_s
        while self.active_associations() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._adopter.shutdown(wait=True)
        self.gate.stop()
        self.spool.drop_spares()

    def active_associations(self) -> int:
        """Number of admitted associations open now in this process."""
        with self._active_lock:
            return self._active

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for accepted connections, if TLS is configured."""
        if not self.config.tls_cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        if self.config.tls_ca:
            context.load_verify_locations(self.config.tls_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def serve_socket(
        self, sock: socket.socket, address: str, tls: ssl.SSLContext | None = None
    ) -> None:
        """Set up an accepted TCP connection (TCP_NODELAY, timeout, TLS) and serve it.

        From here until it is admitted the connection waits at the gate: it has
        ``dicom.negotiation_timeout_s`` for its TLS handshake and A-ASSOCIATE-RQ.
        """
        ticket = self.gate.enter(sock.fileno(), address)
        if ticket is None:
            sock.close()
            return
        try:
            # DCMTK writes each PDU header and body separately; without TCP_NODELAY every
            # response waits for a delayed ACK (~40 ms per image).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _set_timeout(sock, self.config.network_timeout_s)
            if tls is not None:
                # Not in wrap_socket, which closes the descriptor when the handshake fails:
                # the gate must let go of it first.
                sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                if not _handshake(sock, ticket):
                    return
            self.serve_connection(sock, address, ticket)
        finally:
            self.gate.leave(ticket)  # before close: the gate may shut the descriptor down
            sock.close()

    def serve_connection(
        self, sock: socket.socket, address: str, ticket: Ticket | None = None
    ) -> None:
        """Run one association on an accepted connection (in its own thread).

        It counts as open (``active_associations``, the daemon's places) once admitted.
        """
        self.spool.keep_spares(SPARE_FILES)
        association = Association(sock, address, self, ticket)
        try:
            association.run()
        finally:
            if association.admitted:
                self.places.give_admitted()
                self._count(-1)
            self._ended(association.released)

    def _count(self, delta: int) -> None:
        with self._active_lock:
            self._active += delta
        self.stats.add(active=delta)

    def is_allowed(self, calling_ae: str, address: str) -> bool:
        """Deny by default: only a configured (AE title, host) pair may associate."""
        return any(
            c.ae_title == calling_ae and _same_host(c.host, address)
            for c in self.config.allowed_callers
        )

    def admit(self, peer: Peer) -> tuple[int, int, int] | None:
        """Accept (None: it holds one of the daemon's places) or the reason to reject.

        An accepted association gives its place back when it ends (``serve_connection``).
        """
        if peer.called_ae != self.ae_title:
            reason, rejection = "called AE title is not ours", REJECT_CALLED_AE
        elif not self.is_allowed(peer.calling_ae, peer.address):
            reason, rejection = "calling AE is not allowed", REJECT_CALLING_AE
        elif not self.places.take_admitted(self.config.max_associations):
            reason, rejection = "too many associations", REJECT_BUSY
        else:
            self._count(1)
            return None
        self.stats.add(refused=1)
        log.warning(
            "association refused (%s): calling AE %r, called AE %r, from %s",
            reason,
            peer.calling_ae,
            peer.called_ae,
            peer.address,
        )
        return rejection

    def begin_store(self, command: Command | Dataset, syntax: str, peer: Peer) -> IncomingInstance:
        """Where the fragments of an announced C-STORE data set go."""
        return IncomingInstance(self, command, syntax, peer)

    def store(
        self,
        path: Path,
        command: Command | Dataset,
        syntax: str,
        peer: Peer,
        header: Header | None = None,
        synced: bool = False,
        flush: Callable[[], None] | None = None,
    ) -> Dataset:
        """Keep a received dataset file; the one place exceptions become C-STORE statuses.

        ``header`` was read from the data set's first bytes (without it the file is read);
        ``synced``: the file is already flushed to disk; else ``flush`` flushes it (and
        may run beside the row's transaction), or the spool does.
        """
        try:
            stored = self._store(path, command, syntax, peer, header, synced, flush)
        except Exception as exc:
            return self.refuse(exc)
        self._notify(stored)
        ok = Dataset()
        ok.Status = STATUS_SUCCESS
        return ok

    def refuse(self, exc: BaseException) -> Dataset:
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

    def _store(
        self,
        path: Path,
        command: Command | Dataset,
        syntax: str,
        peer: Peer,
        header: Header | None,
        synced: bool,
        flush: Callable[[], None] | None,
    ) -> StoredInstance:
        self.spool.ensure_space()
        if header is None:
            ds = self._read_file(path)
            dataset_head.check_vrs(ds)
            _check_pixel_data_complete(pixel_facts(ds), path.stat().st_size, syntax)
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
        if self.active_associations() > 1:
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

    def _ended(self, released: bool) -> None:
        """An association ended: a release tells the catalog its studies' sender is done.

        An association that aborted or broke off stays counted as a sender, so its studies
        complete by the idle timers only.
        """
        studies = self._sending.pop(threading.get_ident(), set())
        if not released or not studies:
            return
        try:
            self.catalog.released(studies, datetime.now(UTC))
        except SQLAlchemyError:
            log.exception("association release not recorded; its studies wait for idle timers")
            return
        for observer in self.release_observers:
            try:
                observer()
            except Exception:
                log.exception("observer %r failed on a released association", observer)

    def _notify(self, stored: StoredInstance) -> None:
        self.stats.add(stored=1, late=int(stored.late))
        for observer in self.observers:
            try:
                observer(stored)
            except Exception:
                log.exception("observer %r failed on a stored instance", observer)


class IncomingInstance:
    """One C-STORE data set as its fragments arrive.

    The fragments go straight to a temporary file in the spool. The header is read from the
    first fragments while Pixel Data is still on the wire, so once the last fragment is in
    only the flush to disk, the rename and the row remain before the answer.
    """

    def __init__(
        self, receiver: Receiver, command: Command | Dataset, syntax: str, peer: Peer
    ) -> None:
        self.receiver = receiver
        self.command = command
        self.syntax = syntax
        self.peer = peer
        self.path: Path | None = None
        self._file: io.FileIO | None = None
        self._error: Exception | None = None
        self._head = bytearray()
        # The first bytes are kept to check them; the header's, to read it from them.
        self._head_limit = HEAD_BYTES if syntax in HEAD_SYNTAXES else dataset_head.START_BYTES
        self._started = False  # the first bytes were checked (dataset_head.check_start)
        self._decoded: tuple[PixelFacts, InstanceMeta | InvalidDataset] | None = None
        self._meta_length = 0  # preamble and file meta, before the data set
        self._written = 0  # bytes in the file, file meta included
        # Writeback started fragment by fragment leaves the final fdatasync little to wait
        # for, which the peer of a lone association waits on. With more associations the
        # cores are the limit, and one write of the whole file at fdatasync costs less
        # (fewer, larger requests to the disk): receiver CPU 1.7 -> 1.55 ms per image.
        self._early_writeback = receiver.active_associations() <= 1
        try:
            sop_class = check_uid(str(command.get("AffectedSOPClassUID", "")), "SOP Class UID")
            sop_uid = check_uid(str(command.get("AffectedSOPInstanceUID", "")), "SOP Instance UID")
            receiver.spool.ensure_space()
            self.path, self._file = receiver.spool.open_temporary()
            header = part10.part10_header(sop_class, sop_uid, syntax, peer.calling_ae)
            write_all(self._file, header)
            self._meta_length = self._written = len(header)
        except (InvalidDataset, StorageError) as exc:
            self._fail(exc)
        except OSError as exc:
            self._fail(storage_error(exc, "a received instance"))

    def write(self, data: memoryview) -> None:
        """Take the next fragment; read the header once the first bytes are in."""
        if self._file is None:
            return  # already refused: the rest of the data set is read and dropped
        try:
            write_all(self._file, data)
            if self._early_writeback:
                start_writeback(self._file.fileno(), self._written, len(data))
        except OSError as exc:
            self._fail(storage_error(exc, "a received instance"))
            return
        self._written += len(data)
        if self._decoded is None and len(self._head) < self._head_limit:
            self._head += data[: self._head_limit - len(self._head)]
            due = not self._started and len(self._head) >= dataset_head.START_BYTES
            if due and not self._check_start():
                return  # refused: the rest is dropped
            if self.syntax in HEAD_SYNTAXES and PIXEL_DATA_MARK in self._head:
                # Decoded now, while Pixel Data is still on the wire, not after the last byte.
                self._decoded = self._decode_head(bytes(self._head))

    def _check_start(self) -> bool:
        """Check the data set's first bytes against its transfer syntax; False: refused."""
        self._started = True
        try:
            dataset_head.check_start(self._head, self.syntax)
        except InvalidDataset as exc:
            self._fail(exc)
            return False
        return True

    def _decode_head(self, head: bytes) -> tuple[PixelFacts, InstanceMeta | InvalidDataset] | None:
        unread = PixelFacts(None, None, 0)
        try:
            source: Dataset | HeadValues | None = self.receiver.head_reader.read(head, self.syntax)
        except InvalidDataset as exc:  # bytes that pydicom would read otherwise
            return unread, exc
        except Exception:  # whatever else it met, pydicom reads the data set instead
            source = None
        try:
            if source is not None:
                pixel = source.pixel
            else:  # outside the fast reader's common case: pydicom reads it
                source = read_header(head, self.syntax)
                if source is None:
                    return None  # the mark was inside another value: the file is read at the end
                dataset_head.check_vrs(source)
                pixel = pixel_facts(source)
        except InvalidDataset as exc:
            return unread, exc
        except Exception as exc:  # an attribute that cannot be decoded: refused with it
            return unread, InvalidDataset(f"dataset cannot be decoded: {exception_text(exc)}")
        try:
            return pixel, self.receiver.header_meta(source, self.syntax, self.peer.calling_ae)
        except InvalidDataset as exc:
            return pixel, exc

    def finish(self) -> Dataset:
        """Flush the file to disk and keep it (rename, row); give the C-STORE status."""
        if self._file is not None and not self._started:
            self._check_start()  # a data set shorter than dataset_head.START_BYTES
        if self._file is None or self.path is None:
            return self.receiver.refuse(self._error or StorageError("nothing was received"))
        header = None
        decoded = self._decoded
        if decoded is not None:
            size = self._written - self._meta_length
            header = Header(decoded[0], decoded[1], size, self._meta_length)
        status = self.receiver.store(
            self.path, self.command, self.syntax, self.peer, header, flush=self._flush
        )
        self._close()
        if status.Status != STATUS_SUCCESS:
            self.path.unlink(missing_ok=True)  # refused: the file never left tmp
        return status

    def _flush(self) -> None:
        """fdatasync the file (in the receiver's adopting thread, beside the row)."""
        assert self._file is not None
        try:
            os.fdatasync(self._file.fileno())
        except OSError as exc:
            raise storage_error(exc, "a received instance") from exc
        finally:
            self._close()

    def discard(self) -> None:
        """The transfer broke off before the last fragment: nothing is kept."""
        self._close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        self.discard()
        self.path = None

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_header(head: bytes | bytearray, syntax: str) -> Dataset | None:
    """The data set's attributes up to Pixel Data, read from its first bytes, or None.

    None means "not yet": Pixel Data has not been reached in ``head`` (or the syntax is one
    whose encoding needs the whole file, such as deflate), and the file is read at the end.
    Every element before Pixel Data is complete in ``head`` when Pixel Data's header is.
    """
    if syntax not in HEAD_SYNTAXES:
        return None
    try:
        ds = read_dataset(
            io.BytesIO(head),
            is_implicit_VR=syntax == ImplicitVRLittleEndian,
            is_little_endian=True,
            defer_size=1024,
        )
    except Exception:
        return None
    return ds if PIXEL_DATA_TAG in ds else None


def supported_contexts() -> list[PresentationContext]:
    """CT and Enhanced CT storage with every usable syntax, and Verification."""
    syntaxes: list[str | UID] = list(accepted_transfer_syntaxes())
    contexts = [build_context(sop_class, syntaxes) for sop_class in STORAGE_SOP_CLASSES]
    return [*contexts, build_context(Verification)]


class _Server(socketserver.ThreadingTCPServer):
    """Accepts connections and runs each association in a daemon thread."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.tls = receiver.ssl_context()
        if ":" in receiver.config.bind:
            self.address_family = socket.AF_INET6
        super().__init__((receiver.config.bind, receiver.config.port), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.receiver.serve_socket(self.request, str(self.client_address[0]), server.tls)


def open_listener(config: DicomConfig, backlog: int = 64) -> socket.socket:
    """The listening DICOM socket, for a process that hands connections to receivers.

    Raises
    ------
    StartupError
        The address cannot be bound, with a hint.
    """
    family = socket.AF_INET6 if ":" in config.bind else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((config.bind, config.port))
        listener.listen(backlog)
    except OSError as exc:
        listener.close()
        raise StartupError(
            f"cannot listen for DICOM on {config.bind}:{config.port}: "
            f"{exc.strerror}; change dicom.port or stop the other program"
        ) from exc
    return listener


def pixel_facts(ds: Dataset) -> PixelFacts:
    """Pixel Data's position and length in a data set read by pydicom, and what it needs."""
    elem = ds.get_item(PIXEL_DATA_TAG, keep_deferred=True)
    length = getattr(elem, "length", None)
    return PixelFacts(getattr(elem, "value_tell", None), length, needed_bytes(ds))


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


def _handshake(sock: ssl.SSLSocket, ticket: Ticket) -> bool:
    """Run the TLS handshake of an accepted connection; False (logged) if it failed."""
    try:
        sock.do_handshake()
    except (ssl.SSLError, OSError) as exc:
        if not ticket.closed:  # else the gate cut it off at its deadline and logs that
            log.warning("TLS handshake with %s failed: %s", ticket.address, exc)
        return False
    return True


def _set_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Time out a blocked read or write after ``timeout_s`` (an OSError, as settimeout's).

    The kernel's SO_RCVTIMEO/SO_SNDTIMEO on a blocking socket, not ``settimeout``: Python
    implements that with a poll(2) before every recv and send, about a dozen extra system
    calls per image.
    """
    seconds = int(timeout_s)
    interval = struct.pack("@ll", seconds, int((timeout_s - seconds) * 1_000_000))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, interval)


def _same_host(configured: str, address: str) -> bool:
    if configured == address:
        return True
    loopback = {"127.0.0.1", "::1", "localhost"}
    return configured in loopback and address in loopback
