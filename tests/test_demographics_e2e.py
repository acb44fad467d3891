"""A study with PatientBirthDate 19AB0304 and a malformed StudyTime, sent to the daemon, gets its
results on the first attempt with those attributes empty (issue 18, item 10: it failed three
times and delivered nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hl7
import pydicom
import pytest
from imaging_ai_devkit.bench.harness import DaemonProcess
from imaging_ai_devkit.mllp_listener import RisListener
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pydicom.dataelem import DataElement

from tests.conftest import wait_until

BAD = {"PatientBirthDate": ("DA", "19AB0304"), "StudyTime": ("TM", "25xx")}


@pytest.fixture
def study(tmp_path: Path) -> list[Path]:
    root = write_study(generate(PhantomSpec(slices=24, seed=18, nodules=1)), tmp_path / "study")
    paths = sorted((root / "dicom").glob("*.dcm"))
    for path in paths:
        ds = pydicom.dcmread(path)
        for keyword, (vr, value) in BAD.items():
            tag = pydicom.datadict.tag_for_keyword(keyword)
            ds[tag] = DataElement(tag, vr, value, validation_mode=pydicom.config.IGNORE)
        ds.save_as(path)
    return paths


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[tuple[DaemonProcess, RisListener]]:
    listener = RisListener().start()
    daemon = DaemonProcess(
        tmp_path / "daemon",
        "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 1.0\npoll_s = 0.2\n"
        f'[outputs]\nris = [{{host = "127.0.0.1", port = {listener.address[1]}}}]\n',
    )
    daemon.start(timeout_s=240)  # loading and warming the models takes a while under load
    yield daemon, listener
    daemon.stop()
    listener.stop()


def test_bad_demographics_get_results_on_the_first_attempt(
    peers: tuple[DaemonProcess, RisListener], study: list[Path]
) -> None:
    daemon, listener = peers
    uid = str(pydicom.dcmread(study[0], stop_before_pixels=True).StudyInstanceUID)
    daemon.send(study)
    wait_until(lambda: _state(daemon, uid) in ("done", "failed"), timeout_s=240)
    view = daemon.study(uid)
    assert view["state"] == "done", view["error"]
    assert view["error"] is None
    notes = " ".join(view["notes"])
    assert "PatientBirthDate" in notes and "StudyTime" in notes
    log = daemon.log()
    assert "analysis failed" not in log and "attempt 1 failed" not in log
    assert "19AB0304" not in log and "19AB0304" not in notes
    [sr_path] = (daemon.data_dir / "results" / uid).glob("*/sr.dcm")
    sr = pydicom.dcmread(sr_path)
    assert sr.PatientBirthDate == "" and sr.StudyTime == ""
    assert sr.PatientID  # the rest of the patient's identity is kept
    [oru] = listener.received
    assert hl7.parse(oru.replace("\n", "\r"))["PID.F7"] == ""


def _state(daemon: DaemonProcess, uid: str) -> str:
    try:
        return str(daemon.study(uid)["state"])
    except Exception:
        return ""
