"""The whole mission with real peers: Orthanc as PACS pushes a study; SEG and SR come back to
Orthanc, the ORU reaches an MLLP listener, the report is on the RIS API; a RIS that is down
gets the message once, after it returns."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import fhirkit
import highdicom as hd
import pydicom
import pytest
from fhir.resources.R4B.bundle import Bundle
from imaging_ai_devkit.bench.harness import DaemonProcess, free_port
from imaging_ai_devkit.bench.orthanc import ORTHANC_AE, OrthancPacs
from imaging_ai_devkit.mllp_listener import RisListener
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study

from tests.conftest import wait_until
from tests.fhir_schema import assert_valid_fhir

pytestmark = pytest.mark.skipif(not OrthancPacs.available(), reason="needs Debian orthanc")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("study")
    spec = PhantomSpec(
        slices=48,
        seed=4242,
        nodules=2,
        slice_thickness_mm=2.5,
        nodule_diameter_range_mm=(10.0, 16.0),
    )
    write_study(generate(spec), out, priority="inpatient", accession="E2E-RIS-1")
    return out


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[tuple[DaemonProcess, OrthancPacs, int]]:
    ris_port = free_port()
    daemon_port = free_port()
    orthanc = OrthancPacs(tmp_path / "orthanc", "IMAGING_AI", daemon_port)
    daemon = DaemonProcess(
        tmp_path / "daemon",
        "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 1.0\npoll_s = 0.2\n"
        "[outputs]\nretry_min_s = 1.0\nretry_max_s = 2.0\n"
        f'pacs = [{{ae_title = "{ORTHANC_AE}", host = "127.0.0.1", port = {orthanc.dicom_port}}}]\n'
        f'ris = [{{host = "127.0.0.1", port = {ris_port}}}]\n',
        calling_aes=("STORESCU", ORTHANC_AE),
        dicom_port=daemon_port,
    )
    orthanc.start()
    daemon.start()
    yield daemon, orthanc, ris_port
    daemon.stop()
    orthanc.stop()


def test_orthanc_round_trip_and_ris(
    peers: tuple[DaemonProcess, OrthancPacs, int], study: Path
) -> None:
    daemon, orthanc, ris_port = peers
    files = sorted((study / "dicom").glob("*.dcm"))
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    # The RIS is down when the results are ready; it comes back later.
    pushed = orthanc.push_to_daemon(orthanc.upload(files))
    assert pushed["FailedInstancesCount"] == 0
    wait_until(lambda: _state(daemon, uid) == "delivering", timeout_s=180)
    wait_until(lambda: len(orthanc.instances_of_modality("SR")) == 1, timeout_s=60)
    time.sleep(2.5)  # at least one failed attempt at the RIS, whose port is closed
    listener = RisListener(port=ris_port).start()
    try:
        wait_until(lambda: _state(daemon, uid) == "done", timeout_s=60)
        time.sleep(3)  # nothing more should arrive
        assert len(listener.received) == 1
    finally:
        listener.stop()
    oru = listener.received[0]
    assert "ORU^R01" in oru and "E2E-RIS-1" in oru
    [seg] = orthanc.instances_of_modality("SEG")
    segmentation = hd.seg.segread(io.BytesIO(orthanc.file(seg["ID"])))
    labels = [d.SegmentLabel for d in segmentation.SegmentSequence]
    assert labels[:2] == ["Right lung", "Left lung"]
    [sr] = orthanc.instances_of_modality("SR")
    report = hd.sr.srread(io.BytesIO(orthanc.file(sr["ID"])))
    assert report.StudyInstanceUID == uid
    api = daemon.get(f"/api/v1/reports/{uid}")
    assert api["accession"] == "E2E-RIS-1"
    assert api["status"] == "preliminary"
    assert len(api["lesions"]) >= 1
    bundle = daemon.get("/fhir/DiagnosticReport?identifier=E2E-RIS-1")
    Bundle.model_validate(bundle)
    assert [str(issue) for issue in fhirkit.validate(bundle)] == []  # FHIR R4 4.0.1
    assert_valid_fhir(bundle)
    assert bundle["type"] == "searchset" and bundle["total"] == 1
    [match] = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "match"]
    assert match["resourceType"] == "DiagnosticReport" and match["status"] == "preliminary"


def _state(daemon: DaemonProcess, uid: str) -> str:
    try:
        return str(daemon.study(uid)["state"])
    except Exception:
        return ""
