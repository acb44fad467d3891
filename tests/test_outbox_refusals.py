"""The outbox and refusals: a final refusal ends a delivery REFUSED (no loop) and settles its
study; every failure, an unexpected exception included, is a counted attempt with a reason;
a PACS destination gets only the results it takes."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import free_port
from pydicom import dcmread
from pydicom.uid import Comprehensive3DSRStorage
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai import outbox as outbox_module
from imaging_ai.config import Config, OutputsConfig, PacsDestination
from imaging_ai.db.models import Delivery, Study
from imaging_ai.db.session import session_factory
from imaging_ai.outbox import Outbox, Payload
from imaging_ai.outbox_pacs import DELIVERED, Outcome
from imaging_ai.states import DeliveryState, StudyState
from tests.dicom_factory import ct_series

T0 = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)
# A PACS profile without Comprehensive 3D SR (storescp -xf FILE PROFILE): SEG, CT and
# Comprehensive SR only.
PROFILE = """\
[[TransferSyntaxes]]
[Uncompressed]
TransferSyntax1 = LocalEndianExplicit
TransferSyntax2 = LittleEndianImplicit
[[PresentationContexts]]
[NoComprehensive3DSR]
PresentationContext1 = VerificationSOPClass\\Uncompressed
PresentationContext2 = SegmentationStorage\\Uncompressed
PresentationContext3 = CTImageStorage\\Uncompressed
PresentationContext4 = ComprehensiveSRStorage\\Uncompressed
[[Profiles]]
[NoComprehensive3DSR]
PresentationContexts = NoComprehensive3DSR
"""


def restricted_storescp(folder: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    """DCMTK storescp with the profile above; ``$!``-safe (the Popen is storescp itself)."""
    if shutil.which("storescp") is None:
        pytest.skip("needs DCMTK storescp")
    folder.mkdir(parents=True)
    (folder / "storescp.cfg").write_text(PROFILE)
    received, port = folder / "received", free_port()
    received.mkdir()
    proc = subprocess.Popen(
        ["storescp", "-aet", "PACS", "-od", str(received), "-dhl",
         "-xf", str(folder / "storescp.cfg"), "NoComprehensive3DSR", str(port)],
        env={**os.environ, "TCP_NODELAY": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert proc.poll() is None, "storescp exited: is the profile valid?"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port, received
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("storescp did not listen")


def make(
    engine: Engine, tmp_path: Path, dest: PacsDestination, sr_file: Path | None = None
) -> tuple[Outbox, int]:
    data = tmp_path / "data"
    seg, sr = ct_series(data / "outputs", slices=2)
    if sr_file is not None:
        sr = sr_file
    config = Config(outputs=OutputsConfig(pacs=(dest,), retry_min_s=1, retry_max_s=2))
    outbox = Outbox(session_factory(engine), config, data)
    with Session(engine) as s, s.begin():
        study = Study(
            study_instance_uid="1.2.3",
            state=StudyState.PROCESSING,
            received_at=T0,
            last_instance_at=T0,
        )
        s.add(study)
        s.flush()
        outbox.enqueue(s, study, [Payload("seg", seg, "1.1"), Payload("sr", sr, "1.2")], T0)
        return outbox, study.id


def rows(engine: Engine) -> dict[str, Delivery]:
    with Session(engine) as s:
        return {d.kind: d for d in s.scalars(select(Delivery).order_by(Delivery.id))}


def state_of(engine: Engine, study_id: int) -> StudyState:
    with Session(engine) as s:
        study = s.get(Study, study_id)
        assert study is not None
        return study.state


def fake_send(outcomes: dict[str, Outcome], calls: list[list[str]]) -> object:
    def send(calling_ae: str, dest: PacsDestination, files: dict[int, Path], tls: object) -> object:
        calls.append([p.name for p in files.values()])
        return {i: outcomes[p.name] for i, p in files.items()}

    return send


def test_a_refusal_ends_the_delivery_and_settles_the_study(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox, study_id = make(engine, tmp_path, PacsDestination("PACS", "127.0.0.1", 104))
    names = [Path(d.payload).name for d in rows(engine).values()]
    refusal = Outcome("refused by PACS PACS: no presentation context for ...", final=True)
    calls: list[list[str]] = []
    monkeypatch.setattr(
        outbox_module, "send_files", fake_send({names[0]: DELIVERED, names[1]: refusal}, calls)
    )
    assert outbox.deliver_due(T0) == 2
    found = rows(engine)
    assert (found["seg"].state, found["seg"].attempts) == (DeliveryState.DONE, 1)
    sr = found["sr"]
    assert (sr.state, sr.attempts, sr.last_error) == (DeliveryState.REFUSED, 1, refusal.reason)
    assert sr.last_attempt_at is not None
    assert state_of(engine, study_id) == StudyState.DONE
    # No loop: nothing is due again, not even after any lease or backoff.
    assert outbox.deliver_due(T0 + timedelta(days=1)) == 0
    assert calls == [names]
    # An administrator who changed the PACS retries it: pending again, the study delivering.
    assert outbox.retry(sr.id, "it-admin") is True
    assert rows(engine)["sr"].state == DeliveryState.PENDING
    assert state_of(engine, study_id) == StudyState.DELIVERING
    assert outbox.cancel(rows(engine)["seg"].id, "it-admin") is False  # done stays done


def test_an_unexpected_error_is_a_counted_attempt_logged_once(
    sqlite_engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox, study_id = make(sqlite_engine, tmp_path, PacsDestination("PACS", "127.0.0.1", 104))

    def broken(*args: object) -> object:
        raise RuntimeError("the association state machine is in Sta13")

    monkeypatch.setattr(outbox_module, "send_files", broken)
    caplog.set_level(logging.WARNING, logger="imaging_ai.outbox")
    assert outbox.deliver_due(T0) == 2
    first = rows(sqlite_engine)
    for row in first.values():
        assert (row.state, row.attempts) == (DeliveryState.PENDING, 1)
        assert row.last_error == (
            "unexpected error: RuntimeError: the association state machine is in Sta13"
        )
        assert row.next_try_at < T0 + timedelta(seconds=5)  # backed off, not the 180-s lease
    assert outbox.deliver_due(T0 + timedelta(seconds=10)) == 2
    assert {r.attempts for r in rows(sqlite_engine).values()} == {2}
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1
    assert state_of(sqlite_engine, study_id) == StudyState.DELIVERING


def test_a_pacs_gets_only_the_results_it_takes(sqlite_engine: Engine, tmp_path: Path) -> None:
    dest = PacsDestination("PACS", "127.0.0.1", 104, results=("seg",))
    make(sqlite_engine, tmp_path, dest)
    assert list(rows(sqlite_engine)) == ["seg"]


def test_a_pacs_without_comprehensive_3d_sr_gets_the_seg_once_and_refuses_the_sr(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    proc, port, received = restricted_storescp(tmp_path / "pacs")
    try:
        sr = tmp_path / "data" / "sr.dcm"
        sr.parent.mkdir(parents=True)
        _an_sr(ct_series(tmp_path / "src", slices=1)[0], sr)
        outbox, study_id = make(
            sqlite_engine, tmp_path, PacsDestination("PACS", "127.0.0.1", port), sr_file=sr
        )
        assert outbox.deliver_due(T0) == 2
        found = rows(sqlite_engine)
        assert found["seg"].state == DeliveryState.DONE
        assert found["sr"].state == DeliveryState.REFUSED
        assert "Comprehensive 3D SR Storage (1.2.840.10008.5.1.4.1.1.88.34)" in (
            found["sr"].last_error
        )
        assert state_of(sqlite_engine, study_id) == StudyState.DONE
        assert outbox.deliver_due(T0 + timedelta(days=1)) == 0
        assert len(list(received.iterdir())) == 1
    finally:
        proc.terminate()
        proc.wait(10)


def _an_sr(source: Path, out: Path) -> None:
    """A file of SOP class Comprehensive 3D SR (what the PACS is asked to take)."""
    ds = dcmread(source)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = Comprehensive3DSRStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = "1.2.826.0.1.3680043.8.498.99"
    ds.save_as(out, enforce_file_format=True)
