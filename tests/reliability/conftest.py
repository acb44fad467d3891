"""Peers and a daemon for the reliability tests: a recording PACS and RIS that can be taken down,
a daemon that can be armed to SIGKILL itself at a named point, a PostgreSQL that can be stopped
and started again, and the daemon's resident memory, open files and database connections."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hl7
import pytest
from imaging_ai_devkit.bench.harness import DaemonProcess, free_port
from imaging_ai_devkit.mllp_listener import RisListener
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pynetdicom import AE, ALL_TRANSFER_SYNTAXES, evt
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    Comprehensive3DSRStorage,
    SegmentationStorage,
)
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session

from imaging_ai.db.models import Delivery, Job, Report, Study
from imaging_ai.faults import ENV as FAULT_ENV
from tests.conftest import PostgresCluster

FAST_ASSEMBLY = "[assemble]\nseries_idle_s = 0.5\nstudy_idle_s = 0.5\npoll_s = 0.2\n"
KIND_BY_CLASS = {SegmentationStorage: "seg", Comprehensive3DSRStorage: "sr"}


class Pacs:
    """A storage SCP (AE title PACS) that records every C-STORE it is sent, duplicates included.

    DCMTK storescp names its files by SOP Instance UID, so a resend would overwrite the first
    copy and could not be counted; this one keeps (kind, SOP Instance UID) per arrival.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: Any = None

    def start(self) -> Pacs:
        ae = AE(ae_title="PACS")
        ae.require_called_aet = True
        for sop_class in KIND_BY_CLASS:
            ae.add_supported_context(sop_class, ALL_TRANSFER_SYNTAXES)
        self._server = ae.start_server(
            ("127.0.0.1", self.port), block=False, evt_handlers=[(evt.EVT_C_STORE, self._store)]
        )
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def _store(self, event: Any) -> int:
        ds = event.dataset
        with self._lock:
            self.received.append((KIND_BY_CLASS.get(ds.SOPClassUID, "?"), str(ds.SOPInstanceUID)))
        return 0x0000

    def arrivals(self) -> Counter[tuple[str, str]]:
        """How many times each (kind, SOP Instance UID) arrived."""
        with self._lock:
            return Counter(self.received)


class Ris:
    """An MLLP listener on a fixed port that can be down (not listening) and come back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[str] = []
        self._listener: RisListener | None = None

    def start(self) -> Ris:
        self._listener = RisListener(port=self.port).start()
        self._listener.received = self.received
        return self

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None

    def control_ids(self) -> list[str]:
        """MSH-10 of every message received, in order."""
        return [str(hl7.parse(m.replace("\n", "\r")).segment("MSH")[10]) for m in self.received]


@pytest.fixture
def pacs() -> Iterator[Pacs]:
    p = Pacs().start()
    yield p
    p.stop()


@pytest.fixture
def ris() -> Iterator[Ris]:
    r = Ris().start()
    yield r
    r.stop()


def outputs_config(pacs: Pacs, ris: Ris, retry_min_s: float = 0.5, retry_max_s: float = 1.0) -> str:
    """An [outputs] table sending to the test PACS and RIS with a short backoff."""
    return (
        f"[outputs]\nretry_min_s = {retry_min_s}\nretry_max_s = {retry_max_s}\n"
        f'pacs = [{{ae_title = "PACS", host = "127.0.0.1", port = {pacs.port}}}]\n'
        f'ris = [{{host = "127.0.0.1", port = {ris.port}}}]\n'
    )


class FaultDaemon(DaemonProcess):
    """`imaging-ai serve` that may be armed with IMAGING_AI_FAULT, with its database at hand."""

    def launch(self, env: dict[str, str] | None = None, fault: str = "") -> None:
        """Start without waiting: an armed daemon may reach its point before /healthz answers."""
        # Always set, so an IMAGING_AI_FAULT in the test's own environment is not inherited.
        super().launch({**self.env, **(env or {}), FAULT_ENV: fault})

    def start(self, timeout_s: float = 60, fault: str = "") -> None:
        """Start (armed or not) and wait until /healthz answers."""
        self.launch(fault=fault)
        self.wait_ready(timeout_s)

    def wait_fault(self, point: str, timeout_s: float = 90) -> None:
        """Wait until the armed daemon has killed itself at ``point``."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{point} not reached in {timeout_s} s: {self.log()}") from None
        assert code == -signal.SIGKILL, f"exit {code}, not the fault: {self.log()[-3000:]}"
        assert f"{FAULT_ENV}={point} reached" in self.log()

    def database(self) -> Engine:
        """An engine on the daemon's database (SQLite under data_dir unless configured)."""
        url = self._database_url or f"sqlite:///{self.data_dir / 'imaging-ai.sqlite3'}"
        return create_engine(url)

    def __init__(
        self,
        root: Path,
        extra: str = "",
        database_url: str = "",
        receivers: int = 1,
        **kw: Any,
    ) -> None:
        super().__init__(root, extra, database_url=database_url, **kw)
        self._database_url = database_url
        # One receiver process unless a test needs more: a restart is then a second shorter.
        self.env = {"IMAGING_AI_DICOM__RECEIVER_PROCESSES": str(receivers)}


@dataclass(frozen=True)
class Outcome:
    """What the database says about one study's life."""

    state: str
    error: str
    jobs: list[Job]
    reports: int
    deliveries: list[Delivery]


def outcome(engine: Engine, study_uid: str) -> Outcome:
    with Session(engine) as s:
        study = s.scalars(select(Study).where(Study.study_instance_uid == study_uid)).one()
        jobs = list(s.scalars(select(Job).where(Job.study_id == study.id)))
        reports = len(s.scalars(select(Report).where(Report.study_id == study.id)).all())
        deliveries = list(s.scalars(select(Delivery).where(Delivery.study_id == study.id)))
        return Outcome(study.state, study.error, jobs, reports, deliveries)


def study_state(engine: Engine, study_uid: str) -> str:
    """The study's state, or '' before its first instance is recorded."""
    with Session(engine) as s:
        state = s.scalar(select(Study.state).where(Study.study_instance_uid == study_uid))
    return state or ""


class Studies:
    """16-slice phantom chests (5 mm), each with a nodule: small, but real to the models.

    Made on first use and kept for the session: a phantom takes a second or two to draw.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[int, list[Path]] = {}

    def __getitem__(self, index: int) -> list[Path]:
        if index not in self._made:
            out = self.root / f"study{index}"
            spec = PhantomSpec(slices=16, seed=900 + index, nodules=1, slice_thickness_mm=5.0)
            write_study(generate(spec), out, accession=f"REL-{index}")
            self._made[index] = sorted((out / "dicom").glob("*.dcm"))
        return self._made[index]


@pytest.fixture(scope="session")
def small_studies(tmp_path_factory: pytest.TempPathFactory) -> Studies:
    return Studies(tmp_path_factory.mktemp("studies"))


# ---- process figures (Linux /proc) ------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its children (receivers, inference workers), MiB."""
    total = 0
    for p in descendants(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def open_files(pid: int) -> int:
    """Open file descriptors of ``pid`` and its children."""
    total = 0
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{p}/fd"))
    return total


def inference_workers(pid: int) -> list[int]:
    """The daemon's inference worker processes: those that mapped ONNX Runtime."""
    workers = []
    for p in descendants(pid)[1:]:
        try:
            if "onnxruntime" in Path(f"/proc/{p}/maps").read_text():
                workers.append(p)
        except OSError:
            pass
    return workers


class StoppablePostgres(PostgresCluster):
    """A throwaway cluster of this test's own, which can be stopped and started again."""

    def _options(self) -> str:
        return f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -F"

    halted = False

    def halt(self) -> None:
        """Stop the server at once, as a crash or a network cut would look to clients."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.halted = True

    def resume(self) -> None:
        self.halted = False
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", self._options(), "-l", str(self.root / "log"),
            "-w", "start",
        )  # fmt: skip


@pytest.fixture
def own_postgres() -> Iterator[StoppablePostgres]:
    from tests.conftest import _pg_bin

    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries; the database outage is not tested")
    cluster = StoppablePostgres(bin_dir)
    cluster.start()
    yield cluster
    if cluster.halted:
        cluster.resume()
    cluster.stop()


def unread_bytes(pid: int) -> int:
    """Bytes waiting unread on ``pid``'s Unix sockets (``ss``): a stopped inference worker's
    pipe holds its batch there, so this tells that a batch is in flight to it."""
    out = subprocess.run(["ss", "-xpn"], capture_output=True, text=True, check=True).stdout
    return sum(
        int(line.split()[2])
        for line in out.splitlines()[1:]
        if f"pid={pid}," in line and line.split()[2].isdigit()
    )


def log_lines(daemon: DaemonProcess, text: str) -> list[str]:
    """The daemon's log lines that contain ``text``."""
    return [line for line in daemon.log().splitlines() if text in line]
