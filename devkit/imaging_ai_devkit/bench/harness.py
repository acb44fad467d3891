"""Takes a folder and options and gives a running `imaging-ai serve` subprocess on loopback.

Used by the benchmarks and the end-to-end tests: free ports, its own data directory and log,
the shipped models on ONNX Runtime CPU, an admin token for the API, DCMTK storescu to send.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ADMIN_TOKEN = "bench-admin-token-0123456789"
CALLED_AE = "IMAGING_AI"
ENGINES_DIR = Path(__file__).resolve().parents[3] / "engines"


def free_port() -> int:
    """An unused TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonProcess:
    """One daemon: its config file, data directory, ports and log file."""

    def __init__(
        self,
        root: Path,
        extra: str = "",
        database_url: str = "",
        calling_aes: tuple[str, ...] = ("STORESCU", "PACS"),
        dicom_port: int = 0,
        data_dir: Path | None = None,
        storage_extra: str = "",
        engines_dir: Path = ENGINES_DIR,
        http_extra: str = "",
        https_ca: Path | None = None,
    ) -> None:
        self.root = root
        self.data_dir = data_dir or root / "data"
        self.dicom_port = dicom_port or free_port()
        self.http_port = free_port()
        self.log_path = root / "daemon.log"
        self.config_path = root / "imaging-ai.toml"
        root.mkdir(parents=True, exist_ok=True)
        callers = ", ".join(f'{{ae_title = "{ae}", host = "127.0.0.1"}}' for ae in calling_aes)
        self.config_path.write_text(
            f'[dicom]\nae_title = "{CALLED_AE}"\nport = {self.dicom_port}\n'
            f"allowed_callers = [{callers}]\n"
            f'[storage]\ndata_dir = "{self.data_dir}"\nmin_free_mb = 16\n'
            f'database_url = "{database_url}"\n{storage_extra}\n'
            f"[http]\nport = {self.http_port}\n"
            f'tokens = [{{name = "it", token = "{ADMIN_TOKEN}", role = "admin"}}]\n{http_extra}\n'
            f'[engines]\ndir = "{engines_dir}"\nbackend = "onnxruntime-cpu"\n'
            f"{extra}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        # With [http] tls_cert/tls_key in http_extra, the API is reached over HTTPS.
        self.scheme = "https" if https_ca else "http"
        self.tls = ssl.create_default_context(cafile=str(https_ca)) if https_ca else None

    def start(self, timeout_s: float = 60) -> None:
        """Start and wait until /healthz answers; raise with the log if it exits first."""
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self, env: dict[str, str] | None = None) -> None:
        """Start the daemon without waiting, with ``env`` added to this process's environment."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "imaging_ai", "serve", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )

    def wait_ready(self, timeout_s: float = 60) -> None:
        """Wait until /healthz answers; raise with the log if the daemon exits first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.log()}")
            try:
                self.get("/healthz")
                return
            except OSError:  # URLError, a refused connection or a timeout: not up yet
                time.sleep(0.1)
        raise RuntimeError(f"daemon not ready within {timeout_s} s: {self.log()}")

    def log(self) -> str:
        """The daemon's log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> Any:
        """GET a JSON API path with the admin token."""
        request = urllib.request.Request(
            f"{self.scheme}://127.0.0.1:{self.http_port}{path}",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10, context=self.tls) as response:
            return json.loads(response.read())

    def studies(self) -> list[dict[str, Any]]:
        """Every study the API lists."""
        return list(self.get("/api/v1/studies?limit=500")["studies"])

    def study(self, uid: str) -> dict[str, Any]:
        """One study's API view."""
        return dict(self.get(f"/api/v1/studies/{uid}"))

    def send(self, files: list[Path], calling_ae: str = "STORESCU") -> None:
        """Send files with DCMTK storescu (TCP_NODELAY on) and wait for it."""
        subprocess.run(
            [
                "storescu",
                "-aet",
                calling_ae,
                "-aec",
                CALLED_AE,
                "127.0.0.1",
                str(self.dicom_port),
                *map(str, files),
            ],
            check=True,
            capture_output=True,
            timeout=600,
            env={**os.environ, "TCP_NODELAY": "1"},
        )

    def kill(self) -> None:
        """SIGKILL the main process (receivers die with it)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, wait for the documented shutdown; return the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def describe_filesystem(path: Path, root: Path = Path("/")) -> str:
    """The filesystem ``path`` is on, as a benchmark should name it: type, device, journal.

    Ingest figures depend on it (CHANGELOG.md, 2026-12-01, "Ingest with the corrected harness"
    and "Ingest, seventh session"): ext4 without a journal syncs a file
    with fewer writes than with one, and its inode allocator steps over every inode freed in
    the last minute or more, which slows file creation after a server's output is deleted.
    ``root`` holds the ``proc`` and ``sys`` trees read (another one in tests).
    """
    target = path.resolve()
    best: tuple[str, str, str, str] | None = None  # mount point, MAJ:MIN, type, source
    for line in (root / "proc" / "self" / "mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts, tail = fields.split(), rest.split()
        if len(parts) < 5 or len(tail) < 2:
            continue
        mount_point = _unescape_mount(parts[4])
        longer = best is None or len(mount_point) >= len(best[0])
        if longer and target.is_relative_to(mount_point):
            best = (mount_point, parts[2], tail[0], tail[1])
    if best is None:
        return "an unknown filesystem"
    _, device_number, fs_type, source = best
    if fs_type != "ext4":
        return f"{fs_type} ({source})"
    device = (root / "sys" / "dev" / "block" / device_number).resolve().name
    journal_task = root / "sys" / "fs" / "ext4" / device / "journal_task"
    try:
        journal = journal_task.read_text().strip() != "<none>"
    except OSError:
        return f"ext4 ({source})"
    return f"ext4 {'with' if journal else 'without'} a journal ({source})"


def _unescape_mount(field: str) -> str:
    """A mount point as /proc/self/mountinfo writes it: space, tab, newline and \\ as octal."""
    for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, char)
    return field
