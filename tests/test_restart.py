"""SIGKILL in the middle of a C-STORE series, then restart: nothing answered Success is lost."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE, DaemonProcess
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Instance
from tests.conftest import wait_until
from tests.dicom_factory import ct_series

SLICES = 60
KILL_AFTER = 25
# The resend must arrive within study_idle_s of the restart; with another test worker on the
# same two cores it once did not (make test runs this module after the parallel part).
pytestmark = pytest.mark.serial


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path, "[assemble]\nseries_idle_s = 2.0\nstudy_idle_s = 3.0\n")
    d.start()
    yield d
    d.stop()


def send_until_killed(files: list[Path], port: int, daemon: DaemonProcess) -> list[str]:
    """Send one by one; SIGKILL the daemon once KILL_AFTER are acknowledged."""
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED_AE)
    assert assoc.is_established
    acknowledged: list[str] = []
    killer = threading.Timer(0, daemon.kill)
    for path in files:
        ds = pydicom.dcmread(path)
        if (
            len(acknowledged) == KILL_AFTER
            and not killer.is_alive()
            and not killer.finished.is_set()
        ):
            # Kill while the next C-STORE is on the wire.
            killer.start()
        try:
            status = assoc.send_c_store(ds)
        except RuntimeError:  # the association died between two sends
            break
        if status and status.Status == 0x0000:
            acknowledged.append(str(ds.SOPInstanceUID))
        if not assoc.is_established:
            break
    killer.join()
    assoc.abort()
    return acknowledged


def test_sigkill_mid_series_loses_nothing(daemon: DaemonProcess, tmp_path: Path) -> None:
    files = ct_series(tmp_path / "src", slices=SLICES, size=256)
    acknowledged = send_until_killed(files, daemon.dicom_port, daemon)
    assert KILL_AFTER <= len(acknowledged) < SLICES

    daemon.start()
    engine = create_engine(f"sqlite:///{daemon.data_dir / 'imaging-ai.sqlite3'}")
    with Session(engine) as s:
        rows = {i.sop_instance_uid: i for i in s.scalars(select(Instance))}
    for uid in acknowledged:
        assert uid in rows, "an instance answered Success was lost"
        assert not rows[uid].missing
        assert pydicom.dcmread(daemon.data_dir / "spool" / rows[uid].path).SOPInstanceUID == uid
    leftovers = [p for p in (daemon.data_dir / "spool" / "tmp").rglob("*") if p.is_file()]
    assert leftovers == []

    # PACS retries the whole series, as it would after a failed association.
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", daemon.dicom_port, ae_title=CALLED_AE)
    for path in files:
        assert assoc.send_c_store(pydicom.dcmread(path)).Status == 0
    assoc.release()
    wait_until(lambda: daemon.studies()[0]["completed_at"] is not None, timeout_s=60)
    study = daemon.studies()[0]
    assert study["instance_count"] == SLICES
    assert study["late_instances"] == 0
    engine.dispose()
