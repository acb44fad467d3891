"""The outbox: deliveries to a real DICOM peer (DCMTK storescp), backoff, admin retry/cancel."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import free_port
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.config import (
    Config,
    OutputsConfig,
    PacsDestination,
    RisDestination,
)
from imaging_ai.db.models import AuditEvent, Delivery, Study
from imaging_ai.db.session import session_factory
from imaging_ai.errors import DeliveryError
from imaging_ai.outbox import Outbox, Payload, backoff_s
from tests.conftest import wait_until
from tests.dicom_factory import ct_series

T0 = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)


@pytest.fixture
def storescp(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    port, out = free_port(), tmp_path / "pacs"
    out.mkdir()
    proc = subprocess.Popen(
        ["storescp", "-aet", "PACS", "-od", str(out), "-dhl", str(port)],
        env={**os.environ, "TCP_NODELAY": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    yield port, out
    proc.terminate()
    proc.wait(10)


def setup(
    engine: Engine, tmp_path: Path, pacs_port: int, ris: bool = False, sender: object = None
) -> tuple[Outbox, int]:
    outputs = OutputsConfig(
        pacs=(PacsDestination("PACS", "127.0.0.1", pacs_port),),
        ris=(RisDestination("127.0.0.1", 1),) if ris else (),
        retry_min_s=5,
        retry_max_s=60,
    )
    data = tmp_path / "data"
    files = ct_series(data / "outputs", slices=2)
    outbox = Outbox(session_factory(engine), Config(outputs=outputs), data, sender)  # type: ignore[arg-type]
    oru = data / "outputs" / "oru.hl7"
    oru.write_text("MSH|^~\\&|IMAGING_AI\r")
    payloads = [Payload("seg", files[0], "1.1"), Payload("sr", files[1], "1.2")]
    if ris:
        payloads.append(Payload("oru", oru, "ctl-1"))
    with Session(engine) as s, s.begin():
        study = Study(
            study_instance_uid="1.2.3", state="processing", received_at=T0, last_instance_at=T0
        )
        s.add(study)
        s.flush()
        assert outbox.enqueue(s, study, payloads, T0) == len(payloads)
        study_id = study.id
    return outbox, study_id


def rows(engine: Engine) -> list[Delivery]:
    with Session(engine) as s:
        return list(s.scalars(select(Delivery).order_by(Delivery.id)))


def study_state(engine: Engine, study_id: int) -> str:
    with Session(engine) as s:
        study = s.get(Study, study_id)
        assert study is not None
        return study.state


def test_delivers_to_a_real_pacs(
    engine: Engine, tmp_path: Path, storescp: tuple[int, Path]
) -> None:
    port, received = storescp
    outbox, study_id = setup(engine, tmp_path, port)
    assert study_state(engine, study_id) == "delivering"
    assert outbox.deliver_due(T0) == 2
    assert [r.state for r in rows(engine)] == ["done", "done"]
    assert len(list(received.iterdir())) == 2
    assert study_state(engine, study_id) == "done"


def test_pacs_down_backs_off_then_delivers(engine: Engine, tmp_path: Path) -> None:
    if shutil.which("storescp") is None:
        pytest.skip("needs DCMTK storescp")
    port = free_port()
    outbox, study_id = setup(engine, tmp_path, port)
    outbox.deliver_due(T0)
    failed = rows(engine)
    assert all(r.state == "pending" and r.attempts == 1 for r in failed)
    assert "did not accept the association" in failed[0].last_error
    assert all(r.next_try_at > datetime.now(UTC) for r in failed)
    assert outbox.deliver_due() == 0  # not due yet
    out = tmp_path / "late-pacs"
    out.mkdir()
    proc = subprocess.Popen(
        ["storescp", "-aet", "PACS", "-od", str(out), "-dhl", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        assert outbox.deliver_due(datetime.now(UTC) + timedelta(seconds=10)) == 2
    finally:
        proc.terminate()
        proc.wait(10)
    assert [r.state for r in rows(engine)] == ["done", "done"]
    assert study_state(engine, study_id) == "done"


def test_hl7_failures_and_admin_actions(
    engine: Engine, tmp_path: Path, storescp: tuple[int, Path]
) -> None:
    calls: list[str] = []

    def refusing_ris(dest: RisDestination, message: str) -> None:
        calls.append(message)
        raise DeliveryError("RIS answered AE: unknown patient")

    outbox, study_id = setup(engine, tmp_path, storescp[0], ris=True, sender=refusing_ris)
    outbox.deliver_due(T0)
    oru = next(r for r in rows(engine) if r.kind == "oru")
    assert (oru.state, oru.last_error) == ("pending", "RIS answered AE: unknown patient")
    assert calls and calls[0].startswith("MSH|")
    assert study_state(engine, study_id) == "delivering"
    assert outbox.retry(oru.id, "it-admin") is True
    assert outbox.cancel(oru.id, "it-admin") is True
    assert outbox.cancel(oru.id, "it-admin") is False
    assert study_state(engine, study_id) == "done"
    with Session(engine) as s:
        actions = [a.action for a in s.scalars(select(AuditEvent).order_by(AuditEvent.id))]
    assert actions == ["retry_delivery", "cancel_delivery"]


def test_backoff_grows_and_caps() -> None:
    waits = [backoff_s(n, 5, 3600) for n in range(1, 15)]
    assert 4 <= waits[0] <= 5
    assert all(w <= 3600 for w in waits)
    assert waits[-1] >= 3600 * 0.8
    assert waits[3] > waits[0]


def test_destination_key() -> None:
    assert PacsDestination("PACS", "10.1.1.1", 104).key == "pacs:PACS@10.1.1.1:104"


def test_the_sender_is_woken_only_once_the_rows_are_committed(
    engine: Engine, tmp_path: Path
) -> None:
    outbox, study_id = setup(engine, tmp_path, pacs_port=1)
    outbox._wake.clear()
    with Session(engine) as s:
        with s.begin():
            study = s.get(Study, study_id)
            assert study is not None
            outbox.enqueue(
                s, study, [Payload("sr", tmp_path / "data" / "outputs" / "oru.hl7", "9")], T0
            )
            assert not outbox._wake.is_set()  # rows not visible yet: a wake now finds nothing
        assert outbox._wake.is_set()


def test_a_slow_ris_does_not_hold_back_pacs(
    engine: Engine, tmp_path: Path, storescp: tuple[int, Path]
) -> None:
    pacs_done = threading.Event()

    def slow_ris(dest: RisDestination, message: str) -> None:
        pacs_done.wait(10)  # as a RIS does that takes its timeout to fail

    outbox, _ = setup(engine, tmp_path, storescp[0], ris=True, sender=slow_ris)
    with Session(engine) as s, s.begin():
        oru = s.scalars(select(Delivery).where(Delivery.kind == "oru")).one()
        oru.next_try_at = T0 - timedelta(seconds=1)  # first in the pass
    sending = threading.Thread(target=outbox.deliver_due, args=(T0,))
    sending.start()
    try:
        wait_until(
            lambda: [r.state for r in rows(engine) if r.kind != "oru"] == ["done", "done"], 8.0
        )
    finally:
        pacs_done.set()
        sending.join(15)
    assert [r.state for r in rows(engine)] == ["done", "done", "done"]
