"""A model's slice shapes in; numbered slots in shared memory that the batcher and the inference
workers both read and write, out.

One `SliceArena` per model holds `capacity` input slices and as many output slices in two
shared-memory buffers that live as long as the model's batcher. The batcher copies a study's
slices into free slots once, when it admits them; a worker process reads a batch's inputs
straight from those slots and writes its outputs into the same slots of the output buffer; the
batcher copies each study's outputs out and frees the slots. So a batch crosses processes as a
few slot numbers (`SlotBatch`), and no slice is stacked or pickled on the way. GPU workers
page-lock both buffers once (cudaHostRegister), so their copies to and from the GPU are DMA
straight from and into these slots. The arena's size is also the memory bound of everything
queued and running: the batcher admits a slice only into a free slot.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import numpy.typing as npt

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import FloatArray, write_pieces

log = logging.getLogger(__name__)

_SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory
Run = tuple[int, int, int, int]
"""(position in the list, first of `a`, first of `b`, length) of a run consecutive in both."""


@dataclass(frozen=True)
class ArenaRef:
    """What a worker process needs to map an arena: buffer names, slot count, slice shapes."""

    input_name: str
    output_name: str
    capacity: int
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]


@dataclass(frozen=True)
class SlotBatch:
    """One batch: slots of an arena, in batch order (what `Dispatch.submit` takes)."""

    arena: SliceArena = field(compare=False)
    slots: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.slots)

    def inputs(self) -> FloatArray:
        """A copy of the batch's input slices, [N, C, H, W] (for in-process dispatchers)."""
        return np.concatenate([a for a, _ in self.arena.pieces(self.slots)])

    def write_outputs(self, outputs: FloatArray) -> None:
        """Put [N, K, h, w] outputs into the batch's output slots (for in-process dispatchers)."""
        write_pieces(outputs, [b for _, b in self.arena.pieces(self.slots)])


class SliceArena:
    """Input and output slots of one model in shared memory.

    Create it in the daemon (`create`: it owns and finally unlinks the buffers); map it in a
    worker process from its `ref` (`attach`). `allocate` and `free` are for the owner only and
    are thread-safe; the slot contents are not locked: a slot belongs to one slice at a time.
    """

    def __init__(self, ref: ArenaRef, buffers: tuple[SharedMemory, SharedMemory], owner: bool):
        self.ref, self._buffers, self._owner = ref, buffers, owner
        self.inputs: FloatArray = np.ndarray(
            (ref.capacity, *ref.input_shape), np.float32, buffers[0].buf
        )
        self.outputs: FloatArray = np.ndarray(
            (ref.capacity, *ref.output_shape), np.float32, buffers[1].buf
        )
        self._free = np.ones(ref.capacity, bool)
        self._available = ref.capacity
        self._lock = threading.Lock()

    @classmethod
    def create(
        cls, capacity: int, input_shape: Sequence[int], output_shape: Sequence[int]
    ) -> SliceArena:
        """New buffers for `capacity` slices.

        Their pages are allocated on first touch, so memory follows the slots in use; the room
        for all of them is checked now, because a write past a full /dev/shm is a SIGBUS.

        Raises
        ------
        EngineError
            Shared memory is too small for them (a container's /dev/shm, say); the message
            says how much is needed.
        """
        if capacity < 1:
            raise ValueError(f"arena capacity {capacity}: expected >= 1")
        sizes = [4 * capacity * math.prod(s) for s in (input_shape, output_shape)]
        _check_room(sum(sizes))
        made: list[SharedMemory] = []
        try:
            for size in sizes:
                made.append(SharedMemory(create=True, size=max(size, 1)))
        except BaseException:
            for shm in made:
                _drop(shm, unlink=True)
            raise
        ref = ArenaRef(
            made[0].name, made[1].name, capacity, tuple(input_shape), tuple(output_shape)
        )
        return cls(ref, (made[0], made[1]), owner=True)

    @classmethod
    def attach(cls, ref: ArenaRef) -> SliceArena:
        """Map an arena that another process created (a worker does this once per arena)."""
        inputs = SharedMemory(ref.input_name)
        try:
            outputs = SharedMemory(ref.output_name)
        except BaseException:
            _drop(inputs, unlink=False)
            raise
        return cls(ref, (inputs, outputs), owner=False)

    @property
    def capacity(self) -> int:
        """Slots in all."""
        return self.ref.capacity

    @property
    def available(self) -> int:
        """Free slots now."""
        return self._available

    def allocate(self, n: int) -> npt.NDArray[np.intp]:
        """Up to `n` free slots (fewer when fewer are free), the lowest-numbered first.

        Lowest first keeps the memory that is touched (and so resident) to what the busiest
        moment needed, and a study's slices mostly land in one run of slots, so a batch is one
        or two copies to the GPU.
        """
        with self._lock:
            got = np.flatnonzero(self._free)[: max(n, 0)]
            self._free[got] = False
            self._available -= len(got)
            return got

    def free(self, slots: Sequence[int] | npt.NDArray[np.intp]) -> None:
        """Give slots back; freeing a free slot is a bug and raises RuntimeError."""
        index = np.asarray(slots, np.intp)
        with self._lock:
            if self._free[index].any() or len(np.unique(index)) != len(index):
                raise RuntimeError(f"arena: slot(s) freed twice: {sorted(set(index.tolist()))}")
            self._free[index] = True
            self._available += len(index)

    def pieces(self, slots: Sequence[int]) -> list[tuple[FloatArray, FloatArray]]:
        """(input view, output view) per run of consecutive slots, in batch order."""
        return [
            (self.inputs[s : s + n], self.outputs[s : s + n]) for _, s, _, n in runs(slots, slots)
        ]

    def close(self) -> None:
        """Unmap the buffers; the owner also unlinks them (mappings elsewhere stay valid)."""
        del self.inputs, self.outputs
        for shm in self._buffers:
            _drop(shm, unlink=self._owner)


def runs(a: Sequence[int], b: Sequence[int]) -> list[Run]:
    """Split two equally long index lists where either stops counting up by one.

    Parameters
    ----------
    a, b : sequences of int
        E.g. slice indices of a study and the arena slots that hold them.

    Returns
    -------
    list of (position, a start, b start, length)
        Runs in order; together they cover every position once.
    """
    out: list[Run] = []
    start = 0
    for i in range(1, len(a) + 1):
        if i == len(a) or a[i] != a[i - 1] + 1 or b[i] != b[i - 1] + 1:
            out.append((start, int(a[start]), int(b[start]), i - start))
            start = i
    return out


def _check_room(nbytes: int) -> None:
    if not os.path.isdir(_SHM_DIR):
        return
    free = shutil.disk_usage(_SHM_DIR).free
    if nbytes > free:
        raise EngineError(
            f"the batching buffers need {nbytes >> 20} MiB of shared memory, but {_SHM_DIR} has "
            f"{free >> 20} MiB free; give the container more (docker run --shm-size) or lower "
            "[engines] max_pending_slices or max_batch_size"
        )


def _drop(shm: SharedMemory, *, unlink: bool) -> None:
    with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
        shm.close()
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
