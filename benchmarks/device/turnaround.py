#!/usr/bin/env python3
"""`imaging-ai bench turnaround` on the GPU machine, where neither Orthanc nor DCMTK exists.

The same benchmark (`imaging_ai_devkit.bench.turnaround`: the daemon as a subprocess, a 300-slice
study at a time, last instance received -> SEG+SR stored in PACS, by stage from the daemon's
records, against the bare analysis), with the PACS played by pynetdicom: an SCU sends each
study to the daemon as Orthanc's push would, and a storage SCP keeps the SEG and SR that come
back. The backend is ONNX Runtime CUDA unless IMAGING_AI_ENGINES__BACKEND says otherwise.

Run from the repository root on the device by benchmarks/device/turnaround.sh, which puts
onnxruntime-gpu (benchmarks/device/setup_ort.sh) and the daemon's other packages
(benchmarks/device/setup_site2.sh) on PYTHONPATH:

    python3 benchmarks/device/turnaround.py --studies 5 --slices 300 --goal 3 --budget 240

What is missing there (a package, ONNX Runtime's CUDA provider) is named before anything runs;
the studies' stages go to ``$OUT/turnaround.json`` when OUT is set.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "devkit")]
# The daemon and the phantom generator run as `python -m imaging_ai` subprocesses.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
)

# What the daemon, the benchmark and this PACS import (module: distribution).
NEEDED = {
    "numpy": "numpy",
    "PIL": "pillow",
    "packaging": "packaging",
    "onnxruntime": "onnxruntime-gpu",
    "pydicom": "pydicom",
    "pynetdicom": "pynetdicom",
    "SimpleITK": "SimpleITK",
    "highdicom": "highdicom",
    "sqlalchemy": "SQLAlchemy",
    "alembic": "alembic",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "jinja2": "Jinja2",
    "multipart": "python-multipart",
    "itsdangerous": "itsdangerous",
    "prometheus_client": "prometheus-client",
    "hl7": "hl7",
    "hl7apy": "hl7apy",
    "pydantic": "pydantic",
    "tqdm": "tqdm",
}


def missing() -> list[str]:
    """Distributions that cannot be imported here, and a CUDA provider if one is wanted."""
    gone = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
    backend = os.environ.get("IMAGING_AI_ENGINES__BACKEND", "")
    if not gone and backend == "onnxruntime-cuda":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            gone.append(f"onnxruntime {onnxruntime.__version__} without CUDAExecutionProvider")
        from imaging_ai.infer.select import probe_environment

        if probe_environment().gpus == 0:
            gone.append("a visible GPU (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia)")
    return gone


if __name__ == "__main__":
    os.environ.setdefault("IMAGING_AI_ENGINES__BACKEND", "onnxruntime-cuda")
if __name__ == "__main__" and missing():
    print(f"cannot run: missing {', '.join(missing())}; PYTHONPATH={os.environ['PYTHONPATH']}")
    print("headline: turnaround not measured (see the line above; turnaround.sh sets it up)")
    sys.exit(2)

from imaging_ai_devkit.bench import turnaround  # noqa: E402
from imaging_ai_devkit.bench.harness import free_port  # noqa: E402
from imaging_ai_devkit.bench.orthanc import ORTHANC_AE  # noqa: E402
from pydicom import dcmread  # noqa: E402
from pynetdicom import AE, AllStoragePresentationContexts, StoragePresentationContexts, evt  # noqa: E402


class PynetdicomPacs:
    """The parts of `OrthancPacs` that `Hospital` and the benchmark use, over pynetdicom."""

    def __init__(self, root: Path, daemon_ae: str, daemon_port: int) -> None:
        self.root, self.daemon_ae, self.daemon_port = root, daemon_ae, daemon_port
        self.dicom_port = free_port()
        self.http_port = 0
        self._studies: dict[str, list[Path]] = {}
        self._stored: dict[str, list[tuple[str, str, bytes]]] = {}  # study: (series, modality)
        self._lock = threading.Lock()
        self._server: Any = None

    @staticmethod
    def available() -> bool:
        return True

    def start(self) -> None:
        """Listen for the daemon's SEG and SR on loopback."""
        ae = AE(ae_title=ORTHANC_AE)
        ae.supported_contexts = AllStoragePresentationContexts
        handlers: list[Any] = [(evt.EVT_C_STORE, self._store)]
        self._server = ae.start_server(
            ("127.0.0.1", self.dicom_port), block=False, evt_handlers=handlers
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()

    def _store(self, event: Any) -> int:
        ds = event.dataset
        ds.file_meta = event.file_meta
        with self._lock:
            stored = self._stored.setdefault(str(ds.StudyInstanceUID), [])
            stored.append((str(ds.SeriesInstanceUID), str(ds.Modality), event.encoded_dataset()))
        return 0x0000

    def upload(self, files: list[Path]) -> str:
        uid = str(dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        self._studies[uid] = files
        return uid

    def push_to_daemon(self, study: str) -> dict[str, Any]:
        """Send the study on one association, TCP_NODELAY on (PEERS.md)."""
        ae = AE(ae_title=ORTHANC_AE)
        ae.requested_contexts = StoragePresentationContexts[:127]
        assoc = ae.associate("127.0.0.1", self.daemon_port, ae_title=self.daemon_ae)
        if not assoc.is_established:
            raise RuntimeError("the daemon refused the association")
        raw = assoc.dul.socket.socket if assoc.dul.socket is not None else None
        if raw is not None:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        failed = 0
        try:
            for path in self._studies[study]:
                status = assoc.send_c_store(path)
                failed += int(getattr(status, "Status", 0xC000) != 0x0000)
        finally:
            assoc.release()
        return {"InstancesCount": len(self._studies[study]), "FailedInstancesCount": failed}

    def get(self, path: str) -> Any:
        """Only ``/studies/{id}/series``, shaped as Orthanc answers it."""
        study = path.split("/")[2]
        with self._lock:
            stored = list(self._stored.get(study, []))
        series: dict[str, dict[str, Any]] = {}
        for i, (series_uid, modality, _) in enumerate(stored):
            entry = series.setdefault(
                series_uid, {"MainDicomTags": {"Modality": modality}, "Instances": []}
            )
            entry["Instances"].append(f"{study}/{i}")
        return list(series.values())

    def file(self, instance: str) -> bytes:
        study, index = instance.rsplit("/", 1)
        with self._lock:
            return self._stored[study][int(index)][2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    turnaround.add_arguments(parser)
    args = parser.parse_args()
    if args.json is None and os.environ.get("OUT"):
        args.json = Path(os.environ["OUT"]) / "turnaround.json"
    try:
        return turnaround.run(args, PynetdicomPacs)  # type: ignore[arg-type]
    except Exception as exc:  # one clear line last, after the traceback
        import traceback

        traceback.print_exc()
        print(f"headline: turnaround not measured: {type(exc).__name__}: {str(exc)[-300:]}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
