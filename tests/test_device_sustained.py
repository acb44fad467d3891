"""benchmarks/device/sustained.py: imports on the GPU machine; a dry run of it end to end here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infer.test_infer_imports import help_without_dicom_or_database

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "device" / "sustained.py"


def test_the_script_shows_its_help_without_dicom_or_database_packages() -> None:
    assert "--senders" in help_without_dicom_or_database(SCRIPT)


def test_the_script_names_what_is_missing_before_it_runs() -> None:
    code = (
        "import runpy, sys\n"
        "sys.modules['pydicom'] = None\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--cpu']\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "cannot run: missing pydicom" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("headline: sustained not measured")


@pytest.mark.slow
def test_a_dry_run_on_the_cpu_sends_with_pynetdicom_and_prints_the_headline(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("IMAGING_AI_ENGINES__BACKEND", None)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--timeout", "120"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("headline: capacity ")
    assert any(line.startswith("sender (pynetdicom, 2 processes): 4 studies") for line in lines)
    assert (tmp_path / "sustained.json").exists()
