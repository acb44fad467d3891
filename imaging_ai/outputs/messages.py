"""The ORU messages and the FHIR bundle of a report, made in a process of their own.

Building an ORU with hl7apy is pure Python (about 0.15 s on this project's 2-core machine for a
report with four lesions), and so is encoding the SEG and the SR. In one process the GIL runs
them one after the other; here the messages are made in a helper process while the daemon's
process encodes the SEG and SR, which takes them off a study's critical path. Only the report
(a few kilobytes) and the messages cross between the processes.

If the helper process cannot start or dies, the messages are made in the calling process as
before: slower, never lost.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from imaging_ai.config import Hl7Config, RisDestination
from imaging_ai.outputs.common import Report
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.hl7 import build_oru

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RisMessage:
    """One ORU for one RIS."""

    destination: str
    control_id: str
    data: bytes


@dataclass(frozen=True)
class Messages:
    """A report's messages: one ORU per RIS, and the FHIR bundle."""

    orus: tuple[RisMessage, ...]
    fhir: bytes


def build_messages(
    report: Report, destinations: Sequence[RisDestination], sender: Hl7Config | None = None
) -> Messages:
    """Make the ORUs and the FHIR bundle of ``report`` (in whichever process calls it);
    ``sender`` is ``[hl7]`` (MSH-3, MSH-4, MSH-11), default its defaults."""
    orus = []
    for ris in destinations:
        key = ris.key
        control_id = report.uids.message_control_id(key)
        message = build_oru(
            report,
            receiving_application=ris.receiving_application,
            receiving_facility=ris.receiving_facility,
            sender=sender,
            control_id=control_id,
        )
        orus.append(RisMessage(key, control_id, message.encode("utf-8")))
    bundle = diagnostic_report_bundle(report)
    return Messages(tuple(orus), json.dumps(bundle, indent=1).encode("utf-8"))


class Pending:
    """Messages being made: :meth:`result` waits for them."""

    def __init__(
        self,
        future: Future[Messages] | None,
        report: Report,
        destinations: Sequence[RisDestination],
        on_broken: Callable[[], None],
        sender: Hl7Config | None = None,
    ) -> None:
        self._future, self._report, self._destinations = future, report, destinations
        self._on_broken, self._sender = on_broken, sender

    def result(self) -> Messages:
        """The messages; made here if the helper process failed."""
        if self._future is not None:
            try:
                return self._future.result()
            except (BrokenProcessPool, CancelledError):
                self._on_broken()
        return build_messages(self._report, self._destinations, self._sender)


class MessageBuilder:
    """One helper process that makes reports' messages beside the caller's own work."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the helper process (spawned, as the daemon's other processes are)."""
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(
                    1, mp_context=context, initializer=_exit_with, initargs=(os.getpid(),)
                )

    def submit(
        self,
        report: Report,
        destinations: Sequence[RisDestination],
        sender: Hl7Config | None = None,
    ) -> Pending:
        """Start making the messages of ``report``; :meth:`Pending.result` gives them."""
        with self._lock:
            pool = self._pool
        if pool is None:
            return Pending(None, report, destinations, _nothing, sender)
        future = None
        try:
            future = pool.submit(build_messages, report, tuple(destinations), sender)
        except (BrokenProcessPool, RuntimeError):
            self._replace(pool)
        return Pending(future, report, destinations, lambda: self._replace(pool), sender)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """``broken``'s process died: start a new one for the next reports, once however many
        reports were in flight on it (and not after :meth:`stop`)."""
        with self._lock:
            if self._pool is not broken:
                return
            self._pool = None
        log.warning("the process that makes HL7 and FHIR messages died; starting a new one")
        broken.shutdown(wait=False, cancel_futures=True)
        try:
            self.start()
        except OSError:
            log.exception("cannot start the message process; messages are made in the daemon")

    def stop(self) -> None:
        """Stop the helper process (after the messages in hand)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _exit_with(parent: int) -> None:
    """In the helper process: exit when the daemon has gone (a SIGKILL leaves no one to stop
    the pool, and the pool's queue would keep an orphan waiting for ever)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


_PARENT_POLL_S = 0.5


def submit(
    builder: MessageBuilder | None,
    report: Report,
    destinations: Sequence[RisDestination],
    sender: Hl7Config | None = None,
) -> Pending:
    """The messages of ``report`` from ``builder``'s process, or made here without one."""
    if builder is None:
        return Pending(None, report, destinations, _nothing, sender)
    return builder.submit(report, destinations, sender)


def _nothing() -> None:
    pass
