"""Takes a way to start child processes; gives them restarted with backoff, and their state.

The one supervision helper for the daemon's child processes (STYLE.md, "one way for each
concern"): the DICOM receivers (`imaging_ai.receive_pool`) and the inference workers
(`imaging_ai.worker_pool`) both run under a `Supervisor`. `launch` gets the slot's crashes in a
row; `kill` ends a hung child (restarted like a crash); `Backoff.give_up_after` leaves a child
down after repeated crashes, unless `fallback` changes it first (a GPU worker comes back on the
CPU); `healthy` restarts the count once a child did useful work; `leave_down` (from `on_exit`)
keeps a slot down; a `Watch` lets the supervisor's thread also read the children's pipes and
spot hangs; and `status` gives what the status page and the metrics show.

Children are started from the supervisor's own thread. Linux's PR_SET_PDEATHSIG (see
`die_with_parent`) fires when the *thread* that started a child ends, so that thread must live
exactly as long as supervision does: it ends only after its children have exited.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from imaging_ai.states import ChildState

log = logging.getLogger(__name__)

_TICK_S = 0.25
_PR_SET_PDEATHSIG = 1

# Starts the child of a slot and returns it started: (slot index, crashes in a row) -> process.
Launch = Callable[[int, int], BaseProcess]


@dataclass(frozen=True)
class Backoff:
    """How long to wait before starting a child that exited again.

    The n-th crash in a row waits ``first_s * factor ** (n - 1)``, at most ``max_s``. A child
    that ran ``stable_s`` counts as healthy: its next crash waits ``first_s`` again.
    ``give_up_after`` crashes in a row leave it down; None restarts it forever.
    """

    first_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    stable_s: float = 60.0
    give_up_after: int | None = None

    def delay(self, crashes_in_row: int) -> float:
        """Seconds to wait before the restart after ``crashes_in_row`` (>= 1) crashes."""
        return float(min(self.max_s, self.first_s * self.factor ** max(0, crashes_in_row - 1)))


@dataclass(frozen=True)
class ChildStatus:
    """One supervised child as the status page and the metrics show it."""

    name: str
    pid: int | None
    state: ChildState
    alive: bool
    restarts: int
    last_exit: str  # "killed by SIGKILL", "exit code 1", or "" if it never exited
    restart_in_s: float | None


@dataclass(eq=False)
class _Slot:
    index: int
    proc: BaseProcess | None = None
    state: ChildState = ChildState.RESTARTING
    started_at: float = 0.0
    restart_at: float = 0.0
    restarts: int = 0
    crashes_in_row: int = 0
    last_exit: str = ""
    hold: bool = False  # `leave_down` was asked for after its last exit


class Watch(Protocol):
    """What the supervisor's thread watches besides its children's exits (the worker pool's)."""

    def handles(self) -> Mapping[Any, Callable[[], None]]:
        """Connections to wait on beside the children's sentinels, each with its reader."""
        ...

    def check(self) -> None:
        """Called after every wait, at least every tick: progress checks (hung children)."""
        ...


class Supervisor:
    """Keeps ``count`` children running: a child that exits is started again after a backoff.

    Parameters
    ----------
    name : str
        What the children are, for the log ("DICOM receiver").
    count : int
        Number of slots, each with one child at a time.
    launch : Launch
        Starts the child of a slot, in the supervisor's thread; may raise (retried with backoff).
    backoff : Backoff, optional
        Restart delays.
    on_exit : callable, optional
        Called with the slot index after its child exited (or could not start), before the
        restart is scheduled (release what the parent held for that child).
    fallback : callable, optional
        Called with the slot index once it crashed ``backoff.give_up_after`` times in a row:
        True if it changed what the slot starts (a GPU worker moved to the CPU), which then
        starts again with its count reset; False leaves it down.
    watch : Watch, optional
        Pipes to read and checks to run in the supervisor's thread, between its waits.
    tick_s : float
        The longest wait for an exit (or a pipe) before the restarts and `watch` are looked at.
    """

    def __init__(
        self,
        name: str,
        count: int,
        launch: Launch,
        backoff: Backoff | None = None,
        on_exit: Callable[[int], None] | None = None,
        *,
        fallback: Callable[[int], bool] | None = None,
        watch: Watch | None = None,
        tick_s: float = _TICK_S,
    ) -> None:
        self.name, self.backoff = name, backoff or Backoff()
        self._launch_child, self._on_exit = launch, on_exit
        self._fallback, self._watch, self._tick_s = fallback, watch, tick_s
        self._slots = [_Slot(i) for i in range(count)]
        self._lock = threading.Lock()
        self._launched = threading.Event()
        self._stopping = threading.Event()
        self._stop_by = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start every child (from the supervisor's thread); return once each was launched."""
        self._thread = threading.Thread(
            target=self._run, name=f"supervise-{self.name}", daemon=True
        )
        self._thread.start()
        self._launched.wait()

    def stop(self, timeout_s: float = 30.0, tell: Callable[[], None] | None = None) -> None:
        """Restart nothing more; wait up to ``timeout_s`` for the children to exit, then kill them.

        ``tell`` asks the children to stop (their stop event or pipe); it is called once no
        restart can begin, so that a child ending because of it is not started again.
        """
        self._stop_by = time.monotonic() + timeout_s
        self._stopping.set()
        if tell is not None:
            tell()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def process(self, index: int) -> BaseProcess | None:
        """The current process of a slot, if any."""
        return self._slots[index].proc

    def alive(self) -> int:
        """Number of children running now."""
        return sum(1 for s in self._slots if s.proc is not None and s.proc.is_alive())

    def restarts(self) -> int:
        """Restarts of every slot since start."""
        return sum(s.restarts for s in self._slots)

    def status(self) -> tuple[ChildStatus, ...]:
        """Every child's state, restarts and last exit."""
        now = time.monotonic()
        with self._lock:
            return tuple(self._status(s, now) for s in self._slots)

    def kill(self, index: int, reason: str) -> None:
        """SIGKILL a slot's child (a hang); it is restarted like one that crashed."""
        proc = self._slots[index].proc
        if proc is not None and proc.is_alive():
            log.error("%s %d: %s; killing it", self.name, index, reason)
            proc.kill()

    def healthy(self, index: int) -> None:
        """The slot's child did useful work (a batch): its next crash counts as the first."""
        with self._lock:
            self._slots[index].crashes_in_row = 0

    def leave_down(self, index: int) -> None:
        """From `on_exit`: do not start the slot's child again (its state becomes FAILED)."""
        with self._lock:
            self._slots[index].hold = True

    def _status(self, slot: _Slot, now: float) -> ChildStatus:
        proc = slot.proc
        waiting = slot.state is ChildState.RESTARTING
        return ChildStatus(
            name=f"{self.name} {slot.index}",
            pid=proc.pid if proc is not None else None,
            state=slot.state,
            alive=proc is not None and proc.is_alive(),
            restarts=slot.restarts,
            last_exit=slot.last_exit,
            restart_in_s=round(max(0.0, slot.restart_at - now), 1) if waiting else None,
        )

    # -- the supervisor's thread

    def _run(self) -> None:
        for slot in self._slots:
            self._launch(slot)
        self._launched.set()
        while not self._stopping.is_set():
            try:
                self._watch_once()
            except Exception:  # keep supervising: a lost supervisor strands every child
                log.exception("%s supervisor error", self.name)
        self._end_children()

    def _watch_once(self) -> None:
        running = [s.proc.sentinel for s in self._slots if s.proc is not None]
        readers = dict(self._watch.handles()) if self._watch is not None else {}
        for handle in wait([*running, *readers], self._tick_s):
            if handle in readers:
                readers[handle]()
        if self._watch is not None:
            self._watch.check()
        now = time.monotonic()
        for slot in self._slots:
            if self._stopping.is_set():
                return  # an exit now is the stop's doing; _end_children reaps it
            if slot.proc is not None and not slot.proc.is_alive():
                self._exited(slot, now)
            if slot.state is ChildState.RESTARTING and now >= slot.restart_at:
                slot.restarts += 1
                self._launch(slot)

    def _launch(self, slot: _Slot) -> None:
        try:
            proc = self._launch_child(slot.index, slot.crashes_in_row)
        except Exception as exc:  # out of memory or PIDs: try again after the backoff
            log.exception("cannot start %s %d", self.name, slot.index)
            self._ended(slot)
            self._schedule(slot, f"could not start: {exc.__class__.__name__}", time.monotonic())
            return
        with self._lock:
            slot.proc, slot.state, slot.started_at = proc, ChildState.RUNNING, time.monotonic()

    def _exited(self, slot: _Slot, now: float) -> None:
        assert slot.proc is not None
        slot.proc.join(0.1)  # reap it, for its exit code
        why = describe_exit(slot.proc.exitcode)
        if now - slot.started_at >= self.backoff.stable_s:
            slot.crashes_in_row = 0
        self._ended(slot)
        self._schedule(slot, why, now)

    def _ended(self, slot: _Slot) -> None:
        if self._on_exit is not None:
            try:
                self._on_exit(slot.index)
            except Exception:
                log.exception("%s %d: cleaning up after its exit failed", self.name, slot.index)

    def _schedule(self, slot: _Slot, why: str, now: float) -> None:
        slot.crashes_in_row += 1
        limit = self.backoff.give_up_after
        if not slot.hold and limit is not None and slot.crashes_in_row >= limit:
            if self._changed_by_fallback(slot):
                slot.crashes_in_row = 0
            else:
                slot.hold = True
                log.error("%s %d %s, %d times in a row; left down", self.name, slot.index, why,
                          slot.crashes_in_row)  # fmt: skip
        with self._lock:
            slot.proc, slot.last_exit = None, why
            if slot.hold:
                slot.state = ChildState.FAILED
                return
            delay = self.backoff.delay(slot.crashes_in_row)
            slot.state, slot.restart_at = ChildState.RESTARTING, now + delay
        log.error("%s %d %s; restarting it in %.1f s", self.name, slot.index, why, delay)

    def _changed_by_fallback(self, slot: _Slot) -> bool:
        if self._fallback is None:
            return False
        try:
            return self._fallback(slot.index)
        except Exception:
            log.exception("%s %d: its fallback failed", self.name, slot.index)
            return False

    def _end_children(self) -> None:
        for slot in self._slots:
            proc = slot.proc
            if proc is None:
                continue
            proc.join(max(0.0, self._stop_by - time.monotonic()))
            if proc.is_alive():
                log.warning("%s %d did not stop in time; killing it", self.name, slot.index)
                proc.kill()
                proc.join()
        with self._lock:
            for slot in self._slots:
                slot.proc, slot.state = None, ChildState.STOPPED


def describe_exit(exitcode: int | None) -> str:
    """An exit code in words: "killed by SIGKILL", "exited with code 1"."""
    if exitcode is None:
        return "ended"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def die_with_parent() -> None:
    """In a child: ask Linux to SIGKILL this process when the thread that started it ends.

    A child must not outlive the daemon (a receiver would keep writing with no assembler
    behind it). Elsewhere the child's parent-PID poll does the same, slower.
    """
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
