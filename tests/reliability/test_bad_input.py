"""A corpus of broken DICOM, generated here, sent to a running daemon: each gets a clear answer.

What cannot be kept is refused at C-STORE with a failure status and a comment (truncated files,
missing or malformed UIDs, an image larger than its pixel data; a compressed syntax without a
decoder is not even accepted at negotiation). What is valid DICOM but not something the models
can take is kept, and its study ends "failed" with a reason a radiology IT person can act on,
after one attempt (retrying cannot help). A valid study sent between them is analysed: bad
input does not stop the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE
from pydicom.uid import JPEG2000Lossless
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]

from imaging_ai.errors import InvalidDataset, UnsupportedInput
from imaging_ai.receive_contexts import accepted_transfer_syntaxes
from imaging_ai.volume import load_series
from tests.conftest import wait_until
from tests.dicom_factory import ct_series
from tests.reliability.conftest import FAST_ASSEMBLY, FaultDaemon, Studies, outcome, study_state

Maker = Callable[[Path], list[Path]]


def _series(**attributes: object) -> Maker:
    return lambda out: ct_series(out, slices=4, size=64, **attributes)


def _edit(edit: Callable[[pydicom.Dataset, int], None], slices: int = 4) -> Maker:
    def make(out: Path) -> list[Path]:
        files = ct_series(out, slices=slices, size=64)
        for i, path in enumerate(files):
            ds = pydicom.dcmread(path)
            edit(ds, i)
            ds.save_as(path, enforce_file_format=True)
        return files

    return make


def _cut(keep: Callable[[int], int]) -> Maker:
    def make(out: Path) -> list[Path]:
        files = ct_series(out, slices=4, size=64)
        for path in files:
            data = path.read_bytes()
            path.write_bytes(data[: keep(len(data))])
        return files

    return make


def _del(keyword: str) -> Callable[[pydicom.Dataset, int], None]:
    return lambda ds, i: delattr(ds, keyword)


def _set(keyword: str, value: object) -> Callable[[pydicom.Dataset, int], None]:
    return lambda ds, i: setattr(ds, keyword, value)


def _tilt_one(ds: pydicom.Dataset, i: int) -> None:
    if i == 2:
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 0.0, -1.0]  # coronal among axials


def _duplicate_position(ds: pydicom.Dataset, i: int) -> None:
    if i == 2:
        ds.ImagePositionPatient = [-100.0, -100.0, -2.5]  # same as slice 1


def _gap(ds: pydicom.Dataset, i: int) -> None:
    if i == 3:
        ds.ImagePositionPatient = [-100.0, -100.0, -25.0]


def _rgb(ds: pydicom.Dataset, i: int) -> None:
    ds.PhotometricInterpretation = "RGB"
    ds.SamplesPerPixel = 3
    ds.PlanarConfiguration = 0
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit, ds.PixelRepresentation = 7, 0
    ds.PixelData = bytes(64 * 64 * 3)


def _words_in_position(out: Path) -> list[Path]:
    """Image Position (Patient) holding words, not numbers: a DS value PACS let through.

    pydicom will not encode it, so the bytes are patched in place.
    """
    files = ct_series(out, slices=4, size=64)
    header = b"\x20\x00\x32\x00DS"  # (0020,0032) DS, explicit VR little endian
    for path in files:
        data = bytearray(path.read_bytes())
        at = data.index(header) + len(header)
        length = int.from_bytes(data[at : at + 2], "little")
        data[at + 2 : at + 2 + length] = b"left\\up\\high".ljust(length)[:length]
        path.write_bytes(bytes(data))
    return files


def _huge_claim(ds: pydicom.Dataset, i: int) -> None:
    ds.Rows = ds.Columns = 40000  # the pixel data is 64 x 64


@dataclass(frozen=True)
class Refused:
    """An input the receiver must not keep: C-STORE status and a part of its comment."""

    name: str
    make: Maker
    status: int
    comment: str


@dataclass(frozen=True)
class Failed:
    """An input kept, whose study must fail at once with a reason containing ``reason``."""

    name: str
    make: Maker
    reason: str


REFUSED = [
    Refused("truncated pixel data", _cut(lambda n: n - 3000), 0xC000, "Pixel Data truncated"),
    Refused("truncated in the header", _cut(lambda n: 600), 0xC000, ""),
    Refused("no Study Instance UID", _edit(_del("StudyInstanceUID")), 0xC000, "StudyInstanceUID"),
    Refused("UID that climbs out", _series(SeriesInstanceUID="1.2/../../etc"), 0xC000, "UID"),
    Refused("image larger than its pixels", _edit(_huge_claim), 0xC000, "Pixel Data truncated"),
]
FAILED = [
    Failed("no pixel data", _edit(_del("PixelData")), "has no pixel data"),
    Failed("MR in a CT object", _series(Modality="MR"), "no axial CT series"),
    Failed("one slice", _edit(lambda ds, i: None, slices=1), "at least 3 are needed"),
    Failed("mixed orientation", _edit(_tilt_one), "different image orientations"),
    Failed("two slices at one position", _edit(_duplicate_position), "repeated positions"),
    Failed("a gap between slices", _edit(_gap), "missing slices"),
    Failed("colour image", _edit(_rgb), "not a MONOCHROME2"),
]


def store_all(port: int, files: list[Path]) -> list[tuple[int, str]]:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port, ae_title=CALLED_AE)
    assert assoc.is_established
    answers = []
    for path in files:
        status = assoc.send_c_store(path)
        answers.append((int(status.Status), str(status.get("ErrorComment", ""))))
    assoc.release()
    return answers


def test_broken_dicom_gets_a_status_or_a_reason(
    tmp_path: Path, small_studies: Studies
) -> None:  # fmt: skip
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY)
    daemon.start()
    engine = daemon.database()
    try:
        for case in REFUSED:
            answers = store_all(daemon.dicom_port, case.make(tmp_path / case.name))
            assert all(code == case.status for code, _ in answers), (case.name, answers)
            assert all(comment and case.comment in comment for _, comment in answers), (
                case.name,
                answers,
            )
        # A compressed syntax without a decoder here: not accepted, so PACS sends another.
        if JPEG2000Lossless not in accepted_transfer_syntaxes():
            ae = AE(ae_title="PACS")
            ae.add_requested_context(CTImageStorage, [JPEG2000Lossless])
            assoc = ae.associate("127.0.0.1", daemon.dicom_port, ae_title=CALLED_AE)
            assert assoc.is_established and not assoc.accepted_contexts
            assoc.release()
        uids = {}
        for case in FAILED:
            files = case.make(tmp_path / case.name)
            answers = store_all(daemon.dicom_port, files)
            assert all(code == 0 for code, _ in answers), (case.name, answers)
            uids[case.name] = str(pydicom.dcmread(files[0]).StudyInstanceUID)
        valid = small_studies[0]
        daemon.send(valid)
        valid_uid = str(pydicom.dcmread(valid[0], stop_before_pixels=True).StudyInstanceUID)
        wait_until(lambda: study_state(engine, valid_uid) == "done", timeout_s=90)
        wait_until(
            lambda: all(study_state(engine, u) in ("failed", "done") for u in uids.values()),
            timeout_s=60,
        )
        reasons = {}
        for case in FAILED:
            result = outcome(engine, uids[case.name])
            reasons[case.name] = (result.state, result.error, result.jobs[0].attempts)
        print("\n" + "\n".join(f"{k}: {v}" for k, v in reasons.items()))
        for case in FAILED:
            state, error, attempts = reasons[case.name]
            assert state == "failed" and case.reason in error and attempts == 1, (
                case.name,
                reasons[case.name],
            )
    finally:
        engine.dispose()
        daemon.stop()


def _slope_as_sequence(out: Path) -> list[Path]:
    def edit(ds: pydicom.Dataset, i: int) -> None:
        ds["RescaleSlope"] = pydicom.DataElement(0x00281053, "SQ", [pydicom.Dataset()])

    return _edit(edit)(out)


def _empty_samples_per_pixel(out: Path) -> list[Path]:
    def edit(ds: pydicom.Dataset, i: int) -> None:
        ds["SamplesPerPixel"] = pydicom.DataElement(0x00280002, "LO", "")

    return _edit(edit)(out)


@pytest.mark.parametrize(
    "make",
    [_words_in_position, _slope_as_sequence, _empty_samples_per_pixel],
    ids=["words in Image Position", "Rescale Slope as a sequence", "empty Samples per Pixel"],
)
def test_wrong_vr_values_fail_at_once_with_a_reason(tmp_path: Path, make: Maker) -> None:
    with pytest.raises((InvalidDataset, UnsupportedInput)):
        load_series(make(tmp_path))
