"""Takes a log level and format; gives every daemon process the same stderr logging, redacted.

Its own module so that child processes (the DICOM receivers, the inference workers) set up
logging without importing the command line, which imports the daemon that starts them.
"""

from __future__ import annotations

import logging
import sys

from imaging_ai import jsonlog, redact

# What this process was set up with: handed to the processes it spawns (inference workers),
# which start with no logging configured at all.
_settings: tuple[str, str] | None = None


def settings() -> tuple[str, str] | None:
    """The (level, format) this process logs with, or None where `setup_logging` never ran."""
    return _settings


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr as text or JSON lines (``[logging] format``); pynetdicom stays at WARNING
    because its debug output dumps datasets."""
    global _settings
    _settings = (level, fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(jsonlog.formatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging.getLogger("pynetdicom").setLevel(logging.WARNING)
    # highdicom logs each copied module with the source UIDs at INFO.
    logging.getLogger("highdicom").setLevel(logging.WARNING)
    # Library warnings and exception messages quote header values (names, dates): redacted.
    redact.install()
