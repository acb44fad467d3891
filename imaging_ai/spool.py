"""Takes encoded instances and keeps them on disk atomically, keyed by SOP Instance UID."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import logging
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from imaging_ai.durable import fsync_path
from imaging_ai.errors import InvalidDataset, OutOfResources, StorageError

log = logging.getLogger(__name__)

_UID_RE = re.compile(r"^[0-9]+(\.[0-9]+)*$")
_FREE_CHECK_INTERVAL_S = 0.5
# Empty temporary files created ahead (Spool.keep_spares) are named so.
SPARE_PREFIX = "spare-"
# An instance file being deleted by retention (Spool.discard) is renamed into tmp so; the
# name is its relative path with "_" for "/" (UIDs have no "_"). Left for restore_discarded.
DISCARD_PREFIX = "purge-"
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of dirty pages, do not wait


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a just-written range to disk, without waiting.

    Python has no binding for Linux's sync_file_range(2), hence ctypes. Data written while
    the rest of an instance is still arriving is then mostly on disk when the final
    fdatasync comes, which leaves that call little more than the metadata to wait for.
    A no-op where the call does not exist; fdatasync alone still makes the data durable.
    """
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def check_uid(uid: str, what: str) -> str:
    """Return ``uid`` if it is a valid DICOM UID (digits and dots, at most 64 characters).

    Raises
    ------
    InvalidDataset
        Naming which UID is malformed; this also keeps path traversal out of the spool.
    """
    if not uid or len(uid) > 64 or not _UID_RE.match(uid):
        # The value is shown only while it looks like a UID: a damaged one can run on into
        # the next elements' bytes (a patient's name among them).
        shown = repr(uid) if re.fullmatch(r"[0-9.]{0,64}", uid) else f"of {len(uid)} characters"
        raise InvalidDataset(f"{what} {shown} is not a valid DICOM UID")
    return uid


def check_node(node: str) -> str:
    """A node name usable as a directory name."""
    if not node or not re.match(r"^[A-Za-z0-9._-]+$", node) or node in (".", ".."):
        raise StorageError(f"node name {node!r} must be letters, digits, '.', '_' or '-'")
    return node


@dataclass(frozen=True)
class SpooledFile:
    """Where an instance now lives and how big it is."""

    path: Path
    relative: str
    size_bytes: int


class Spool:
    """Instance files under ``root/<study>/<series>/<sop>.dcm``, written tmp + fsync + rename."""

    def __init__(self, root: Path, min_free_mb: int, node: str = "local") -> None:
        self.root = root
        self.node = check_node(node)
        # Temporary files per node: a spool shared over NFS is cleaned by each node for itself.
        self.tmp_dir = root / "tmp" / self.node
        self.min_free_bytes = min_free_mb * 1024 * 1024
        self._free_lock = threading.Lock()
        self._free_checked_at = 0.0
        self._free_bytes = 0
        # Directories known to exist; a set of paths is enough since nothing removes them.
        self._dirs: set[Path] = set()
        # Temporary files created ahead of need (keep_spares), taken by open_temporary.
        self._spares: deque[tuple[Path, io.FileIO]] = deque()
        self._spare_target = 0
        self._spare_cond = threading.Condition()
        self._spare_thread: threading.Thread | None = None

    def prepare(self) -> None:
        """Create the spool and drop temporary files of writes that never finished.

        A temporary file was never answered Success, so the sender still owns it. A file
        that retention was deleting (`discard`) is left to `restore_discarded`.
        """
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp_dir.iterdir():
            if not leftover.name.startswith(DISCARD_PREFIX):
                leftover.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        """Free bytes on the spool's filesystem, re-read at most twice a second."""
        now = time.monotonic()
        with self._free_lock:
            if now - self._free_checked_at > _FREE_CHECK_INTERVAL_S:
                self._free_bytes = shutil.disk_usage(self.root).free
                self._free_checked_at = now
            return self._free_bytes

    def ensure_space(self) -> None:
        """Raise OutOfResources when free space is below the low-water mark."""
        free = self.free_bytes()
        if free < self.min_free_bytes:
            raise OutOfResources(
                f"disk below storage.min_free_mb: {free // 2**20} MB free of "
                f"{self.min_free_bytes // 2**20} MB required at {self.root}"
            )

    def open_temporary(self) -> tuple[Path, io.FileIO]:
        """A new file in ``tmp_dir`` for an instance still arriving; ``adopt`` takes it later.

        Raises
        ------
        StorageError
            OutOfResources when the disk is full.
        """
        with self._spare_cond:
            if self._spares:
                # Woken once the spares are half used, it refills them all: a wake-up (a
                # thread switch) per instance cost more CPU than creating the file.
                if len(self._spares) <= (self._spare_target + 1) // 2:
                    self._spare_cond.notify()
                return self._spares.popleft()
        return self._create_temporary()

    def keep_spares(self, count: int) -> None:
        """Keep ``count`` empty temporary files created ahead, for ``open_temporary``.

        Creating a file can take up to a millisecond: on ext4 without a journal, the inode
        allocator steps over every inode freed in the last minute or more
        (CHANGELOG.md, 2026-12-01, "Ingest, seventh session"). A thread creates them between
        instances, so no peer waits for it for its C-STORE answer.
        """
        with self._spare_cond:
            self._spare_target = count
            self._spare_cond.notify()
            if self._spare_thread is None and count > 0:
                self._spare_thread = threading.Thread(
                    target=self._fill_spares, name="spool-spares", daemon=True
                )
                self._spare_thread.start()

    def drop_spares(self) -> None:
        """Stop creating spares and remove the unused ones."""
        with self._spare_cond:
            self._spare_target = 0
            spares, self._spares = list(self._spares), deque()
            self._spare_cond.notify()
        for path, file in spares:
            file.close()
            path.unlink(missing_ok=True)

    def _fill_spares(self) -> None:
        while True:
            with self._spare_cond:
                while len(self._spares) >= self._spare_target:
                    if self._spare_target == 0:
                        self._spare_thread = None
                        return
                    self._spare_cond.wait()
            try:
                spare = self._create_temporary(SPARE_PREFIX)
            except StorageError:
                # The disk is full or failing: open_temporary reports it to the sender.
                time.sleep(1.0)
                continue
            with self._spare_cond:
                if self._spare_target == 0:
                    spare[1].close()
                    spare[0].unlink(missing_ok=True)
                else:
                    self._spares.append(spare)

    def _create_temporary(self, prefix: str = "") -> tuple[Path, io.FileIO]:
        path = self.tmp_dir / f"{prefix}{uuid.uuid4().hex}.part"
        try:
            # Unbuffered: each fragment goes to the kernel at once (see start_writeback).
            return path, io.FileIO(path, "xb")
        except OSError as exc:
            raise storage_error(exc, path.name) from exc

    def relative_path(self, study_uid: str, series_uid: str, sop_uid: str) -> str:
        """The spool-relative path of an instance."""
        return "/".join(
            (
                check_uid(study_uid, "Study Instance UID"),
                check_uid(series_uid, "Series Instance UID"),
                check_uid(sop_uid, "SOP Instance UID") + ".dcm",
            )
        )

    def store(self, data: bytes, study_uid: str, series_uid: str, sop_uid: str) -> SpooledFile:
        """Write an instance durably; a second copy of the same SOP Instance UID replaces it.

        Raises
        ------
        OutOfResources
            Below the low-water mark, or when the disk fills during the write.
        StorageError
            Any other I/O failure; the previous copy, if any, is untouched.
        """
        self.ensure_space()
        tmp = self.tmp_dir / f"{check_uid(sop_uid, 'SOP Instance UID')}.{threading.get_ident()}.tmp"
        try:
            _write(tmp, data)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise storage_error(exc, tmp.name) from exc
        return self.adopt(tmp, study_uid, series_uid, sop_uid)

    def adopt(
        self,
        src: Path,
        study_uid: str,
        series_uid: str,
        sop_uid: str,
        synced: bool = False,
        size: int | None = None,
    ) -> SpooledFile:
        """Move a complete Part-10 file into the spool durably (fsync, rename, fsync dir).

        ``src`` should be on the spool's filesystem (``tmp_dir``) so the rename is atomic;
        elsewhere it is copied first. ``synced`` says its data was already flushed to disk
        (``os.fdatasync`` by the writer), which saves opening it again; ``size``, its
        length in bytes when the caller knows it.

        Not `imaging_ai.durable.write_atomic`: the data is already in a file (the receiver
        streams each instance into one as it arrives, fdatasyncs it and hands it over), so
        this moves a file into place, without writing it again, from the spool's own
        temporary folder (one per node, emptied at start) into a folder made on first use.
        """
        relative = self.relative_path(study_uid, series_uid, sop_uid)
        final = self.root / relative
        try:
            if src.parent != self.tmp_dir:
                src = Path(
                    shutil.copy(src, self.tmp_dir / f"{sop_uid}.{threading.get_ident()}.tmp")
                )
                synced, size = False, None
            if not synced:
                fsync_path(src)
            if size is None:
                size = src.stat().st_size
            if final.parent not in self._dirs:
                final.parent.mkdir(parents=True, exist_ok=True)
                self._dirs.add(final.parent)
            os.replace(src, final)
            fsync_path(final.parent)
        except OSError as exc:
            if src.parent == self.tmp_dir:
                src.unlink(missing_ok=True)
            raise storage_error(exc, relative) from exc
        return SpooledFile(path=final, relative=relative, size_bytes=size)

    def remove(self, relative: str) -> None:
        """Delete an instance file durably (unlink, fsync its directory); absent is fine."""
        path = self.root / relative
        try:
            path.unlink(missing_ok=True)
            fsync_path(path.parent)
        except OSError as exc:
            raise storage_error(exc, relative) from exc

    def discard(self, relative: str, written_before: float) -> int | None:
        """Delete an instance file written before ``written_before`` (POSIX time); its size.

        The file is first renamed into ``tmp_dir`` (atomic) and looked at there, so that a
        copy received again meanwhile, answered Success and written since, is put back and
        never deleted. Returns None when the file is absent or was put back. The caller
        fsyncs the directories (`sync_dirs`) once for many files.

        Raises
        ------
        StorageError
            An I/O error other than the file being absent.
        """
        path = self.root / relative
        taken = self.tmp_dir / (DISCARD_PREFIX + relative.replace("/", "_"))
        try:
            os.rename(path, taken)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot delete {relative}: {exc.strerror}") from exc
        try:
            stat = taken.stat()
            if stat.st_mtime >= written_before:
                self._put_back(taken, path)
                return None
            taken.unlink()
        except OSError as exc:
            raise StorageError(f"cannot delete {relative}: {exc.strerror}") from exc
        return stat.st_size

    def restore_discarded(self, keep: Callable[[str, float], bool]) -> tuple[int, int]:
        """Finish deletions a crash interrupted: files `discard` had taken into ``tmp_dir``.

        ``keep(relative, mtime)`` says whether a file must go back to its place (a copy
        received again meanwhile); the others are deleted. Returns (put back, deleted).
        """
        restored = deleted = 0
        for taken in self.tmp_dir.glob(DISCARD_PREFIX + "*"):
            relative = taken.name.removeprefix(DISCARD_PREFIX).replace("_", "/")
            if keep(relative, taken.stat().st_mtime):
                self._put_back(taken, self.root / relative)
                restored += 1
            else:
                taken.unlink(missing_ok=True)
                deleted += 1
        if restored or deleted:
            fsync_path(self.tmp_dir)
        return restored, deleted

    def _put_back(self, taken: Path, path: Path) -> None:
        # A link does not replace: a copy that landed there even later stays, and wins.
        with contextlib.suppress(FileExistsError):
            os.link(taken, path)
        taken.unlink()
        fsync_path(path.parent)

    def sync_dirs(self, relatives: Iterable[str]) -> None:
        """fsync the directories of these instance files and ``tmp_dir`` (after `discard`)."""
        for parent in {(self.root / r).parent for r in relatives}:
            with contextlib.suppress(FileNotFoundError):
                fsync_path(parent)
        fsync_path(self.tmp_dir)

    def exists(self, relative: str) -> bool:
        """Whether an instance file is present."""
        return (self.root / relative).is_file()

    def walk(self) -> Iterator[str]:
        """Yield the relative path of every instance file in the spool."""
        for study_dir in self.root.iterdir():
            if study_dir.name == "tmp" or not study_dir.is_dir():
                continue
            for path in study_dir.glob("*/*.dcm"):
                yield path.relative_to(self.root).as_posix()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def storage_error(exc: OSError, relative: str) -> StorageError:
    """The StorageError for an OSError while writing ``relative`` (OutOfResources if full)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutOfResources(f"disk full while writing {relative}")
    return StorageError(f"cannot write {relative}: {exc.strerror}")
