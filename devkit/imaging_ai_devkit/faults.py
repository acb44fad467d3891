"""Takes an IMAGING_AI_FAULT value and gives the daemon its fault plan: a kill point or a failure.

Registered for the daemon's ``imaging_ai.faults`` extension point (`imaging_ai.faults`). A
point (`imaging_ai.faults.POINTS`) makes the daemon SIGKILL itself there, so the reliability
tests kill it at an exact stage boundary instead of racing a timer; ``docs/reliability.md``
lists the points and what is durable at each. A failure (`FAILURES`) instead breaks a part
while the daemon runs on, e.g. a GPU whose every batch raises a CUDA error.
"""

from __future__ import annotations

import logging
import os
import signal

from imaging_ai.errors import ConfigError
from imaging_ai.faults import ENV, POINTS
from imaging_ai.infer.base import EngineFactory
from imaging_ai_devkit.fake_engines import FailingGpu

log = logging.getLogger(__name__)

GPU_ERROR = "gpu:error"
FAILURES = {
    GPU_ERROR: "every batch on a GPU worker's engine raises a CUDA error, so the CPU fallback "
    "runs it; the engines' set starts one GPU worker even on a host without a GPU",
}


class KillAt:
    """SIGKILL the daemon when it reaches one point; its engines stay its own."""

    def __init__(self, point: str) -> None:
        self.point = point
        log.warning("%s=%s: this daemon will SIGKILL itself there (test only)", ENV, point)

    def reach(self, point: str) -> None:
        """SIGKILL this process if ``point`` is the armed one; otherwise do nothing."""
        if point == self.point:
            log.critical("%s=%s reached: SIGKILL", ENV, point)
            os.kill(os.getpid(), signal.SIGKILL)

    def engine_factory(self, cpu_threads: int, max_batch_size: int) -> EngineFactory | None:
        """None: the workers keep their engines."""
        return None


class GpuFails:
    """GPU workers whose every batch raises a CUDA error, behind the daemon's own CPU fallback."""

    def __init__(self) -> None:
        log.warning("%s=%s: %s (test only)", ENV, GPU_ERROR, FAILURES[GPU_ERROR])

    def reach(self, point: str) -> None:
        """Nothing: this plan kills nothing."""

    def engine_factory(self, cpu_threads: int, max_batch_size: int) -> EngineFactory | None:
        """`FailingGpu` engines, on one GPU worker at least."""
        return FailingGpu(cpu_threads, max_batch_size)


def plan(value: str) -> KillAt | GpuFails:
    """The plan for ``value``: a point of `imaging_ai.faults.POINTS` or one of `FAILURES`.

    Raises
    ------
    ConfigError
        ``value`` names neither.
    """
    if value in POINTS:
        return KillAt(value)
    if value == GPU_ERROR:
        return GpuFails()
    known = ", ".join([*POINTS, *FAILURES])
    raise ConfigError(f"{ENV}={value!r} is not a fault point; known: {known}")
