"""Takes the arenas a worker is sent; gives their slots mapped (page-locked) for its engines.

The worker's side of the shared-memory hand-off (`imaging_ai.arena`): each arena is mapped once
and, on a GPU, page-locked, so an engine copies a batch straight from and into its slots; in
staged mode (`WorkerSpec.staged_copies`) each set of engines copies through page-locked buffers
of its own instead.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from dataclasses import dataclass

import numpy as np

from imaging_ai.arena import ArenaRef, SliceArena
from imaging_ai.errors import EngineError
from imaging_ai.infer.base import Engine, FloatArray, infer_into, write_pieces
from imaging_ai.infer.cuda_mem import CudaRuntime, PinnedBuffer

log = logging.getLogger(__name__)

Pieces = tuple[FloatArray, FloatArray]


class MappedArenas:
    """The arenas this worker has mapped, by name; on a GPU each is page-locked once, so
    the engines' copies to and from the GPU are DMA straight from and into the slots."""

    def __init__(self, page_lock: bool) -> None:
        self._mapped: dict[str, SliceArena] = {}
        self._page_lock = page_lock
        self._locked: list[int] = []
        self._cuda: CudaRuntime | None = None
        self._mutex = threading.Lock()

    def get(self, ref: ArenaRef) -> SliceArena:
        with self._mutex:
            arena = self._mapped.get(ref.input_name)
            if arena is None:
                arena = self._mapped[ref.input_name] = SliceArena.attach(ref)
                if self._page_lock:
                    self._lock(arena)
            return arena

    def _lock(self, arena: SliceArena) -> None:
        try:
            self._cuda = self._cuda or CudaRuntime()
            for view in (arena.inputs, arena.outputs):
                self._cuda.host_register(view.ctypes.data, view.nbytes)
                self._locked.append(view.ctypes.data)
        except EngineError as exc:  # copies still work from pageable memory, only slower
            log.warning("shared slots not page-locked (%s); GPU copies will be staged", exc)
            self._page_lock = False

    def close(self) -> None:
        for address in self._locked:
            with contextlib.suppress(EngineError):
                assert self._cuda is not None
                self._cuda.host_unregister(address)
        for arena in self._mapped.values():
            arena.close()
        self._mapped.clear()


@dataclass
class Runner:
    """One set of engines and, in staged mode, its page-locked buffers: one batch at a time."""

    engines: dict[str, Engine]
    staging: Staging | None


class Staging:
    """Page-locked input and output buffers per model, for batches copied through them."""

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[FloatArray, FloatArray]] = {}
        self._pinned: list[PinnedBuffer] = []
        self._cuda: CudaRuntime | None = None

    def run(self, model: str, engine: Engine, ref: ArenaRef, pieces: list[Pieces]) -> None:
        """Gather the pieces, run them as one batch, scatter the outputs back."""
        x, y = self._for(model, engine.max_batch_size, ref)
        n = sum(len(a) for a, _ in pieces)
        at = 0
        for a, _ in pieces:
            x[at : at + len(a)] = a
            at += len(a)
        infer_into(engine, [x[:n]], [y[:n]])
        write_pieces(y[:n], [b for _, b in pieces])

    def _for(self, model: str, size: int, ref: ArenaRef) -> tuple[FloatArray, FloatArray]:
        if model not in self._buffers:
            shapes = ((size, *ref.input_shape), (size, *ref.output_shape))
            x, y = (self._array(shape) for shape in shapes)
            self._buffers[model] = (x, y)
        return self._buffers[model]

    def _array(self, shape: tuple[int, ...]) -> FloatArray:
        try:
            self._cuda = self._cuda or CudaRuntime()
            self._pinned.append(self._cuda.alloc_pinned(4 * math.prod(shape)))
        except EngineError as exc:  # still correct, only the copies are staged by the driver
            log.warning("staging buffers not page-locked: %s", exc)
            return np.empty(shape, np.float32)
        array: FloatArray = self._pinned[-1].array(np.float32, shape)
        return array

    def close(self) -> None:
        self._buffers.clear()
        for buffer in self._pinned:
            with contextlib.suppress(EngineError):
                buffer.close()
