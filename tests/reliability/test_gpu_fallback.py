"""A GPU that fails while the daemon runs does not fail the study: its worker runs the batches on
the CPU fallback, the study is done with real results, its record says so, and the status page
and /metrics show it.

The daemon is armed with IMAGING_AI_FAULT=gpu:error: its one inference worker is a GPU worker
whose engines are the daemon's own (`select.load_engine`: a GPU engine wrapped with an ONNX
Runtime CPU session as its fallback), except that the GPU engine raises the CUDA error a lost
device gives on every batch. The engine-level cases (a rerun, out of memory, degraded after
failures in a row) are in tests/infer/test_select.py; a worker whose engines took the GPU as
lost, shown as degraded, in tests/test_workers.py.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pydicom
from imaging_ai_devkit.bench.harness import ADMIN_TOKEN
from imaging_ai_devkit.faults import GPU_ERROR

from tests.conftest import wait_until
from tests.reliability.conftest import FAST_ASSEMBLY, FaultDaemon, Studies, outcome, study_state

ON_CPU = "ran on the CPU instead of the GPU"


def page(daemon: FaultDaemon, path: str) -> str:
    """The text of a page, fetched with the admin token."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{daemon.http_port}{path}",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def metric(text: str, name: str, device: str) -> float:
    """The value of one Prometheus sample with a `device` label."""
    found = re.search(rf'^{name}{{device="{device}"}} (\S+)$', text, re.MULTILINE)
    assert found, f"no {name} for {device} in /metrics"
    return float(found.group(1))


def test_a_failing_gpu_does_not_fail_the_study(tmp_path: Path, small_studies: Studies) -> None:
    files = small_studies[1]
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start(fault=GPU_ERROR)
    try:
        daemon.send(files)
        engine = daemon.database()
        wait_until(lambda: study_state(engine, uid) in ("done", "failed"), timeout_s=120)
        result = outcome(engine, uid)
        engine.dispose()
        assert (result.state, result.error, result.reports) == ("done", "", 1)
        [job] = result.jobs
        assert job.attempts == 1 and job.error in ("", None)
        [note] = [n for n in job.notes if ON_CPU in n]
        assert int(note.split()[0]) >= 2  # "N batch(es) ran ...": at least one of each model

        # The results are the models' own, run on the CPU: both lungs found.
        report = daemon.get(f"/api/v1/reports/{uid}")
        volumes = report["organ_volumes_ml"]
        assert volumes["right lung"] > 100 and volumes["left lung"] > 100, volumes

        assert any(ON_CPU in n for n in daemon.study(uid)["notes"])  # the RIS API's study view
        assert ON_CPU in page(daemon, f"/admin/studies/{uid}")  # the study on the status page
        status = page(daemon, "/admin")
        assert "cuda:0" in status and "failing-gpu" in status  # the worker and its backend
        metrics = page(daemon, "/metrics")
        assert metric(metrics, "imaging_ai_engine_fallbacks_total", "cuda:0") >= 2
        assert "failed, batch rerun on CPU" in daemon.log()
        assert "CUDA failure 700" in daemon.log()
    finally:
        daemon.stop()
