"""The start-up warm-up of the result encoders, and the in-memory encoding it shares with
write_results."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydicom
import pytest

from imaging_ai.config import Config, OutputsConfig, RisDestination, StorageConfig
from imaging_ai.outputs import warm
from imaging_ai.outputs.files import EncodedResults, encode_results, write_results
from tests.outputs.conftest import IMPRESSION, Study

CREATED = datetime(2026, 12, 1, 4, 0, 0, tzinfo=UTC)


def _config(tmp_path: Path) -> Config:
    ris = RisDestination(host="127.0.0.1", port=2575)
    return Config(storage=StorageConfig(data_dir=str(tmp_path)), outputs=OutputsConfig(ris=(ris,)))


def test_written_results_are_the_encoded_ones(study: Study, tmp_path: Path) -> None:
    config = _config(tmp_path)
    encoded = encode_results(study.analysis, study.headers, 41, CREATED, IMPRESSION, config)
    files = write_results(
        study.analysis, study.paths, 41, CREATED, IMPRESSION, config, headers=study.headers
    )
    by_kind = {p.kind: p for p in files.payloads}
    assert by_kind["seg"].path.read_bytes() == bytes(encoded.seg)
    assert by_kind["sr"].path.read_bytes() == bytes(encoded.sr)
    assert by_kind["oru"].path.read_bytes() == encoded.messages[0].data
    assert files.fhir.read_bytes() == encoded.fhir
    assert not list(files.folder.glob("*.tmp"))


def test_warm_up_encodes_a_seg_and_sr_and_leaves_nothing_behind(tmp_path: Path) -> None:
    config = _config(tmp_path / "data")
    seconds = warm.warm_up_outputs(config)
    assert seconds > 0
    # Nothing under data_dir: the warm-up's objects are never written or sent.
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*"))


def test_warm_up_objects_are_valid_dicom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[EncodedResults] = []

    def keep(*args: Any) -> EncodedResults:
        encoded = encode_results(*args)
        seen.append(encoded)
        return encoded

    monkeypatch.setattr(warm, "encode_results", keep)
    warm.warm_up_outputs(_config(tmp_path))
    (encoded,) = seen
    seg = pydicom.dcmread(io.BytesIO(bytes(encoded.seg)))
    sr = pydicom.dcmread(io.BytesIO(bytes(encoded.sr)))
    assert seg.Modality == "SEG" and seg.NumberOfFrames >= 1
    assert sr.Modality == "SR"
