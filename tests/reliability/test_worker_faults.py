"""An inference worker that crashes or hangs in the middle of a study, in the running daemon: the
watchdog kills and restarts it, the batch it held runs again, and the study completes.

The worker is stopped (SIGSTOP) before the study arrives, so the study's first batch is
certainly in its pipe when it is killed (crash) or when the watchdog gives up on it (hang). The
pool-level cases (a GPU worker that keeps failing comes back on the CPU, a batch that kills
every worker fails after its attempts) are in tests/test_workers.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pydicom
import pytest

from tests.conftest import wait_until
from tests.reliability.conftest import (
    FAST_ASSEMBLY,
    FaultDaemon,
    Studies,
    inference_workers,
    log_lines,
    outcome,
    study_state,
    unread_bytes,
)


def stop_worker_then_send(daemon: FaultDaemon, files: list[Path]) -> int:
    """SIGSTOP the only inference worker, send the study, wait until a batch waits in its pipe."""
    assert daemon.proc is not None
    [worker] = inference_workers(daemon.proc.pid)
    os.kill(worker, signal.SIGSTOP)
    daemon.send(files)
    wait_until(lambda: unread_bytes(worker) > 0, timeout_s=30, interval_s=0.2)
    return worker


def check_completed_after_restart(daemon: FaultDaemon, uid: str, worker: int) -> None:
    engine = daemon.database()
    wait_until(lambda: study_state(engine, uid) == "done", timeout_s=90)
    result = outcome(engine, uid)
    engine.dispose()
    assert result.reports == 1 and [j.attempts for j in result.jobs] == [1]
    [line] = log_lines(daemon, "inference worker cpu exited")
    in_flight = int(re.search(r"with (\d+) batch", line).group(1))  # type: ignore[union-attr]
    assert in_flight >= 1, line
    assert daemon.proc is not None
    assert inference_workers(daemon.proc.pid) not in ([], [worker])  # a new worker runs


def test_worker_crash_mid_study(tmp_path: Path, small_studies: Studies) -> None:
    files = small_studies[2]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start()
    try:
        worker = stop_worker_then_send(daemon, files)
        os.kill(worker, signal.SIGKILL)
        check_completed_after_restart(daemon, uid, worker)
    finally:
        daemon.stop()


@pytest.mark.slow
def test_worker_hang_mid_study(tmp_path: Path, small_studies: Studies) -> None:
    """The watchdog's batch deadline is PoolConfig.hang_timeout_s, 120 s, not configurable."""
    files = small_studies[2]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start()
    try:
        started = time.monotonic()
        worker = stop_worker_then_send(daemon, files)
        wait_until(lambda: log_lines(daemon, "batch took over"), timeout_s=200, interval_s=1)
        print(f"\nhung worker killed by the watchdog after {time.monotonic() - started:.0f} s")
        check_completed_after_restart(daemon, uid, worker)
    finally:
        daemon.stop()
