"""Load on loopback: many DCMTK senders at once for a fixed time, and a soak of hundreds of studies
through the whole pipeline. Each prints its figures (docs/reliability.md records them).

- Ingest load: 8 storescu processes (TCP_NODELAY=1), each sending 16-image 512x512 studies one
  association after another for a fixed time; the queue is paused, so this is the receive path
  alone. Figures: images/s, errors (goal: none), the daemon's resident memory (main process,
  receivers and inference workers together) at start, peak and end.
- Soak (slow): a few hundred small studies received, analysed and delivered to a PACS and a RIS,
  on PostgreSQL; resident memory, open files and database connections sampled throughout, to
  show they stay flat once warm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pydicom
import pytest
from imaging_ai_devkit.bench.harness import CALLED_AE
from pydicom.uid import generate_uid
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from imaging_ai.config import PRIORITY_CLASSES
from imaging_ai.db.models import ClassControl, Instance, Study
from tests.conftest import wait_until
from tests.reliability.conftest import (
    FAST_ASSEMBLY,
    FaultDaemon,
    Pacs,
    Ris,
    StoppablePostgres,
    Studies,
    open_files,
    outputs_config,
    rss_mib,
)

SENDERS = 8


def clone(files: list[Path], out: Path, tag: str) -> list[Path]:
    """The study again under new UIDs (a different study to the daemon), in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    # One source string each: generate_uid joins its sources, so ("a-1", "12") == ("a-11", "2").
    study, series, frame = (generate_uid(entropy_srcs=[f"{tag}/{k}"]) for k in ("st", "se", "fr"))
    copies = []
    for i, path in enumerate(files):
        ds = pydicom.dcmread(path)
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid(
            entropy_srcs=[f"{tag}/{i}"]
        )
        copy = out / f"{i:04d}.dcm"
        ds.save_as(copy)
        copies.append(copy)
    return copies


def storescu(port: int, files: list[Path]) -> bool:
    """Send one study on one association; True if every image was stored."""
    command = ["storescu", "-aet", "STORESCU", "-aec", CALLED_AE, "127.0.0.1", str(port)]
    done = subprocess.run(
        [*command, *map(str, files)],
        capture_output=True,
        timeout=300,
        env={**os.environ, "TCP_NODELAY": "1"},
    )
    # storescu halts at a refused C-STORE and says so on stderr.
    return done.returncode == 0 and b"E:" not in done.stderr and b"Store Failed" not in done.stderr


@dataclass
class Sampler:
    """Samples a figure every ``every_s`` in a thread: first, peak and last value."""

    read: Callable[[], float]
    every_s: float = 0.5
    values: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.values.append(self.read())
            self._stop.wait(self.every_s)

    def __enter__(self) -> Sampler:
        self.values.append(self.read())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(self.read())

    def figures(self) -> tuple[float, float, float]:
        return self.values[0], max(self.values), self.values[-1]


def pause_queue(daemon: FaultDaemon) -> None:
    """Pause every priority class, as an administrator would: studies are kept, not analysed."""
    engine = daemon.database()
    with Session(engine) as s, s.begin():
        for priority in PRIORITY_CLASSES:
            s.add(ClassControl(priority=priority, paused=True, changed_at=datetime.now(UTC)))
    engine.dispose()


def run_ingest_load(tmp_path: Path, study: list[Path], seconds: float) -> None:
    daemon = FaultDaemon(tmp_path / "daemon", FAST_ASSEMBLY, receivers=0)
    daemon.start()
    assert daemon.proc is not None
    pause_queue(daemon)
    pid = daemon.proc.pid
    sent, failed = [0] * SENDERS, [0] * SENDERS
    end = time.monotonic() + seconds

    def sender(k: int) -> None:
        n = 0
        while time.monotonic() < end:
            files = clone(study, tmp_path / "out" / f"{k}-{n}", f"load-{k}-{n}")
            ok = storescu(daemon.dicom_port, files)
            sent[k] += len(files) if ok else 0
            failed[k] += 0 if ok else 1
            shutil.rmtree(files[0].parent)
            n += 1

    try:
        with Sampler(lambda: rss_mib(pid)) as memory:
            started = time.monotonic()
            threads = [threading.Thread(target=sender, args=(k,)) for k in range(SENDERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            took = time.monotonic() - started
        engine = daemon.database()
        with Session(engine) as s:
            stored = s.scalar(select(func.count(Instance.id)))
        engine.dispose()
        start, peak, last = memory.figures()
        rate = sum(sent) / took
        print(
            f"\ningest load: {SENDERS} senders x {took:.0f} s: {sum(sent)} images "
            f"({rate:.0f} images/s), {sum(failed)} failed associations, {stored} stored; "
            f"resident memory start {start:.0f} MiB, peak {peak:.0f} MiB, end {last:.0f} MiB"
        )
        assert sum(failed) == 0
        assert stored == sum(sent)  # every image answered Success is in the catalog
        # Flat: the spool and database grow on disk, not in memory.
        assert last - start < 150, (start, peak, last)
    finally:
        daemon.stop()
        shutil.rmtree(daemon.data_dir, ignore_errors=True)


def test_ingest_load_8_senders(tmp_path: Path, small_studies: Studies) -> None:
    run_ingest_load(tmp_path, small_studies[0], seconds=8)


@pytest.mark.slow
def test_ingest_load_8_senders_for_2_minutes(tmp_path: Path, small_studies: Studies) -> None:
    run_ingest_load(tmp_path, small_studies[0], seconds=120)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(3600)
def test_soak_hundreds_of_studies(
    tmp_path: Path, small_studies: Studies, own_postgres: StoppablePostgres, pacs: Pacs, ris: Ris
) -> None:
    studies = int(os.environ.get("IMAGING_AI_SOAK_STUDIES", "200"))
    url = own_postgres.create_database()
    daemon = FaultDaemon(
        tmp_path / "daemon",
        FAST_ASSEMBLY + outputs_config(pacs, ris),
        database_url=url,
        receivers=0,
    )
    daemon.start()
    assert daemon.proc is not None
    pid, name = daemon.proc.pid, url.rsplit("/", 1)[1]
    admin = daemon.database()

    def connections() -> float:
        with admin.connect() as conn:
            query = text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = :d AND pid <> pg_backend_pid()"
            )
            return float(conn.execute(query, {"d": name}).scalar_one())

    def done() -> int:
        with Session(admin) as s:
            return int(s.scalar(select(func.count(Study.id)).where(Study.state == "done")) or 0)

    figures: dict[str, list[float]] = {"memory": [], "files": [], "connections": []}
    warm_at = 20
    try:
        started = time.monotonic()
        for n in range(studies):
            files = clone(small_studies[n % 3], tmp_path / "out" / str(n), f"soak-{n}")
            assert storescu(daemon.dicom_port, files)
            shutil.rmtree(files[0].parent)
            # Keep the queue short, as a PACS at a steady rate would: a few studies ahead.
            wait_until(lambda n=n: done() >= n - 3, timeout_s=300, interval_s=0.5)
            if n == warm_at or n % 10 == 0:
                figures["memory"].append(rss_mib(pid))
                figures["files"].append(float(open_files(pid)))
                figures["connections"].append(connections())
        wait_until(lambda: done() == studies, timeout_s=600, interval_s=1)
        took = time.monotonic() - started
        figures["memory"].append(rss_mib(pid))
        figures["files"].append(float(open_files(pid)))
        figures["connections"].append(connections())
        arrivals = pacs.arrivals()
        warm = warm_at // 10  # the sample taken once warm
        lines = [
            f"\nsoak: {studies} studies received, analysed and delivered in {took:.0f} s "
            f"({studies / took * 60:.1f} studies/min); {len(arrivals)} SEG/SR objects at PACS, "
            f"{len(ris.received)} ORU at RIS"
        ]
        for what, values in figures.items():
            lines.append(
                f"  {what}: start {values[0]:.0f}, after {warm_at} studies {values[warm]:.0f}, "
                f"peak {max(values):.0f}, end {values[-1]:.0f}"
            )
        print("\n".join(lines))
        assert len(arrivals) == 2 * studies and max(arrivals.values()) == 1
        assert len(ris.received) == studies
        memory, files_open, conns = figures["memory"], figures["files"], figures["connections"]
        assert memory[-1] - memory[warm] < 0.15 * memory[warm], memory
        assert files_open[-1] - files_open[warm] <= 20, files_open
        assert conns[-1] <= max(conns[: warm + 1]) + 2, conns
    finally:
        admin.dispose()
        daemon.stop()
        shutil.rmtree(daemon.data_dir, ignore_errors=True)
