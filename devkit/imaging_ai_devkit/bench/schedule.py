"""Takes phantom studies and gives the urgent study's turnaround under load vs idle, and misses.

`imaging-ai bench schedule --studies 10 --slices 120`: an urgent study alone on an idle daemon,
then N outpatient studies followed by the same urgent study on a loaded daemon (same run, same
machine). The figure is the time from the study's completion of receive (`completed_at`) to its
report (`created_at`): what a radiologist waits for once PACS has sent everything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from imaging_ai import progress as bars
from imaging_ai_devkit.bench.harness import DaemonProcess

FAST_ASSEMBLY = "[assemble]\nseries_idle_s = 1.0\nstudy_idle_s = 1.0\npoll_s = 0.2\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `imaging-ai bench schedule`."""
    parser.add_argument("--studies", type=int, default=10, help="outpatient studies of the load")
    parser.add_argument("--slices", type=int, default=120, help="slices per phantom study")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for results")
    bars.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print the table; the last line starts with headline:."""
    force = args.progress
    with tempfile.TemporaryDirectory(prefix="imaging-ai-bench-schedule-") as tmp:
        work = Path(tmp)
        # Bars on stderr: the phantoms made, then the reports back (the urgent study idle, then
        # the backlog and the urgent study behind it).
        with bars.progress(
            total=args.studies + 1, desc="phantoms", unit="study", force=force
        ) as made:
            urgent = make_study(work / "urgent", 9000, args.slices, "urgent", "URGENT-1")
            made.update()
            load = []
            for i in range(args.studies):
                load.append(
                    make_study(work / f"out{i}", 9100 + i, args.slices, "outpatient", f"OUT-{i}")
                )
                made.update()
        with bars.progress(
            total=args.studies + 2, desc="schedule", unit="report", force=force
        ) as back:
            idle = _idle_run(work / "idle", urgent, args.timeout, back.update)
            loaded, misses = _loaded_run(work / "loaded", load, urgent, args.timeout, back.update)
    _print(args, idle, loaded, misses)
    return 0


def make_study(out: Path, seed: int, slices: int, priority: str, accession: str) -> list[Path]:
    """Write a phantom study and return its files."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "imaging_ai",
            "phantom",
            str(out),
            "--slices",
            str(slices),
            "--seed",
            str(seed),
            "--priority",
            priority,
            "--accession",
            accession,
            "--nodules",
            "3",
            # The caller's bar counts the phantoms; none of the subprocess's own on its stderr.
            "--no-progress",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return sorted((out / "dicom").glob("*.dcm"))


def study_uid_of(files: list[Path]) -> str:
    """The Study Instance UID of a study's files."""
    import pydicom

    return str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)


def results_seconds(daemon: DaemonProcess, uid: str, timeout_s: float) -> float:
    """Wait for a study's report; return completed_at → report created_at in seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            report = daemon.get(f"/api/v1/reports/{uid}")
        except urllib.error.HTTPError:
            time.sleep(0.2)
            continue
        study = daemon.study(uid)
        return (_when(report["created_at"]) - _when(study["completed_at"])).total_seconds()
    raise RuntimeError(f"no report for {uid} within {timeout_s} s:\n{daemon.log()[-2000:]}")


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _idle_run(
    root: Path, urgent: list[Path], timeout_s: float, done: Callable[[], object] = lambda: None
) -> float:
    """The urgent study alone; ``done`` is called once its report is back."""
    daemon = DaemonProcess(root, FAST_ASSEMBLY)
    daemon.start()
    try:
        daemon.send(urgent)
        seconds = results_seconds(daemon, study_uid_of(urgent), timeout_s)
        done()
        return seconds
    finally:
        daemon.stop()


def _loaded_run(
    root: Path,
    load: list[list[Path]],
    urgent: list[Path],
    timeout_s: float,
    done: Callable[[], object] = lambda: None,
) -> tuple[float, dict[str, tuple[int, int]]]:
    """The backlog, then the urgent study; ``done`` is called as each report is back."""
    daemon = DaemonProcess(root, FAST_ASSEMBLY)
    daemon.start()
    try:
        senders = [threading.Thread(target=daemon.send, args=(files,)) for files in load]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        # The backlog is queued and running; the urgent study arrives now.
        daemon.send(urgent)
        seconds = results_seconds(daemon, study_uid_of(urgent), timeout_s)
        done()
        for files in load:
            results_seconds(daemon, study_uid_of(files), timeout_s)
            done()
        return seconds, _deadline_misses(daemon)
    finally:
        daemon.stop()


def _deadline_misses(daemon: DaemonProcess) -> dict[str, tuple[int, int]]:
    """Per class: (studies, reports later than the deadline)."""
    out: dict[str, tuple[int, int]] = {}
    for study in daemon.studies():
        report = daemon.get(f"/api/v1/reports/{study['study_uid']}")
        late = _when(report["created_at"]) > _when(study["deadline"])
        total, missed = out.get(study["priority"], (0, 0))
        out[study["priority"]] = (total + 1, missed + int(late))
    return out


def _print(
    args: argparse.Namespace, idle: float, loaded: float, misses: dict[str, tuple[int, int]]
) -> None:
    print()
    print(f"schedule: {args.studies} outpatient studies then 1 urgent, {args.slices} slices each,")
    print("CPU path (ONNX Runtime), completion of receive -> report")
    print(f"{'urgent study':<24} {'seconds':>8}")
    print(f"{'idle daemon':<24} {idle:>8.1f}")
    print(f"{'behind the backlog':<24} {loaded:>8.1f}")
    print(f"{'class':<12} {'studies':>8} {'deadline misses':>16}")
    for cls, (total, missed) in sorted(misses.items()):
        print(f"{cls:<12} {total:>8} {missed:>16}")
    print(
        f"headline: urgent study under load at {loaded / idle:.2f}x its idle turnaround "
        f"({loaded:.1f} s vs {idle:.1f} s)"
    )
