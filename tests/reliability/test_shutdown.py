"""SIGTERM: the daemon stops accepting associations at once, finishes the study in hand (or
gives it back to the queue), and exits within a bound; a second SIGTERM exits at once. Either
way the study finishes once after the restart."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE
from pynetdicom import AE
from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

from imaging_ai.pipeline import SHUTDOWN_S
from tests.conftest import wait_until
from tests.reliability.conftest import (
    FAST_ASSEMBLY,
    FaultDaemon,
    Studies,
    inference_workers,
    outcome,
    study_state,
    unread_bytes,
)

# systemd's TimeoutStopSec in deploy/imaging-ai.service: past it, the unit is SIGKILLed.
STOP_BOUND_S = 60


def refuses_associations(port: int) -> bool:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(Verification)
    ae.acse_timeout = ae.network_timeout = 2
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED_AE)
    if assoc.is_established:
        assoc.release()
        return False
    return True


def finishes_once_after_restart(daemon: FaultDaemon, uid: str) -> None:
    daemon.start()
    engine = daemon.database()
    wait_until(lambda: study_state(engine, uid) == "done", timeout_s=90)
    result = outcome(engine, uid)
    engine.dispose()
    assert result.reports == 1 and len(result.jobs) == 1, daemon.log()[-2000:]


def test_sigterm_mid_study_stops_accepting_and_exits_in_bound(
    tmp_path: Path, small_studies: Studies
) -> None:
    files = small_studies[0]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start()
    assert daemon.proc is not None
    engine = daemon.database()
    try:
        daemon.send(files)
        wait_until(lambda: study_state(engine, uid) == "processing", timeout_s=30)
        sent = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: refuses_associations(daemon.dicom_port), timeout_s=5, interval_s=0.1)
        refused_after = time.monotonic() - sent
        code = daemon.proc.wait(STOP_BOUND_S)
        took = time.monotonic() - sent
        print(f"\nSIGTERM mid-study: refusing after {refused_after:.1f} s, exit {took:.1f} s")
        assert code == 0, daemon.log()[-2000:]
        # The study in hand was finished, or given back to the queue: never left "processing".
        assert outcome(engine, uid).jobs[0].state in ("done", "queued")
        finishes_once_after_restart(daemon, uid)
    finally:
        engine.dispose()
        daemon.stop()


def test_second_sigterm_exits_at_once_and_loses_nothing(
    tmp_path: Path, small_studies: Studies
) -> None:
    files = small_studies[1]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start()
    assert daemon.proc is not None
    try:
        # A stopped worker holds the study's batch, so the first SIGTERM has to wait for it.
        [worker] = inference_workers(daemon.proc.pid)
        os.kill(worker, signal.SIGSTOP)
        daemon.send(files)
        wait_until(lambda: unread_bytes(worker) > 0, timeout_s=30, interval_s=0.2)
        daemon.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert daemon.proc.poll() is None  # still draining
        sent = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.proc.wait(10)
        print(f"\nsecond SIGTERM: exit {code} after {time.monotonic() - sent:.2f} s")
        assert code == 1
        wait_until(lambda: not Path(f"/proc/{worker}").exists(), timeout_s=10)
        finishes_once_after_restart(daemon, uid)
    finally:
        daemon.stop()


@pytest.mark.slow
def test_sigterm_with_a_hung_worker_exits_within_the_budget_and_requeues(
    tmp_path: Path, small_studies: Studies
) -> None:
    """The study in hand cannot finish (its worker is stopped): the daemon gives it back to the
    queue and exits within pipeline.SHUTDOWN_S, not after every step's own 60 s."""
    files = small_studies[1]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start()
    assert daemon.proc is not None
    engine = daemon.database()
    try:
        [worker] = inference_workers(daemon.proc.pid)
        os.kill(worker, signal.SIGSTOP)
        daemon.send(files)
        wait_until(lambda: unread_bytes(worker) > 0, timeout_s=30, interval_s=0.2)
        sent = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.proc.wait(STOP_BOUND_S)
        took = time.monotonic() - sent
        print(f"\nSIGTERM with the study's worker hung: exit {code} after {took:.1f} s")
        assert code == 0 and took < SHUTDOWN_S + 10
        [job] = outcome(engine, uid).jobs
        assert job.state == "queued" and "daemon stopped while processing" in job.notes
        finishes_once_after_restart(daemon, uid)
    finally:
        engine.dispose()
        daemon.stop()
