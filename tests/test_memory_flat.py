"""Memory stays flat whatever the backlog: the whole daemon (CPU path) takes rounds of studies
sent all at once, and the resident memory of its processes peaks no higher when three or more
times as many studies are queued at once.

The backlog waits in the spool and the job table, not in memory: the processor holds a few
studies at a time, the batchers admit slices only into free slots of a fixed arena (lowest
first, so the memory touched follows the busiest moment), and nothing is kept per study
afterwards. The fast variant runs in `make test`; the slow one (`make soak`) sends more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from imaging_ai.bench.harness import DaemonProcess
from imaging_ai.phantom import PhantomSpec, generate, write_study

SLICES = 6
MARGIN_MB = 40.0  # allocator noise between rounds; one study's arrays alone are about 50 MiB


def tree_rss_mb(root: int) -> float:
    """Resident memory (VmRSS) of a process and all its descendants, in MiB."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        rss = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
        total += int(rss[0]) if rss else 0
    return total / 1024


def clone(template: Path, dest: Path, k: int) -> list[Path]:
    """The template study's files with new study, series and instance UIDs (study `k`)."""
    study, series = generate_uid(), generate_uid()
    dest.mkdir(parents=True)
    files = []
    for i, path in enumerate(sorted(template.glob("*.dcm"))):
        ds = pydicom.dcmread(path)
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.AccessionNumber = f"MEM-{k}"
        files.append(dest / f"{i:04d}.dcm")
        ds.save_as(files[-1])
    return files


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("template")
    write_study(generate(PhantomSpec(slices=SLICES, seed=515)), out, accession="MEM-T", workers=1)
    return out / "dicom"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        tmp_path / "daemon",
        # The harness's [engines] table comes last: a key before any header lands in it.
        "cpu_threads = 1\n[assemble]\nseries_idle_s = 0.5\nstudy_idle_s = 1.0\npoll_s = 0.2\n",
    )
    d.start()
    yield d
    assert d.stop() == 0, d.log()


def run_round(daemon: DaemonProcess, files: list[Path], done_before: int, n: int) -> float:
    """Send `n` studies at once; the peak resident memory until all of them are done."""
    assert daemon.proc is not None
    daemon.send(files)
    peak, end = 0.0, time.monotonic() + 60 + 20 * n
    while sum(s["state"] in ("done", "failed") for s in daemon.studies()) < done_before + n:
        assert time.monotonic() < end, daemon.log()[-3000:]
        peak = max(peak, tree_rss_mb(daemon.proc.pid))
        time.sleep(0.25)
    assert not [s for s in daemon.studies() if s["state"] == "failed"], daemon.studies()
    return max(peak, tree_rss_mb(daemon.proc.pid))


def check_flat(daemon: DaemonProcess, template: Path, tmp_path: Path, rounds: list[int]) -> None:
    """A warm-up round (models, arena pages, caches), then `rounds`, each sent all at once."""
    peaks, done, k = [], 0, 0
    for n in [rounds[0], *rounds]:
        files = []
        for _ in range(n):
            files += clone(template, tmp_path / f"study{k}", k)
            k += 1
        peaks.append(run_round(daemon, files, done, n))
        done += n
    measured = peaks[1:]
    assert max(measured) <= measured[0] + MARGIN_MB, f"peak MiB per round {peaks} for {rounds}"


def test_memory_stays_flat_over_rounds_of_queued_studies(
    daemon: DaemonProcess, template: Path, tmp_path: Path
) -> None:
    check_flat(daemon, template, tmp_path, [3, 10])


@pytest.mark.slow
def test_memory_stays_flat_over_a_long_backlog(
    daemon: DaemonProcess, template: Path, tmp_path: Path
) -> None:
    check_flat(daemon, template, tmp_path, [5, 20, 40, 40])
