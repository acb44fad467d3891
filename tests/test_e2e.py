"""End to end: the daemon as a subprocess, a phantom study sent by DCMTK storescu."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE, DaemonProcess

from tests.conftest import wait_until

SLICES = 120


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path, "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 2.0\n")
    d.start()
    yield d
    assert d.stop() == 0, d.log()


def test_phantom_study_via_storescu(daemon: DaemonProcess, tmp_path: Path) -> None:
    study = tmp_path / "study"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "imaging_ai",
            "phantom",
            str(study),
            "--slices",
            str(SLICES),
            "--seed",
            "7",
            "--priority",
            "urgent",
            "--accession",
            "E2E-1",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    files = sorted((study / "dicom").glob("*.dcm"))
    assert len(files) == SLICES
    subprocess.run(
        ["storescu", "-aec", CALLED_AE, "127.0.0.1", str(daemon.dicom_port), *map(str, files)],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "TCP_NODELAY": "1"},
    )
    # No outputs are configured: the study ends "done" once its report is made.
    wait_until(lambda: daemon.studies() and daemon.studies()[0]["state"] == "done", timeout_s=120)
    [row] = daemon.studies()
    assert row["instance_count"] == SLICES
    assert row["series_count"] == 1
    assert row["accession"] == "E2E-1"
    assert row["priority"] == "urgent"
    assert row["completed_at"] is not None
    assert row["deadline"] is not None
    ready = daemon.get("/readyz")
    assert ready["ready"] is True
    assert set(ready["checks"]) == {"database", "disk", "receivers", "engines"}
    # The same study through the single-study view.
    assert daemon.get(f"/api/v1/studies/{row['study_uid']}")["instance_count"] == SLICES
    # No patient identifiers in the daemon's log.
    first = pydicom.dcmread(files[0], stop_before_pixels=True)
    log = daemon.log()
    for identifier in (str(first.PatientName), str(first.PatientID), str(first.PatientBirthDate)):
        assert identifier and identifier not in log
