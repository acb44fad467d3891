"""Takes a folder and gives Orthanc (Debian `orthanc`) running as the hospital's PACS on loopback.

Orthanc has no bind-address option and listens on every interface; only 127.0.0.1 is ever
addressed, and it gets free ports. Used by the end-to-end tests, `make demo` and the
turnaround benchmark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from imaging_ai_devkit.bench.harness import free_port

ORTHANC_AE = "ORTHANC"


class OrthancPacs:
    """One Orthanc process with its own storage, configured to know the daemon as a modality."""

    def __init__(self, root: Path, daemon_ae: str, daemon_port: int) -> None:
        self.root = root
        self.http_port = free_port()
        self.dicom_port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        self.config_path = root / "orthanc.json"
        self.config_path.write_text(
            json.dumps(
                {
                    "Name": "imaging-ai test PACS",
                    "StorageDirectory": str(root / "storage"),
                    "IndexDirectory": str(root / "index"),
                    "HttpPort": self.http_port,
                    "DicomPort": self.dicom_port,
                    "DicomAet": ORTHANC_AE,
                    "RemoteAccessAllowed": False,
                    "AuthenticationEnabled": False,
                    "DicomCheckCalledAet": True,
                    "DicomAlwaysAllowStore": True,
                    "DicomModalities": {"imaging-ai": [daemon_ae, "127.0.0.1", daemon_port]},
                    "MaximumPduLength": 131072,
                    "StableAge": 1,
                    "SaveJobs": False,
                    "Plugins": [],
                }
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        """Whether Debian's Orthanc is installed."""
        return shutil.which("Orthanc") is not None

    def start(self, timeout_s: float = 30) -> None:
        """Start Orthanc and wait for its REST API."""
        log = (self.root / "orthanc.log").open("ab")
        self.proc = subprocess.Popen(
            ["Orthanc", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TCP_NODELAY": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Orthanc exited with {self.proc.returncode}")
            try:
                self.get("/system")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("Orthanc did not answer in time")

    def stop(self) -> None:
        """Stop Orthanc and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            data=body,
            method=method,
            headers={"Content-Type": content_type},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            data = response.read()
        return json.loads(data) if data[:1] in (b"{", b"[") else data

    def get(self, path: str) -> Any:
        """GET a REST path (JSON decoded when it is JSON)."""
        return self._request("GET", path)

    def upload(self, files: list[Path]) -> str:
        """POST each file to /instances; return the Orthanc study id."""
        study = ""
        for path in files:
            answer = self._request("POST", "/instances", path.read_bytes(), "application/dicom")
            study = answer["ParentStudy"]
        return study

    def push_to_daemon(self, orthanc_study: str) -> dict[str, Any]:
        """Have Orthanc C-STORE a study to the daemon (as PACS routing would)."""
        body = json.dumps({"Resources": [orthanc_study], "Synchronous": True}).encode()
        return dict(self._request("POST", "/modalities/imaging-ai/store", body))

    def instances_of_modality(self, modality: str) -> list[dict[str, Any]]:
        """Every stored instance whose series has the given Modality (SEG, SR, CT)."""
        found = []
        for series_id in self.get("/series"):
            series = self.get(f"/series/{series_id}")
            if series["MainDicomTags"].get("Modality") == modality:
                found += [self.get(f"/instances/{i}") for i in series["Instances"]]
        return found

    def file(self, instance_id: str) -> bytes:
        """The stored DICOM file of an instance."""
        data = self.get(f"/instances/{instance_id}/file")
        assert isinstance(data, bytes)
        return data
