"""Takes DICOM associations from PACS (C-ECHO, C-STORE); gives spooled, catalogued instances.

The storage SCP's service side. A `Receiver` admits an association or says why not (called AE
title, the (calling AE, host) whitelist, the daemon's places), runs it on its connection
(`imaging_ai.dicom.association`, which asks it to `admit` and where a data set goes:
`begin_store`), and answers each C-STORE from `store`, the one place exceptions become statuses.
Where the parts are: the presentation contexts offered (`imaging_ai.receive_contexts`), a data
set on its way in (`imaging_ai.receive_incoming`), its checks, landing and row
(`imaging_ai.receive_store`), the listener and each connection's set-up
(`imaging_ai.receive_listen`). Notifications go to `observers` (an instance kept) and
`release_observers` (an association that delivered released).
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydicom import Dataset
from sqlalchemy.exc import SQLAlchemyError

from imaging_ai.admission import Gate, Places, Ticket
from imaging_ai.catalog import Catalog
from imaging_ai.config import DicomConfig
from imaging_ai.dicom.association import Association, Peer
from imaging_ai.dicom.dimse import Command
from imaging_ai.dicom.negotiation import REJECT_BUSY, REJECT_CALLED_AE, REJECT_CALLING_AE
from imaging_ai.errors import StartupError
from imaging_ai.receive_contexts import supported_contexts
from imaging_ai.receive_incoming import IncomingInstance
from imaging_ai.receive_listen import Server, handshake, set_up
from imaging_ai.receive_store import (
    STATUS_SUCCESS,
    Header,
    InstanceStore,
    StoredInstance,
    refuse,
)
from imaging_ai.spool import Spool

log = logging.getLogger(__name__)

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
        self.contexts = supported_contexts(config.storage_sop_classes)
        self.instances = InstanceStore(
            spool, catalog, routing_tags, self.active_associations, config.max_associations
        )
        self._server: Server | None = None
        self._active = 0
        self._active_lock = threading.Lock()
        self.places = places or Places()
        self.gate = Gate(self.places, config.max_pending_connections, config.negotiation_timeout_s)

    def start(self) -> None:
        """Listen in this process; refuse to start with a hint if the port cannot be bound.

        The daemon uses :class:`~imaging_ai.receive_pool.ReceiverPool` instead, which
        listens once and hands connections to receiver processes (``serve_socket``).
        """
        try:
            self._server = Server(self.config, self.serve_socket)
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
        self.instances.close()
        self.gate.stop()
        self.spool.drop_spares()

    def active_associations(self) -> int:
        """Number of admitted associations open now in this process."""
        with self._active_lock:
            return self._active

    def serve_socket(
        self, sock: socket.socket, address: str, tls: ssl.SSLContext | None = None
    ) -> None:
        """Set up an accepted TCP connection (TCP_NODELAY, timeouts, TLS: `set_up`) and serve it.

        From here until it is admitted the connection waits at the gate: it has
        ``dicom.negotiation_timeout_s`` for its TLS handshake and A-ASSOCIATE-RQ.
        """
        ticket = self.gate.enter(sock.fileno(), address)
        if ticket is None:
            sock.close()
            return
        try:
            sock = set_up(sock, self.config.network_timeout_s, tls)
            if isinstance(sock, ssl.SSLSocket) and not handshake(sock, ticket):
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
        may run beside the row's transaction), or the spool does (`InstanceStore.keep`).
        """
        try:
            stored = self.instances.keep(path, command, syntax, peer, header, synced, flush)
        except Exception as exc:
            return refuse(exc)
        self._notify(stored)
        ok = Dataset()
        ok.Status = STATUS_SUCCESS
        return ok

    def _ended(self, released: bool) -> None:
        """An association ended: a release tells the catalog its studies' sender is done.

        An association that aborted or broke off stays counted as a sender, so its studies
        complete by the idle timers only.
        """
        studies = self.instances.released()
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


def _same_host(configured: str, address: str) -> bool:
    if configured == address:
        return True
    loopback = {"127.0.0.1", "::1", "localhost"}
    return configured in loopback and address in loopback
