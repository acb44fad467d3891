"""Compressed transfer syntaxes end to end: DCMTK encodes a CT series, storescu proposes that
syntax, every C-STORE is Success, the instance is kept as sent, and the pixels the volume reads
from the spool equal the uncompressed original's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Instance
from imaging_ai.dicom.slice_read import read_plain
from imaging_ai.receive import Receiver
from imaging_ai.receive_contexts import accepted_transfer_syntaxes
from imaging_ai.volume import load_series
from tests.dicom_factory import ct_series
from tests.test_receive import CALLED

pytestmark = pytest.mark.skipif(shutil.which("storescu") is None, reason="needs DCMTK")
SLICES = 3


def _dcmtk(tool: list[str]) -> object:
    def encode(source: Path, target: Path) -> None:
        subprocess.run([*tool, str(source), str(target)], check=True, capture_output=True)

    return encode


def _gdcm_j2k(source: Path, target: Path) -> None:
    """JPEG 2000 lossless with GDCM (DCMTK's free toolkit has no JPEG 2000 encoder)."""
    gdcm = pytest.importorskip("gdcm")
    reader = gdcm.ImageReader()
    reader.SetFileName(str(source))
    assert reader.Read()
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(gdcm.TransferSyntax(gdcm.TransferSyntax.JPEG2000Lossless))
    change.SetInput(reader.GetImage())
    assert change.Change()
    writer = gdcm.ImageWriter()
    writer.SetFileName(str(target))
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()


# storescu proposes a compressed syntax only when told to (each option below proposes it first,
# then the uncompressed ones); JPEG Lossless process 14 has no option: a profile proposes it.
PROCESS_14_PROFILE = """\
[[TransferSyntaxes]]
[Process14]
TransferSyntax1 = 1.2.840.10008.1.2.4.57
TransferSyntax2 = LittleEndianExplicit
[[PresentationContexts]]
[Process14]
PresentationContext1 = CTImageStorage\\Process14
[[Profiles]]
[Process14]
PresentationContexts = Process14
"""
PROPOSE = {
    JPEGLosslessSV1: ["-xs"],
    JPEGLossless: ["-xf", "{profile}", "Process14"],
    JPEGLSLossless: ["-xt"],
    RLELossless: ["-xr"],
    JPEG2000Lossless: ["-xv"],
}
ENCODERS = {
    JPEGLosslessSV1: _dcmtk(["dcmcjpeg", "+e1"]),
    JPEGLossless: _dcmtk(["dcmcjpeg", "+el"]),
    JPEGLSLossless: _dcmtk(["dcmcjpls"]),
    RLELossless: _dcmtk(["dcmcrle"]),
    JPEG2000Lossless: _gdcm_j2k,
}


def _send(port: int, files: list[Path], *options: str) -> None:
    subprocess.run(
        ["storescu", *options, "-aec", CALLED, "127.0.0.1", str(port), *map(str, files)],
        check=True,
        env={**os.environ, "TCP_NODELAY": "1"},
        capture_output=True,
        timeout=60,
    )


def _kept(engine: Engine, receiver: Receiver) -> tuple[set[str], list[Path]]:
    with Session(engine) as s:
        rows = s.scalars(select(Instance)).all()
        return {r.transfer_syntax_uid for r in rows}, [receiver.spool.root / r.path for r in rows]


@pytest.mark.parametrize("syntax", list(ENCODERS), ids=lambda uid: uid.name)
def test_compressed_ct_is_kept_as_sent_and_decodes_to_the_original(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path, syntax: str
) -> None:
    if shutil.which("dcmcjpeg") is None:
        pytest.skip("needs DCMTK's encoders")
    originals = ct_series(tmp_path / "src", slices=SLICES)
    encoded = []
    for path in originals:
        encoded.append(tmp_path / f"{path.stem}.{syntax}.dcm")
        ENCODERS[syntax](path, encoded[-1])  # type: ignore[operator]
        assert pydicom.dcmread(encoded[-1]).file_meta.TransferSyntaxUID == syntax
    (tmp_path / "storescu.cfg").write_text(PROCESS_14_PROFILE)
    options = [o.format(profile=tmp_path / "storescu.cfg") for o in PROPOSE[syntax]]
    _send(receiver.port, encoded, *options)
    syntaxes, stored = _kept(sqlite_engine, receiver)
    assert syntaxes == {syntax} and len(stored) == SLICES
    assert all(read_plain(path) is None for path in stored)  # pydicom's decoders read them
    assert np.array_equal(load_series(stored).hu, load_series(originals).hu)


def test_every_lossless_syntax_is_offered_for_ct() -> None:
    # The decoders are dependencies (pyproject.toml): none may silently go missing.
    assert set(ENCODERS) <= set(accepted_transfer_syntaxes())
    assert JPEGLSNearLossless not in accepted_transfer_syntaxes()  # lossy: never analysed


def test_storescu_deflate_is_success_and_decodes_to_the_original(
    receiver: Receiver, sqlite_engine: Engine, tmp_path: Path
) -> None:
    originals = ct_series(tmp_path / "src", slices=SLICES)
    _send(receiver.port, originals, "-xd")
    syntaxes, stored = _kept(sqlite_engine, receiver)
    assert syntaxes == {DeflatedExplicitVRLittleEndian} and len(stored) == SLICES
    assert np.array_equal(load_series(stored).hu, load_series(originals).hu)


def test_deflate_alone_is_success(receiver: Receiver, tmp_path: Path) -> None:
    """The bug: the completeness check compared a position in the inflated stream with the
    compressed file's size, so every deflated C-STORE was refused "Pixel Data truncated"."""
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage, [DeflatedExplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", receiver.port, ae_title=CALLED)
    assert assoc.is_established
    try:
        for path in ct_series(tmp_path / "src", slices=2):
            status = assoc.send_c_store(pydicom.dcmread(path))
            assert status.Status == 0x0000, status.get("ErrorComment")
    finally:
        assoc.release()


def test_deflated_pixel_data_cut_short_is_still_refused(receiver: Receiver, tmp_path: Path) -> None:
    ds = pydicom.dcmread(ct_series(tmp_path / "src", slices=1)[0])
    ds.PixelData = ds.PixelData[: len(ds.PixelData) // 2]  # the image needs twice as many
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage, [DeflatedExplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", receiver.port, ae_title=CALLED)
    try:
        status = assoc.send_c_store(ds)
    finally:
        assoc.release()
    assert status.Status == 0xC000 and "Pixel Data truncated" in status.ErrorComment


def test_the_senders_first_choice_wins(receiver: Receiver, tmp_path: Path) -> None:
    ae = AE(ae_title="PACS")
    ae.add_requested_context(CTImageStorage, [JPEGLSLossless, ExplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", receiver.port, ae_title=CALLED)
    try:
        [context] = [c for c in assoc.accepted_contexts if c.abstract_syntax == CTImageStorage]
    finally:
        assoc.release()
    assert context.transfer_syntax == [JPEGLSLossless]
