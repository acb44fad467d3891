"""Every log line the suite writes is scanned for the test patients' identifiers (issue 18,
item 9).

Two kinds of log are read after each test:

- the records logged in the test's own process, each passed first through the daemon's
  :class:`~imaging_ai.redact.RedactingFilter` (what ``imaging-ai serve``'s handlers apply), then
  formatted with its traceback;
- every ``daemon.log`` a :class:`~imaging_ai_devkit.bench.harness.DaemonProcess` started in the test
  wrote (the daemon as a subprocess, its receivers and workers included).

A test whose logs hold one of :data:`IDENTIFIERS` fails with the offending lines.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imaging_ai_devkit.bench import harness

from imaging_ai.redact import RedactingFilter

IDENTIFIERS = re.compile(
    "|".join(
        [
            r"TEST\^PATIENT",  # tests/dicom_factory.py
            r"TEST-ID-1",
            r"OTHER\^PERSON",  # tests/test_uid_reuse.py
            r"OTHER-ID-9",
            r"19AB0304",  # the malformed PatientBirthDate of the demographics tests
            r"Doe\^J",  # tests/outputs/test_demographics.py
            r"M[üu]ller\^J",
            r"Ødegård",
            r"PHANTOM\^S\d+",  # devkit/imaging_ai_devkit/phantom/dicom.py: PatientName, PatientID
            r"PHANTOM-\d+",
        ]
    )
)


class _Collect(logging.Handler):
    """Keeps every record's text as the daemon's handlers would write it."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.addFilter(RedactingFilter())
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if _active[-1] is not self:  # a scan nested inside this one takes the record
            return
        with contextlib.suppress(Exception):  # a record logging cannot format reports itself
            self.lines.append(self.format(record))


_active: list[_Collect] = []
_daemon_logs: list[Path] = []
_original_init = harness.DaemonProcess.__init__


def _recording_init(self: harness.DaemonProcess, *args: object, **kwargs: object) -> None:
    _original_init(self, *args, **kwargs)  # type: ignore[arg-type]
    _daemon_logs.append(self.log_path)


harness.DaemonProcess.__init__ = _recording_init  # type: ignore[method-assign]


def offending(lines: list[str]) -> list[str]:
    """The lines that name a test patient."""
    return [line for line in lines if IDENTIFIERS.search(line)]


@contextmanager
def scanned() -> Iterator[None]:
    """Collects this test's logs; raises AssertionError if any line names a test patient."""
    collect = _Collect()
    root = logging.getLogger()
    root.addHandler(collect)
    _active.append(collect)
    first_daemon = len(_daemon_logs)
    try:
        yield
    finally:
        _active.remove(collect)
        root.removeHandler(collect)
    found = offending(collect.lines)
    for path in _daemon_logs[first_daemon:]:
        if path.exists():
            text = path.read_text(errors="replace")
            found += [f"{path.name}: {line}" for line in offending(text.splitlines())]
    del _daemon_logs[first_daemon:]
    if found:
        shown = "\n".join(found[:20])
        raise AssertionError(f"{len(found)} log line(s) name a test patient:\n{shown}")
