"""Takes log records, gives one JSON object per line for a hospital's log collector.

``[logging] format = "json"``: each line holds ``time`` (ISO 8601, UTC, milliseconds),
``level``, ``logger``, ``message``, ``process`` and ``thread`` (their names), and ``exc`` or
``stack`` when the record has a traceback or a stack. The handler's
:class:`~imaging_ai.redact.RedactingFilter` has already redacted the message and traceback;
this formatter only lays them out. Standard-library ``json``: the layout is these few keys,
which a dependency (python-json-logger) would not shorten.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in the text are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": str(record.processName),
            "thread": str(record.threadName),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry)


def formatter(fmt: str) -> logging.Formatter:
    """The formatter for ``[logging] format`` (``text`` or ``json``)."""
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
