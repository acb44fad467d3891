"""Takes a CT study and gives images/s into the daemon vs DCMTK storescp, 1 and N associations.

The servers are run in rounds (storescp, tuned storescp, imaging-ai, then again), and each
round's ratio is taken between its own runs: the machine's speed drifts by more than the
difference being measured (docs/benchmarks.md, "Ingest"). Every server gets the same pause between
being ready and its first image, so each writes into memory in the same state (see
``SETTLE_S``).

With ``--orthanc``, Debian's Orthanc runs in each round too (before imaging-ai): a PACS that
indexes every instance it receives, a reference that keeps more than files.

Every run's output is kept until the whole benchmark ends, and the disk is synced after each
run and given ``--quiet-s`` to go quiet (outside any timing), so that no server writes while
an earlier run's files are written back or pays for their deletion. On ext4 without a
journal, creating a file steps over every inode freed in the last minute or more: deleting
each run's output at once slowed the next server's file creation, storescp's most
(CHANGELOG.md, 2026-12-01, "Ingest with the corrected harness"). The table names the filesystem
the runs wrote to.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from imaging_ai import progress as bars
from imaging_ai_devkit.bench.harness import CALLED_AE, describe_filesystem, free_port
from imaging_ai_devkit.bench.orthanc import ORTHANC_AE, OrthancPacs

CALLING_AE = "STORESCU"
# Seconds between a server being ready and its first image, the same for every server. A
# virtual machine that hands idle memory back to its host (virtio-balloon free page
# reporting, two seconds after it is freed) makes the first write to such a page cost a
# fault on the host: a server started slowly (the daemon) wrote into returned memory while
# one started at once (storescp) reused the pages its previous run had just freed.
SETTLE_S = 3.0
# Seconds to wait after syncing the disk between runs. The sync returns once this guest has
# written its data, but the virtual disk behind it can take longer to go quiet: with a 3 s
# pause the daemon, which fsyncs, received 300-371 img/s with four associations after a
# storescp run's sync; with 20 s, 387-484 (CHANGELOG.md, 2026-12-01, "Ingest with the corrected
# harness").
QUIET_S = 15.0
# Free space left over once every run's output is kept (the daemon's database, the phantom).
_DISK_MARGIN = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `imaging-ai bench ingest`."""
    parser.add_argument("--study", type=Path, help="folder of DICOM files (default: a phantom)")
    parser.add_argument("--slices", type=int, default=300, help="phantom slices (default 300)")
    parser.add_argument("--studies", type=int, default=1, help="studies sent per run")
    parser.add_argument("--associations", default="1,4", help="comma-separated counts")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; medians reported")
    parser.add_argument(
        "--orthanc",
        action="store_true",
        help="also run Debian's Orthanc, a PACS that indexes each instance, in every round",
    )
    parser.add_argument(
        "--quiet-s",
        type=float,
        default=QUIET_S,
        help=f"pause after syncing the disk between runs (default {QUIET_S})",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help=f"pause between each server being ready and its first image (default {SETTLE_S})",
    )
    bars.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print the table; last line starts with headline:."""
    for tool in ("storescu", "storescp"):
        if shutil.which(tool) is None:
            print(f"bench ingest needs DCMTK's {tool} (apt-get install dcmtk)", file=sys.stderr)
            return 2
    if args.orthanc and not OrthancPacs.available():
        print("bench ingest --orthanc needs Orthanc (apt-get install orthanc)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="imaging-ai-bench-") as tmp:
        work = Path(tmp)
        files = _study_files(args, work)
        counts = [int(n) for n in str(args.associations).split(",")]
        runs = len(_servers(args.orthanc)) * args.repeats * len(counts)
        needed = sum(p.stat().st_size for p in files) * runs
        free = shutil.disk_usage(work).free
        if free < needed + _DISK_MARGIN:
            print(
                f"bench ingest keeps every run's output until it ends: it needs "
                f"{(needed + _DISK_MARGIN) / 2**30:.1f} GiB free in {work.parent}, which has "
                f"{free / 2**30:.1f} GiB (set TMPDIR elsewhere, or fewer --repeats)",
                file=sys.stderr,
            )
            return 2
        # A bar of the runs on stderr (each server, round and association count); the
        # rounds' lines go above it through echo (stdout).
        with bars.progress(total=runs, desc="ingest", unit="run", force=args.progress) as bar:
            rows = [
                _rounds(
                    files,
                    n,
                    work,
                    args.repeats,
                    args.settle_s,
                    args.orthanc,
                    args.quiet_s,
                    bar.update,
                )
                for n in counts
            ]
        filesystem = describe_filesystem(work)
    _print_table(len(files), rows, filesystem)
    return 0


def _study_files(args: argparse.Namespace, work: Path) -> list[Path]:
    if args.study:
        files = sorted(p for p in Path(args.study).rglob("*") if p.is_file())
    else:
        files = []
        made = bars.progress(
            range(args.studies), desc="phantoms", unit="study", force=args.progress
        )
        for i in made:
            out = work / f"phantom{i}"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "imaging_ai",
                    "phantom",
                    str(out),
                    "--slices",
                    str(args.slices),
                    "--seed",
                    str(1000 + i),
                    "--no-progress",  # this process's bar counts the phantoms
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            files += sorted((out / "dicom").glob("*.dcm"))
    print(f"sending {len(files)} images per run", flush=True)
    return files


@dataclass(frozen=True)
class Row:
    """One association count's medians: images/s of each server and the rounds' ratios."""

    associations: int
    storescp: float
    tuned: float
    ours: float
    ratio: float  # median over rounds of imaging-ai / storescp in the same round
    ratio_tuned: float
    orthanc: float | None = None  # with --orthanc
    ratio_orthanc: float | None = None


def _rounds(
    files: list[Path],
    n: int,
    work: Path,
    repeats: int,
    settle_s: float,
    orthanc: bool = False,
    quiet_s: float = QUIET_S,
    done: Callable[[], object] = lambda: None,
) -> Row:
    """Run the servers ``repeats`` times in turn; medians of rates and of ratios. ``done`` is
    called after each run."""
    runs: dict[str, list[float]] = {name: [] for name in _servers(orthanc)}
    for _ in range(repeats):
        for name, server_runs in runs.items():
            server_runs.append(_run_server(name, files, n, work, settle_s))
            _sync_disk(quiet_s)
            done()
        extra = f", Orthanc {runs['orthanc'][-1]:.0f}" if orthanc else ""
        bars.echo(
            f"  {n} association(s): storescp {runs['storescp'][-1]:.0f}, tuned storescp "
            f"{runs['tuned'][-1]:.0f}{extra}, imaging-ai {runs['ours'][-1]:.0f} img/s"
        )
    ours = runs["ours"]

    def ratio(theirs: list[float]) -> float:
        return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))

    return Row(
        n,
        statistics.median(runs["storescp"]),
        statistics.median(runs["tuned"]),
        statistics.median(ours),
        ratio(runs["storescp"]),
        ratio(runs["tuned"]),
        statistics.median(runs["orthanc"]) if orthanc else None,
        ratio(runs["orthanc"]) if orthanc else None,
    )


def _servers(orthanc: bool) -> list[str]:
    """The servers of one round, in the order they run (Orthanc only with ``--orthanc``)."""
    return ["storescp", "tuned", *(["orthanc"] if orthanc else []), "ours"]


def _run_server(name: str, files: list[Path], n: int, work: Path, settle_s: float) -> float:
    """One run of the server ``name`` (see `_servers`); images/s."""
    if name == "orthanc":
        return _run_orthanc(files, n, work, settle_s)
    if name == "ours":
        return _run_daemon(files, n, work, settle_s)
    return _run_storescp(files, n, work, name == "tuned", settle_s)


def _sync_disk(quiet_s: float) -> None:
    """Write back what the last run left in memory (storescp never syncs), then let the disk
    go quiet, before the next run."""
    os.sync()
    time.sleep(quiet_s)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Wait until something listens on loopback ``port``; fail if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s} s")


def _env() -> dict[str, str]:
    # DCMTK only sets TCP_NODELAY when asked; without it each image waits ~40 ms.
    return {**os.environ, "TCP_NODELAY": "1"}


def send(files: list[Path], port: int, associations: int, called_ae: str = CALLED_AE) -> float:
    """Send ``files`` split over parallel storescu processes; return images/s."""
    chunks = [files[i::associations] for i in range(associations)]
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                "storescu",
                "-aet",
                CALLING_AE,
                "-aec",
                called_ae,
                "127.0.0.1",
                str(port),
                *map(str, chunk),
            ],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for chunk in chunks
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"storescu failed: {err.decode(errors='replace')[-500:]}")
    return len(files) / (time.perf_counter() - start)


@contextmanager
def _server(cmd: list[str], port: int) -> Iterator[None]:
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port, proc)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_storescp(
    files: list[Path], associations: int, work: Path, tuned: bool, settle_s: float
) -> float:
    """storescp as shipped (16 KB PDU, one association at a time), or tuned: the daemon's
    PDU size, bit-preserving writes and one process per association (--fork)."""
    port = free_port()
    out = Path(tempfile.mkdtemp(dir=work))
    options = ["-pdu", "131072", "+B", "--fork"] if tuned else []
    cmd = ["storescp", "-aet", CALLED_AE, "-od", str(out), "-dhl", *options, str(port)]
    with _server(cmd, port):
        time.sleep(settle_s)
        return send(files, port, associations)


def _run_daemon(files: list[Path], associations: int, work: Path, settle_s: float) -> float:
    port, http_port = free_port(), free_port()
    data = Path(tempfile.mkdtemp(dir=work))
    config = data / "bench.toml"
    config.write_text(
        f'[dicom]\nae_title = "{CALLED_AE}"\nport = {port}\n'
        f'allowed_callers = [{{ ae_title = "{CALLING_AE}", host = "127.0.0.1" }}]\n'
        f'[storage]\ndata_dir = "{data}"\nmin_free_mb = 64\n'
        f'[http]\nport = {http_port}\n[logging]\nlevel = "WARNING"\n'
        # Ingest is measured, not analysis: the study does not complete on release, so
        # the daemon stops at once instead of analysing it first.
        "[assemble]\ncomplete_on_release = false\n"
    )
    cmd = [sys.executable, "-m", "imaging_ai", "serve", "--config", str(config)]
    with _server(cmd, port):
        # Engines load and warm up after the port opens; their start-up is not ingest.
        _wait_readyz(http_port)
        time.sleep(settle_s)
        return send(files, port, associations)


def _run_orthanc(files: list[Path], associations: int, work: Path, settle_s: float) -> float:
    """Orthanc with its default storage and SQLite index; fails unless it kept every image."""
    # Orthanc is only sent to here; the modality it would push to is never used.
    pacs = OrthancPacs(Path(tempfile.mkdtemp(dir=work)), CALLING_AE, free_port())
    try:
        pacs.start()
        time.sleep(settle_s)
        rate = send(files, pacs.dicom_port, associations, ORTHANC_AE)
        kept = len(pacs.get("/instances"))
    finally:
        pacs.stop()
    if kept != len(files):
        raise RuntimeError(f"Orthanc kept {kept} of {len(files)} images")
    return rate


def _wait_readyz(http_port: int, timeout_s: float = 180) -> None:
    """Wait until the daemon's /readyz says every check is ok."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=5):
                return
        except OSError:  # refused while starting, or 503 (HTTPError) until every check is ok
            time.sleep(0.2)
    raise RuntimeError(f"daemon not ready within {timeout_s:.0f} s")


def _print_table(images: int, rows: list[Row], filesystem: str) -> None:
    print()
    print(f"ingest, {images} images per run, loopback, TCP_NODELAY=1, medians of rounds")
    print(f"written to {filesystem}; every run's output kept, disk synced and quiet between runs")
    print("storescp writes without fsync; imaging-ai fsyncs each file and commits its row first")
    print("ratio: median over rounds of imaging-ai / storescp run in the same round")
    orthanc = any(row.orthanc is not None for row in rows)
    header = ["associations", "storescp", "tuned storescp", "imaging-ai", "ratio", "ratio tuned"]
    widths = [12, 9, 15, 11, 6, 12]
    if orthanc:
        print(
            "Orthanc (Debian) indexes each instance in SQLite; ratio Orthanc: imaging-ai / Orthanc"
        )
        header += ["Orthanc", "ratio Orthanc"]
        widths += [8, 14]
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, widths, strict=True)))
    for row in rows:
        cells = [f"{row.storescp:.0f}", f"{row.tuned:.0f}", f"{row.ours:.0f}"]
        cells += [f"{row.ratio:.2f}", f"{row.ratio_tuned:.2f}"]
        if row.orthanc is not None and row.ratio_orthanc is not None:
            cells += [f"{row.orthanc:.0f}", f"{row.ratio_orthanc:.2f}"]
        values = [str(row.associations), *cells]
        print(" ".join(f"{value:>{width}}" for value, width in zip(values, widths, strict=False)))
    summary = ", ".join(f"{row.ratio:.2f}x storescp with {row.associations}" for row in rows)
    print(f"headline: imaging-ai ingest (img/s) at {summary} association(s)")
