"""Acceptance (issue 20): the daemon against a PACS that refuses Comprehensive 3D SR (DCMTK
storescp with a restricted profile). The SEG arrives once, the SR delivery ends refused with
the reason on the API and the status page within a minute, with no loop; with
``sr = "comprehensive"`` for that destination the SR arrives, and dsrdump reads it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import ADMIN_TOKEN, DaemonProcess, free_port
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pydicom.uid import ComprehensiveSRStorage, SegmentationStorage

from tests.conftest import wait_until
from tests.test_outbox_refusals import PROFILE

pytestmark = pytest.mark.skipif(
    shutil.which("storescp") is None or shutil.which("dsrdump") is None,
    reason="needs DCMTK storescp and dsrdump",
)
SETTINGS = (
    "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 1.0\npoll_s = 0.2\n"
    "[outputs]\nretry_min_s = 1.0\nretry_max_s = 2.0\n"
)


@pytest.fixture
def pacs(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """storescp without Comprehensive 3D SR; the Popen is storescp itself (PEERS.md)."""
    (tmp_path / "storescp.cfg").write_text(PROFILE)
    port, received = free_port(), tmp_path / "received"
    received.mkdir()
    proc = subprocess.Popen(
        ["storescp", "-aet", "PACS", "-od", str(received), "-dhl",
         "-xf", str(tmp_path / "storescp.cfg"), "NoComprehensive3DSR", str(port)],
        env={**os.environ, "TCP_NODELAY": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    assert proc.poll() is None, "storescp did not start with the profile"
    yield port, received
    proc.terminate()
    proc.wait(10)


def daemon_for(root: Path, port: int, sr_class: str = "") -> DaemonProcess:
    sr = f', sr = "{sr_class}"' if sr_class else ""
    pacs = f'pacs = [{{ae_title = "PACS", host = "127.0.0.1", port = {port}{sr}}}]\n'
    return DaemonProcess(root, SETTINGS + pacs)


def phantom(root: Path, seed: int, accession: str) -> list[Path]:
    spec = PhantomSpec(slices=32, seed=seed, nodules=1, nodule_diameter_range_mm=(10.0, 14.0))
    write_study(generate(spec), root, priority="urgent", accession=accession, workers=1)
    return sorted((root / "dicom").glob("*.dcm"))


def deliveries(daemon: DaemonProcess, uid: str) -> dict[str, dict[str, Any]]:
    try:
        return {d["result"]: d for d in daemon.study(uid).get("deliveries", [])}
    except OSError:
        return {}


def received(folder: Path) -> list[pydicom.Dataset]:
    return [pydicom.dcmread(p, stop_before_pixels=True) for p in sorted(folder.iterdir())]


def admin_page(daemon: DaemonProcess, path: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{daemon.http_port}{path}",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_pacs_without_comprehensive_3d_sr(tmp_path: Path, pacs: tuple[int, Path]) -> None:
    port, folder = pacs
    files = phantom(tmp_path / "study-1", 11, "REFUSE-1")
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = daemon_for(tmp_path / "daemon", port)
    daemon.start()
    try:
        daemon.send(files)
        wait_until(lambda: deliveries(daemon, uid).get("sr", {}).get("state") == "refused", 240)
        found = deliveries(daemon, uid)
        sr, seg = found["sr"], found["seg"]
        assert at(sr["last_attempt_at"]) - at(sr["created_at"]) < timedelta(seconds=60)
        assert sr["attempts"] == 1 and "Comprehensive 3D SR Storage" in sr["last_error"]
        assert "1.2.840.10008.5.1.4.1.1.88.34" in sr["last_error"]
        assert (seg["state"], seg["attempts"]) == ("done", 1)
        assert daemon.study(uid)["state"] == "done"
        page = admin_page(daemon, "/admin")
        assert "1 refused" in page and "Comprehensive 3D SR Storage" in page
        assert "Comprehensive 3D SR Storage" in admin_page(daemon, f"/admin/studies/{uid}")
        time.sleep(6)  # three retry intervals: a loop would have sent and tried again
        again = deliveries(daemon, uid)
        assert (again["sr"]["attempts"], again["seg"]["attempts"]) == (1, 1)
        [stored] = received(folder)
        assert stored.SOPClassUID == SegmentationStorage  # the SEG, exactly once
    finally:
        assert daemon.stop() == 0, daemon.log()

    # The same destination told to take Comprehensive SR: the next study's SR arrives. The
    # refused delivery stays refused across the restart.
    daemon = daemon_for(tmp_path / "daemon", port, "comprehensive")
    daemon.start()
    try:
        files = phantom(tmp_path / "study-2", 12, "REFUSE-2")
        second = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        daemon.send(files)
        wait_until(lambda: daemon.study(second)["state"] == "done", 240)
        found = deliveries(daemon, second)
        assert {k: (d["state"], d["attempts"]) for k, d in found.items()} == {
            "seg": ("done", 1),
            "sr": ("done", 1),
        }
        assert deliveries(daemon, uid)["sr"]["attempts"] == 1
    finally:
        assert daemon.stop() == 0, daemon.log()
    srs = [p for p in folder.iterdir() if pydicom.dcmread(p).SOPClassUID == ComprehensiveSRStorage]
    assert len(srs) == 1 and len(received(folder)) == 3  # SEG 1, SEG 2, SR 2
    dump = subprocess.run(["dsrdump", str(srs[0])], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0 and dump.stderr == "", dump.stderr
    assert "Comprehensive SR Document" in dump.stdout
    assert "Imaging Measurement Report" in dump.stdout
