#!/usr/bin/env python3
"""A real run of one real CT case through the daemon, and what came back, read independently.

Starts DCMTK's ``storescp`` as the PACS, an MLLP listener as the RIS and the daemon
(``imaging-ai serve``, ONNX Runtime CPU, the shipped models) on loopback; sends the case's DICOM
series with ``storescu``; waits for the SEG and SR in the PACS's folder and the ORU at the RIS;
then prints what each carries: the SR's findings and certainty read back by DCMTK's ``dsrdump``,
the ORU's OBX segments, and the FHIR bundle's Observations (from the daemon's results folder).
Nothing leaves the machine. ::

    python scripts/fetch_real_ct.py /work/realct/cases
    .venv/bin/python scripts/real_ct_run.py /work/realct/cases/dev/lidc-idri-0001 --out /tmp/run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from imaging_ai_devkit.bench.harness import DaemonProcess, free_port
from imaging_ai_devkit.mllp_listener import RisListener


def wait_for(what: str, test: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if test():  # type: ignore[operator]
            return
        time.sleep(1.0)
    raise SystemExit(f"{what} did not arrive within {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", type=Path, help="a case folder with image/ (DICOM)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    pacs_dir, pacs_port = args.out / "pacs", free_port()
    pacs_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TCP_NODELAY": "1"}
    storescp = subprocess.Popen(
        ["storescp", "-aet", "PACS", "-od", str(pacs_dir), "-dhl", str(pacs_port)], env=env
    )
    ris = RisListener().start()
    host, port = ris.address
    daemon = DaemonProcess(
        args.out / "daemon",
        extra=(
            f'[outputs]\npacs = [{{ae_title = "PACS", host = "127.0.0.1", port = {pacs_port}}}]\n'
            f'ris = [{{host = "{host}", port = {port}}}]\n'
        ),
    )
    try:
        daemon.start(timeout_s=180)
        files = sorted(str(p) for p in (args.case / "image").rglob("*.dcm"))
        subprocess.run(
            ["storescu", "-aec", "IMAGING_AI", "127.0.0.1", str(daemon.dicom_port), *files],
            env=env,
            check=True,
        )
        started = time.monotonic()
        wait_for("SEG and SR at the PACS", lambda: len(list(pacs_dir.iterdir())) >= 2, args.timeout)
        wait_for("ORU at the RIS", lambda: bool(ris.received), args.timeout)
        print(f"results at PACS and RIS {time.monotonic() - started:.1f} s after the send")
        report(pacs_dir, ris.received[0], daemon.data_dir)
    finally:
        daemon.stop()
        ris.stop()
        storescp.terminate()


def report(pacs_dir: Path, oru: str, data_dir: Path) -> None:
    """What the SR, the ORU and the FHIR bundle say about the findings."""
    sr = next(p for p in pacs_dir.iterdir() if p.name.startswith("SR"))
    dump = subprocess.run(["dsrdump", str(sr)], capture_output=True, text=True).stdout
    print("== SR (dsrdump), finding groups and certainty:")
    for line in dump.splitlines():
        if any(k in line for k in ("Finding", "Certainty", "Long Axis", "Comment", "Impression")):
            print("  ", line.strip()[:160])
    print("== ORU OBX/NTE:")
    for segment in oru.replace("\n", "\r").split("\r"):
        if segment.startswith(("OBX", "NTE")):
            print("  ", segment[:160])
    bundle = json.loads(next(data_dir.glob("results/*/*/fhir.json")).read_text())
    print("== FHIR Observations:")
    for entry in bundle["entry"]:
        res = entry["resource"]
        if res["resourceType"] == "Observation":
            parts = [
                f"{c['code']['coding'][0]['display']}={c.get('valueQuantity', {}).get('value')}"
                for c in res.get("component", [])
            ]
            print("  ", res["code"]["coding"][0].get("display"), "; ".join(parts)[:160])
        if res["resourceType"] == "DiagnosticReport":
            print("   conclusion:", res.get("conclusion", "")[:300])


if __name__ == "__main__":
    sys.exit(main())
