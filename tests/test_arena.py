"""Shared-memory slice arenas: slot allocation, runs, another mapping, reserved memory, cleanup."""

from __future__ import annotations

import os
from collections import namedtuple

import numpy as np
import pytest

from imaging_ai import arena as arena_module
from imaging_ai.arena import SliceArena, SlotBatch, runs
from imaging_ai.errors import EngineError

IN, OUT = (1, 4, 4), (2, 4, 4)


@pytest.fixture
def arena() -> SliceArena:
    made = SliceArena.create(8, IN, OUT)
    yield made
    made.close()


def test_the_lowest_free_slots_go_first_and_never_twice(arena: SliceArena) -> None:
    first = arena.allocate(3)
    second = arena.allocate(3)
    assert first.tolist() == [0, 1, 2] and second.tolist() == [3, 4, 5]
    arena.free(first)
    third = arena.allocate(5)
    assert third.tolist() == [0, 1, 2, 6, 7] and arena.available == 0
    assert len(arena.allocate(1)) == 0  # full: nothing, not an error
    arena.free(second)
    with pytest.raises(RuntimeError, match="freed twice"):
        arena.free([3])
    with pytest.raises(RuntimeError, match="freed twice"):
        arena.free([6, 6])
    assert arena.available == 3


def test_runs_split_where_either_index_stops_counting_up() -> None:
    assert runs([4, 5, 6, 7], [10, 11, 0, 1]) == [(0, 4, 10, 2), (2, 6, 0, 2)]
    assert runs(range(3), [5, 6, 7]) == [(0, 0, 5, 3)]
    assert runs([0, 2], [0, 1]) == [(0, 0, 0, 1), (1, 2, 1, 1)]
    assert runs([], []) == []


def test_a_second_mapping_sees_and_writes_the_same_slots(arena: SliceArena) -> None:
    slots = tuple(int(s) for s in arena.allocate(3))
    x = np.random.default_rng(0).random((3, *IN), dtype=np.float32)
    arena.inputs[list(slots)] = x
    worker = SliceArena.attach(arena.ref)
    try:
        batch = SlotBatch(worker, slots)
        np.testing.assert_array_equal(batch.inputs(), x)
        batch.write_outputs(np.full((3, *OUT), 7.0, np.float32))
    finally:
        worker.close()
    assert (arena.outputs[list(slots)] == 7.0).all()
    assert [len(a) for a, _ in arena.pieces((6, 7, 0))] == [2, 1]
    with pytest.raises(ValueError, match="do not fit"):
        SlotBatch(arena, slots).write_outputs(np.zeros((2, *OUT), np.float32))


def test_closing_the_owner_removes_the_shared_memory() -> None:
    made = SliceArena.create(2, IN, OUT)
    names = [made.ref.input_name, made.ref.output_name]
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
    made.close()
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)


def test_too_little_shared_memory_is_refused_with_the_size_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(arena_module.shutil, "disk_usage", lambda _: usage(1 << 20, 0, 1 << 20))
    with pytest.raises(EngineError, match=r"need 12 MiB of shared memory.*shm-size"):
        SliceArena.create(1024, (1, 32, 32), (2, 32, 32))
