"""Disk full, on a real filesystem that fills: a small tmpfs holding the spool and the database.

Two ways it happens: free space falls under ``storage.min_free_mb`` (the designed refusal), or
the disk really fills in the middle of a write (``min_free_mb = 0``). Either way C-STORE
answers 0xA700 (out of resources), no stored instance or database page is damaged, and once
space returns PACS's retry is stored and the study completes. Needs root for the mount (CI
runs as root); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest

from imaging_ai.spool import SPARE_PREFIX
from tests.conftest import wait_until
from tests.reliability.conftest import FAST_ASSEMBLY, FaultDaemon, Studies, outcome, study_state
from tests.reliability.test_outages import STATUS_OUT_OF_RESOURCES, store_each

DISK_MB = 64


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {DISK_MB} MB tmpfs here ({done.stderr.strip()})")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """Fill ``disk`` with a ballast file until about ``leave_bytes`` stay free."""
    ballast = disk / "ballast"
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.truncate(ballast, max(0, ballast.stat().st_size - leave_bytes))
    return ballast


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*.dcm")
    }


def readiness(daemon: FaultDaemon) -> dict[str, Any]:
    """/readyz's answer, also when it is 503 (not ready)."""
    try:
        return dict(daemon.get("/readyz"))
    except urllib.error.HTTPError as exc:
        assert exc.code == 503
        return dict(json.loads(exc.read()))


def integrity(database: Path) -> str:
    with sqlite3.connect(database) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


@pytest.mark.parametrize(
    ("min_free_mb", "leave_bytes", "why"),
    [
        (8, 4 << 20, "disk below storage.min_free_mb"),
        (0, 64 << 10, ""),  # really full: the write itself fails
    ],
    ids=["low-water-mark", "really-full"],
)
def test_disk_full_answers_out_of_resources_and_damages_nothing(
    small_disk: Path, tmp_path: Path, small_studies: Studies, min_free_mb: int, leave_bytes: int,
    why: str,
) -> None:  # fmt: skip
    files = small_studies[0]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    half = len(files) // 2
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY, data_dir=small_disk / "data")
    daemon.env["IMAGING_AI_STORAGE__MIN_FREE_MB"] = str(min_free_mb)
    daemon.start()
    spool, database = small_disk / "data" / "spool", small_disk / "data" / "imaging-ai.sqlite3"
    try:
        assert [a[0] for a in store_each(daemon.dicom_port, files[:half])] == [0] * half
        before = digests(spool)
        ballast = fill(small_disk, leave_bytes)
        time.sleep(0.6)  # the spool re-reads free space at most twice a second
        during = store_each(daemon.dicom_port, files[half:])
        assert all(code == STATUS_OUT_OF_RESOURCES for code, _, _ in during), during
        assert all(why in comment for _, comment, _ in during), during
        if min_free_mb:
            assert "min_free_mb" in readiness(daemon)["checks"]["disk"]
        # Nothing already stored was touched; the database is whole.
        assert digests(spool) == before
        assert integrity(database) == "ok"
        assert daemon.proc is not None and daemon.proc.poll() is None
        ballast.unlink()
        time.sleep(0.6)
        # PACS retries what was refused.
        assert [a[0] for a in store_each(daemon.dicom_port, files[half:])] == [0] * (
            len(files) - half
        )
        engine = daemon.database()
        wait_until(lambda: study_state(engine, uid) == "done", timeout_s=60)
        assert outcome(engine, uid).reports == 1
        engine.dispose()
        assert daemon.study(uid)["instance_count"] == len(files)
        # Nothing left half-written: the receivers' empty spare files, created ahead of need,
        # are the only files there.
        assert [p for p in (spool / "tmp").rglob("*") if p.is_file() and not _spare(p)] == []
    finally:
        daemon.stop()


def _spare(path: Path) -> bool:
    """An unused temporary file a receiver keeps ready (Spool.keep_spares): named so, empty."""
    return path.name.startswith(SPARE_PREFIX) and path.stat().st_size == 0
