"""Takes the Config; gives N supervised receiver processes fed with connections by one listener."""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import recvfds, sendfds
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

from imaging_ai.admission import Places
from imaging_ai.assemble import routing_tags
from imaging_ai.catalog import Catalog
from imaging_ai.config import Config
from imaging_ai.db.session import make_engine
from imaging_ai.errors import StartupError
from imaging_ai.logs import setup_logging
from imaging_ai.receive import Receiver, ReceiverStats
from imaging_ai.receive_listen import open_listener, ssl_context
from imaging_ai.spool import Spool
from imaging_ai.supervise import Backoff, ChildStatus, Supervisor, die_with_parent

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_ACCEPT_POLL_S = 0.5
_READY_TIMEOUT_S = 30.0
# accept() failing (out of descriptors, above all) is retried after 50 ms, doubling up to 1 s:
# the pending connections wait in the listen backlog meanwhile.
_ACCEPT_RETRY_S = (0.05, 1.0)
# accept() errors that mean the listener itself is unusable, not that resources ran short.
_LISTENER_BROKEN = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK, errno.EOPNOTSUPP}
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE}


def receiver_count(config: Config) -> int:
    """Configured receiver processes; 0 means one per CPU core, at most 4."""
    wanted = config.dicom.receiver_processes
    return wanted if wanted > 0 else max(1, min(os.cpu_count() or 1, 4))


@dataclass(eq=False)
class _Link:
    """The parent's end of one receiver process: its pipe, open associations and ready flag."""

    pipe: Connection
    # The pipe as a socket, made once: passing a descriptor through multiprocessing's
    # send_handle duplicates the pipe each time, which fails exactly when descriptors run out.
    channel: socket.socket
    load: Synchronized[int]
    ready: Event

    def close(self) -> None:
        for end in (self.channel, self.pipe):
            with contextlib.suppress(OSError):
                end.close()


class ReceiverPool:
    """Receiver processes, so that ingest neither waits on nor slows the rest of the daemon.

    Python runs one thread at a time per process; separate processes let associations use
    every core. This process listens on the DICOM port and hands each accepted connection
    (its file descriptor, over a pipe) to the receiver with the fewest open associations,
    so four associations spread two and two over two processes. Each receiver has its own
    database engine; the counters are shared memory. A receiver that dies (the OOM killer's
    SIGKILL) is started again with backoff (`imaging_ai.supervise`).
    """

    def __init__(self, config: Config, backoff: Backoff | None = None) -> None:
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
        self._links: list[_Link | None] = [None] * receiver_count(config)
        self._retired: list[_Link] = []  # of dead receivers; closed by the acceptor, or stop()
        self._supervisor = Supervisor(
            "DICOM receiver", receiver_count(config), self._launch, backoff, self._on_exit
        )
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._accept_trouble = _Trouble("DICOM port: accept()")
        self._no_receiver = _Trouble("DICOM port: handing connections to a receiver")

    @property
    def port(self) -> int:
        """The bound DICOM port (useful when configured as 0)."""
        return int(self._listener.getsockname()[1]) if self._listener else self.config.dicom.port

    def start(self) -> None:
        """Listen, start the processes and wait until each is ready; raise StartupError."""
        self._listener = open_listener(self.config.dicom)
        self._supervisor.start()
        if not self._all_ready(time.monotonic() + _READY_TIMEOUT_S):
            self.stop()
            raise StartupError(
                f"DICOM receiver could not start for {self.config.dicom.bind}:"
                f"{self.config.dicom.port}; see the log above"
            )
        # Taken here, not in the thread: descriptors may run out before the thread first runs.
        spare = _Spare()
        self._acceptor = threading.Thread(
            target=self._accept, args=(spare,), name="dicom-acceptor", daemon=True
        )
        self._acceptor.start()
        log.info(
            "DICOM storage SCP %s listening on %s:%d with %d receiver process(es)",
            self.config.dicom.ae_title,
            self.config.dicom.bind,
            self.port,
            len(self._links),
        )

    def _all_ready(self, deadline: float) -> bool:
        for i, link in enumerate(self._links):
            proc = self._supervisor.process(i)
            while link is None or proc is None or not link.ready.wait(0.1):
                if link is None or proc is None or not proc.is_alive():
                    return False
                if time.monotonic() > deadline:
                    return False
        return True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop accepting associations; each process lets its open associations finish."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._acceptor is not None:
            self._acceptor.join(_ACCEPT_POLL_S * 4)
            self._acceptor = None
        self._supervisor.stop(timeout_s, tell=self._stop.set)
        for link in [*self._retired, *self._links]:
            if link is not None:
                link.close()
        self._retired.clear()
        self._links = [None] * len(self._links)

    def alive(self) -> int:
        """Number of receiver processes running."""
        return self._supervisor.alive()

    def restarts(self) -> int:
        """Receiver processes started again after they died, since start."""
        return self._supervisor.restarts()

    def processes(self) -> tuple[ChildStatus, ...]:
        """Each receiver process: state, PID, restarts, how it last exited."""
        return self._supervisor.status()

    def can_accept(self) -> str:
        """Why a new association cannot be taken now, or "ok" (for /readyz and the watchdog)."""
        if self._listener is None:
            return "DICOM port closed"
        if self._acceptor is None or not self._acceptor.is_alive():
            return "DICOM acceptor thread stopped"
        if self._accept_trouble.problem:
            return f"DICOM port cannot accept: {self._accept_trouble.problem}"
        if self.alive() == 0:
            return "no DICOM receiver process running"
        return "ok"

    def readiness(self) -> str:
        """What keeps ingest from full strength (a receiver down, the port), or "ok"."""
        problem = self.can_accept()
        ready, expected = self._ready(), len(self._links)
        if problem == "ok" and ready < expected:
            problem = f"{ready} of {expected} receivers ready"
        return problem

    def _ready(self) -> int:
        """Receivers running and done starting (a restarted one takes seconds to import)."""
        count = 0
        for i, link in enumerate(self._links):
            proc = self._supervisor.process(i)
            alive = proc is not None and proc.is_alive()
            count += alive and link is not None and link.ready.is_set()
        return count

    # -- supervision (in the supervisor's thread)

    def _launch(self, index: int, crashes_in_row: int) -> BaseProcess:
        ours, theirs = self._ctx.Pipe()
        try:
            link = _Link(
                ours,
                socket.fromfd(ours.fileno(), socket.AF_UNIX, socket.SOCK_STREAM),
                self._ctx.Value("i", 0),
                self._ctx.Event(),
            )
            proc: BaseProcess = self._ctx.Process(
                target=_worker_main,
                args=(
                    self.config,
                    self.stats,
                    self._stop,
                    link.ready,
                    os.getpid(),
                    theirs,
                    link.load,
                    self.released,
                    self.places.bind(index),
                ),
                name=f"imaging-ai-receiver-{index}",
                daemon=True,
            )
            proc.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._links[index] = link
        return proc

    def _on_exit(self, index: int) -> None:
        link, self._links[index] = self._links[index], None
        if link is not None:
            self._retired.append(link)
        # Its sockets died with it: the places they held are free again.
        self.places.bind(index).clear_row()

    # -- the acceptor thread

    def _accept(self, spare: _Spare) -> None:
        try:
            self._accept_connections(spare)
        finally:
            spare.close()

    def _accept_connections(self, spare: _Spare) -> None:
        listener = self._listener
        if listener is None:
            return
        try:
            listener.settimeout(_ACCEPT_POLL_S)
        except OSError:
            return  # stop() closed it before this thread ran
        while self._listener is listener:
            try:
                conn, address = spare.accept(listener)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._listener is not listener:
                    return  # closed by stop()
                if exc.errno in _LISTENER_BROKEN:
                    self._accept_trouble.failed(f"listener broken: {exc}")
                    return
                # Out of descriptors (EMFILE, ENFILE), memory or buffers: retry, not stop.
                time.sleep(self._accept_trouble.failed(_strerror(exc), _ACCEPT_RETRY_S))
                continue
            self._accept_trouble.recovered()
            try:
                self._hand_over(conn, str(address[0]))
            except Exception:  # one connection's failure must not end ingest
                log.exception("DICOM port: cannot hand a connection over; it is closed")
            finally:
                conn.close()  # the receiver holds its own duplicate now
                spare.refill()

    def _hand_over(self, conn: socket.socket, address: str) -> None:
        """Give a connection to the live receiver with the fewest associations."""
        while self._retired:
            self._retired.pop().close()
        links = [(i, link) for i, link in enumerate(self._links) if link is not None]
        for i, link in sorted(links, key=lambda pair: pair[1].load.value):
            proc = self._supervisor.process(i)
            if proc is None or not proc.is_alive():
                continue
            with link.load.get_lock():
                link.load.value += 1
            try:
                sendfds(link.channel, [conn.fileno()])
                link.pipe.send(address)
                self._no_receiver.recovered()
                return
            except OSError as exc:
                with link.load.get_lock():
                    link.load.value -= 1
                log.error("receiver %s cannot take a connection: %s", proc.name, exc)
        self._no_receiver.failed("no DICOM receiver process running; connections are closed")


class _Spare:
    """A descriptor held in reserve for the DICOM port's accept().

    When an HTTP flood (or anything else in the process) has taken every descriptor, accept()
    fails with EMFILE and a PACS could not connect until the flood is over. The spare is
    closed for one accept() and taken again once the connection is handed over (its own
    descriptor then closed), so DICOM ingest keeps one descriptor that HTTP cannot take.
    Another thread may still win the freed number; then accept() fails as before and is retried.
    """

    def __init__(self) -> None:
        self._fd = self._open()

    @staticmethod
    def _open() -> int | None:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def accept(self, listener: socket.socket) -> tuple[socket.socket, tuple[str, int]]:
        """``listener.accept()``, with the spare given up for it when descriptors ran out."""
        self.refill()
        try:
            return listener.accept()
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS or self._fd is None:
                raise
        self.close()
        return listener.accept()  # taken again at the next accept

    def refill(self) -> None:
        """Take the spare again if it was given up (right after a connection's descriptor was
        closed, its number is the likeliest to be free)."""
        if self._fd is None:
            self._fd = self._open()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Trouble:
    """A failure that repeats: logged when it starts and when it ends, not at each attempt.

    A flood repeats a failure thousands of times a second; one line per attempt filled the
    log with 76 MB in two minutes.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.problem = ""
        self.failures = 0
        self.since = 0.0

    def failed(self, problem: str, retry_s: tuple[float, float] = (0.0, 0.0)) -> float:
        """Count a failure; return the wait before the next attempt (doubling from retry_s[0])."""
        if not self.failures:
            self.since = time.monotonic()
            log.error("%s failing: %s; retrying until it works", self.what, problem)
        self.failures += 1
        self.problem = problem
        first, most = retry_s
        return min(most, first * 2.0 ** min(self.failures - 1, 30))

    def recovered(self) -> None:
        """Log the end of a failure, if there was one."""
        if self.failures:
            log.warning(
                "%s working again after %d failure(s) in %.1f s",
                self.what,
                self.failures,
                time.monotonic() - self.since,
            )
        self.failures, self.problem = 0, ""


def _strerror(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{name} ({exc.strerror})" if name else str(exc)


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
    setup_logging(config.logging.level, config.logging.format)
    die_with_parent()
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
    tls = ssl_context(config.dicom)
    ready.set()

    def serve(sock: socket.socket, address: str) -> None:
        try:
            receiver.serve_socket(sock, address, tls)
        finally:
            with load.get_lock():
                load.value -= 1

    # Also stop when the parent has died (SIGKILL), so no orphan keeps writing.
    _take_connections(pipe, load, serve, lambda: stop.is_set() or os.getppid() != parent_pid)
    with contextlib.suppress(OSError):
        pipe.close()
    receiver.stop()
    engine.dispose()


def _take_connections(
    pipe: Connection,
    load: Synchronized[int],
    serve: Callable[[socket.socket, str], None],
    stopping: Callable[[], bool],
) -> None:
    """In a receiver: serve each connection the parent hands over, until ``stopping``.

    A connection this process cannot hold (out of descriptors, so its descriptor is not
    received, or out of threads) is closed and the receiver carries on; it used to end the
    process with a RuntimeError from the descriptor hand-over.
    """
    channel = socket.fromfd(pipe.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
    trouble = _Trouble("DICOM receiver: taking connections")
    with channel:
        while not stopping():
            try:
                if not pipe.poll(_PARENT_POLL_S):
                    continue
                sock, address = _next_connection(pipe, channel)
            except (EOFError, OSError):
                return  # the parent closed its end
            if sock is not None and _start_thread(serve, sock, address):
                trouble.recovered()
                continue
            with load.get_lock():
                load.value -= 1
            trouble.failed("out of descriptors or threads; new connections are closed")


def _next_connection(pipe: Connection, channel: socket.socket) -> tuple[socket.socket | None, str]:
    """The next connection handed over, None if its descriptor could not be received.

    Without a free descriptor the kernel truncates the message (MSG_CTRUNC) and closes the
    descriptor in flight, so the sender sees its connection close; the address still follows.
    """
    try:
        fd: int | None = recvfds(channel, 1)[0]
    except RuntimeError:  # "received 0 items of ancdata"
        fd = None
    address = str(pipe.recv())
    return (socket.socket(fileno=fd) if fd is not None else None), address


def _start_thread(
    serve: Callable[[socket.socket, str], None], sock: socket.socket, address: str
) -> bool:
    try:
        threading.Thread(target=serve, args=(sock, address), daemon=True).start()
        return True
    except RuntimeError:  # can't start new thread
        sock.close()
        return False
