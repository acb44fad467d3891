"""Takes bytes and a path, gives a file on disk that a crash cannot leave half-written.

`write_atomic` is the daemon's one "write a file atomically": a temporary name beside the file,
one write and an fsync on the same descriptor, a rename over the file, then an fsync of its
directory. It writes the results (SEG, SR, HL7, FHIR, key images), TensorRT's plans, their
metadata and timing cache, and the FP16 models. The spool does not use it: it moves an instance
that the receiver has already streamed into a file (`imaging_ai.spool.Spool.adopt`), see there.
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path


def write_all(file: io.FileIO, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` to an unbuffered file (a raw write may take only part)."""
    view = memoryview(data)
    while view:
        view = view[file.write(view) or 0 :]


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (the names created or renamed in it are then on disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path, data: bytes | bytearray | memoryview, *, sync_dir: bool = True
) -> Path:
    """Write ``data`` to ``path`` so that it holds the old contents or all the new, never part.

    A temporary file beside ``path`` (same directory, so the rename is atomic; named for this
    process and thread, so concurrent writers do not share it) gets the data in one unbuffered
    write and an fsync on the same descriptor (pydicom or numpy writing to the file itself make
    thousands of small writes); it is then renamed over ``path``. On failure it is removed and
    ``path`` is untouched.

    Parameters
    ----------
    path : Path
        The file; its directory must exist.
    data : bytes-like
        The whole contents.
    sync_dir : bool
        fsync the directory after the rename, so that the new name survives a crash too.
        False where the caller writes several files in one directory and fsyncs it once after
        the last (`imaging_ai.outputs.files.write_results`).

    Returns
    -------
    Path
        ``path``.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb", buffering=0) as f:
            write_all(f, data)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_path(path.parent)
    return path
