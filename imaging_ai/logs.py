"""Takes a log level; gives every process of the daemon the same stderr logging, redacted.

Its own module so that child processes (the DICOM receivers) set up logging without importing
the command line, which imports the daemon that starts them.
"""

from __future__ import annotations

import logging
import sys

from imaging_ai import redact


def setup_logging(level: str) -> None:
    """Log to stderr; pynetdicom stays at WARNING because its debug output dumps datasets."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("pynetdicom").setLevel(logging.WARNING)
    # highdicom logs each copied module with the source UIDs at INFO.
    logging.getLogger("highdicom").setLevel(logging.WARNING)
    # Library warnings and exception messages quote header values (names, dates): redacted.
    redact.install()
