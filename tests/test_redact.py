"""No patient identifier in the daemon's log or a study's error text (issue 18, item 9)."""

from __future__ import annotations

import copy
import io
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pydicom.valuerep
import pytest

from imaging_ai.config import Config, StorageConfig
from imaging_ai.logs import setup_logging
from imaging_ai.outputs.files import encode_results
from imaging_ai.process import Processor
from imaging_ai.redact import REDACTED, exception_text, redact_text
from imaging_ai.schedule import Claim
from tests.outputs.conftest import CREATED, IMPRESSION, Study, study  # noqa: F401

BIRTH_DATE = "19AB0304"


@contextmanager
def daemon_log(fmt: str = "text") -> Iterator[io.StringIO]:
    """What the daemon's logging (``imaging-ai serve``'s setup, ``[logging] format`` ``fmt``)
    writes, with warnings shown."""
    root = logging.getLogger()
    handlers, level, stderr = root.handlers, root.level, sys.stderr
    stream = io.StringIO()
    root.handlers, sys.stderr = [], stream
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            # An earlier test's setup_logging may have left warnings captured: then
            # captureWarnings(True) is a no-op and pytest's per-test recorder, installed since,
            # would take the warning instead of logging.
            logging.captureWarnings(False)
            setup_logging("INFO", fmt)
            try:
                yield stream
            finally:
                logging.captureWarnings(False)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, sys.stderr = handlers, stderr
        root.setLevel(level)


def test_a_single_component_name_is_warned_about_without_the_name(
    study: Study,  # noqa: F811
    tmp_path: Path,
) -> None:
    headers = [copy.deepcopy(ds) for ds in study.headers]
    for ds in headers:
        ds.PatientName = "Doe"
    config = Config(storage=StorageConfig(data_dir=str(tmp_path)))
    with daemon_log() as log:
        encode_results(study.analysis, headers, 41, CREATED, IMPRESSION, config)
    text = log.getvalue()
    assert "unlikely to represent the intended person name" in text  # still warned
    assert f'The string "{REDACTED}"' in text
    assert "Doe" not in text


class _Scheduler:
    node = "node-1"
    lease = timedelta(minutes=2)

    def __init__(self) -> None:
        self.requeued: list[str] = []

    def renew(self, claim: Claim) -> bool:
        return True

    def requeue(self, claim: Claim, reason: str) -> None:
        self.requeued.append(reason)


def test_an_error_from_a_bad_birth_date_is_redacted_in_log_and_job() -> None:
    scheduler = _Scheduler()
    none: Any = None
    processor = Processor(none, none, none, Config(), none)
    processor.scheduler = scheduler  # type: ignore[assignment]

    def files(claim: Claim) -> list[Path]:
        pydicom.valuerep.DA(BIRTH_DATE)  # what reading the header's PatientBirthDate raises
        return []

    processor._files = files  # type: ignore[method-assign]
    claim = Claim(7, 3, "1.2.3", "routine", datetime.now(UTC), attempt=1)
    with daemon_log() as log:
        processor._process(claim)
    text = log.getvalue()
    assert "job 7: analysis failed (attempt 1)" in text
    assert "ValueError: invalid literal for int() with base 10" in text  # the traceback
    assert scheduler.requeued and "invalid literal for int()" in scheduler.requeued[0]
    for written in (text, *scheduler.requeued):
        assert BIRTH_DATE[:4] not in written


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Unable to convert '19AB0304' to 'DA' object",
            f"Unable to convert '{REDACTED}' to 'DA' object",
        ),
        ('Invalid value for VR PN: "O\'Brien".', f'Invalid value for VR PN: "{REDACTED}".'),
        ("PatientID 'X-1' in the study's header", f"PatientID '{REDACTED}' in the study's header"),
        ("19AB0304 is not an HL7 valid date value", f"{REDACTED} is not an HL7 valid date value"),
        (
            "Invalid value for VR UI: '4.0\\x10\\x00LO\\n\\x00TEST-ID-1 '.",  # a damaged UID
            f"Invalid value for VR UI: '{REDACTED}'.",
        ),
        ("cannot listen on 'eth0'", "cannot listen on 'eth0'"),  # nothing about a patient
    ],
)
def test_log_messages(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_an_exception_has_every_quoted_value_redacted() -> None:
    assert exception_text(KeyError("Doe")) == f"'{REDACTED}'"


def test_a_damaged_uid_is_not_quoted_in_the_refusal() -> None:
    from imaging_ai.errors import InvalidDataset
    from imaging_ai.spool import check_uid

    with pytest.raises(InvalidDataset) as refused:
        check_uid("4.0\x10\x00 \x00LO\n\x00TEST-ID-1 ", "SOPInstanceUID")
    assert "TEST-ID" not in str(refused.value)
    assert "of 21 characters" in str(refused.value)
    with pytest.raises(InvalidDataset, match=r"'1\.2\.\.3'"):
        check_uid("1.2..3", "SOPInstanceUID")  # looks like a UID: shown, to be found
