"""Peers that go away: the database (PostgreSQL stopped mid-run) and the destinations (PACS and
RIS down). Receiving never answers Success for what it cannot keep, work resumes when the
database returns, and deliveries back off and complete once the destinations are back."""

from __future__ import annotations

import time
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]

from tests.conftest import wait_until
from tests.reliability.conftest import (
    FAST_ASSEMBLY,
    FaultDaemon,
    Pacs,
    Ris,
    StoppablePostgres,
    Studies,
    outcome,
    outputs_config,
    study_state,
)

STATUS_OUT_OF_RESOURCES = 0xA700


def store_each(port: int, files: list[Path]) -> list[tuple[int, str, float]]:
    """C-STORE each file on one association: (status, error comment, seconds) per file."""
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    ae.dimse_timeout = 60
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED_AE)
    assert assoc.is_established
    answers = []
    for path in files:
        t = time.monotonic()
        status = assoc.send_c_store(pydicom.dcmread(path))
        answers.append(
            (int(status.Status), str(status.get("ErrorComment", "")), time.monotonic() - t)
        )
    assoc.release()
    return answers


def run_database_outage(
    tmp_path: Path, studies: Studies, postgres: StoppablePostgres, outage_s: float
) -> None:
    files = studies[0]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    half = len(files) // 2
    daemon = FaultDaemon(
        tmp_path / "daemon", FAST_ASSEMBLY, database_url=postgres.create_database()
    )
    daemon.start()
    assert daemon.proc is not None
    try:
        assert [a[0] for a in store_each(daemon.dicom_port, files[:half])] == [0] * half
        postgres.halt()
        down_at = time.monotonic()
        during = store_each(daemon.dicom_port, files[half:])
        # Never Success for an instance whose row cannot be written: PACS keeps it and retries.
        assert all(code == STATUS_OUT_OF_RESOURCES for code, _, _ in during), during
        assert all("database" in comment for _, comment, _ in during), during
        slowest = max(s for _, _, s in during)
        time.sleep(max(0.0, outage_s - (time.monotonic() - down_at)))
        assert daemon.proc.poll() is None, "the daemon died with its database"
        postgres.resume()
        up_at = time.monotonic()
        # PACS retries what was refused; the first try may meet a connection the server dropped.
        wait_until(
            lambda: all(a[0] == 0 for a in store_each(daemon.dicom_port, files[half:])),
            timeout_s=60,
            interval_s=1.0,
        )
        stored_after = time.monotonic() - up_at
        engine = daemon.database()
        wait_until(lambda: study_state(engine, uid) == "done", timeout_s=90)
        result = outcome(engine, uid)
        engine.dispose()
        assert result.reports == 1 and len(result.jobs) == 1
        study = daemon.study(uid)
        assert study["instance_count"] == len(files)
        print(
            f"\ndatabase down {outage_s:.0f} s: {len(during)} C-STORE answered 0xA700 "
            f"(slowest {slowest:.2f} s); stored again {stored_after:.1f} s after it returned"
        )
    finally:
        if postgres.halted:
            postgres.resume()
        daemon.stop()


@pytest.mark.postgres
def test_database_down_5s_receiving_refuses_then_resumes(
    tmp_path: Path, small_studies: Studies, own_postgres: StoppablePostgres
) -> None:
    run_database_outage(tmp_path, small_studies, own_postgres, outage_s=5)


@pytest.mark.postgres
@pytest.mark.slow
def test_database_down_30s_receiving_refuses_then_resumes(
    tmp_path: Path, small_studies: Studies, own_postgres: StoppablePostgres
) -> None:
    run_database_outage(tmp_path, small_studies, own_postgres, outage_s=30)


def run_destinations_down(
    tmp_path: Path, studies: Studies, down_s: float, retry_max_s: float
) -> None:
    files = studies[1]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    pacs, ris = Pacs(), Ris()  # not started: nothing listens on their ports
    daemon = FaultDaemon(
        tmp_path / "daemon",
        FAST_ASSEMBLY + outputs_config(pacs, ris, retry_min_s=0.5, retry_max_s=retry_max_s),
    )
    daemon.start()
    engine = daemon.database()
    try:
        daemon.send(files)
        wait_until(lambda: study_state(engine, uid) == "delivering", timeout_s=60)
        down_at = time.monotonic()
        time.sleep(down_s)
        tries = {d.kind: d.attempts for d in outcome(engine, uid).deliveries}
        errors = {d.last_error for d in outcome(engine, uid).deliveries}
        pacs.start()
        ris.start()
        back_at = time.monotonic()
        wait_until(lambda: study_state(engine, uid) == "done", timeout_s=retry_max_s + 30)
        caught_up = time.monotonic() - back_at
        result = outcome(engine, uid)
        # Backoff, not a busy loop: doubling from 0.5 s, so a few tries over the outage.
        assert all(2 <= n <= 4 + down_s / (retry_max_s * 0.8) for n in tries.values()), tries
        assert any("did not accept the association" in e for e in errors), errors
        assert all(d.state == "done" for d in result.deliveries)
        # Exactly once each: nothing was accepted while they were down.
        assert sorted(pacs.arrivals().values()) == [1, 1]
        assert len(ris.received) == 1
        print(
            f"\nPACS and RIS down {time.monotonic() - down_at - caught_up:.0f} s: tries {tries}; "
            f"all delivered {caught_up:.1f} s after they came back (retry_max_s {retry_max_s})"
        )
    finally:
        engine.dispose()
        daemon.stop()
        pacs.stop()
        ris.stop()


def test_pacs_and_ris_down_then_back(tmp_path: Path, small_studies: Studies) -> None:
    run_destinations_down(tmp_path, small_studies, down_s=6, retry_max_s=2)


@pytest.mark.slow
def test_pacs_and_ris_down_for_minutes_then_back(tmp_path: Path, small_studies: Studies) -> None:
    run_destinations_down(tmp_path, small_studies, down_s=180, retry_max_s=20)
