"""Takes the Config and gives N receiver processes that share the DICOM port (SO_REUSEPORT)."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

from imaging_ai.assemble import routing_tags
from imaging_ai.catalog import Catalog
from imaging_ai.config import Config
from imaging_ai.db.session import make_engine
from imaging_ai.errors import StartupError
from imaging_ai.receive import Receiver, ReceiverStats
from imaging_ai.spool import Spool

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1
_READY_TIMEOUT_S = 30.0


def receiver_count(config: Config) -> int:
    """Configured receiver processes; 0 means one per CPU core, at most 4."""
    wanted = config.dicom.receiver_processes
    return wanted if wanted > 0 else max(1, min(os.cpu_count() or 1, 4))


class ReceiverPool:
    """Receiver processes, so that ingest neither waits on nor slows the rest of the daemon.

    Python runs one thread at a time per process; separate processes let associations use
    every core. Each process has its own database engine; the counters are shared memory.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self._ctx = multiprocessing.get_context("spawn")
        self.stats = ReceiverStats(self._ctx)
        self._stop = self._ctx.Event()
        self._processes: list[BaseProcess] = []

    def start(self) -> None:
        """Start the processes and wait until each listens; raise StartupError if one fails."""
        count = receiver_count(self.config)
        ready = [self._ctx.Event() for _ in range(count)]
        for i in range(count):
            proc: BaseProcess = self._ctx.Process(
                target=_worker_main,
                args=(self.config, self.stats, self._stop, ready[i], os.getpid()),
                name=f"imaging-ai-receiver-{i}",
                daemon=True,
            )
            proc.start()
            self._processes.append(proc)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        for proc, event in zip(self._processes, ready, strict=True):
            while not event.wait(0.1):
                if not proc.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    raise StartupError(
                        f"DICOM receiver could not start on {self.config.dicom.bind}:"
                        f"{self.config.dicom.port}; see the log above"
                    )
        log.info("%d DICOM receiver process(es) listening", count)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop accepting associations; each process lets its open associations finish."""
        self._stop.set()
        for proc in self._processes:
            proc.join(timeout_s)
            if proc.is_alive():
                log.warning("receiver %s did not stop in %.0f s; killing it", proc.name, timeout_s)
                proc.kill()
                proc.join()
        self._processes.clear()

    def alive(self) -> int:
        """Number of receiver processes running."""
        return sum(p.is_alive() for p in self._processes)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the daemon's main process dies.

    A receiver must not outlive the daemon: it would keep answering on the port with no
    assembler behind it. Elsewhere the parent-PID poll in the main loop does the same, slower.
    """
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _worker_main(
    config: Config, stats: ReceiverStats, stop: Event, ready: Event, parent_pid: int
) -> None:
    from imaging_ai.cli import setup_logging

    setup_logging(config.logging.level)
    _die_with_parent()
    # The parent owns shutdown; a terminal's Ctrl-C must not kill receivers mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine = make_engine(config.storage.resolved_database_url)
    spool = Spool(config.storage.spool_dir, config.storage.min_free_mb, config.storage.node)
    receiver = Receiver(
        config.dicom, spool, Catalog(engine, spool), routing_tags(config.priority.rules), stats
    )
    try:
        receiver.start(reuse_port=True)
    except StartupError as exc:
        log.error("%s", exc)
        return
    ready.set()
    # Also stop when the parent has died (SIGKILL), so no orphan keeps the port.
    while not stop.wait(_PARENT_POLL_S) and os.getppid() == parent_pid:
        pass
    receiver.stop()
    engine.dispose()
