"""Takes accepted DICOM connections and gives each a bounded wait for admission; counts places.

A connection is *waiting* from the moment a receiver gets it until its A-ASSOCIATE-RQ has been
read and answered, and *admitted* once it was accepted (A-ASSOCIATE-AC). Only admitted
associations count against ``dicom.max_associations``; waiting connections have their own,
separate limit (``dicom.max_pending_connections``) and an overall deadline
(``dicom.negotiation_timeout_s``, PS3.8's ARTIM timer stretched to the whole negotiation, TLS
handshake included). Without these, sockets that never send a request held the places of
real senders, and one byte every 30 s kept a socket open however short the network timeout.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import logging
import multiprocessing
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import Any

log = logging.getLogger(__name__)

# Closing waiting connections is logged at most this often (a flood must not flood the log).
_LOG_EVERY_S = 10.0


class Places:
    """Waiting connections and admitted associations of every receiver process.

    Shared memory, one row per receiver process, created by the parent and handed to each
    receiver bound to its row (:meth:`bind`): the limits hold for the daemon, not per process.
    A receiver that dies (SIGKILL, the OOM killer) loses its sockets with it; its successor
    clears the row (:meth:`clear_row`), so the dead one's places are not lost for good.
    """

    def __init__(self, processes: int = 1, context: BaseContext | None = None) -> None:
        ctx: Any = context or multiprocessing.get_context("spawn")
        self._lock = ctx.Lock()
        self._waiting = ctx.RawArray("i", processes)
        self._admitted = ctx.RawArray("i", processes)
        self.row = 0

    def bind(self, row: int) -> Places:
        """The same places, written by receiver process number ``row``."""
        bound = copy.copy(self)
        bound.row = row
        return bound

    def clear_row(self) -> None:
        """Forget this row's places: a new receiver process starts with none."""
        with self._lock:
            self._waiting[self.row] = 0
            self._admitted[self.row] = 0

    def take_waiting(self, limit: int) -> bool:
        """Count one more waiting connection, unless ``limit`` are waiting already."""
        with self._lock:
            if sum(self._waiting) >= limit:
                return False
            self._waiting[self.row] += 1
            return True

    def give_waiting(self) -> None:
        """A waiting connection was admitted, refused or closed."""
        with self._lock:
            self._waiting[self.row] -= 1

    def take_admitted(self, limit: int) -> bool:
        """Count one more admitted association, unless ``limit`` are open already."""
        with self._lock:
            if sum(self._admitted) >= limit:
                return False
            self._admitted[self.row] += 1
            return True

    def give_admitted(self) -> None:
        """An admitted association ended."""
        with self._lock:
            self._admitted[self.row] -= 1

    def counts(self) -> tuple[int, int]:
        """Waiting connections and admitted associations, across the daemon."""
        with self._lock:
            return sum(self._waiting), sum(self._admitted)


@dataclass(eq=False)
class Ticket:
    """One connection waiting for admission at a gate."""

    gate: Gate = field(repr=False)
    fd: int
    address: str
    deadline: float
    closed: str = ""  # why the gate closed it, if it did

    def settle(self) -> bool:
        """Its request is in: it waits no more. False if the gate has closed it already."""
        return self.gate.admit(self)


class Gate:
    """This process's waiting connections: their deadline, and room for new ones.

    A connection that has not been admitted by its deadline is shut down (PS3.8 AA-2: the
    transport is closed, no A-ABORT). When the daemon's waiting connections reach the limit,
    a new one takes the place of the one of this process that has waited longest, which had
    the most time to send its request: a real sender sends it at once.
    """

    def __init__(self, places: Places, max_waiting: int, deadline_s: float) -> None:
        self.places = places
        self.max_waiting = max_waiting
        self.deadline_s = deadline_s
        self._waiting: dict[Ticket, None] = {}  # in order of arrival
        self._deadlines: list[tuple[float, int, Ticket]] = []
        self._wake = threading.Condition()
        self._closed_since_log: dict[str, int] = {}
        self._last_log = 0.0
        self._stopped = False
        places.clear_row()
        self._thread = threading.Thread(target=self._expire, name="dicom-gate", daemon=True)
        self._thread.start()

    def enter(self, fd: int, address: str) -> Ticket | None:
        """Start a connection's wait; None when there is no room (the caller closes it)."""
        ticket = Ticket(self, fd, address, time.monotonic() + self.deadline_s)
        with self._wake:
            if not self.places.take_waiting(self.max_waiting):
                if not self._waiting:
                    self._note_closed("no room for another connection waiting for admission")
                    return None
                # The new connection takes over the oldest one's place.
                oldest = next(iter(self._waiting))
                self._close(oldest, "closed to make room for a newer connection", give=False)
            self._waiting[ticket] = None
            heapq.heappush(self._deadlines, (ticket.deadline, id(ticket), ticket))
            self._wake.notify()
        return ticket

    def admit(self, ticket: Ticket) -> bool:
        """The connection's request is in: it waits no more. False if the gate closed it."""
        with self._wake:
            if ticket not in self._waiting:
                return False
            del self._waiting[ticket]
            self.places.give_waiting()
            return True

    def leave(self, ticket: Ticket) -> None:
        """The connection ends; call before its socket is closed (its descriptor is reused)."""
        with self._wake:
            if ticket in self._waiting:
                del self._waiting[ticket]
                self.places.give_waiting()

    def stop(self) -> None:
        """End the deadline thread (waiting connections stay as they are)."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join()

    def _expire(self) -> None:
        with self._wake:
            while not self._stopped:
                now = time.monotonic()
                while self._deadlines and self._deadlines[0][0] <= now:
                    ticket = heapq.heappop(self._deadlines)[2]
                    if ticket in self._waiting:
                        self._close(ticket, f"no association within {self.deadline_s:g} s")
                due = [self._deadlines[0][0] - now] if self._deadlines else []
                log_in = self._log_closings(now)
                if log_in is not None:
                    due.append(log_in)
                self._wake.wait(min(due, default=None))

    def _close(self, ticket: Ticket, why: str, give: bool = True) -> None:
        """Shut a waiting connection down (its thread then ends it); hold ``_wake``.

        ``give``: give its place back (False: a new connection takes it over).
        """
        del self._waiting[ticket]
        if give:
            self.places.give_waiting()
        ticket.closed = why
        # The descriptor is still open: leave() comes before close, and both hold _wake.
        with contextlib.suppress(OSError):  # the peer may have gone already
            sock = socket.socket(fileno=ticket.fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()
        self._note_closed(why)

    def _note_closed(self, why: str) -> None:
        self._closed_since_log[why] = self._closed_since_log.get(why, 0) + 1
        self._log_closings(time.monotonic())

    def _log_closings(self, now: float) -> float | None:
        """Log the closings counted, at most one line per ``_LOG_EVERY_S`` (a flood's count).

        Returns the seconds until the counted ones can be logged, None if none wait.
        """
        if not self._closed_since_log:
            return None
        if now - self._last_log < _LOG_EVERY_S:
            return self._last_log + _LOG_EVERY_S - now
        self._last_log = now
        summary = "; ".join(f"{n} {why}" for why, n in self._closed_since_log.items())
        self._closed_since_log.clear()
        log.warning(
            "DICOM connections waiting for admission closed: %s (limit %d waiting, %g s each)",
            summary,
            self.max_waiting,
            self.deadline_s,
        )
        return None
