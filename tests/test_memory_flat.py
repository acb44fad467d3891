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
from imaging_ai_devkit.bench.harness import DaemonProcess
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study
from pydicom.uid import generate_uid

SLICES = 6
MARGIN_MB = 40.0  # allocator noise between rounds; one study's arrays alone are about 50 MiB


def tree_rss_by_process(root: int) -> dict[str, float]:
    """VmRSS in MiB of a process and each descendant, keyed "pid name" (for the failure
    message: which process grew)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = fields.get("VmRSS", "0 kB").split()[0]
        out[f"{pid} {fields.get('Name', '?').strip()}"] = int(rss) / 1024
    return out


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


def run_round(
    daemon: DaemonProcess, files: list[Path], done_before: int, n: int
) -> tuple[float, dict[str, float]]:
    """Send `n` studies at once; the peak resident memory until all of them are done, and
    each process's share at that peak."""
    assert daemon.proc is not None
    daemon.send(files)
    peak: tuple[float, dict[str, float]] = (0.0, {})
    end = time.monotonic() + 60 + 20 * n
    while True:
        sample = tree_rss_by_process(daemon.proc.pid)
        peak = max(peak, (sum(sample.values()), sample), key=lambda p: p[0])
        if sum(s["state"] in ("done", "failed") for s in daemon.studies()) >= done_before + n:
            break
        assert time.monotonic() < end, daemon.log()[-3000:]
        time.sleep(0.25)
    assert not [s for s in daemon.studies() if s["state"] == "failed"], daemon.studies()
    return peak


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
    measured = [total for total, _ in peaks[1:]]
    by_process = "; ".join(
        f"round {i}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(parts.items()))
        for i, (_, parts) in enumerate(peaks)
    )
    assert max(measured) <= measured[0] + MARGIN_MB, (
        f"peak MiB per round {[round(t, 1) for t, _ in peaks]} for {rounds}; "
        f"MiB by process at each peak: {by_process}"
    )


def test_memory_stays_flat_over_rounds_of_queued_studies(
    daemon: DaemonProcess, template: Path, tmp_path: Path
) -> None:
    check_flat(daemon, template, tmp_path, [3, 10])


@pytest.mark.slow
def test_memory_stays_flat_over_a_long_backlog(
    daemon: DaemonProcess, template: Path, tmp_path: Path
) -> None:
    check_flat(daemon, template, tmp_path, [5, 20, 40, 40])
