"""Takes nothing; gives the messages the worker pool and its worker processes pass over a pipe.

Parent to worker: `Task` (run a batch in these arena slots), `Attach` (map an arena ahead),
None (stop). Worker to parent: `Ready` once every model loaded, then `Done` or `Failed` per
batch (`Failed` with no job: the models did not load). Each is small: pixels stay in the arena.
"""

from __future__ import annotations

from dataclasses import dataclass

from imaging_ai.arena import ArenaRef
from imaging_ai.infer.base import BackendInfo


@dataclass(frozen=True)
class Task:
    """Parent to worker: run the inputs in these arena slots; write the outputs into them."""

    job: int
    model: str
    arena: ArenaRef
    slots: tuple[int, ...]


@dataclass(frozen=True)
class Attach:
    """Parent to worker: map (and on a GPU page-lock) this arena now, before its first batch."""

    arena: ArenaRef


@dataclass(frozen=True)
class Ready:
    """Worker to parent: every model loaded; their infos and output slice shapes."""

    infos: dict[str, BackendInfo]
    output_shapes: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Done:
    """Worker to parent: the outputs are in the batch's output slots.

    `marks` (the worker's received, started, ended, replied) and `stages` (the engine's) make
    the batch's `BatchTrace`.
    """

    job: int
    seconds: float
    fallbacks: int
    gpu_lost: bool = False  # an engine took its GPU as lost and runs every batch on the CPU
    marks: tuple[int, int, int, int] = (0, 0, 0, 0)
    stages: tuple[int, int, int] | None = None
    runner: int = 0


@dataclass(frozen=True)
class Failed:
    """Worker to parent: a batch failed (`retry`: on another worker), or loading did."""

    job: int | None  # None: the models did not load
    reason: str
    retry: bool
