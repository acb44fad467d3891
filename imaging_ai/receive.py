"""Takes DICOM associations from PACS (C-ECHO, C-STORE) and gives spooled, catalogued instances."""

from __future__ import annotations

import logging
import multiprocessing
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydicom import Dataset, dcmread
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
from pynetdicom import AE, _config, evt
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    CTImageStorage,
    EnhancedCTImageStorage,
    Verification,
)
from pynetdicom.transport import ThreadedAssociationServer
from sqlalchemy.exc import SQLAlchemyError

from imaging_ai.catalog import Catalog, InstanceMeta, meta_from_dataset
from imaging_ai.config import DicomConfig
from imaging_ai.errors import InvalidDataset, SOPClassMismatch, StartupError, StorageError
from imaging_ai.spool import Spool

log = logging.getLogger(__name__)

STORAGE_SOP_CLASSES = (CTImageStorage, EnhancedCTImageStorage)
UNCOMPRESSED_SYNTAXES = (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
)
LOSSLESS_SYNTAXES = (JPEGLSLossless, JPEG2000Lossless, RLELossless, JPEGLosslessSV1)

# pynetdicom's reader sleeps this long whenever a poll finds nothing (default 1 ms);
# each image crosses several polls, so a shorter sleep is most of a single association's rate.
DUL_LOOP_DELAY_S = 0.00005
# DICOM PS3.4 Annex B status codes for the Storage service class.
STATUS_SUCCESS = 0x0000
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_SOP_CLASS_MISMATCH = 0xA900
STATUS_CANNOT_UNDERSTAND = 0xC000
PIXEL_DATA_TAG = 0x7FE00010
UNDEFINED_LENGTH = 0xFFFFFFFF
# A-ASSOCIATE-RJ (result, source, diagnostic): rejected-permanent, service-user.
REJECT_CALLING_AE = (0x01, 0x01, 0x03)


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
    """The storage SCP: whitelist, C-ECHO, C-STORE into the spool and catalog."""

    def __init__(
        self,
        config: DicomConfig,
        spool: Spool,
        catalog: Catalog,
        routing_tags: tuple[str, ...],
        stats: ReceiverStats | None = None,
    ) -> None:
        self.config = config
        self.spool = spool
        self.catalog = catalog
        self.routing_tags = routing_tags
        self.observers: list[Callable[[StoredInstance], None]] = []
        self.ae = self._make_ae()
        self._server: Any = None
        self.stats = stats or ReceiverStats()

    def _make_ae(self) -> AE:
        ae = AE(ae_title=self.config.ae_title)
        ae.require_called_aet = True
        ae.maximum_pdu_size = self.config.max_pdu
        ae.maximum_associations = self.config.max_associations
        ae.network_timeout = self.config.network_timeout_s
        ae.dimse_timeout = self.config.network_timeout_s
        ae.acse_timeout = self.config.network_timeout_s
        syntaxes = accepted_transfer_syntaxes()
        for sop_class in STORAGE_SOP_CLASSES:
            ae.add_supported_context(sop_class, syntaxes)
        ae.add_supported_context(Verification)
        return ae

    def start(self, reuse_port: bool = False) -> None:
        """Open the port; refuse to start with a hint if it cannot be bound.

        With ``reuse_port`` several receiver processes listen on the same port and the
        kernel spreads associations over them (SO_REUSEPORT).
        """
        handlers: list[Any] = [
            (evt.EVT_CONN_OPEN, self._on_conn_open),
            (evt.EVT_CONN_CLOSE, self._on_conn_close),
            (evt.EVT_REQUESTED, self._on_requested),
            (evt.EVT_C_ECHO, self._on_echo),
            (evt.EVT_C_STORE, self._on_store),
        ]
        address = (self.config.bind, self.config.port)
        # pynetdicom then writes each dataset to a temporary file as its fragments arrive,
        # on the spool's filesystem, so the handler only fsyncs and renames it. Both
        # settings are process-wide: the daemon owns its process.
        _config.STORE_RECV_CHUNKED_DATASET = True
        tempfile.tempdir = str(self.spool.tmp_dir)
        server_class = _ReusePortServer if reuse_port else ThreadedAssociationServer
        try:
            server = self.ae.make_server(
                address,
                evt_handlers=handlers,
                ssl_context=self._ssl_context(),
                server_class=server_class,
            )
        except OSError as exc:
            raise StartupError(
                f"cannot listen for DICOM on {self.config.bind}:{self.config.port}: "
                f"{exc.strerror}; change dicom.port or stop the other program"
            ) from exc
        self._server = server
        # As AE.start_server does: the server removes itself from this list on shutdown.
        self.ae._servers.append(server)
        threading.Thread(target=server.serve_forever, name="dicom-acceptor", daemon=True).start()
        log.info(
            "DICOM storage SCP %s listening on %s:%d",
            self.config.ae_title,
            self.config.bind,
            self.port,
        )

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        return int(self._server.server_address[1]) if self._server else self.config.port

    def stop(self) -> None:
        """Stop accepting associations and wait for the open ones to end."""
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def active_associations(self) -> int:
        """Number of associations open now."""
        return len(self.ae.active_associations)

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.config.tls_cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        if self.config.tls_ca:
            context.load_verify_locations(self.config.tls_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _on_conn_close(self, event: Any) -> None:
        self.stats.add(active=-1)

    def _on_conn_open(self, event: Any) -> None:
        self.stats.add(active=1)
        # DCMTK writes each PDU header and body separately; without TCP_NODELAY every
        # response waits for a delayed ACK (~40 ms per image).
        event.assoc.dul._run_loop_delay = DUL_LOOP_DELAY_S
        sock = event.assoc.dul.socket.socket
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def is_allowed(self, calling_ae: str, address: str) -> bool:
        """Deny by default: only a configured (AE title, host) pair may associate."""
        return any(
            c.ae_title == calling_ae and _same_host(c.host, address)
            for c in self.config.allowed_callers
        )

    def _on_requested(self, event: Any) -> None:
        assoc = event.assoc
        calling = assoc.requestor.primitive.calling_ae_title.strip()
        address = assoc.requestor.address
        if self.is_allowed(calling, address):
            return
        self.stats.add(refused=1)
        log.warning("association refused: calling AE %r from %s is not allowed", calling, address)
        assoc.acse.send_reject(*REJECT_CALLING_AE)
        assoc.is_rejected = True
        evt.trigger(assoc, evt.EVT_REJECTED, {})
        assoc.kill()

    def _on_echo(self, event: Any) -> int:
        return STATUS_SUCCESS

    def _on_store(self, event: Any) -> int | Dataset:
        try:
            stored = self._store(event)
        except Exception as exc:
            status = store_status(exc)
            level = logging.ERROR if not isinstance(exc, InvalidDataset) else logging.WARNING
            log.log(
                level,
                "C-STORE refused with status 0x%04X: %s",
                status.Status,
                exc,
                exc_info=not isinstance(exc, InvalidDataset | StorageError),
            )
            return status
        self._notify(stored)
        return STATUS_SUCCESS

    def _store(self, event: Any) -> StoredInstance:
        self.spool.ensure_space()
        meta = self._meta(event)
        if meta.sop_class_uid != str(event.request.AffectedSOPClassUID):
            raise SOPClassMismatch("dataset SOP Class UID differs from the C-STORE request")
        spooled = self.spool.adopt(
            Path(event.dataset_path), meta.study_uid, meta.series_uid, meta.sop_uid
        )
        at = datetime.now(UTC)
        late = self.catalog.record(meta, spooled.relative, spooled.size_bytes, at)
        if late:
            log.warning("late instance kept and flagged for an already completed study")
        return StoredInstance(meta, spooled.relative, spooled.size_bytes, late, at)

    def _meta(self, event: Any) -> InstanceMeta:
        calling = event.assoc.requestor.ae_title.strip()
        syntax = str(event.context.transfer_syntax)
        path = Path(event.dataset_path)
        try:
            # Values over 1 KB (Pixel Data) are not read, only located.
            ds = dcmread(path, defer_size=1024)
            _check_pixel_data_complete(ds, path)
            return meta_from_dataset(ds, syntax, calling, self.routing_tags)
        except InvalidDataset:
            raise
        except Exception as exc:
            raise InvalidDataset(f"dataset cannot be decoded: {exc}") from exc

    def _notify(self, stored: StoredInstance) -> None:
        self.stats.add(stored=1, late=int(stored.late))
        for observer in self.observers:
            try:
                observer(stored)
            except Exception:
                log.exception("observer %r failed on a stored instance", observer)


class _ReusePortServer(ThreadedAssociationServer):
    """An association server that shares its port with the daemon's other receivers."""

    def server_bind(self) -> None:
        assert self.socket is not None
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


def _check_pixel_data_complete(ds: Dataset, path: Path) -> None:
    """Refuse native Pixel Data shorter than its image attributes need, or past the file's end.

    Only the element's position and length are read, never the pixels.
    """
    elem = ds.get_item(PIXEL_DATA_TAG, keep_deferred=True)
    length = getattr(elem, "length", None)
    if elem is None or length is None or length == UNDEFINED_LENGTH:
        return
    tell = getattr(elem, "value_tell", None)
    size = path.stat().st_size
    if tell is not None and tell + length > size:
        raise InvalidDataset(f"Pixel Data truncated: {size - tell} of {length} bytes received")
    frames = int(ds.get("NumberOfFrames") or 1)
    bytes_per_sample = (int(ds.get("BitsAllocated") or 16) + 7) // 8
    samples = int(ds.get("SamplesPerPixel") or 1)
    needed = int(ds.get("Rows") or 0) * int(ds.get("Columns") or 0) * frames
    needed *= samples * bytes_per_sample
    if length < needed:
        raise InvalidDataset(f"Pixel Data truncated: {length} bytes, the image needs {needed}")


def _same_host(configured: str, address: str) -> bool:
    if configured == address:
        return True
    loopback = {"127.0.0.1", "::1", "localhost"}
    return configured in loopback and address in loopback
