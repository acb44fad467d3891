"""Takes an analysis and its job and gives the result files on disk, ready for the outbox.

One folder per job under ``<data_dir>/results/<study uid>/<job id>/``: ``seg.dcm``, ``sr.dcm``
(Comprehensive 3D SR), ``sr-comprehensive.dcm`` where a PACS takes Comprehensive SR instead
(``[[outputs.pacs]] sr``), ``oru-<n>.hl7`` (one per RIS: the message header names its
receiver), ``fhir.json``, and ``key-<n>.png`` per finding for the status page (never
delivered). Each file is written atomically (temporary name, fsync, rename). The same job
rebuilt gives the same bytes (deterministic UIDs, pinned creation time), so a retry resends
the same objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from io import BytesIO
from pathlib import Path

from pydicom.dataset import Dataset

from imaging_ai.analyse import Analysis
from imaging_ai.config import Config
from imaging_ai.durable import fsync_path, write_atomic
from imaging_ai.outbox import Payload
from imaging_ai.outputs.common import (
    MANUFACTURER,
    Algorithm,
    build_report,
    institution_of,
    read_headers,
)
from imaging_ai.outputs.keyimages import write_key_images
from imaging_ai.outputs.messages import MessageBuilder, RisMessage, submit
from imaging_ai.outputs.seg import encode_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.sr.classes import COMPREHENSIVE_3D, sr_instance_uid
from imaging_ai.outputs.uids import output_uids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResultFiles:
    """What was written for one job."""

    folder: Path
    payloads: tuple[Payload, ...]
    fhir: Path
    key_images: tuple[Path, ...] = ()


@dataclass(frozen=True)
class EncodedResults:
    """A job's result objects, encoded in memory and not written yet."""

    seg_uid: str
    seg: bytes | memoryview
    sr_uid: str
    sr: bytes | memoryview
    messages: tuple[RisMessage, ...]
    fhir: bytes
    # The SR in the other classes PACS destinations take: (class, SOP Instance UID, bytes).
    other_srs: tuple[tuple[str, str, bytes | memoryview], ...] = ()


def encode_results(
    analysis: Analysis,
    headers: Sequence[Dataset],
    job_id: int,
    created: datetime,
    impression: str,
    config: Config,
    builder: MessageBuilder | None = None,
    on_ready: Callable[[str, bytes | memoryview], object] | None = None,
) -> EncodedResults:
    """Build SEG, SR, ORU and FHIR for a job in memory; SEG comes first (SR refers to it).

    With a ``builder`` the ORUs and the FHIR bundle are made in its process while this one
    encodes the SEG and the SR. ``on_ready(name, data)`` is called as each object is ready
    ("seg", "sr", "oru-<n>", "fhir"), so that it can be written while the next is encoded.
    """
    ready = on_ready or (lambda name, data: None)
    uids = output_uids(analysis.volume.study_instance_uid, job_id)
    algorithm = Algorithm.from_analysis(
        analysis,
        # Set at the daemon's start (imaging_ai.site); unset only where no daemon started.
        device_serial_number=config.site.device_serial_number or MANUFACTURER,
        institution_name=config.institution or institution_of(headers),
        time_zone=config.site.time_zone,
    )
    report = build_report(analysis, headers, algorithm, uids, impression, created)
    pending = submit(builder, report, config.outputs.ris, config.hl7)
    seg = encode_segmentation(analysis, headers, algorithm, uids, created=created)
    seg_bytes = _encode_dicom(seg.dataset)
    ready("seg", seg_bytes)
    sr = build_measurement_report(
        analysis, headers, seg, algorithm, uids, impression=impression, created=created
    )
    sr_bytes = _encode_dicom(sr)
    ready("sr", sr_bytes)
    others = []
    for sr_class in _other_sr_classes(config):
        other = build_measurement_report(
            analysis, headers, seg, algorithm, uids, impression=impression, created=created,
            sr_class=sr_class,
        )  # fmt: skip
        others.append((sr_class, sr_instance_uid(uids, sr_class), _encode_dicom(other)))
        ready(f"sr-{sr_class}", others[-1][2])
    messages = pending.result()
    for n, message in enumerate(messages.orus):
        ready(f"oru-{n}", message.data)
    ready("fhir", messages.fhir)
    return EncodedResults(
        seg_uid=uids.seg_instance,
        seg=seg_bytes,
        sr_uid=uids.sr_instance,
        sr=sr_bytes,
        messages=messages.orus,
        fhir=messages.fhir,
        other_srs=tuple(others),
    )


def _other_sr_classes(config: Config) -> list[str]:
    """The SR classes other than Comprehensive 3D SR that a PACS destination takes."""
    wanted = {d.sr for d in config.outputs.pacs if "sr" in d.results}
    return sorted(wanted - {COMPREHENSIVE_3D})


def write_results(
    analysis: Analysis,
    sources: list[Path],
    job_id: int,
    created: datetime,
    impression: str,
    config: Config,
    headers: Sequence[Dataset] | None = None,
    builder: MessageBuilder | None = None,
) -> ResultFiles:
    """Build SEG, SR, ORU and FHIR for a job and write them.

    ``headers`` are the sources' headers where the caller has read them already (reading 300
    takes about 0.05 s); otherwise they are read here. ``builder``: see :func:`encode_results`.
    """
    data_dir = Path(config.storage.data_dir)
    folder = data_dir / "results" / analysis.volume.study_instance_uid / str(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    if headers is None:
        headers = read_headers(sources)
    # Each object is written (write + fsync, both without the GIL) while the next is encoded.
    with ThreadPoolExecutor(4, thread_name_prefix="results-write") as pool:
        written: dict[str, Future[Path]] = {}

        def write(name: str, data: bytes | memoryview) -> None:
            written[name] = pool.submit(_save_bytes, folder / _file_name(name), data)

        # Drawn in a writer thread while SEG and SR are encoded (numpy, zlib and the writes
        # release the GIL), so the key images add little to the results' time.
        keys = pool.submit(_write_key_images, analysis, folder, job_id)
        encoded = encode_results(
            analysis, headers, job_id, created, impression, config, builder, write
        )
        paths = {name: future.result() for name, future in written.items()}
        key_images = tuple(keys.result())
    # The renames (and the job's and study's folders, if new) are durable before the caller
    # commits the deliveries that name these files: one fsync of each directory.
    for directory in (folder, folder.parent, folder.parent.parent):
        fsync_path(directory)
    payloads = [
        Payload("seg", paths["seg"], encoded.seg_uid),
        *_sr_payloads(config, paths, encoded),
    ]
    for n, message in enumerate(encoded.messages):
        payloads.append(
            Payload("oru", paths[f"oru-{n}"], message.control_id, destination=message.destination)
        )
    fhir = paths["fhir"]
    return ResultFiles(folder, tuple(payloads), fhir, key_images)


def _sr_payloads(config: Config, paths: dict[str, Path], encoded: EncodedResults) -> list[Payload]:
    """One SR for every PACS that takes SR, or, where one takes another class, each PACS its
    class's SR (a different object, under its own UID)."""
    if not encoded.other_srs:
        return [Payload("sr", paths["sr"], encoded.sr_uid)]
    uids = {sr_class: uid for sr_class, uid, _ in encoded.other_srs}
    return [
        Payload("sr", paths["sr"], encoded.sr_uid, destination=d.key)
        if d.sr == COMPREHENSIVE_3D
        else Payload("sr", paths[f"sr-{d.sr}"], uids[d.sr], destination=d.key)
        for d in config.outputs.pacs
        if "sr" in d.results
    ]


_FILE_NAMES = {"seg": "seg.dcm", "sr": "sr.dcm", "fhir": "fhir.json"}


def _file_name(name: str) -> str:
    if name.startswith("sr-"):
        return f"{name}.dcm"
    return _FILE_NAMES.get(name) or f"{name}.hl7"


def _write_key_images(analysis: Analysis, folder: Path, job_id: int) -> list[Path]:
    """The findings' key images; a failure is logged and costs the pictures, not the results
    (they are a check for people on the status page, delivered nowhere)."""
    try:
        return write_key_images(analysis, folder, _save_bytes)
    except Exception:
        log.exception("job %d: key images not written; the status page shows none", job_id)
        return []


def _encode_dicom(dataset: Dataset) -> memoryview:
    buffer = BytesIO()
    dataset.save_as(buffer, enforce_file_format=True)
    return buffer.getbuffer()


def _save_bytes(path: Path, data: bytes | memoryview) -> Path:
    """Write atomically (`imaging_ai.durable.write_atomic`); the folders are fsynced once, after
    every file of the job is written (`write_results`)."""
    return write_atomic(path, data, sync_dir=False)
