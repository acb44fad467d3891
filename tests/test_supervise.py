"""The supervision helper: a child that dies is started again after a backoff, and says so."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

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
