#!/usr/bin/env python3
"""`make demo`: the daemon between a real PACS (Orthanc) and a stand-in RIS, on this machine.

Starts Orthanc (Debian `orthanc`) as the hospital's PACS, a stand-in RIS taking HL7 over MLLP,
and `imaging-ai serve` configured for both, all on loopback. Makes phantom studies of mixed
priority with `imaging-ai phantom`, uploads them to Orthanc over REST, has Orthanc push each one
to the daemon (`POST /modalities/imaging-ai/store`), and shows where every result arrived: SEG
and SR back in Orthanc, the ORU^R01 at the RIS, the report on the RIS API and as FHIR, the study
done on the status page; urgent first. Then it leaves everything running until Ctrl-C.

    .venv/bin/python scripts/demo.py [--studies 4] [--slices 64] [--once] [--summary FILE]

The daemon's queue is paused (an admin action, as radiology IT would during maintenance) while
the studies arrive and resumed once all of them are queued: the order in which they are then
taken and finished is the scheduler's, not the order they happened to arrive in. ``--once``
checks everything, writes the summary, stops and exits 1 if anything is missing; the end-to-end
test runs it that way.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devkit")]

from imaging_ai_devkit.bench.harness import ADMIN_TOKEN  # noqa: E402
from imaging_ai_devkit.bench.orthanc import OrthancPacs  # noqa: E402
from imaging_ai_devkit.bench.schedule import make_study  # noqa: E402
from imaging_ai_devkit.bench.stack import (  # noqa: E402
    PRIORITY_ORDER,
    Hospital,
    HospitalOptions,
    study_identity,
)
from imaging_ai_devkit.bench.stages import label, read_stages  # noqa: E402

# Study i gets PRIORITIES[i % 3]; they are sent least urgent first, so the urgent one is last in.
PRIORITIES = ("urgent", "inpatient", "outpatient")


def say(text: str) -> None:
    """One step of the demo, as it happens."""
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", flush=True)


def make_studies(root: Path, count: int, slices: int) -> list[tuple[str, str, list[Path]]]:
    """(priority, accession, files) per phantom study, least urgent first."""
    wanted = [PRIORITIES[i % len(PRIORITIES)] for i in range(count)]
    wanted.sort(key=PRIORITY_ORDER.index, reverse=True)
    studies, counts = [], dict.fromkeys(PRIORITIES, 0)
    for i, priority in enumerate(wanted):
        counts[priority] += 1
        accession = f"DEMO-{priority[0].upper()}{counts[priority]}"
        files = make_study(root / accession, 7100 + i, slices, priority, accession)
        studies.append((priority, accession, files))
        say(f"made {accession}: {priority}, {slices} slices (imaging-ai phantom)")
    return studies


def wait_for(what: str, done: Callable[[], bool], timeout_s: float) -> None:
    """Poll until ``done()``; raise with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def introduce(hospital: Hospital) -> None:
    """Where to look, and with which credentials."""
    say("running, all on 127.0.0.1:")
    for name, url in hospital.urls.items():
        print(f"    {name:<16} {url}")
    print(f"    DICOM            daemon AE IMAGING_AI port {hospital.daemon.dicom_port}; ")
    print(f"                     Orthanc AE ORTHANC port {hospital.orthanc.dicom_port}")
    print(f"    stand-in RIS     MLLP port {hospital.ris_port}")
    print(f"    token            {ADMIN_TOKEN} (role admin: API, FHIR and the admin pages;")
    print("                     in a browser sign in as 'it' with it)")
    print(f"    daemon log       {hospital.daemon.log_path}")
    print(
        f"    try: curl -H 'Authorization: Bearer {ADMIN_TOKEN}' "
        f"'http://127.0.0.1:{hospital.daemon.http_port}/api/v1/reports?accession=DEMO-U1'",
        flush=True,
    )


def run_studies(
    hospital: Hospital, studies: list[tuple[str, str, list[Path]]], timeout_s: float
) -> dict[str, Any]:
    """Upload, push with the queue paused, resume, wait; return the summary."""
    ids = {}
    for _, accession, files in studies:
        ids[accession] = hospital.upload(files)
        say(f"uploaded {accession} to Orthanc over REST ({len(files)} instances)")
    for priority in PRIORITY_ORDER:
        hospital.set_paused(priority, True)
    say("paused the daemon's queue (admin action), so every study queues before work starts")
    uids = {}
    for priority, accession, files in studies:
        uids[accession], _ = study_identity(files)
        sent = hospital.push(ids[accession])
        say(f"Orthanc pushed {accession} ({priority}) to the daemon: {sent} instances")
    wait_for(
        "the studies to be complete and queued",
        lambda: all(hospital.state(uid) == "queued" for uid in uids.values()),
        timeout_s,
    )
    say("every study is complete and queued; resuming the queue, most urgent class first")
    for priority in PRIORITY_ORDER:
        hospital.set_paused(priority, False)
    _wait_done(hospital, uids, timeout_s)
    return _summary(hospital, studies, uids, ids)


def _wait_done(hospital: Hospital, uids: dict[str, str], timeout_s: float) -> None:
    reported: set[str] = set()

    def done() -> bool:
        for accession, uid in uids.items():
            if accession not in reported and hospital.state(uid) == "done":
                reported.add(accession)
                say(f"{accession} done: results delivered to Orthanc and the RIS")
        return len(reported) == len(uids)

    wait_for("the studies' results", done, timeout_s)


def _summary(
    hospital: Hospital,
    studies: list[tuple[str, str, list[Path]]],
    uids: dict[str, str],
    ids: dict[str, str],
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for priority, accession, files in studies:
        results = hospital.results(uids[accession], accession, ids[accession])
        stages = read_stages(hospital.database_url, uids[accession])
        rows.append(
            {
                "priority": priority,
                "slices": len(files),
                "results": asdict(results),
                "problems": results.problems(),
                "finished_at": results.api_reports[0]["created_at"] if results.api_reports else "",
                "turnaround_s": stages.turnaround_s,
                "stages_s": stages.stages,
            }
        )
    order = sorted(rows, key=lambda r: str(r["finished_at"]) or "~")
    urgent_first = bool(order) and order[0]["priority"] == "urgent"
    problems = [f"{r['results']['accession']}: {p}" for r in rows for p in r["problems"]]
    if not urgent_first:
        problems.append("the urgent study did not finish first")
    return {
        "studies": rows,
        "finish_order": [(r["results"]["accession"], r["priority"]) for r in order],
        "urgent_first": urgent_first,
        "problems": problems,
    }


def show(summary: dict[str, Any]) -> None:
    """What arrived where, and where each study's time went."""
    print()
    print(f"{'study':<10} {'class':<11} {'SEG':>3} {'SR':>3} {'ORU':>3} {'API':>3} {'FHIR':>4}")
    for row in summary["studies"]:
        r: dict[str, Any] = row["results"]
        print(
            f"{r['accession']:<10} {row['priority']:<11} {len(r['seg_labels']):>3} "
            f"{len(r['sr_study_uids']):>3} {r['oru_messages']:>3} {len(r['api_reports']):>3} "
            f"{r['fhir_matches']:>4}   status page: {r['admin_state']}"
        )
    print()
    print("last instance in -> SEG+SR stored in Orthanc, by stage (s):")
    for row in summary["studies"]:
        parts = ", ".join(f"{label(k)} {v:.1f}" for k, v in row["stages_s"].items() if v >= 0.05)
        print(f"  {row['results']['accession']}: {row['turnaround_s']:.1f} s = {parts}")
    order = " then ".join(f"{a} ({p})" for a, p in summary["finish_order"])
    print(f"finished: {order}")
    problems = summary["problems"]
    print("all results arrived" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems))


def wait_for_interrupt() -> None:
    """Block until Ctrl-C or SIGTERM."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    say("everything keeps running; look around at the addresses above. Ctrl-C stops it.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print()


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when every result arrived (and, urgent first)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--studies", type=int, default=4, help="phantom studies (default 4)")
    parser.add_argument("--slices", type=int, default=64, help="slices per study (default 64)")
    parser.add_argument("--once", action="store_true", help="check, stop and exit")
    parser.add_argument("--workdir", type=Path, help="folder for everything (default: temporary)")
    parser.add_argument("--summary", type=Path, help="write what was checked as JSON here")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait per step")
    args = parser.parse_args(argv)
    if not OrthancPacs.available():
        print("the demo needs Orthanc: apt-get install orthanc (make deps-system)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="imaging-ai-demo-") as tmp:
        root = args.workdir or Path(tmp)
        studies = make_studies(root / "studies", args.studies, args.slices)
        # Batches of 8 slices: an urgent study's slices overtake the others' every 8 slices
        # (preemption is at batch boundaries) instead of once per 32-slice batch.
        hospital = Hospital(root, HospitalOptions(engines="max_batch_size = 8"))
        say("starting Orthanc (PACS), the stand-in RIS and imaging-ai serve")
        summary: dict[str, Any] = {}
        try:
            hospital.start()
            introduce(hospital)
            summary = run_studies(hospital, studies, args.timeout)
            show(summary)
            if not args.once:
                wait_for_interrupt()
        finally:
            say("stopping the daemon, Orthanc and the RIS")
            hospital.stop()
        summary["daemon_exit"] = hospital.daemon_exit
        if args.summary:
            args.summary.write_text(json.dumps(summary, indent=2, default=str))
    return 0 if not summary.get("problems") and hospital.daemon_exit == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
