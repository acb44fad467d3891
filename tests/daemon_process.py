"""Runs `imaging-ai serve` as a subprocess on free loopback ports, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import free_port

ADMIN_TOKEN = "e2e-admin-token-0123456789"
CALLED_AE = "IMAGING_AI"


class DaemonProcess:
    """One daemon: its config, data directory, ports and log file."""

    def __init__(self, root: Path, extra: str = "", database_url: str = "") -> None:
        self.root = root
        self.data_dir = root / "data"
        self.dicom_port = free_port()
        self.http_port = free_port()
        self.log_path = root / "daemon.log"
        self.config_path = root / "imaging-ai.toml"
        self.config_path.write_text(
            f'[dicom]\nae_title = "{CALLED_AE}"\nport = {self.dicom_port}\n'
            'allowed_callers = [{ae_title = "STORESCU", host = "127.0.0.1"},'
            ' {ae_title = "PACS", host = "127.0.0.1"}]\n'
            f'[storage]\ndata_dir = "{self.data_dir}"\nmin_free_mb = 16\n'
            f'database_url = "{database_url}"\n'
            f"[http]\nport = {self.http_port}\n"
            f'tokens = [{{name = "it", token = "{ADMIN_TOKEN}", role = "admin"}}]\n'
            f"{extra}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "imaging_ai", "serve", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.log()}")
            try:
                self.get("/healthz")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError(f"daemon not ready within {timeout_s} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def studies(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/studies")["studies"])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)
