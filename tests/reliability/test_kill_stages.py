"""SIGKILL at every stage boundary, then restart: the study finishes once, and SEG, SR and ORU each
arrive once or arrive again with the same UIDs (which PACS and RIS treat as a replace).

`receiving` is killed from outside, in the middle of a C-STORE series; every later boundary is
reached exactly with IMAGING_AI_FAULT (imaging_ai/faults.py). The fast test walks one study
through all of them in turn, one SIGKILL per boundary; the slow one kills a fresh daemon at each
boundary on its own, with the default-sized leases, so a study resumes within seconds of the
restart instead of waiting for its lease (the restarted node takes its own orphaned jobs back).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]

from imaging_ai.faults import POINTS
from tests.conftest import wait_until
from tests.reliability.conftest import (
    FaultDaemon,
    Pacs,
    Ris,
    Studies,
    outcome,
    outputs_config,
    study_state,
)

# The boundaries after receiving, in the order a study crosses them.
CHAIN = list(POINTS)
# after:postprocess leaves what in:batch leaves (a claimed job, nothing written) and costs one
# more analysis: make test skips it in the walk; the slow test kills there too.
FAST_CHAIN = [p for p in CHAIN if p != "after:postprocess"]
# After a restart the idle clocks start again (the sender gets a full window to resend): the
# study window must outlast the restart, or the study would complete before PACS resends it.
ASSEMBLY = "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 6.0\npoll_s = 0.2\n"


def send_then_kill(files: list[Path], daemon: FaultDaemon, acknowledged_before_kill: int) -> int:
    """Send over one association; SIGKILL the daemon while the next C-STORE is on the wire."""
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", daemon.dicom_port, ae_title=CALLED_AE)
    assert assoc.is_established
    acknowledged = 0
    killer = threading.Timer(0.002, daemon.kill)
    for path in files:
        if acknowledged == acknowledged_before_kill:
            killer.start()
        try:
            status = assoc.send_c_store(pydicom.dcmread(path))
        except RuntimeError:  # the association died between two sends
            break
        if not (status and status.Status == 0x0000) or not assoc.is_established:
            break
        acknowledged += 1
    killer.join()
    assoc.abort()
    return acknowledged


def check_delivered_once(pacs: Pacs, ris: Ris, uid: str, daemon: FaultDaemon) -> None:
    """One SEG and one SR UID at PACS (resends keep it), one ORU control ID at RIS."""
    engine = daemon.database()
    result = outcome(engine, uid)
    engine.dispose()
    assert (result.state, result.error) == ("done", ""), daemon.log()[-3000:]
    assert len(result.jobs) == 1 and result.jobs[0].state == "done"
    assert result.reports == 1
    assert sorted(d.kind for d in result.deliveries) == ["oru", "seg", "sr"]
    assert all(d.state == "done" for d in result.deliveries)
    arrivals = pacs.arrivals()
    assert sorted(kind for kind, _ in arrivals) == ["seg", "sr"], arrivals
    expected = {(d.kind, d.object_uid) for d in result.deliveries if d.kind != "oru"}
    assert set(arrivals) == expected
    assert ris.received and set(ris.control_ids()) == {
        next(d.object_uid for d in result.deliveries if d.kind == "oru")
    }


def test_one_study_killed_at_every_stage_boundary_finishes_once(
    tmp_path: Path, small_studies: Studies, pacs: Pacs, ris: Ris
) -> None:
    files = small_studies[0]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(
        tmp_path / "daemon",
        ASSEMBLY + outputs_config(pacs, ris),
        # Short leases: this test also covers nodes that wait a lease out (see the slow one).
        storage_extra="job_lease_s = 5.0",
    )
    daemon.start()
    engine = daemon.database()
    try:
        # receiving: killed in the middle of the series; PACS sends the whole study again.
        assert 0 < send_then_kill(files, daemon, 6) < len(files)
        assert study_state(engine, uid) == "receiving"
        daemon.start(fault=CHAIN[0])
        daemon.send(files)
        daemon.wait_fault(CHAIN[0])
        assert study_state(engine, uid) == "queued"
        # Each restart is armed with the next boundary; the study has to cross it to reach it.
        for point in FAST_CHAIN[1:]:
            daemon.launch(fault=point)
            daemon.wait_fault(point)
        daemon.start()
        wait_until(lambda: study_state(engine, uid) == "done", timeout_s=60)
        check_delivered_once(pacs, ris, uid, daemon)
        [job] = outcome(engine, uid).jobs
        # One attempt per kill from before:preprocess to after:outputs (a kill before the claim
        # commits leaves the job as it was), and the one that finished before after:deliver.
        assert job.attempts == len(FAST_CHAIN) - 1
        seg, sr = (n for (kind, _), n in sorted(pacs.arrivals().items()) if kind in ("seg", "sr"))
        # Sent, killed before the rows were marked done, sent again. Destinations are sent to
        # in parallel threads (outbox.deliver_due), so the kill at after:deliver, reached by
        # whichever destination finishes first, may find the PACS association between the SEG
        # and the SR, or its rows already recorded: each object arrives once or twice, and the
        # resend after the kill shows in at least one of them.
        oru = len(ris.received)
        assert 1 <= seg <= 2 and 1 <= sr <= 2 and 1 <= oru <= 2
        assert max(seg, sr, oru) == 2
    finally:
        engine.dispose()
        daemon.stop()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["receiving", *CHAIN])
def test_killed_at_one_boundary_resumes_without_waiting_for_its_lease(
    point: str, tmp_path: Path, small_studies: Studies, pacs: Pacs, ris: Ris
) -> None:
    files = small_studies[1]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    # A 30 s job lease (so a 45 s send lease): a job the killed process held must be claimed
    # again within seconds of the restart, not when its lease runs out.
    daemon = FaultDaemon(
        tmp_path / "daemon",
        ASSEMBLY + outputs_config(pacs, ris),
        storage_extra="job_lease_s = 30.0",
    )
    engine = daemon.database()
    try:
        if point == "receiving":
            daemon.start()
            send_then_kill(files, daemon, 8)
        else:
            daemon.start(fault=point)
            daemon.send(files)
            daemon.wait_fault(point)
        killed_at = time.monotonic()
        daemon.start()
        restarted = datetime.now(UTC)
        if point == "receiving":
            daemon.send(files)
        wait_until(lambda: study_state(engine, uid) == "done", timeout_s=180)
        took = time.monotonic() - killed_at
        check_delivered_once(pacs, ris, uid, daemon)
        [job] = outcome(engine, uid).jobs
        claimed = job.started_at.replace(tzinfo=UTC) if job.started_at else restarted
        after = (claimed - restarted).total_seconds()
        print(
            f"\nkilled at {point}: claimed {after:.1f} s after the restart, "
            f"done {took:.1f} s after the kill (job attempts {job.attempts})"
        )
        if point not in ("receiving", "after:deliver"):
            assert after < 10  # the lease is 30 s
    finally:
        engine.dispose()
        daemon.stop()
