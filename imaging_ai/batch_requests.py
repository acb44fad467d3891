"""Takes a study's slices in arena slots; gives the records a batcher queues and routes back.

A `SliceRequest` is one run of a study's slices in the queue, ordered by its `Priority` (urgent
first, then earliest deadline, then arrival) with its `SliceWork` (which slices, which slots)
left out of the comparison; the study's `ResultSlot` collects the outputs run by run as
batches finish. `BatchCallback` is how a dispatcher reports a batch back. The worker pool
(`imaging_ai.worker_dispatch`, `imaging_ai.worker_pool`) sees only `Priority` and
`BatchCallback`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from imaging_ai.arena import runs
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import FloatArray

Priority = tuple[int, float, int]
"""(rank, deadline, sequence): the sort key of a request or a waiter; smaller goes first."""
BatchCallback = Callable[[BaseException | None], None]
"""Called once per batch: None when its outputs are in their arena slots, else the error."""


def _keep(slots: Sequence[int]) -> None:
    """The release of a ResultSlot that owns no arena slots (tests)."""


class ResultSlot:
    """The outputs of one `infer` call, copied out of the arena run by run as batches finish.

    Parameters
    ----------
    slices : int
        Slices of the study.
    output_shape : tuple[int, ...]
        (K, h, w) of one output slice.
    release : callable
        Frees arena slots once their outputs are copied (or no longer wanted).
    """

    def __init__(
        self,
        slices: int,
        output_shape: tuple[int, ...] = (),
        release: Callable[[Sequence[int]], None] = _keep,
    ) -> None:
        self._left = slices
        self._out = np.empty((slices, *output_shape), np.float32)
        self._release = release
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.done = threading.Event()

    @property
    def failed(self) -> bool:
        """True once any of its slices failed; its queued slices are then dropped, not run."""
        return self._error is not None

    def deliver(self, outputs: FloatArray, first: int, slots: Sequence[int]) -> None:
        """Copy slices first, first+1, ... out of arena `outputs` at `slots`; free the slots.

        The last slice sets `done`. Outputs of a study that has failed are not copied.
        """
        try:
            if self._error is None:
                for _, i, s, n in runs(range(first, first + len(slots)), slots):
                    self._out[i : i + n] = outputs[s : s + n]
        finally:
            self._release(slots)
        with self._lock:
            self._left -= len(slots)
            if self._left <= 0:
                self.done.set()

    def fail(self, error: BaseException) -> None:
        """Record the first error and wake the waiting study."""
        with self._lock:
            if self._error is None:
                self._error = error
        self.done.set()

    def result(self, model: str) -> FloatArray:
        """The outputs in slice order, once `done` is set; raises EngineError if a batch failed."""
        if self._error is not None:
            # A fresh exception per study: the same error may be shared by several studies.
            raise EngineError(f"{model}: {self._error}") from self._error
        return self._out


@dataclass(frozen=True)
class SliceWork:
    """A request's payload: slices `first`, `first`+1, ... of a study, in these arena slots."""

    study: str
    first: int
    slots: tuple[int, ...]
    result: ResultSlot


@dataclass(frozen=True, order=True)
class SliceRequest:
    """A run of queued slices, ordered by (rank, deadline, enqueued_ns); payload not compared.

    A batch may take the first part of a run; the rest goes back to the queue with its key,
    so it keeps its place.
    """

    rank: int
    deadline: float
    enqueued_ns: int
    payload: SliceWork = field(compare=False)

    @property
    def priority(self) -> Priority:
        """The sort key as a tuple, for `Dispatch.reserve`."""
        return (self.rank, self.deadline, self.enqueued_ns)
