"""Progress bars: on stderr, only on a terminal unless forced, redaction kept, never in serve."""

from __future__ import annotations

import argparse
import io
import logging
import subprocess
import sys

import pytest

from imaging_ai import progress
from imaging_ai.redact import REDACTED
from tests.test_redact import daemon_log


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_only_on_a_terminal_unless_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.shown()
    assert progress.shown(True)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress.shown()
    assert not progress.shown(False)


def test_the_bar_goes_to_stderr_and_off_draws_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    err, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    assert list(progress.progress(range(3), desc="cases", unit="case")) == [0, 1, 2]
    assert err.getvalue() == ""
    assert list(progress.progress(range(3), desc="cases", unit="case", force=True)) == [0, 1, 2]
    assert "cases" in err.getvalue() and "3/3" in err.getvalue()
    assert out.getvalue() == ""


def test_the_flag_forces_either_way_and_defaults_to_the_rule() -> None:
    parser = argparse.ArgumentParser()
    progress.add_argument(parser)
    assert parser.parse_args([]).progress is None
    assert parser.parse_args(["--progress"]).progress is True
    assert parser.parse_args(["--no-progress"]).progress is False


def test_logs_printed_above_the_bars_are_still_redacted() -> None:
    with daemon_log() as log, progress.logs_above_bars():
        bar = progress.progress(range(2), desc="evaluate", unit="case", force=True)
        for _ in bar:
            logging.getLogger("pydicom").warning("Invalid value for VR PN: 'Doe^Jane'")
    text = log.getvalue()
    assert f"Invalid value for VR PN: '{REDACTED}'" in text
    assert "Doe" not in text
    assert "2/2" in text  # the bar, on the same stderr


def test_the_daemon_does_not_load_the_progress_bars() -> None:
    code = "import sys, imaging_ai.pipeline; print('imaging_ai.progress' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"
