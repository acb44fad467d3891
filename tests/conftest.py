"""Shared fixtures: databases (SQLite and a throwaway PostgreSQL cluster), ports, configs."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import free_port
from sqlalchemy import Engine, create_engine, text

from imaging_ai.config import Config, load_config
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.receive import Receiver
from tests import phi_scan

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def _pg_bin() -> Path | None:
    candidates = sorted(glob.glob(PG_BIN_GLOB), key=lambda p: int(Path(p).parent.name))
    for candidate in reversed(candidates):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class PostgresCluster:
    """A throwaway PostgreSQL cluster on loopback, owned by this test session."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="imaging-ai-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        # initdb refuses to run as root; CI runs as root, so the cluster runs as 'postgres'.
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, cwd=self.root)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, self.user)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "-E", "UTF8")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -F"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        name = "t_" + uuid.uuid4().hex[:12]
        admin = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        return self.url(name)


@pytest.fixture(autouse=True)
def no_patient_identifiers_in_logs() -> Iterator[None]:
    """Fails a test whose log lines name a test patient (tests/phi_scan.py)."""
    with phi_scan.scanned():
        yield


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster for the whole session; skipped, saying so, without server binaries."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip(f"no PostgreSQL server binaries under {PG_BIN_GLOB}; PostgreSQL not tested")
    cluster = PostgresCluster(bin_dir)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.sqlite3'}"
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return cluster.create_database()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated engine on each backend."""
    eng = make_engine(db_url)
    upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    """A migrated SQLite database of the test's own."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def receiver(sqlite_engine: Engine, tmp_path: Path) -> Iterator[Receiver]:
    """A DICOM receiver on a free loopback port, over ``sqlite_engine`` and a spool in
    ``tmp_path`` (`tests.test_receive.start_receiver`)."""
    from tests.test_receive import start_receiver

    r = start_receiver(sqlite_engine, tmp_path)
    yield r
    r.stop()


def wait_until(predicate: object, timeout_s: float = 20.0, interval_s: float = 0.05) -> None:
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout_s``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def receiver_config(tmp_path: Path, processes: int, dicom_extra: str = "") -> Config:
    """A daemon config for a receiver pool alone (PACS allowed from loopback), its spool folders
    made and its database migrated."""
    path = tmp_path / "daemon.toml"
    path.write_text(
        f'[dicom]\nae_title = "IMAGING_AI"\nport = {free_port()}\n'
        f"receiver_processes = {processes}\n{dicom_extra}"
        'allowed_callers = [{ ae_title = "PACS", host = "127.0.0.1" }]\n'
        f'[storage]\ndata_dir = "{tmp_path / "data"}"\nmin_free_mb = 1\n'
    )
    config = load_config(path)
    config.storage.spool_dir.mkdir(parents=True)
    (config.storage.spool_dir / "tmp" / config.storage.node).mkdir(parents=True)
    migrated = make_engine(config.storage.resolved_database_url)
    upgrade(migrated)
    migrated.dispose()
    return config
