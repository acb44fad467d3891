"""The log scan of tests/phi_scan.py catches what it should, so that its silence means something."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import DaemonProcess

from tests import phi_scan

log = logging.getLogger("imaging_ai.test")


def test_a_patient_name_logged_in_process_is_caught() -> None:
    with pytest.raises(AssertionError, match="name a test patient"), phi_scan.scanned():
        log.warning("study of %s received", "TEST^PATIENT")


def test_a_traceback_quoting_a_birth_date_is_caught() -> None:
    # A message not about a patient is not redacted by the filter, so the scan must see it.
    with pytest.raises(AssertionError, match="19AB0304"), phi_scan.scanned():
        try:
            raise RuntimeError("unexpected 19AB0304 in header")
        except RuntimeError:
            log.exception("analysis failed")


def test_a_daemon_log_naming_a_patient_is_caught(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"daemon\.log"), phi_scan.scanned():
        daemon = DaemonProcess(tmp_path)
        daemon.log_path.write_text("INFO imaging_ai.receive: PatientID TEST-ID-1\n")


def test_clean_logs_pass(tmp_path: Path) -> None:
    with phi_scan.scanned():
        log.warning("study 1.2.3 received: 20 instances")
        DaemonProcess(tmp_path).log_path.write_text("INFO ready\n")
