"""Takes an analysis and its job and gives the result files on disk, ready for the outbox.

One folder per job under ``<data_dir>/results/<study uid>/<job id>/``: ``seg.dcm``, ``sr.dcm``,
``oru-<n>.hl7`` (one per RIS: the message header names its receiver) and ``fhir.json``. Each
file is written atomically (temporary name, fsync, rename). The same job rebuilt gives the
same bytes (deterministic UIDs, pinned creation time), so a retry resends the same objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from io import BytesIO
from pathlib import Path

from pydicom.dataset import Dataset

from imaging_ai.analyse import Analysis
from imaging_ai.config import Config
from imaging_ai.outbox import Payload, ris_key
from imaging_ai.outputs.common import Algorithm, build_report, read_headers
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.hl7 import build_oru
from imaging_ai.outputs.seg import encode_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.uids import output_uids


@dataclass(frozen=True)
class ResultFiles:
    """What was written for one job."""

    folder: Path
    payloads: tuple[Payload, ...]
    fhir: Path


@dataclass(frozen=True)
class _Message:
    """One ORU for one RIS."""

    destination: str
    control_id: str
    data: bytes


@dataclass(frozen=True)
class EncodedResults:
    """A job's result objects, encoded in memory and not written yet."""

    seg_uid: str
    seg: bytes | memoryview
    sr_uid: str
    sr: bytes | memoryview
    messages: tuple[_Message, ...]
    fhir: bytes


def encode_results(
    analysis: Analysis,
    headers: Sequence[Dataset],
    job_id: int,
    created: datetime,
    impression: str,
    config: Config,
) -> EncodedResults:
    """Build SEG, SR, ORU and FHIR for a job in memory; SEG comes first (SR refers to it)."""
    uids = output_uids(analysis.volume.study_instance_uid, job_id)
    algorithm = Algorithm.from_analysis(
        analysis,
        device_serial_number=config.storage.node,
        institution_name=config.outputs.institution,
    )
    seg = encode_segmentation(analysis, headers, algorithm, uids, created=created)
    sr = build_measurement_report(
        analysis, headers, seg, algorithm, uids, impression=impression, created=created
    )
    report = build_report(analysis, headers, algorithm, uids, impression, created)
    messages = []
    for ris in config.outputs.ris:
        key = ris_key(ris)
        control_id = uids.message_control_id(key)
        message = build_oru(
            report,
            receiving_application=ris.receiving_application,
            receiving_facility=ris.receiving_facility,
            control_id=control_id,
        )
        messages.append(_Message(key, control_id, message.encode("utf-8")))
    bundle = diagnostic_report_bundle(report)
    return EncodedResults(
        seg_uid=uids.seg_instance,
        seg=_encode_dicom(seg.dataset),
        sr_uid=uids.sr_instance,
        sr=_encode_dicom(sr),
        messages=tuple(messages),
        fhir=json.dumps(bundle, indent=1).encode("utf-8"),
    )


def write_results(
    analysis: Analysis,
    sources: list[Path],
    job_id: int,
    created: datetime,
    impression: str,
    config: Config,
    headers: Sequence[Dataset] | None = None,
) -> ResultFiles:
    """Build SEG, SR, ORU and FHIR for a job and write them.

    ``headers`` are the sources' headers where the caller has read them already (reading 300
    takes about 0.05 s); otherwise they are read here.
    """
    data_dir = Path(config.storage.data_dir)
    folder = data_dir / "results" / analysis.volume.study_instance_uid / str(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    if headers is None:
        headers = read_headers(sources)
    encoded = encode_results(analysis, headers, job_id, created, impression, config)
    payloads = [
        Payload("seg", _save_bytes(folder / "seg.dcm", encoded.seg), encoded.seg_uid),
        Payload("sr", _save_bytes(folder / "sr.dcm", encoded.sr), encoded.sr_uid),
    ]
    for n, message in enumerate(encoded.messages):
        path = _save_bytes(folder / f"oru-{n}.hl7", message.data)
        payloads.append(Payload("oru", path, message.control_id, destination=message.destination))
    fhir = _save_bytes(folder / "fhir.json", encoded.fhir)
    return ResultFiles(folder, tuple(payloads), fhir)


def _encode_dicom(dataset: Dataset) -> memoryview:
    buffer = BytesIO()
    dataset.save_as(buffer, enforce_file_format=True)
    return buffer.getbuffer()


def _save_bytes(path: Path, data: bytes | memoryview) -> Path:
    """Write atomically: one write and an fsync on the same descriptor, then rename (pydicom
    writing to the file itself makes thousands of small writes)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb", buffering=0) as f:
        f.write(data)
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
