"""Takes phantom studies and gives the daemon's capacity (studies/hour, slices/s) and, for a
mixed-priority stream at a fraction of it, the deadline misses of each class.

`imaging-ai bench sustained --studies 20 --slices 120`: first a backlog of ``--capacity-studies``
studies sent at once measures capacity (steady rate: studies finished between the first and the
last result); then ``--studies`` studies arrive at ``--load`` (default 80%) of that rate, Poisson
arrivals, classes drawn urgent/inpatient/outpatient by ``--mix``. Each study is a copy of a
phantom of its class with new UIDs, sent by DCMTK storescu to the daemon (as a modality or PACS
would); results go to Orthanc and the stand-in RIS (`imaging_ai.bench.stack`). A miss is the
daemon's own: results ready after the study's deadline (completion + the class's SLA).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pydicom
from pydicom.uid import generate_uid

from imaging_ai.bench.schedule import make_study
from imaging_ai.bench.stack import PRIORITY_ORDER, Hospital, HospitalOptions
from imaging_ai.bench.stages import job_times
from imaging_ai.bench.turnaround import percentile


@dataclass(frozen=True)
class Sent:
    """One study of a run: its class, UID, slice count and when it went out (monotonic)."""

    priority: str
    uid: str
    slices: int
    sent_at: float


@dataclass(frozen=True)
class Outcome:
    """A finished study as the daemon recorded it."""

    priority: str
    slices: int
    turnaround_s: float  # completion -> results ready, what the SLA counts
    missed: bool
    finished_at: datetime
    started_at: datetime


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `imaging-ai bench sustained`."""
    parser.add_argument("--studies", type=int, default=20, help="studies in the stream")
    parser.add_argument("--slices", type=int, default=120, help="slices per study")
    parser.add_argument("--capacity-studies", type=int, default=6, help="backlog for capacity")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of capacity (0.8)")
    parser.add_argument("--mix", default="0.2,0.3,0.5", help="urgent,inpatient,outpatient")
    parser.add_argument("--seed", type=int, default=1, help="arrivals and classes")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for results")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print the table; the last line starts with headline:."""
    rng = random.Random(args.seed)
    weights = [float(w) for w in str(args.mix).split(",")]
    with tempfile.TemporaryDirectory(prefix="imaging-ai-bench-sustained-") as tmp:
        work = Path(tmp)
        bases = {
            p: make_study(work / "base" / p, 7500 + i, args.slices, p, f"BASE-{p[:3].upper()}")
            for i, p in enumerate(PRIORITY_ORDER)
        }
        classes = rng.choices(PRIORITY_ORDER, weights, k=args.capacity_studies + args.studies)
        copies = [
            _copy(bases[p], work / "send" / f"{n}", f"SUS-{n}") for n, p in enumerate(classes)
        ]
        print(f"prepared {len(copies)} studies of {args.slices} slices", flush=True)
        options = HospitalOptions(1.0, 1.0, 0.2, log_level="WARNING")
        with Hospital(work / "hospital", options) as hospital:
            backlog = list(zip(classes, copies, strict=True))[: args.capacity_studies]
            print(f"capacity: a backlog of {len(backlog)} studies at once", flush=True)
            first = _run_stream(hospital, backlog, [0.0] * len(backlog), args.timeout)
            capacity = _rate(first)
            print(f"capacity: {capacity * 3600:.0f} studies/hour", flush=True)
            rate = capacity * args.load
            gaps = [rng.expovariate(rate) for _ in range(args.studies)]
            stream = list(zip(classes, copies, strict=True))[args.capacity_studies :]
            print(
                f"stream: {args.studies} studies at {rate * 3600:.0f}/hour "
                f"({args.load:.0%} of capacity), about {sum(gaps) / 60:.1f} min",
                flush=True,
            )
            start = time.monotonic()
            outcomes = _run_stream(hospital, stream, gaps, args.timeout)
            window = time.monotonic() - start
    _print(args, capacity, rate, outcomes, window)
    print(headline(args, capacity, outcomes, window))
    return 0


def _copy(base: list[Path], out: Path, accession: str) -> tuple[list[Path], str]:
    """The base study with new Study, Series and SOP Instance UIDs and accession; its UID."""
    out.mkdir(parents=True)
    study, series = generate_uid(), generate_uid()
    for path in base:
        ds = pydicom.dcmread(path)
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.AccessionNumber = accession
        ds.save_as(out / path.name, enforce_file_format=True)
    return sorted(out.glob("*.dcm")), study


def _run_stream(
    hospital: Hospital,
    studies: Sequence[tuple[str, tuple[list[Path], str]]],
    gaps: list[float],
    timeout_s: float,
) -> list[Outcome]:
    """Send the studies in the background while collecting their results as they come."""
    sent: list[Sent] = []
    sender = threading.Thread(target=_send_all, args=(hospital, studies, gaps, sent))
    sender.start()
    try:
        return _collect(hospital, sent, len(studies), timeout_s)
    finally:
        sender.join()


def _send_all(
    hospital: Hospital,
    studies: Sequence[tuple[str, tuple[list[Path], str]]],
    gaps: list[float],
    sent: list[Sent],
) -> None:
    """Send each study after its gap, each on its own association (not waiting for the last)."""
    threads = []
    for (priority, (files, uid)), gap in zip(studies, gaps, strict=True):
        time.sleep(gap)
        thread = threading.Thread(target=_send_and_remove, args=(hospital, files))
        thread.start()
        threads.append(thread)
        sent.append(Sent(priority, uid, len(files), time.monotonic()))
    for thread in threads:
        thread.join()


def _send_and_remove(hospital: Hospital, files: list[Path]) -> None:
    hospital.daemon.send(files)
    shutil.rmtree(files[0].parent, ignore_errors=True)


def _collect(hospital: Hospital, sent: list[Sent], count: int, timeout_s: float) -> list[Outcome]:
    """Wait for ``count`` studies' results as ``sent`` fills; report progress as they finish."""
    deadline = time.monotonic() + timeout_s
    outcomes: list[Outcome] = []
    seen: set[str] = set()
    start = time.monotonic()
    while len(outcomes) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{count - len(outcomes)} studies without results after {timeout_s} s"
            )
        pending = {s.uid: s for s in list(sent) if s.uid not in seen}
        for uid, s in pending.items():
            state = hospital.state(uid)
            if state == "failed":
                raise RuntimeError(f"study {uid} failed: {hospital.daemon.study(uid)['error']}")
            if state == "done":
                outcomes.append(_outcome(hospital, s))
                seen.add(uid)
                o = outcomes[-1]
                print(
                    f"  [{time.monotonic() - start:5.0f} s] {len(outcomes)}/{count} done: "
                    f"{o.priority}, {o.turnaround_s:.1f} s{' MISSED' if o.missed else ''}",
                    flush=True,
                )
        time.sleep(0.5)
    return outcomes


def _outcome(hospital: Hospital, sent: Sent) -> Outcome:
    started, finished, completed, deadline = job_times(hospital.database_url, sent.uid)
    return Outcome(
        sent.priority,
        sent.slices,
        (finished - completed).total_seconds(),
        finished > deadline,
        finished,
        started,
    )


def _rate(outcomes: list[Outcome]) -> float:
    """Studies per second between the first and the last result (steady state)."""
    times = sorted(o.finished_at for o in outcomes)
    if len(times) < 2:
        raise RuntimeError("capacity needs at least two studies")
    return (len(times) - 1) / (times[-1] - times[0]).total_seconds()


def _print(
    args: argparse.Namespace,
    capacity: float,
    rate: float,
    outcomes: list[Outcome],
    window: float,
) -> None:
    slices = sum(o.slices for o in outcomes)
    print()
    print(f"sustained: {args.slices}-slice studies, CPU path unless configured otherwise")
    print(
        f"capacity (backlog of {args.capacity_studies}): {capacity * 3600:.0f} studies/hour, "
        f"{capacity * args.slices:.1f} slices/s"
    )
    print(
        f"stream at {args.load:.0%}: offered {rate * 3600:.0f} studies/hour; served "
        f"{len(outcomes) / window * 3600:.0f} studies/hour, {slices / window:.1f} slices/s "
        f"over {window / 60:.1f} min"
    )
    print(f"{'class':<12} {'studies':>8} {'p50 s':>7} {'p95 s':>7} {'deadline misses':>16}")
    for priority in PRIORITY_ORDER:
        mine = [o for o in outcomes if o.priority == priority]
        if mine:
            t = [o.turnaround_s for o in mine]
            misses = sum(o.missed for o in mine)
            print(
                f"{priority:<12} {len(mine):>8} {percentile(t, 50):>7.1f} "
                f"{percentile(t, 95):>7.1f} {misses:>16}"
            )
    print("turnaround: completion of receive -> results ready, as the SLA counts it")


def headline(
    args: argparse.Namespace, capacity: float, outcomes: list[Outcome], window: float
) -> str:
    """Capacity and the misses per class at the offered load."""
    misses = ", ".join(
        f"{p} {sum(o.missed for o in outcomes if o.priority == p)}/"
        f"{sum(1 for o in outcomes if o.priority == p)}"
        for p in PRIORITY_ORDER
    )
    slices = sum(o.slices for o in outcomes)
    return (
        f"headline: capacity {capacity * 3600:.0f} studies/hour ({capacity * args.slices:.1f} "
        f"slices/s) of {args.slices}-slice studies; at {args.load:.0%} of it "
        f"({len(outcomes) / window * 3600:.0f} studies/hour, {slices / window:.1f} slices/s) "
        f"deadline misses {misses}"
    )
