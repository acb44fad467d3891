"""Takes phantom studies and gives the daemon's capacity (studies/hour, slices/s) and, for a
mixed-priority stream at a fraction of it, the deadline misses of each class.

`imaging-ai bench sustained --studies 20 --slices 120`: first a backlog of ``--capacity-studies``
studies sent at once measures capacity (steady rate: studies finished between the first and the
last result); then ``--studies`` studies arrive at ``--load`` (default 80%) of that rate, Poisson
arrivals, classes drawn urgent/inpatient/outpatient by ``--mix``. Each study is a copy of a
phantom of its class with new UIDs, sent by DCMTK storescu to the daemon (as a modality or PACS
would); results go to Orthanc and the stand-in RIS (`imaging_ai_devkit.bench.stack`). A miss is the
daemon's own: results ready after the study's deadline (completion + the class's SLA).

How the copies are made and sent, and which PACS takes the results, is a `Sender`: the default
above, or what a script brings (benchmarks/device/sustained.py: pynetdicom where there is no DCMTK
or Orthanc). ``--budget`` stops sending the stream past that many seconds and reports the
studies sent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import pydicom
from pydicom.uid import generate_uid

from imaging_ai import progress as bars
from imaging_ai.stats import quantile
from imaging_ai_devkit.bench.harness import describe_filesystem
from imaging_ai_devkit.bench.orthanc import OrthancPacs
from imaging_ai_devkit.bench.schedule import make_study
from imaging_ai_devkit.bench.stack import PRIORITY_ORDER, Hospital, HospitalOptions
from imaging_ai_devkit.bench.stages import job_times

# One copy to make: the phantom's files, the folder for the copy, its accession number.
CopyJob = tuple[list[Path], Path, str]
# A study to send: its files and its Study Instance UID.
Copied = tuple[list[Path], str]


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


@dataclass(frozen=True)
class Sending:
    """One study's send, from the first instance out to the sender's return (monotonic)."""

    slices: int
    started: float
    ended: float


def copy_each(jobs: Sequence[CopyJob]) -> list[Copied]:
    """Make the copies one after the other, in this process."""
    return [copy_study(job) for job in jobs]


def copy_study(job: CopyJob) -> Copied:
    """One copy (a module-level function, so that a process pool can run it)."""
    return _copy(*job)


def storescu(hospital: Hospital, files: list[Path]) -> None:
    """Send a study with DCMTK storescu, as a modality would."""
    hospital.daemon.send(files)


@dataclass(frozen=True)
class Sender:
    """How the studies reach the daemon and where its results go.

    ``copy_all`` makes the re-UID'd copies of the phantoms; ``send`` sends one study on one
    association and returns when it is sent; ``pacs`` makes the PACS that takes the SEG and SR
    (see `Hospital`).
    """

    copy_all: Callable[[Sequence[CopyJob]], list[Copied]] = copy_each
    send: Callable[[Hospital, list[Path]], None] = storescu
    pacs: Callable[[Path, str, int], OrthancPacs] = OrthancPacs
    name: str = "DCMTK storescu"


@dataclass
class _Run:
    """What a stream records while it runs: what went out, and each send's times."""

    sent: list[Sent] = field(default_factory=list)
    sendings: list[Sending] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `imaging-ai bench sustained`."""
    parser.add_argument("--studies", type=int, default=20, help="studies in the stream")
    parser.add_argument("--slices", type=int, default=120, help="slices per study")
    parser.add_argument("--capacity-studies", type=int, default=6, help="backlog for capacity")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of capacity (0.8)")
    parser.add_argument("--mix", default="0.2,0.3,0.5", help="urgent,inpatient,outpatient")
    parser.add_argument("--seed", type=int, default=1, help="arrivals and classes")
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds to wait for results once sent"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="stop sending the stream past this many s (0: none)",
    )
    parser.add_argument("--json", type=Path, help="write the figures and each study's outcome")
    bars.add_argument(parser)


def run(args: argparse.Namespace, sender: Sender | None = None) -> int:
    """Run the benchmark and print the table; the last line starts with headline:.

    ``sender`` makes the copies, sends them and makes the PACS; DCMTK and Orthanc by default.
    """
    sender = sender or Sender()
    # Scripts that parse their own options (benchmarks/device/sustained.py) may have no
    # --progress: the terminal rule then.
    force: bool | None = getattr(args, "progress", None)
    started = time.monotonic()
    stop_at = started + args.budget if args.budget else float("inf")
    rng = random.Random(args.seed)
    weights = [float(w) for w in str(args.mix).split(",")]
    with tempfile.TemporaryDirectory(prefix="imaging-ai-bench-sustained-") as tmp:
        work = Path(tmp)
        bases = _phantoms(work / "base", args.slices)
        classes = rng.choices(PRIORITY_ORDER, weights, k=args.capacity_studies + args.studies)
        jobs = [(bases[p], work / "send" / f"{n}", f"SUS-{n}") for n, p in enumerate(classes)]
        copies = sender.copy_all(jobs)
        print(
            f"prepared {len(copies)} studies of {args.slices} slices "
            f"({time.monotonic() - started:.0f} s); data on {describe_filesystem(work)}",
            flush=True,
        )
        options = HospitalOptions(1.0, 1.0, 0.2, log_level="WARNING")
        with Hospital(work / "hospital", options, sender.pacs) as hospital:
            backlog = list(zip(classes, copies, strict=True))[: args.capacity_studies]
            print(f"capacity: a backlog of {len(backlog)} studies at once", flush=True)
            first_run = _Run()
            first = _run_stream(
                hospital,
                sender,
                backlog,
                [0.0] * len(backlog),
                args.timeout,
                first_run,
                desc="capacity",
                force=force,
            )
            capacity = _rate(first)
            print(
                f"capacity: {capacity * 3600:.0f} studies/hour ({sender_line(first_run, first)})",
                flush=True,
            )
            rate = capacity * args.load
            gaps = [rng.expovariate(rate) for _ in range(args.studies)]
            stream = list(zip(classes, copies, strict=True))[args.capacity_studies :]
            print(
                f"stream: {args.studies} studies at {rate * 3600:.0f}/hour "
                f"({args.load:.0%} of capacity), about {sum(gaps) / 60:.1f} min",
                flush=True,
            )
            start = time.monotonic()
            stream_run = _Run()
            outcomes = _run_stream(
                hospital, sender, stream, gaps, args.timeout, stream_run, stop_at, force=force
            )
            window = time.monotonic() - start
    if len(outcomes) < len(stream):
        print(f"budget of {args.budget:g} s: {len(outcomes)} of {len(stream)} studies sent")
    _print(args, capacity, rate, outcomes, window)
    print(f"sender ({sender.name}): {sender_line(stream_run, outcomes)}")
    line = headline(args, capacity, outcomes, window)
    if args.json:
        _write_json(args, line, capacity, rate, window, {"backlog": first, "stream": outcomes})
    print(line, flush=True)
    return 0


def _phantoms(out: Path, slices: int) -> dict[str, list[Path]]:
    """One phantom study of each class, generated side by side (a subprocess each)."""
    with ThreadPoolExecutor(len(PRIORITY_ORDER)) as pool:
        made = {
            p: pool.submit(make_study, out / p, 7500 + i, slices, p, f"BASE-{p[:3].upper()}")
            for i, p in enumerate(PRIORITY_ORDER)
        }
        return {p: future.result() for p, future in made.items()}


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
    sender: Sender,
    studies: Sequence[tuple[str, Copied]],
    gaps: list[float],
    timeout_s: float,
    record: _Run,
    stop_at: float = float("inf"),
    *,
    desc: str = "stream",
    force: bool | None = None,
) -> list[Outcome]:
    """Send the studies in the background while collecting their results as they come.

    A bar of the results, labelled ``desc``, on stderr: drawn or not as ``force`` says, or
    where stderr is a terminal (None).
    """
    thread = threading.Thread(
        target=_send_all, args=(hospital, sender, studies, gaps, record, stop_at)
    )
    thread.start()
    try:
        with bars.progress(total=len(studies), desc=desc, unit="study", force=force) as results:
            return _collect(hospital, record, timeout_s, len(studies), results.update)
    finally:
        thread.join()


def _send_all(
    hospital: Hospital,
    sender: Sender,
    studies: Sequence[tuple[str, Copied]],
    gaps: list[float],
    record: _Run,
    stop_at: float,
) -> None:
    """Send each study after its gap, each on its own association (not waiting for the last);
    none once ``stop_at`` (monotonic) has passed."""
    threads = []
    try:
        for (priority, (files, uid)), gap in zip(studies, gaps, strict=True):
            time.sleep(gap)
            if time.monotonic() > stop_at:
                break
            thread = threading.Thread(
                target=_send_and_remove, args=(hospital, sender, files, record)
            )
            thread.start()
            threads.append(thread)
            record.sent.append(Sent(priority, uid, len(files), time.monotonic()))
        for thread in threads:
            thread.join()
    finally:
        record.done.set()


def _send_and_remove(hospital: Hospital, sender: Sender, files: list[Path], record: _Run) -> None:
    start = time.monotonic()
    sender.send(hospital, files)
    record.sendings.append(Sending(len(files), start, time.monotonic()))
    shutil.rmtree(files[0].parent, ignore_errors=True)


def _collect(
    hospital: Hospital,
    record: _Run,
    timeout_s: float,
    planned: int,
    done: Callable[[], object] = lambda: None,
) -> list[Outcome]:
    """Wait for the results of every study sent, until the sender is done and ``timeout_s``
    after; report progress (of ``planned``) as they finish, a line each and ``done()``."""
    outcomes: list[Outcome] = []
    seen: set[str] = set()
    start = time.monotonic()
    deadline = float("inf")
    while not record.done.is_set() or len(outcomes) < len(record.sent):
        if record.done.is_set() and deadline == float("inf"):
            deadline = time.monotonic() + timeout_s
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(record.sent) - len(outcomes)} studies without results {timeout_s} s "
                "after the last was sent"
            )
        sent = list(record.sent)
        pending = {s.uid: s for s in sent if s.uid not in seen}
        for uid, s in pending.items():
            state = hospital.state(uid)
            if state == "failed":
                raise RuntimeError(f"study {uid} failed: {hospital.daemon.study(uid)['error']}")
            if state == "done":
                outcomes.append(_outcome(hospital, s))
                seen.add(uid)
                o = outcomes[-1]
                bars.echo(
                    f"  [{time.monotonic() - start:5.0f} s] {len(outcomes)}/{planned} done: "
                    f"{o.priority}, {o.turnaround_s:.1f} s{' MISSED' if o.missed else ''}"
                )
                done()
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


def sender_line(record: _Run, outcomes: list[Outcome]) -> str:
    """How fast the studies went out, against how long their results took: whether the sender
    could have held the daemon back."""
    if not record.sendings or not outcomes:
        return "nothing sent"
    seconds = [s.ended - s.started for s in record.sendings]
    rates = [s.slices / max(s.ended - s.started, 1e-6) for s in record.sendings]
    span = max(s.ended for s in record.sendings) - min(s.started for s in record.sendings)
    finished = sorted(o.finished_at for o in outcomes)
    results = (finished[-1] - finished[0]).total_seconds()
    return (
        f"{len(seconds)} studies sent over {span:.1f} s, p50 {quantile(seconds, 0.5):.1f} s "
        f"and {quantile(rates, 0.5):.0f} slices/s a study, at most {_most_at_once(record)} at "
        f"once; results from first to last over {results:.1f} s"
    )


def _most_at_once(record: _Run) -> int:
    events = sorted(
        [(s.started, 1) for s in record.sendings] + [(s.ended, -1) for s in record.sendings]
    )
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _write_json(
    args: argparse.Namespace,
    line: str,
    capacity: float,
    rate: float,
    window: float,
    runs: dict[str, list[Outcome]],
) -> None:
    figures = {
        "headline": line,
        "args": vars(args),
        "capacity_studies_per_hour": capacity * 3600,
        "capacity_slices_per_s": capacity * args.slices,
        "offered_studies_per_hour": rate * 3600,
        "stream_window_s": window,
    }
    studies = {name: [asdict(o) for o in outcomes] for name, outcomes in runs.items()}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({**figures, **studies}, default=str, indent=1))


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
    backend = os.environ.get("IMAGING_AI_ENGINES__BACKEND", "onnxruntime-cpu")
    print(f"sustained: {args.slices}-slice studies, {backend}")
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
                f"{priority:<12} {len(mine):>8} {quantile(t, 0.5):>7.1f} "
                f"{quantile(t, 0.95):>7.1f} {misses:>16}"
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
