"""The supervision helper: a child that dies is started again after a backoff, and says so."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from imaging_ai.supervise import Backoff, ChildState, Supervisor, describe_exit
from tests.children import crash, idle
from tests.conftest import wait_until

CTX = multiprocessing.get_context("spawn")


class Launches:
    """Starts `target` in each slot and records each launch's (slot, crashes in a row)."""

    def __init__(self, target: object = idle) -> None:
        self.target = target
        self.calls: list[tuple[int, int]] = []

    def __call__(self, index: int, crashes_in_row: int) -> BaseProcess:
        self.calls.append((index, crashes_in_row))
        proc = CTX.Process(target=self.target, daemon=True)  # type: ignore[attr-defined]
        proc.start()
        return proc


@pytest.fixture
def launches() -> Launches:
    return Launches()


@pytest.fixture
def supervisor(launches: Launches) -> Iterator[Supervisor]:
    exits: list[int] = []
    sup = Supervisor("test child", 2, launches, Backoff(first_s=0.3), on_exit=exits.append)
    sup.exits = exits  # type: ignore[attr-defined]
    sup.start()
    yield sup
    sup.stop(timeout_s=0.5)


def _kill(sup: Supervisor, index: int) -> int:
    proc = sup.process(index)
    assert proc is not None and proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    return proc.pid


def test_a_killed_child_is_restarted_after_the_backoff(supervisor: Supervisor) -> None:
    assert supervisor.alive() == 2
    old_pid = _kill(supervisor, 0)
    killed_at = time.monotonic()
    wait_until(lambda: supervisor.status()[0].state is ChildState.RESTARTING, timeout_s=5)
    status = supervisor.status()[0]
    assert status.last_exit == "was killed by SIGKILL"
    assert status.restart_in_s is not None and status.restart_in_s <= 0.3
    assert supervisor.exits == [0]  # type: ignore[attr-defined]
    wait_until(lambda: supervisor.alive() == 2, timeout_s=10)
    assert time.monotonic() - killed_at >= 0.3
    status = supervisor.status()[0]
    assert status.state is ChildState.RUNNING and status.pid != old_pid
    assert status.restarts == 1 and supervisor.restarts() == 1
    assert supervisor.status()[1].restarts == 0


def test_the_backoff_grows_with_crashes_in_a_row_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(first_s=0.5, factor=2.0, max_s=3.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_child_that_keeps_crashing_is_left_down_after_give_up_after() -> None:
    launches = Launches(crash)
    sup = Supervisor("crasher", 1, launches, Backoff(first_s=0.05, give_up_after=3))
    sup.start()
    try:
        wait_until(lambda: sup.status()[0].state is ChildState.FAILED, timeout_s=20)
        # Each launch is told how many crashes came before it (a GPU worker picks the CPU).
        assert launches.calls == [(0, 0), (0, 1), (0, 2)]
        assert sup.status()[0].last_exit == "exited with code 3"
    finally:
        sup.stop(timeout_s=0.5)


def test_stop_ends_the_children_and_restarts_nothing(supervisor: Supervisor) -> None:
    procs = [supervisor.process(i) for i in range(2)]
    supervisor.stop(timeout_s=0.2, tell=lambda: _kill(supervisor, 0))
    assert all(p is not None and not p.is_alive() for p in procs)
    assert supervisor.restarts() == 0
    assert {s.state for s in supervisor.status()} == {ChildState.STOPPED}


def test_exit_codes_in_words() -> None:
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(None) == "ended"


def test_healthy_makes_the_next_crash_count_as_the_first() -> None:
    launches = Launches()
    sup = Supervisor("worker", 1, launches, Backoff(first_s=0.05))
    sup.start()
    try:
        _kill(sup, 0)
        wait_until(lambda: len(launches.calls) == 2 and sup.alive() == 1, timeout_s=10)
        sup.healthy(0)  # it did a batch since its restart
        _kill(sup, 0)
        wait_until(lambda: len(launches.calls) == 3, timeout_s=10)
        # Without `healthy` the third launch would be told of two crashes in a row.
        assert launches.calls == [(0, 0), (0, 1), (0, 1)]
    finally:
        sup.stop(timeout_s=0.5)


def test_leave_down_from_on_exit_keeps_that_slot_down_and_the_others_up() -> None:
    launches = Launches()
    sup: Supervisor

    def on_exit(index: int) -> None:
        if index == 0:
            sup.leave_down(index)

    sup = Supervisor("receiver", 2, launches, Backoff(first_s=0.05), on_exit)
    sup.start()
    try:
        _kill(sup, 0)
        wait_until(lambda: sup.status()[0].state is ChildState.FAILED, timeout_s=10)
        time.sleep(0.5)  # ten backoffs: nothing restarts it
        first, second = sup.status()
        assert first.state is ChildState.FAILED and not first.alive and first.pid is None
        assert first.last_exit == "was killed by SIGKILL" and first.restart_in_s is None
        assert second.state is ChildState.RUNNING and second.alive
        assert sorted(launches.calls) == [(0, 0), (1, 0)] and sup.restarts() == 0
    finally:
        sup.stop(timeout_s=0.5)


def test_a_fallback_that_changes_the_child_restarts_it_with_its_count_reset() -> None:
    launches = Launches(crash)
    fallbacks: list[int] = []

    def fallback(index: int) -> bool:  # the GPU worker comes back on the CPU
        fallbacks.append(index)
        launches.target = idle
        return True

    sup = Supervisor(
        "worker", 1, launches, Backoff(first_s=0.05, give_up_after=2), fallback=fallback
    )
    sup.start()
    try:
        wait_until(lambda: len(launches.calls) == 3 and sup.alive() == 1, timeout_s=20)
        assert fallbacks == [0]
        assert launches.calls == [(0, 0), (0, 1), (0, 0)]
        status = sup.status()[0]
        assert status.state is ChildState.RUNNING and status.last_exit == "exited with code 3"
    finally:
        sup.stop(timeout_s=0.5)


@pytest.mark.parametrize("answer", [False, "raises"])
def test_a_fallback_that_changes_nothing_leaves_the_child_down(answer: object) -> None:
    launches = Launches(crash)
    fallbacks: list[int] = []

    def fallback(index: int) -> bool:  # a CPU worker has nowhere else to go
        fallbacks.append(index)
        if answer == "raises":
            raise RuntimeError("no CPU either")
        return False

    sup = Supervisor(
        "worker", 1, launches, Backoff(first_s=0.05, give_up_after=2), fallback=fallback
    )
    sup.start()
    try:
        wait_until(lambda: sup.status()[0].state is ChildState.FAILED, timeout_s=20)
        time.sleep(0.3)
        assert fallbacks == [0]
        assert launches.calls == [(0, 0), (0, 1)]
    finally:
        sup.stop(timeout_s=0.5)


class PipeWatch:
    """A `Watch` on one pipe: records what its reader got, in which thread, and each check."""

    def __init__(self) -> None:
        self.ours, self.theirs = CTX.Pipe()
        self.read: list[tuple[object, str]] = []
        self.checks = 0

    def handles(self) -> Mapping[Any, Callable[[], None]]:
        return {self.ours: self._read}

    def _read(self) -> None:
        self.read.append((self.ours.recv(), threading.current_thread().name))

    def check(self) -> None:
        self.checks += 1


def test_a_watch_reads_its_pipes_in_the_supervisor_thread_as_soon_as_they_are_ready() -> None:
    watch = PipeWatch()
    # A long tick: a message read within it was waited on, not found at the next tick.
    sup = Supervisor("worker", 1, Launches(), watch=watch, tick_s=30.0)
    sup.start()
    try:
        watch.theirs.send("done 1")
        wait_until(lambda: len(watch.read) == 1, timeout_s=10)  # a third of the tick
        assert watch.read == [("done 1", "supervise-worker")]
        assert watch.checks >= 1  # checked after the wait that read it
    finally:
        sup.stop(timeout_s=0.5, tell=lambda: watch.theirs.send("stop"))  # wakes its wait
        watch.ours.close()
        watch.theirs.close()


def test_tick_s_is_the_longest_wait_between_checks() -> None:
    watch = PipeWatch()
    sup = Supervisor("worker", 1, Launches(), watch=watch, tick_s=0.02)
    sup.start()
    try:
        before = watch.checks
        time.sleep(1.0)  # no exit and no message: only the tick wakes the thread
        assert watch.checks - before >= 10  # 50 at 20 ms; 4 at the default 0.25 s
    finally:
        sup.stop(timeout_s=0.5)
        watch.ours.close()
        watch.theirs.close()


def test_a_child_that_cannot_start_is_cleaned_up_after_and_tried_again() -> None:
    launches = Launches()
    exits: list[int] = []

    def launch(index: int, crashes_in_row: int) -> BaseProcess:
        if not launches.calls:
            launches.calls.append((index, crashes_in_row))
            raise OSError("out of PIDs")
        return launches(index, crashes_in_row)

    sup = Supervisor("receiver", 1, launch, Backoff(first_s=0.3), on_exit=exits.append)
    sup.start()
    try:
        # `start` returns once each slot was launched or failed: its exit was already handled.
        assert exits == [0]
        status = sup.status()[0]
        assert status.state is ChildState.RESTARTING and status.pid is None
        assert status.last_exit == "could not start: OSError"
        wait_until(lambda: sup.alive() == 1, timeout_s=10)
        assert launches.calls == [(0, 0), (0, 1)] and sup.restarts() == 1
        assert exits == [0]
    finally:
        sup.stop(timeout_s=0.5)
