"""Test-only: takes IMAGING_AI_FAULT=<point> at start and SIGKILLs the daemon at that point,
or makes one part fail.

Off unless the variable is set. The reliability tests (``tests/reliability``) use it to kill the
daemon at an exact stage boundary instead of racing a timer; ``docs/reliability.md`` lists the
points and what is durable at each. A failure (`FAILURES`) instead breaks a part while the
daemon runs on, e.g. a GPU whose every batch raises a CUDA error. It is read once, by
:func:`arm` when the daemon starts, and a value that names neither stops the start. A hospital
never sets it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

from imaging_ai.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "IMAGING_AI_FAULT"
POINTS = {
    "before:claim": "a queued job was found, before its claim commits (it stays queued)",
    "before:preprocess": "a job was claimed (its lease held), before its files are read",
    "in:batch": "a batch was sent to an inference worker, before its result came back",
    "after:postprocess": "the analysis (postprocessing included) finished, before any output",
    "after:outputs": "SEG, SR and ORU files written, before the report and deliveries commit",
    "after:deliver": "a destination confirmed a delivery, before the row is marked done",
}

GPU_ERROR = "gpu:error"
FAILURES = {
    GPU_ERROR: "every batch on a GPU worker's engine raises a CUDA error, so the CPU fallback "
    "runs it; the engines' set starts one GPU worker even on a host without a GPU",
}

_armed = ""


def arm(environ: Mapping[str, str]) -> None:
    """Read the fault point from ``environ`` (once, at start); no variable disarms.

    Raises
    ------
    ConfigError
        The variable names no known point.
    """
    global _armed
    point = environ.get(ENV, "")
    if point and point not in POINTS and point not in FAILURES:
        known = ", ".join([*POINTS, *FAILURES])
        raise ConfigError(f"{ENV}={point!r} is not a fault point; known: {known}")
    _armed = point
    if point in FAILURES:
        log.warning("%s=%s: %s (test only)", ENV, point, FAILURES[point])
    elif point:
        log.warning("%s=%s: this daemon will SIGKILL itself there (test only)", ENV, point)


def failing(failure: str) -> bool:
    """Whether ``failure`` (one of `FAILURES`) is the armed fault."""
    return failure == _armed


def reach(point: str) -> None:
    """SIGKILL this process if ``point`` is the armed one; otherwise do nothing."""
    if point == _armed:
        log.critical("%s=%s reached: SIGKILL", ENV, point)
        os.kill(os.getpid(), signal.SIGKILL)
