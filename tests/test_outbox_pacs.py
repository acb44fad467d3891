"""The C-STORE SCU's outcomes: each way an association or a C-STORE ends, from fake pynetdicom
results (a refused context, statuses, rejections, aborts, timeouts, no connection)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from imaging_ai_devkit.bench.harness import free_port
from pydicom.dataset import Dataset
from pydicom.uid import (
    Comprehensive3DSRStorage,
    CTImageStorage,
    ExplicitVRLittleEndian,
)
from pynetdicom.pdu_primitives import A_ASSOCIATE

from imaging_ai import outbox_pacs
from imaging_ai.config import PacsDestination
from imaging_ai.errors import DeliveryError
from imaging_ai.outbox_pacs import Outcome, association_failure, send_files, status_outcome
from tests.dicom_factory import ct_series

DEST = PacsDestination("PACS", "127.0.0.1", 104)
NO_TLS = ("", "", "")


@dataclass
class Context:
    abstract_syntax: str
    transfer_syntax: list[str]
    result: int = 0


@dataclass
class FakeAssociation:
    """What pynetdicom's Association shows after ``AE.associate`` and each C-STORE."""

    accepted: list[Context] = field(default_factory=list)
    rejected: list[Context] = field(default_factory=list)
    statuses: list[Dataset] = field(default_factory=list)
    is_established: bool = True
    is_rejected: bool = False
    is_aborted: bool = False
    dimse_timeout: float = 60.0
    answer: A_ASSOCIATE | None = None
    sent: list[Path] = field(default_factory=list)
    released: bool = False

    @property
    def accepted_contexts(self) -> list[Context]:
        return self.accepted

    @property
    def rejected_contexts(self) -> list[Context]:
        return self.rejected

    @property
    def acceptor(self) -> SimpleNamespace:
        return SimpleNamespace(primitive=self.answer)

    def send_c_store(self, path: Path) -> Dataset:
        self.sent.append(path)
        status = self.statuses.pop(0)
        if "Status" not in status:  # as pynetdicom after a timeout or an abort
            self.is_established = False
        return status

    def release(self) -> None:
        self.released = True


def status(code: int | None, comment: str = "") -> Dataset:
    ds = Dataset()
    if code is not None:
        ds.Status = code
        if comment:
            ds.ErrorComment = comment
    return ds


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAssociation]:
    assoc = FakeAssociation()

    class FakeAE:
        def __init__(self, ae_title: str) -> None:
            self.requested: list[tuple[str, str]] = []

        def add_requested_context(self, sop_class: str, syntax: str) -> None:
            self.requested.append((sop_class, syntax))

        def associate(self, host: str, port: int, **kwargs: Any) -> FakeAssociation:
            for _, handler in kwargs["evt_handlers"]:  # the connection opened
                if assoc.is_established or assoc.answer is not None:
                    handler(_no_socket())
            return assoc

    monkeypatch.setattr(outbox_pacs, "AE", FakeAE)
    yield assoc


def _no_socket() -> SimpleNamespace:
    return SimpleNamespace(
        assoc=SimpleNamespace(dul=SimpleNamespace(socket=SimpleNamespace(socket=None)))
    )


@pytest.fixture
def files(tmp_path: Path) -> dict[int, Path]:
    """A CT image (context accepted) and a Comprehensive 3D SR file (context refused)."""
    ct = ct_series(tmp_path, slices=1)[0]
    sr = Dataset()
    sr.SOPClassUID, sr.SOPInstanceUID = Comprehensive3DSRStorage, "1.2.3.4"
    sr.Modality = "SR"
    sr.file_meta = Dataset()
    sr.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    sr.file_meta.MediaStorageSOPClassUID = sr.SOPClassUID
    sr.file_meta.MediaStorageSOPInstanceUID = sr.SOPInstanceUID
    path = tmp_path / "sr.dcm"
    sr.save_as(path, enforce_file_format=True)
    return {1: ct, 2: path}


def test_no_context_for_a_sop_class_is_a_final_refusal_naming_it(
    fake: FakeAssociation, files: dict[int, Path]
) -> None:
    fake.accepted = [Context(CTImageStorage, [ExplicitVRLittleEndian])]
    fake.rejected = [Context(Comprehensive3DSRStorage, [ExplicitVRLittleEndian], result=3)]
    fake.statuses = [status(0x0000)]
    out = send_files("IMAGING_AI", DEST, files, NO_TLS)
    assert out[1] == Outcome()
    assert out[2].final and not out[2].delivered
    assert "Comprehensive 3D SR Storage (1.2.840.10008.5.1.4.1.1.88.34)" in out[2].reason
    assert "abstract syntax not supported" in out[2].reason
    assert 'sr = "comprehensive"' in out[2].reason  # what to change, for radiology IT
    assert fake.sent == [files[1]] and fake.released  # the SR is not even tried


def test_every_context_refused_is_still_a_refusal_not_an_abort(
    fake: FakeAssociation, files: dict[int, Path]
) -> None:
    # pynetdicom aborts an association in which no context was accepted; the AC said why.
    fake.is_established, fake.is_aborted = False, True
    fake.answer = A_ASSOCIATE()
    fake.rejected = [Context(Comprehensive3DSRStorage, [ExplicitVRLittleEndian], result=3)]
    out = send_files("IMAGING_AI", DEST, {2: files[2]}, NO_TLS)
    assert out[2].final and "Comprehensive 3D SR Storage" in out[2].reason
    assert fake.sent == [] and not fake.released


@pytest.mark.parametrize(
    ("code", "comment", "final", "words"),
    [
        (0x0000, "", False, ""),
        (0xB000, "", False, ""),
        (
            0xA700,
            "disk full",
            False,
            "C-STORE failed: 0xA700 Refused: Out of Resources (disk full)",
        ),
        (0x0110, "", False, "0x0110 Processing Failure"),
        (0x0122, "", True, "C-STORE refused: 0x0122 Refused: SOP Class Not Supported"),
        (0x0124, "", True, "0x0124 Refused: Not Authorised"),
        (0xA900, "", True, "0xA900 Data Set Does Not Match SOP Class"),
        (0xC123, "", True, "0xC123 Cannot Understand"),
        (0xF0F0, "", False, "0xF0F0 unknown status"),
    ],
)
def test_statuses_are_named_and_classified(
    code: int, comment: str, final: bool, words: str
) -> None:
    outcome = status_outcome(code, comment)
    assert outcome.final is final
    assert outcome.delivered is (words == "")
    assert words in outcome.reason


def test_a_failure_status_then_a_timeout_and_the_objects_left(
    fake: FakeAssociation, files: dict[int, Path], tmp_path: Path
) -> None:
    fake.accepted = [
        Context(CTImageStorage, [ExplicitVRLittleEndian]),
        Context(Comprehensive3DSRStorage, [ExplicitVRLittleEndian]),
    ]
    fake.dimse_timeout = 0.0  # the empty answer came "after" the timeout
    third = ct_series(tmp_path / "more", slices=1)[0]
    fake.statuses = [status(0xA700), status(None)]
    out = send_files("IMAGING_AI", DEST, {**files, 3: third}, NO_TLS)
    assert "0xA700 Refused: Out of Resources" in out[1].reason and not out[1].final
    assert "no C-STORE response within 0 s" in out[2].reason and not out[2].final
    assert "association with PACS PACS had ended" in out[3].reason and not out[3].final


def test_an_abort_before_the_response(fake: FakeAssociation, files: dict[int, Path]) -> None:
    fake.accepted = [Context(CTImageStorage, [ExplicitVRLittleEndian])]
    fake.statuses = [status(None)]
    out = send_files("IMAGING_AI", DEST, {1: files[1]}, NO_TLS)
    assert "aborted the association or closed the connection" in out[1].reason


def test_a_missing_result_file_fails_alone(fake: FakeAssociation, files: dict[int, Path]) -> None:
    fake.accepted = [Context(CTImageStorage, [ExplicitVRLittleEndian])]
    fake.statuses = [status(0)]
    out = send_files("IMAGING_AI", DEST, {1: files[1], 9: files[1].parent / "gone.dcm"}, NO_TLS)
    assert out[1].delivered
    assert "result file gone.dcm cannot be read" in out[9].reason and not out[9].final


def test_a_rejected_association_says_by_whom_and_why(fake: FakeAssociation) -> None:
    rj = A_ASSOCIATE()
    rj.result, rj.result_source, rj.diagnostic = 0x01, 0x01, 0x07
    fake.is_established, fake.is_rejected, fake.answer = False, True, rj
    reason = association_failure(fake, DEST, connected=True)
    assert reason.startswith("PACS PACS at 127.0.0.1:104 did not accept the association")
    assert "A-ASSOCIATE-RJ Rejected Permanent" in reason
    assert "Called AE title not recognised" in reason


def test_no_answer_to_the_request(fake: FakeAssociation) -> None:
    fake.is_established, fake.is_aborted = False, True
    assert "no answer to the association request within 60 s" in association_failure(
        fake, DEST, connected=True
    )


def test_an_unreachable_pacs_says_what_the_system_said(files: dict[int, Path]) -> None:
    closed = PacsDestination("PACS", "127.0.0.1", free_port())
    with pytest.raises(DeliveryError) as caught:
        send_files("IMAGING_AI", closed, files, NO_TLS)
    assert "did not accept the association: no connection (Connection refused)" in str(caught.value)


def test_the_connection_handler_sets_tcp_nodelay() -> None:
    """The handler that records the connection still sets TCP_NODELAY (PEERS.md)."""
    sock = socket.socket()
    event = SimpleNamespace(
        assoc=SimpleNamespace(dul=SimpleNamespace(socket=SimpleNamespace(socket=sock)))
    )
    try:
        opened: list[bool] = []
        outbox_pacs._opened(event, opened)
        assert opened == [True]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


def test_the_storage_scu_announces_the_daemons_implementation_not_pynetdicoms() -> None:
    from pynetdicom import AE, evt
    from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

    from imaging_ai.dicom.dul import IMPLEMENTATION_CLASS_UID, IMPLEMENTATION_VERSION

    seen: list[tuple[str, str]] = []

    def requested(event: Any) -> None:
        requestor = event.assoc.requestor
        seen.append((requestor.implementation_class_uid, requestor.implementation_version_name))

    scp = AE(ae_title="PACS")
    scp.add_supported_context(Verification)
    port = free_port()
    server = scp.start_server(
        ("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_REQUESTED, requested)]
    )
    try:
        scu = outbox_pacs.scu_ae("IMAGING_AI")
        scu.add_requested_context(Verification)
        assoc = scu.associate("127.0.0.1", port, ae_title="PACS")
        assert assoc.is_established
        assoc.release()
    finally:
        server.shutdown()
    assert seen == [(IMPLEMENTATION_CLASS_UID, IMPLEMENTATION_VERSION)]
