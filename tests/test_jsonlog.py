"""``[logging] format = "json"``: one JSON object per line with the fields, redacted as the text."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

from imaging_ai.redact import REDACTED
from tests.test_redact import daemon_log

FIELDS = {"time", "level", "logger", "message", "process", "thread"}


def lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` parsed as JSON (fails on a line that is not)."""
    return [json.loads(line) for line in text.splitlines()]


def test_each_record_is_one_json_object_with_the_fields() -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    with daemon_log("json") as log:
        logging.getLogger("imaging_ai.pipeline").info("ready: DICOM on %s:%d", "127.0.0.1", 11112)
        worker = threading.Thread(
            target=logging.getLogger("imaging_ai.outbox").warning,
            args=("PACS refused\nretrying",),
            name="outbox",
        )
        worker.start()
        worker.join()
    first, second = lines(log.getvalue())
    assert set(first) == FIELDS
    assert first["message"] == "ready: DICOM on 127.0.0.1:11112"
    assert (first["level"], first["logger"]) == ("INFO", "imaging_ai.pipeline")
    assert first["process"] == "MainProcess"
    assert first["thread"] == threading.current_thread().name
    assert first["time"].endswith("Z")
    at = datetime.fromisoformat(first["time"])
    assert at.utcoffset() == timedelta(0)
    assert before <= at <= datetime.now(UTC)
    assert (second["message"], second["thread"]) == ("PACS refused\nretrying", "outbox")


def test_text_stays_the_default() -> None:
    with daemon_log() as log:
        logging.getLogger("imaging_ai.pipeline").info("ready")
    assert log.getvalue().rstrip().endswith(" INFO imaging_ai.pipeline: ready")


def test_messages_warnings_and_tracebacks_are_redacted() -> None:
    year = "19AB"  # a malformed birth date's year, as pydicom parses it
    with daemon_log("json") as log:
        logging.getLogger("pydicom").warning("Invalid value for VR PN: 'Doe^Jane'")
        warnings.warn(
            'The string "Doe" is unlikely to represent the intended person name', stacklevel=1
        )
        try:
            int(year)
        except ValueError:
            logging.getLogger("imaging_ai.process").exception("study failed")
    text = log.getvalue()
    vr, warned, failed = lines(text)
    assert vr["message"] == f"Invalid value for VR PN: '{REDACTED}'"
    assert warned["logger"] == "py.warnings"
    assert f'The string "{REDACTED}"' in warned["message"]
    assert failed["message"] == "study failed"
    assert f"ValueError: invalid literal for int() with base 10: '{REDACTED}'" in failed["exc"]
    assert "Traceback (most recent call last)" in failed["exc"]
    for value in ("Doe", year):
        assert value not in text
