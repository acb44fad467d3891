"""Takes the Config and gives N receiver processes fed with connections from one listener."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import recv_handle, send_handle
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

from imaging_ai.admission import Places
from imaging_ai.assemble import routing_tags
from imaging_ai.catalog import Catalog
from imaging_ai.config import Config
from imaging_ai.db.session import make_engine
from imaging_ai.errors import StartupError
from imaging_ai.receive import Receiver, ReceiverStats, open_listener
from imaging_ai.spool import Spool

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_ACCEPT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1
_READY_TIMEOUT_S = 30.0


def receiver_count(config: Config) -> int:
    """Configured receiver processes; 0 means one per CPU core, at most 4."""
    wanted = config.dicom.receiver_processes
    return wanted if wanted > 0 else max(1, min(os.cpu_count() or 1, 4))


class ReceiverPool:
    """Receiver processes, so that ingest neither waits on nor slows the rest of the daemon.

    Python runs one thread at a time per process; separate processes let associations use
    every core. This process listens on the DICOM port and hands each accepted connection
    (its file descriptor, over a pipe) to the receiver with the fewest open associations,
    so four associations spread two and two over two processes. Each receiver has its own
    database engine; the counters are shared memory.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self._ctx = multiprocessing.get_context("spawn")
        self.stats = ReceiverStats(self._ctx)
        self._stop = self._ctx.Event()
        # Set by a receiver when an association that delivered instances released: wakes
        # the assembler (`imaging_ai.assemble`), which clears it.
        self.released = self._ctx.Event()
        # dicom.max_associations and max_pending_connections hold for the daemon: each
        # receiver counts its connections here in its own row (places.bind(i)).
        self.places = Places(receiver_count(config), self._ctx)
        self._processes: list[BaseProcess] = []
        self._pipes: list[Connection] = []
        self._loads: list[Synchronized[int]] = []
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound DICOM port (useful when configured as 0)."""
        return int(self._listener.getsockname()[1]) if self._listener else self.config.dicom.port

    def start(self) -> None:
        """Listen, start the processes and wait until each is ready; raise StartupError."""
        self._listener = open_listener(self.config.dicom)
        count = receiver_count(self.config)
        ready = [self._ctx.Event() for _ in range(count)]
        for i in range(count):
            ours, theirs = self._ctx.Pipe()
            load: Synchronized[int] = self._ctx.Value("i", 0)
            proc: BaseProcess = self._ctx.Process(
                target=_worker_main,
                args=(
                    self.config,
                    self.stats,
                    self._stop,
                    ready[i],
                    os.getpid(),
                    theirs,
                    load,
                    self.released,
                    self.places.bind(i),
                ),
                name=f"imaging-ai-receiver-{i}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self._processes.append(proc)
            self._pipes.append(ours)
            self._loads.append(load)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        for proc, event in zip(self._processes, ready, strict=True):
            while not event.wait(0.1):
                if not proc.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    raise StartupError(
                        f"DICOM receiver could not start for {self.config.dicom.bind}:"
                        f"{self.config.dicom.port}; see the log above"
                    )
        self._acceptor = threading.Thread(target=self._accept, name="dicom-acceptor", daemon=True)
        self._acceptor.start()
        log.info(
            "DICOM storage SCP %s listening on %s:%d with %d receiver process(es)",
            self.config.dicom.ae_title,
            self.config.dicom.bind,
            self.port,
            count,
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop accepting associations; each process lets its open associations finish."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._acceptor is not None:
            self._acceptor.join(_ACCEPT_POLL_S * 4)
            self._acceptor = None
        self._stop.set()
        for proc in self._processes:
            proc.join(timeout_s)
            if proc.is_alive():
                log.warning("receiver %s did not stop in %.0f s; killing it", proc.name, timeout_s)
                proc.kill()
                proc.join()
        for pipe in self._pipes:
            pipe.close()
        self._processes.clear()
        self._pipes.clear()
        self._loads.clear()

    def alive(self) -> int:
        """Number of receiver processes running."""
        return sum(p.is_alive() for p in self._processes)

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        try:
            listener.settimeout(_ACCEPT_POLL_S)
        except OSError:
            return  # stop() closed it before this thread ran
        while self._listener is listener:
            try:
                conn, address = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            try:
                self._hand_over(conn, str(address[0]))
            finally:
                conn.close()  # the receiver holds its own duplicate now

    def _hand_over(self, conn: socket.socket, address: str) -> None:
        """Give a connection to the live receiver with the fewest associations."""
        order = sorted(range(len(self._processes)), key=lambda i: self._loads[i].value)
        for i in order:
            if not self._processes[i].is_alive():
                continue
            with self._loads[i].get_lock():
                self._loads[i].value += 1
            try:
                send_handle(self._pipes[i], conn.fileno(), self._processes[i].pid)
                self._pipes[i].send(address)
                return
            except OSError as exc:
                with self._loads[i].get_lock():
                    self._loads[i].value -= 1
                log.error("receiver %s cannot take a connection: %s", self._processes[i].name, exc)
        log.error("no DICOM receiver process is running; connection from %s closed", address)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the daemon's main process dies.

    A receiver must not outlive the daemon: it would keep writing with no assembler
    behind it. Elsewhere the parent-PID poll in the main loop does the same, slower.
    """
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _worker_main(
    config: Config,
    stats: ReceiverStats,
    stop: Event,
    ready: Event,
    parent_pid: int,
    pipe: Connection,
    load: Synchronized[int],
    released: Event,
    places: Places,
) -> None:
    from imaging_ai.cli import setup_logging

    setup_logging(config.logging.level)
    _die_with_parent()
    # The parent owns shutdown; a terminal's Ctrl-C must not kill receivers mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine = make_engine(config.storage.resolved_database_url)
    spool = Spool(config.storage.spool_dir, config.storage.min_free_mb, config.storage.node)
    receiver = Receiver(
        config.dicom,
        spool,
        Catalog(engine, spool),
        routing_tags(config.priority.rules),
        stats,
        places,
    )
    receiver.release_observers.append(released.set)
    tls = receiver.ssl_context()
    ready.set()

    def serve(sock: socket.socket, address: str) -> None:
        try:
            receiver.serve_socket(sock, address, tls)
        finally:
            with load.get_lock():
                load.value -= 1

    # Also stop when the parent has died (SIGKILL), so no orphan keeps writing.
    while not stop.is_set() and os.getppid() == parent_pid:
        try:
            if not pipe.poll(_PARENT_POLL_S):
                continue
            fd = recv_handle(pipe)
            address = pipe.recv()
        except (EOFError, OSError):
            break  # the parent closed its end
        sock = socket.socket(fileno=fd)
        threading.Thread(target=serve, args=(sock, address), daemon=True).start()
    with contextlib.suppress(OSError):
        pipe.close()
    receiver.stop()
    engine.dispose()
