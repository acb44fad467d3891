"""Work split over CPUs: takes a task over index spans, runs it in forked worker processes.

Workers are forked, so they inherit the scene, the volume and the task without pickling, and
write into anonymous shared memory (or files), so nothing is copied back to the parent.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Task = Callable[[int, int], None]
Done = Callable[[int], object]
"""Told the number of items just finished (``tqdm.update`` returns a bool, hence object)."""
MIN_ITEMS_PER_WORKER = 8
"""Below this many items per worker, forking costs more than it saves."""
SPAN = 4
"""Items per hand-out; small spans keep workers equally busy when items differ in cost."""

_task: Task | None = None
"""What forked workers run: set by the parent just before it forks."""


def shared_array(shape: tuple[int, ...], dtype: type[Any]) -> npt.NDArray[Any]:
    """A zeroed array in anonymous shared memory, visible to processes forked afterwards."""
    count = int(np.prod(shape))
    buf = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def default_workers() -> int:
    """CPUs this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0))))


def worker_count(items: int, workers: int | None) -> int:
    """Processes worth forking for ``items`` (1 means: run in this process)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(workers or default_workers(), items // MIN_ITEMS_PER_WORKER))


def _run(span: tuple[int, int]) -> int:
    """Worker side: run the inherited task on one span; the items it did."""
    assert _task is not None, "forked without a task"
    _task(*span)
    return span[1] - span[0]


def for_spans(task: Task, items: int, workers: int | None = None, done: Done | None = None) -> None:
    """Call ``task(start, stop)`` over ``range(items)``, in forked workers when it pays.

    Parameters
    ----------
    task : callable
        Does items ``start`` to ``stop - 1``; results must go to shared memory or files.
    items : int
        Number of items.
    workers : int, optional
        Processes; default :func:`default_workers`.
    done : callable, optional
        Called in this process with the number of items of each span as it finishes (a
        progress bar's ``update``); in this process too the items then go span by span.
    """
    global _task
    count = worker_count(items, workers)
    spans = [(i, min(i + SPAN, items)) for i in range(0, items, SPAN)]
    if count <= 1:
        if done is None:
            task(0, items)
            return
        for start, stop in spans:
            task(start, stop)
            done(stop - start)
        return
    _task = task
    try:
        with multiprocessing.get_context("fork").Pool(count) as pool:
            for finished in pool.imap_unordered(_run, spans, chunksize=1):
                if done is not None:
                    done(finished)
    finally:
        _task = None
