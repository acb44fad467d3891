"""Fuzz the receive → preprocess path with mutated CT datasets (hypothesis), for a bounded time.

Each example is one instance of a four-slice series, mutated (attributes deleted, replaced with
values of the wrong type or VR, bytes flipped, the data set truncated), sent over a real
association to the storage SCP and, if it is kept, preprocessed with its three intact siblings
for both shipped models. The properties:

- C-STORE answers Success or a failure status with a comment; nothing hangs or kills the SCP;
- a kept instance either preprocesses, or fails with UnsupportedInput or InvalidDataset: the
  errors the processor records on the study as its reason, without retrying. Anything else
  would be retried three times and recorded as "analysis failed", which is not a reason a
  radiology IT person can act on.

Bounded in time: 20 s in make test, derandomized so that a failure replays; 300 s in the soak
(IMAGING_AI_FUZZ_SECONDS), random.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydicom
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from imaging_ai_devkit.bench.harness import ENGINES_DIR, free_port
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from sqlalchemy import Engine

from imaging_ai.catalog import Catalog
from imaging_ai.config import AllowedCaller, DicomConfig
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.dicom.association import Peer
from imaging_ai.errors import InvalidDataset, UnsupportedInput
from imaging_ai.modelcard import ModelCard, discover_models
from imaging_ai.preprocess import prepare_slices
from imaging_ai.receive import Receiver
from imaging_ai.spool import Spool
from imaging_ai.volume import group_series, load_series, pick_series
from tests.dicom_factory import ct_series

FAST_SECONDS = 20
SOAK_SECONDS = int(os.environ.get("IMAGING_AI_FUZZ_SECONDS", "300"))
CALLED = "IMAGING_AI"
PEER = Peer("PACS", CALLED, "127.0.0.1")
FRAGMENT = 16_372  # a 16 KB PDU's data
STATUSES = {0x0000, 0xA700, 0xA900, 0xC000}
CLEAR = (UnsupportedInput, InvalidDataset)

# Attributes the receiver and the volume builder read, with a VR each could wrongly arrive in.
KEYWORDS = [
    "SOPClassUID", "SOPInstanceUID", "StudyInstanceUID", "SeriesInstanceUID", "Modality",
    "ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing", "SliceThickness",
    "Rows", "Columns", "BitsAllocated", "BitsStored", "HighBit", "PixelRepresentation",
    "SamplesPerPixel", "PhotometricInterpretation", "RescaleSlope", "RescaleIntercept",
    "NumberOfFrames", "PixelData", "FrameOfReferenceUID", "InstanceNumber", "SeriesNumber",
    "RequestedProcedurePriority", "PatientName",
]  # fmt: skip
VRS = ["DS", "IS", "US", "SS", "UL", "FD", "CS", "LO", "UI", "OB", "OW", "SQ", "UN", "PN"]

values = st.one_of(
    st.text(max_size=40),
    st.integers(-(2**31), 2**31),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=7),
    st.binary(max_size=600),
    st.just(""),
)


@st.composite
def mutations(draw: st.DrawFn) -> list[tuple[str, str, str, Any]]:
    """One to three changes: ("delete", keyword) or ("set", keyword, vr, value)."""
    changes = []
    for _ in range(draw(st.integers(1, 3))):
        keyword = draw(st.sampled_from(KEYWORDS))
        if draw(st.booleans()):
            changes.append(("delete", keyword, "", None))
        else:
            vr = draw(st.sampled_from(VRS))
            changes.append(("set", keyword, vr, draw(values)))
    return changes


@st.composite
def byte_damage(draw: st.DrawFn) -> tuple[str, int, bytes]:
    """Damage to the encoded data set: none, truncation, flipped bytes or inserted bytes."""
    kind = draw(st.sampled_from(["none", "none", "truncate", "flip", "insert"]))
    return kind, draw(st.integers(0, 10_000)), draw(st.binary(min_size=1, max_size=16))


@dataclass
class Rig:
    """A storage SCP in this process, its spool, and the series the mutant joins."""

    receiver: Receiver
    engine: Engine
    siblings: list[Path]
    template: Path
    cards: tuple[ModelCard, ...]
    work: Path
    outcomes: Counter[str] = field(default_factory=Counter)
    unclear: dict[str, str] = field(default_factory=dict)
    current: str = ""

    @property
    def spool_root(self) -> Path:
        return self.receiver.spool.root

    def send(self, path: Path) -> tuple[int, str]:
        """The C-STORE as the association hands it over: the data set in PDU-sized fragments."""
        meta = pydicom.filereader.read_file_meta_info(path)
        raw = path.read_bytes()
        body = memoryview(raw)[132 + 12 + int(meta.FileMetaInformationGroupLength) :]
        command = Dataset()
        command.AffectedSOPClassUID = meta.MediaStorageSOPClassUID
        command.AffectedSOPInstanceUID = meta.MediaStorageSOPInstanceUID
        incoming = self.receiver.begin_store(command, str(meta.TransferSyntaxUID), PEER)
        for start in range(0, len(body), FRAGMENT):
            incoming.write(body[start : start + FRAGMENT])
        status = incoming.finish()
        return int(status.Status), str(status.get("ErrorComment", ""))


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("fuzz")
    engine = make_engine(f"sqlite:///{root / 'db.sqlite3'}")
    upgrade(engine)
    config = DicomConfig(
        ae_title=CALLED, port=free_port(), allowed_callers=(AllowedCaller("PACS", "127.0.0.1"),)
    )
    spool = Spool(root / "spool", 0)
    spool.prepare()
    receiver = Receiver(config, spool, Catalog(engine, spool), ("RequestedProcedurePriority",))
    files = ct_series(root / "series", slices=4, size=64)
    cards = tuple(discover_models(ENGINES_DIR))
    rig = Rig(receiver, engine, files[:3], files[3], cards, root)
    yield rig
    engine.dispose()
    print(f"\nfuzz outcomes: {dict(rig.outcomes.most_common())}")
    for name, example in rig.unclear.items():
        print(f"  {name}: {example}")


def mutate(template: Path, changes: list[tuple[str, str, str, Any]], out: Path) -> bool:
    """Write the mutant as a Part-10 file; False when pydicom cannot even encode it.

    The file meta stays the template's: the SCU announces the C-STORE from it.
    """
    ds = pydicom.dcmread(template)
    try:
        for op, keyword, vr, value in changes:
            tag = pydicom.datadict.tag_for_keyword(keyword)
            assert tag is not None
            if op == "delete":
                ds.pop(tag, None)
            else:
                ds[tag] = DataElement(tag, vr, _coerce(vr, value))
        pydicom.dcmwrite(out, ds, enforce_file_format=False)
    except Exception:  # not encodable: a PACS could not send it either
        return False
    return True


def _coerce(vr: str, value: Any) -> Any:
    if vr == "SQ":
        return [Dataset()] if value else []
    if vr in ("OB", "OW", "UN"):
        return value if isinstance(value, bytes) else str(value).encode()
    return value


def damage(path: Path, kind: str, at: int, data: bytes) -> None:
    """Damage the data set's bytes, never the file meta (the SCU reads it to announce it)."""
    raw = path.read_bytes()
    meta = pydicom.filereader.read_file_meta_info(path)
    start = 132 + 12 + int(meta.FileMetaInformationGroupLength)
    body = bytearray(raw[start:])
    if not body or kind == "none":
        return
    at %= len(body)
    if kind == "truncate":
        body = body[:at]
    elif kind == "flip":
        for i, b in enumerate(data):
            body[(at + i * 97) % len(body)] ^= b or 0xFF
    else:
        body[at:at] = data
    path.write_bytes(raw[:start] + bytes(body))


def preprocess(rig: Rig, stored: Path) -> str:
    """The processor's view of the series: '' when it preprocesses, else the error's class.

    An error other than UnsupportedInput/InvalidDataset does not stop the daemon (the
    processor's boundary catches everything) but gives the study a poor reason after three
    attempts; it is counted as "unclear" and its first example kept for the report.
    """
    try:
        series = group_series([*rig.siblings, stored])
        if not series:
            raise UnsupportedInput("no DICOM image series in the study")
        volume = load_series(series[pick_series(series)])
        for card in rig.cards:
            prepare_slices(volume, card.preprocess)
    except CLEAR as exc:
        assert str(exc), "an error without a reason"
        return type(exc).__name__
    except Exception as exc:
        name = f"unclear {type(exc).__name__}"
        rig.unclear.setdefault(name, f"{exc} (from {rig.current})")
        return name
    return ""


def run_fuzz(rig: Rig, seconds: float, soak: bool) -> None:
    """Fuzz for ``seconds``: derandomized (a failure replays) unless ``soak``."""
    deadline = time.monotonic() + seconds
    failed: list[bool] = []

    @settings(
        max_examples=50_000 if soak else 3_000,
        deadline=None,
        derandomize=not soak,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(changes=mutations(), damaged=byte_damage())
    def fuzz_one(changes: list[tuple[str, str, str, Any]], damaged: tuple[str, int, bytes]) -> None:
        if time.monotonic() > deadline and not failed:
            return  # out of time: the remaining examples pass at once
        try:
            check_one(rig, changes, damaged)
        except BaseException:
            failed.append(True)  # shrinking replays must run in full, past the deadline too
            raise

    fuzz_one()
    print(f"\nfuzz: {sum(rig.outcomes.values())} examples in {seconds:.0f} s")
    assert sum(rig.outcomes.values()) > 50
    # The receiver still takes an intact instance afterwards.
    assert rig.send(rig.template) == (0, "")


def check_one(
    rig: Rig, changes: list[tuple[str, str, str, Any]], damaged: tuple[str, int, bytes]
) -> None:
    path = rig.work / "mutant.dcm"
    if not mutate(rig.template, changes, path):
        rig.outcomes["not encodable"] += 1
        return
    damage(path, *damaged)
    rig.current = f"{changes}, {damaged}"
    started = time.monotonic()
    code, comment = rig.send(path)
    assert code in STATUSES, (hex(code), comment)
    assert code == 0 or comment, f"status 0x{code:04X} without a reason"
    outcome = f"refused 0x{code:04X}"
    if code == 0:
        # The newest file in the spool: the mutant's UIDs may have been changed too.
        stored = max(
            rig.receiver.spool.walk(), key=lambda p: (rig.spool_root / p).stat().st_mtime_ns
        )
        outcome = preprocess(rig, rig.spool_root / stored) or "preprocessed"
    assert time.monotonic() - started < 10, "one example took over 10 s"
    rig.outcomes[outcome] += 1


@pytest.mark.timeout(FAST_SECONDS + 120)
def test_fuzz_receive_then_preprocess(rig: Rig) -> None:
    run_fuzz(rig, FAST_SECONDS, soak=False)


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 300)
def test_fuzz_receive_then_preprocess_for_minutes(rig: Rig) -> None:
    run_fuzz(rig, SOAK_SECONDS, soak=True)
