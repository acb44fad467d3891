"""MLLP to the stand-in RIS (hl7apy's MLLP server): AA delivers; AE, AR, silence, hang-ups and
refusals fail; a RIS that is down gets the message once, through the outbox, when it returns."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import free_port
from imaging_ai_devkit.mllp_listener import Answer, RisListener, ack
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.config import Config, OutputsConfig, RisDestination
from imaging_ai.db.models import Delivery
from imaging_ai.db.models import Study as StudyRow
from imaging_ai.db.session import session_factory
from imaging_ai.errors import DeliveryError
from imaging_ai.outbox import Outbox, Payload
from imaging_ai.outputs.common import build_report
from imaging_ai.outputs.hl7 import build_oru
from imaging_ai.outputs.mllp import Ack, control_id, parse_ack, send_oru
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Study


@pytest.fixture(scope="module")
def message(study: Study) -> str:
    report = build_report(study.analysis, study.headers, ALGORITHM, study.uids, IMPRESSION, CREATED)
    return build_oru(report)


@pytest.fixture
def ris() -> Iterator[RisListener]:
    with RisListener() as listener:
        yield listener


def test_aa_delivers_and_the_ris_gets_the_message(ris: RisListener, message: str) -> None:
    answer = send_oru(*ris.address, message, timeout=5)
    assert answer == Ack("AA", control_id(message))
    assert ris.received == [message]


def test_lf_separated_message_is_sent_with_cr(ris: RisListener, message: str) -> None:
    """What a text file read with universal newlines gives back still goes out as HL7."""
    send_oru(*ris.address, message.replace("\r", "\n"), timeout=5)
    assert ris.received == [message]


@pytest.mark.parametrize("code", ["AE", "AR"])
def test_error_acks_fail_with_the_ris_text(ris: RisListener, message: str, code: str) -> None:
    ris.answer = Answer(code, "Unknown patient PHANTOM-1")
    with pytest.raises(DeliveryError, match=f"answered {code} .*: Unknown patient PHANTOM-1$"):
        send_oru(*ris.address, message, timeout=5)


def test_silence_times_out(ris: RisListener, message: str) -> None:
    ris.answer = Answer(silent=True)
    started = time.monotonic()
    with pytest.raises(DeliveryError, match=r"no acknowledgement within 0\.3 s"):
        send_oru(*ris.address, message, timeout=0.3)
    assert time.monotonic() - started < 2


def test_hang_up_fails(ris: RisListener, message: str) -> None:
    ris.answer = Answer(drop=True)
    with pytest.raises(DeliveryError, match="closed the connection without acknowledging"):
        send_oru(*ris.address, message, timeout=5)


def test_a_message_of_another_type_is_rejected(ris: RisListener) -> None:
    adt = "MSH|^~\\&|IMAGING_AI||RIS||20260101||ADT^A01^ADT_A01|ADT1|P|2.5.1\rEVN|A01|20260101\r"
    with pytest.raises(DeliveryError, match=r"answered AR .*Unsupported message type ADT"):
        send_oru(*ris.address, adt, timeout=5)


def test_connection_refused_fails(message: str) -> None:
    with pytest.raises(DeliveryError, match="refused the connection"):
        send_oru("127.0.0.1", free_port(), message, timeout=5)


def one_reply_server(reply: bytes) -> tuple[int, threading.Thread]:
    """A listener that reads one block and answers ``reply`` as it is."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        with server, server.accept()[0] as conn:
            while not conn.recv(65536).endswith(b"\x1c\r"):
                pass
            conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


def test_an_ack_of_another_message_fails(message: str) -> None:
    port, thread = one_reply_server(b"\x0b" + ack("SOMETHING-ELSE").encode() + b"\x1c\r")
    with pytest.raises(DeliveryError, match="acknowledged message 'SOMETHING-ELSE'"):
        send_oru("127.0.0.1", port, message, timeout=5)
    thread.join(5)


def test_a_block_without_mllp_framing_fails(message: str) -> None:
    port, thread = one_reply_server(ack(control_id(message)).encode() + b"\x1c\r")
    with pytest.raises(DeliveryError, match="malformed MLLP block"):
        send_oru("127.0.0.1", port, message, timeout=5)
    thread.join(5)


def test_parse_ack_reads_error_texts_of_2_3_and_2_5() -> None:
    v25 = (
        "MSH|^~\\&|RIS||IMAGING_AI||20260101||ACK^R01^ACK|1|P|2.5.1\r"
        "MSA|AE|IA1|Unknown \\T\\ patient\r"
        "ERR|||207^Application internal error^HL70357|E||||No such order\r"
    )
    assert parse_ack(v25) == Ack("AE", "IA1", "Unknown & patient; No such order")
    v23 = "MSH|^~\\&|RIS||X||1||ACK|2|P|2.3\nMSA|AR|IA1\nERR|OBR^1^2^103&Table value not found\n"
    assert parse_ack(v23) == Ack("AR", "IA1", "Table value not found")
    assert parse_ack("MSH|^~\\&|RIS||X||1||ACK|3|P|2.3\rMSA|CA|IA1\r").ok
    with pytest.raises(DeliveryError, match="not an HL7 ACK"):
        parse_ack("HTTP/1.1 400 Bad Request")


def test_a_ris_that_is_down_gets_the_message_once_after_it_returns(
    engine: Engine, tmp_path: Path, message: str
) -> None:
    """The outbox with the real MLLP sender: refused while the RIS is down, backed off,
    delivered once the listener is up, and never sent again."""
    port = free_port()
    path = tmp_path / "outputs" / "oru.hl7"
    path.parent.mkdir()
    path.write_bytes(message.encode("utf-8"))
    outputs = OutputsConfig(ris=(RisDestination("127.0.0.1", port),), retry_min_s=5)

    def send(dest: RisDestination, text: str) -> None:
        send_oru(dest.host, dest.port, text, timeout=5)

    outbox = Outbox(session_factory(engine), Config(outputs=outputs), tmp_path, send)
    start = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    with Session(engine) as s, s.begin():
        study = StudyRow(study_instance_uid="1.2.3", state="processing")
        study.received_at = study.last_instance_at = start
        s.add(study)
        s.flush()
        assert outbox.enqueue(s, study, [Payload("oru", path, control_id(message))], start) == 1
    assert outbox.deliver_due(start) == 1
    [row] = deliveries(engine)
    assert (row.state, row.attempts) == ("pending", 1)
    assert "refused the connection" in row.last_error
    assert outbox.deliver_due() == 0  # backing off
    later = datetime.now(UTC) + timedelta(minutes=2)
    with RisListener(port=port) as listener:
        assert outbox.deliver_due(later) == 1
        assert outbox.deliver_due(later + timedelta(hours=2)) == 0
    assert listener.received == [message]
    [row] = deliveries(engine)
    assert (row.state, row.attempts, row.last_error) == ("done", 2, "")


def deliveries(engine: Engine) -> list[Delivery]:
    with Session(engine) as s:
        return list(s.scalars(select(Delivery)))
