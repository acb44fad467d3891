"""Spool: atomic writes, replacement by SOP Instance UID, low-water mark, bad UIDs, full disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from imaging_ai.errors import InvalidDataset, OutOfResources, StorageError
from imaging_ai.spool import Spool


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", min_free_mb=0)
    s.prepare()
    return s


def test_store_writes_under_uid_path_and_leaves_no_temp(spool: Spool) -> None:
    stored = spool.store(b"DICM-data", "1.2.3", "1.2.3.4", "1.2.3.4.5")
    assert stored.relative == "1.2.3/1.2.3.4/1.2.3.4.5.dcm"
    assert stored.path.read_bytes() == b"DICM-data"
    assert stored.size_bytes == 9
    assert list(spool.tmp_dir.iterdir()) == []
    assert list(spool.walk()) == [stored.relative]


def test_same_sop_instance_replaces(spool: Spool) -> None:
    spool.store(b"first", "1.2", "1.3", "1.4")
    stored = spool.store(b"second", "1.2", "1.3", "1.4")
    assert stored.path.read_bytes() == b"second"
    assert len(list(spool.walk())) == 1


@pytest.mark.parametrize("uid", ["../../etc", "1.2.a", "", "1." * 40, "1..2"])
def test_bad_uids_are_refused(spool: Spool, uid: str) -> None:
    with pytest.raises(InvalidDataset):
        spool.store(b"x", uid, "1.3", "1.4")


def test_low_water_mark(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", min_free_mb=10**9)
    spool.prepare()
    with pytest.raises(OutOfResources, match=r"below storage\.min_free_mb"):
        spool.store(b"x", "1.2", "1.3", "1.4")
    assert list(spool.walk()) == []


def test_disk_full_during_write_keeps_previous_copy(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool.store(b"good copy", "1.2", "1.3", "1.4")

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OutOfResources, match="disk full"):
        spool.store(b"new copy", "1.2", "1.3", "1.4")
    monkeypatch.undo()
    assert (spool.root / "1.2/1.3/1.4.dcm").read_bytes() == b"good copy"
    assert list(spool.tmp_dir.iterdir()) == []


def test_other_io_errors_are_storage_errors(spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(StorageError, match="Input/output error"):
        spool.store(b"x", "1.2", "1.3", "1.4")


def test_prepare_removes_unfinished_temporaries(spool: Spool) -> None:
    (spool.tmp_dir / "half-written.tmp").write_bytes(b"partial")
    spool.prepare()
    assert list(spool.tmp_dir.iterdir()) == []
