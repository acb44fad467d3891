"""End to end as `make demo` runs it: Orthanc (as the hospital's PACS) pushes phantom studies of
three priorities to the daemon; SEG and SR come back to Orthanc, the ORU^R01 reaches the
stand-in RIS, the reports are on the RIS API and FHIR, the status page shows every study done,
and the urgent study finishes first.

The demo is run as a subprocess in its --once mode, so the command people use is the one
tested; it reads every result back from where it went (SEG and SR parsed with highdicom from
Orthanc's copy) and writes what it found as JSON, which this test checks item by item.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from imaging_ai_devkit.bench.orthanc import OrthancPacs

pytestmark = pytest.mark.skipif(not OrthancPacs.available(), reason="needs Debian orthanc")

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.py"
SLICES = 32


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    root = tmp_path_factory.mktemp("demo")
    summary = root / "summary.json"
    cmd = [sys.executable, str(DEMO), "--once", "--studies", "3", "--slices", str(SLICES)]
    cmd += ["--workdir", str(root), "--summary", str(summary), "--timeout", "150"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert summary.exists(), run.stdout + run.stderr
    return json.loads(summary.read_text()), run.stdout + run.stderr


def _studies(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["priority"]: row for row in summary["studies"]}


def test_every_result_arrives_where_it_belongs(demo: tuple[dict[str, Any], str]) -> None:
    summary, output = demo
    studies = _studies(summary)
    assert set(studies) == {"urgent", "inpatient", "outpatient"}, output
    for priority, row in studies.items():
        results = row["results"]
        assert row["problems"] == [], (priority, output)
        assert row["slices"] == SLICES
        assert results["state"] == "done"
        # SEG and SR stored in Orthanc, read back from its copy.
        [labels] = results["seg_labels"]
        assert labels[:2] == ["Right lung", "Left lung"]
        assert results["sr_study_uids"] == [results["study_uid"]]
        # One ORU^R01 with the accession at the RIS, acknowledged (the study is done).
        assert results["oru_messages"] == 1
        # The report on the RIS API and as a FHIR DiagnosticReport.
        [report] = results["api_reports"]
        assert report["accession"] == results["accession"]
        assert report["study_uid"] == results["study_uid"]
        assert report["status"] == "preliminary" and report["ai_generated"] is True
        assert results["fhir_matches"] == 1
        # The admin status page lists it and its page says done.
        assert results["admin_state"] == "done" and results["on_status_page"] is True


def test_urgent_finishes_first_and_stages_add_up(demo: tuple[dict[str, Any], str]) -> None:
    summary, output = demo
    assert summary["finish_order"][0][1] == "urgent", output
    assert summary["urgent_first"] is True
    for row in summary["studies"]:
        stages = row["stages_s"]
        assert {"assemble", "queue", "preprocess", "lung-seg", "nodule-det", "outputs"} <= set(
            stages
        )
        assert sum(stages.values()) == pytest.approx(row["turnaround_s"], abs=1e-6)
        assert min(v for k, v in stages.items() if k != "other") >= 0


def test_demo_says_where_to_look_and_stops_cleanly(demo: tuple[dict[str, Any], str]) -> None:
    summary, output = demo
    assert summary["problems"] == []
    assert summary["daemon_exit"] == 0
    for what in ("/admin", "/api/v1/reports?accession=", "/fhir/DiagnosticReport", "Bearer"):
        assert what in output
    assert "all results arrived" in output
