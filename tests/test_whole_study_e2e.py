"""Acceptance (issue 20): Orthanc pushes a study holding CT + a dose SR + a localizer + a previous
SEG/SR of ours. Every instance is Success (Orthanc's store job has no failure), the CT is
analysed once (one job), the results reach Orthanc, and the series not analysed say why on the
API and the study page.

The previous SEG and SR are the daemon's own, written by an earlier run (another data
directory) on the same CT; they are given new UIDs, as an earlier job's results have.
"""

from __future__ import annotations

import sqlite3
import urllib.request
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import ADMIN_TOKEN, DaemonProcess, free_port
from imaging_ai_devkit.bench.orthanc import ORTHANC_AE, OrthancPacs
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pydicom.uid import generate_uid

from tests.conftest import wait_until
from tests.dicom_factory import dose_sr, localizer

pytestmark = pytest.mark.skipif(not OrthancPacs.available(), reason="needs Debian orthanc")
SLICES = 24
SETTINGS = (
    "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 1.0\npoll_s = 0.2\n"
    "[outputs]\nretry_min_s = 1.0\nretry_max_s = 2.0\n"
)


def earlier_results(root: Path, ct: list[Path], port: int) -> list[Path]:
    """SEG and SR of ours on this CT, from a first daemon, with an earlier job's new UIDs."""
    daemon = DaemonProcess(root / "earlier", SETTINGS, dicom_port=port)
    daemon.start()
    try:
        daemon.send(ct)
        uid = str(pydicom.dcmread(ct[0], stop_before_pixels=True).StudyInstanceUID)
        wait_until(lambda: daemon.study(uid)["state"] == "done", 240)
    finally:
        assert daemon.stop() == 0, daemon.log()
    found = []
    for path in sorted((daemon.data_dir / "results").rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.SeriesInstanceUID = generate_uid()
        found.append(root / f"earlier-{path.name}")
        ds.save_as(found[-1], enforce_file_format=True)
    assert len(found) == 2, found  # seg.dcm and sr.dcm
    return found


def page(daemon: DaemonProcess, path: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{daemon.http_port}{path}",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def jobs_of(daemon: DaemonProcess) -> int:
    with sqlite3.connect(daemon.data_dir / "imaging-ai.sqlite3") as db:
        return int(db.execute("SELECT count(*) FROM jobs").fetchone()[0])


def test_orthanc_pushes_a_whole_study(tmp_path: Path) -> None:
    spec = PhantomSpec(slices=SLICES, seed=21, nodules=1, nodule_diameter_range_mm=(10.0, 14.0))
    write_study(
        generate(spec), tmp_path / "study", priority="urgent", accession="WHOLE-1", workers=1
    )
    ct = sorted((tmp_path / "study" / "dicom").glob("*.dcm"))
    first = pydicom.dcmread(ct[0], stop_before_pixels=True)
    uid = str(first.StudyInstanceUID)
    port = free_port()
    others = [
        dose_sr(tmp_path / "dose.dcm", first),
        localizer(tmp_path / "scout.dcm", pydicom.dcmread(ct[0])),
        *earlier_results(tmp_path, ct, port),
    ]

    orthanc = OrthancPacs(tmp_path / "orthanc", "IMAGING_AI", port)
    orthanc.start()
    daemon = DaemonProcess(
        tmp_path / "daemon",
        SETTINGS + f'pacs = [{{ae_title = "{ORTHANC_AE}", host = "127.0.0.1", '
        f"port = {orthanc.dicom_port}}}]\n",
        calling_aes=("STORESCU", ORTHANC_AE),
        dicom_port=port,
    )
    try:
        orthanc_study = orthanc.upload([*ct, *others])
        daemon.start()
        job = orthanc.push_to_daemon(orthanc_study)
        total = len(ct) + len(others)
        assert (job["InstancesCount"], job["FailedInstancesCount"]) == (total, 0), job
        wait_until(lambda: daemon.study(uid)["state"] == "done", 240)
        view = daemon.study(uid)
        assert view["instance_count"] == total
        assert {d["result"]: d["state"] for d in view["deliveries"]} == {
            "seg": "done",
            "sr": "done",
        }
        reasons = sorted(((s["modality"], s["not_analysed"]) for s in view["series"]), key=str)
        assert reasons == [
            ("CT", "localizer"),
            ("CT", None),  # the one analysed
            ("SEG", "our own result"),
            ("SR", "not CT: X-Ray Radiation Dose SR Storage"),
            ("SR", "our own result"),
        ]
        assert jobs_of(daemon) == 1  # the CT analysed once
        study_page = page(daemon, f"/admin/studies/{uid}")
        assert "not analysed: our own result" in study_page
        assert "not analysed: localizer" in study_page
        # The new SEG and SR reached Orthanc beside the earlier ones.
        assert len(orthanc.instances_of_modality("SEG")) == 2
        assert len(orthanc.instances_of_modality("SR")) == 3  # dose SR, earlier SR, new SR
    finally:
        try:
            assert daemon.stop() == 0, daemon.log()
        finally:
            orthanc.stop()
