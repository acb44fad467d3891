"""The storage SCP with real DICOM senders: whitelist, called AE, statuses, duplicates."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import free_port
from pydicom.uid import JPEG2000Lossless
from pynetdicom import AE
from pynetdicom.sop_class import (  # type: ignore
    CTImageStorage,
    EnhancedCTImageStorage,
    MRImageStorage,
    Verification,
)
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.catalog import Catalog
from imaging_ai.config import AllowedCaller, DicomConfig
from imaging_ai.db.models import Instance, Study
from imaging_ai.dicom.association import Peer
from imaging_ai.receive import Receiver
from imaging_ai.receive_contexts import accepted_transfer_syntaxes
from imaging_ai.spool import Spool
from tests.dicom_factory import ct_series

CALLED = "IMAGING_AI"


def start_receiver(
    engine: Engine,
    tmp_path: Path,
    min_free_mb: int = 0,
    storage_sop_classes: tuple[str, ...] = ("all",),
) -> Receiver:
    config = DicomConfig(
        ae_title=CALLED,
        port=free_port(),
        allowed_callers=(
            AllowedCaller("PACS", "127.0.0.1"),
            AllowedCaller("STORESCU", "127.0.0.1"),
        ),
        storage_sop_classes=storage_sop_classes,
    )
    spool = Spool(tmp_path / "spool", min_free_mb)
    spool.prepare()
    receiver = Receiver(config, spool, Catalog(engine, spool), ("RequestedProcedurePriority",))
    receiver.start()
    return receiver


def associate(
    port: int,
    calling: str = "PACS",
    called: str = CALLED,
    bind: str = "127.0.0.1",
    syntaxes: list[str] | None = None,
) -> object:
    ae = AE(ae_title=calling)
    ae.add_requested_context(Verification)
    ae.add_requested_context(CTImageStorage, syntaxes) if syntaxes else ae.add_requested_context(
        CTImageStorage
    )
    ae.add_requested_context(MRImageStorage)
    return ae.associate("127.0.0.1", port, ae_title=called, bind_address=(bind, 0))


def test_echo_from_allowed_caller(receiver: Receiver) -> None:
    assoc = associate(receiver.port)
    assert assoc.is_established  # type: ignore[attr-defined]
    assert assoc.send_c_echo().Status == 0  # type: ignore[attr-defined]
    assoc.release()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("calling", "called", "bind"),
    [
        ("INTRUDER", CALLED, "127.0.0.1"),  # unknown calling AE
        ("PACS", CALLED, "127.0.0.2"),  # known AE title from the wrong host
        ("PACS", "SOMEONE_ELSE", "127.0.0.1"),  # wrong called AE title
    ],
)
def test_association_rejected(receiver: Receiver, calling: str, called: str, bind: str) -> None:
    assoc = associate(receiver.port, calling, called, bind)
    assert assoc.is_rejected  # type: ignore[attr-defined]
    assert not assoc.is_established  # type: ignore[attr-defined]


def test_store_then_duplicate_replaces(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    path = ct_series(tmp_path / "src", slices=1)[0]
    ds = pydicom.dcmread(path)
    assoc = associate(receiver.port)
    assert assoc.send_c_store(ds).Status == 0x0000  # type: ignore[attr-defined]
    ds.InstanceNumber = 99
    assert assoc.send_c_store(ds).Status == 0x0000  # type: ignore[attr-defined]
    assoc.release()  # type: ignore[attr-defined]
    with Session(sqlite_engine) as s:
        row = s.scalars(select(Instance)).one()
        assert s.scalars(select(Study)).one().calling_ae == "PACS"
    stored = pydicom.dcmread(receiver.spool.root / row.path)
    assert stored.InstanceNumber == 99
    ct_context = next(
        c
        for c in assoc.accepted_contexts  # type: ignore[attr-defined]
        if c.abstract_syntax == CTImageStorage
    )
    assert stored.file_meta.TransferSyntaxUID == ct_context.transfer_syntax[0]
    assert receiver.stats.snapshot()["stored"] == 2


def test_dataset_without_uids_is_refused(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    del ds.StudyInstanceUID
    assoc = associate(receiver.port)
    status = assoc.send_c_store(ds)  # type: ignore[attr-defined]
    assoc.release()  # type: ignore[attr-defined]
    assert status.Status == 0xC000
    assert "StudyInstanceUID" in status.ErrorComment
    with Session(sqlite_engine) as s:
        assert s.scalars(select(Instance)).all() == []


def test_truncated_pixel_data_is_refused_and_receiver_carries_on(
    receiver: Receiver, tmp_path: Path
) -> None:
    good = ct_series(tmp_path / "src", slices=2)
    truncated = tmp_path / "truncated.dcm"
    truncated.write_bytes(good[0].read_bytes()[:-3000])
    assoc = associate(receiver.port)
    status = assoc.send_c_store(truncated)  # type: ignore[attr-defined]
    assert status.Status == 0xC000
    assert "Pixel Data truncated" in status.ErrorComment
    assert assoc.send_c_store(pydicom.dcmread(good[1])).Status == 0  # type: ignore[attr-defined]
    assoc.release()  # type: ignore[attr-defined]
    assert len(list(receiver.spool.walk())) == 1


def test_garbage_bytes_are_refused(receiver: Receiver, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.dcm"
    header = ct_series(tmp_path / "src", slices=1)[0].read_bytes()[:400]
    garbage.write_bytes(header + bytes(range(256)) * 4)
    command = pydicom.Dataset()
    command.AffectedSOPClassUID = CTImageStorage
    status = receiver.store(garbage, command, "1.2.840.10008.1.2.1", Peer("PACS", CALLED, "::1"))
    assert isinstance(status, pydicom.Dataset)
    assert status.Status == 0xC000
    assert list(receiver.spool.walk()) == []


def test_mr_storage_is_not_accepted_where_the_list_is_ct(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    # Every Storage SOP class is offered by default (tests/test_receive_whole_study.py); a
    # site that lists CT and Enhanced CT only is offered only those.
    receiver = start_receiver(
        sqlite_engine, tmp_path, storage_sop_classes=("CTImageStorage", "EnhancedCTImageStorage")
    )
    try:
        assoc = associate(receiver.port)
        accepted = {c.abstract_syntax for c in assoc.accepted_contexts}  # type: ignore[attr-defined]
        assoc.release()  # type: ignore[attr-defined]
    finally:
        receiver.stop()
    assert MRImageStorage not in accepted  # only CT and Enhanced CT are offered to the pipeline
    assert CTImageStorage in accepted


def test_mr_storage_is_accepted_by_default(receiver: Receiver) -> None:
    assoc = associate(receiver.port)
    accepted = {c.abstract_syntax for c in assoc.accepted_contexts}  # type: ignore[attr-defined]
    assoc.release()  # type: ignore[attr-defined]
    assert {MRImageStorage, CTImageStorage} <= accepted  # kept, never analysed


def test_sop_class_mismatch_answers_a900(receiver: Receiver, tmp_path: Path) -> None:
    # A CT image sent in the Enhanced CT context: the command and the dataset disagree.
    path = ct_series(tmp_path / "src", slices=1)[0]
    command = pydicom.Dataset()
    command.AffectedSOPClassUID = EnhancedCTImageStorage
    status = receiver.store(path, command, "1.2.840.10008.1.2.1", Peer("PACS", CALLED, "::1"))
    assert isinstance(status, pydicom.Dataset)
    assert status.Status == 0xA900
    assert list(receiver.spool.walk()) == []


def test_low_water_mark_answers_out_of_resources(sqlite_engine: Engine, tmp_path: Path) -> None:
    receiver = start_receiver(sqlite_engine, tmp_path, min_free_mb=10**9)
    try:
        ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
        assoc = associate(receiver.port)
        status = assoc.send_c_store(ds)  # type: ignore[attr-defined]
        assoc.release()  # type: ignore[attr-defined]
        assert status.Status == 0xA700
        assert "storage.min_free_mb" in status.ErrorComment
        assert list(receiver.spool.walk()) == []
    finally:
        receiver.stop()


def test_undecodable_compressed_syntax_refused_at_negotiation(receiver: Receiver) -> None:
    if JPEG2000Lossless in accepted_transfer_syntaxes():
        pytest.skip("a JPEG 2000 decoder is installed here")
    assoc = associate(receiver.port, syntaxes=[JPEG2000Lossless])
    accepted = {c.abstract_syntax for c in assoc.accepted_contexts}  # type: ignore[attr-defined]
    assert CTImageStorage not in accepted
    assoc.release()  # type: ignore[attr-defined]


def test_dcmtk_storescu_sends_a_series(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    files = ct_series(tmp_path / "src", slices=10)
    env = {**os.environ, "TCP_NODELAY": "1"}
    subprocess.run(
        ["storescu", "-aec", CALLED, "127.0.0.1", str(receiver.port), *map(str, files)],
        check=True,
        env=env,
        capture_output=True,
        timeout=60,
    )
    with Session(sqlite_engine) as s:
        assert len(s.scalars(select(Instance)).all()) == 10
        assert s.scalars(select(Study)).one().calling_ae == "STORESCU"
