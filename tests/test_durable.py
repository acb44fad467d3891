"""write_atomic: the one atomic write (results, TensorRT plans and caches, FP16 models)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from imaging_ai import durable
from imaging_ai.durable import write_atomic


def record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Log of fsyncs (of files, by their temporary name's existence, and of directories) and
    renames, in order."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    return events


def test_writes_fsyncs_renames_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = record_syncs(monkeypatch)
    path = tmp_path / "seg.dcm"
    assert write_atomic(path, memoryview(b"new contents")) == path
    assert path.read_bytes() == b"new contents"
    assert events == ["fsync file", "rename", "fsync dir"]
    assert [p.name for p in tmp_path.iterdir()] == ["seg.dcm"]


def test_without_the_folder_fsync_for_callers_that_do_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = record_syncs(monkeypatch)
    write_atomic(tmp_path / "sr.dcm", b"x", sync_dir=False)
    assert events == ["fsync file", "rename"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plan"
    write_atomic(path, b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]


def test_the_fp16_model_is_written_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from imaging_ai.infer import fp16

    written: list[Path] = []

    def write(path: Path, data: bytes) -> Path:
        written.append(path)
        return write_atomic(path, data)

    monkeypatch.setattr(fp16, "fp16_model_bytes", lambda onnx: b"fp16 model")
    monkeypatch.setattr(fp16, "write_atomic", write)
    dest = tmp_path / "engines" / "m-fp16.onnx"
    assert fp16.write_fp16_model(tmp_path / "m.onnx", dest) == dest
    assert written == [dest] and dest.read_bytes() == b"fp16 model"
    assert fp16.write_fp16_model(tmp_path / "m.onnx", dest) == dest  # reused
    assert written == [dest]
