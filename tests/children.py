"""Tiny child-process targets for the supervision tests: this module imports nothing heavy, so a
spawned child starts in a fraction of a second even on a loaded machine."""

from __future__ import annotations

import time


def idle() -> None:
    """Sleep until killed."""
    time.sleep(120)


def crash() -> None:
    """Exit at once with code 3."""
    raise SystemExit(3)
