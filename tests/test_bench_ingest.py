"""The ingest benchmark's rounds: each round's ratio is taken between that round's runs."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
from imaging_ai_devkit.bench import ingest
from imaging_ai_devkit.bench.harness import describe_filesystem
from imaging_ai_devkit.bench.orthanc import OrthancPacs
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study


def fake_servers(
    monkeypatch: pytest.MonkeyPatch, rates: dict[str, list[float]], events: list[str] | None = None
) -> list[float]:
    """Each server's run gives its next rate from ``rates`` (storescp, tuned, orthanc, ours);
    the settle each run was given is appended to the list returned. ``events``, if given,
    gets each run's server name and each sync of the disk, in order."""
    runs = {name: iter(values) for name, values in rates.items()}
    settles: list[float] = []
    log = events if events is not None else []

    def run(name: str, settle: float) -> float:
        settles.append(settle)
        log.append(name)
        return next(runs[name])

    monkeypatch.setattr(ingest, "_sync_disk", lambda quiet_s: log.append(f"sync {quiet_s}"))

    monkeypatch.setattr(
        ingest,
        "_run_storescp",
        lambda files, n, work, tuned, settle: run("tuned" if tuned else "storescp", settle),
    )
    monkeypatch.setattr(ingest, "_run_orthanc", lambda files, n, work, s: run("orthanc", s))
    monkeypatch.setattr(ingest, "_run_daemon", lambda files, n, work, s: run("ours", s))
    return settles


# Three rounds on a drifting machine: round 2 runs everything at half speed.
DRIFTING = {
    "storescp": [800.0, 400.0, 700.0],
    "tuned": [1000.0, 500.0, 900.0],
    "ours": [600.0, 320.0, 420.0],
}


def test_ratio_is_the_median_of_each_rounds_own_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    # Medians of the rates alone would pair round 1's storescp with round 3's daemon; each
    # round's own ratio does not.
    settles = fake_servers(monkeypatch, DRIFTING)
    row = ingest._rounds([], 4, Path("."), 3, 2.5)
    assert (row.storescp, row.tuned, row.ours) == (700.0, 900.0, 420.0)
    assert row.ratio == pytest.approx(0.75)  # rounds: 0.75, 0.80, 0.60
    assert row.ratio_tuned == pytest.approx(0.60)  # rounds: 0.60, 0.64, 0.467
    assert settles == [2.5] * 9  # every server, every round, the same pause


def test_orthanc_runs_in_each_round_with_its_own_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    settles = fake_servers(monkeypatch, {**DRIFTING, "orthanc": [300.0, 100.0, 280.0]})
    row = ingest._rounds([], 4, Path("."), 3, 1.5, orthanc=True)
    assert row.orthanc == 280.0
    assert row.ratio_orthanc == pytest.approx(2.0)  # rounds: 2.0, 3.2, 1.5
    assert row.ratio == pytest.approx(0.75)  # unchanged by the extra server
    assert settles == [1.5] * 12


@pytest.mark.skipif(not OrthancPacs.available(), reason="needs Debian orthanc")
@pytest.mark.skipif(shutil.which("storescu") is None, reason="needs DCMTK storescu")
def test_orthanc_run_sends_for_real_and_counts_what_it_kept(tmp_path: Path) -> None:
    write_study(generate(PhantomSpec(slices=4, seed=3), workers=1), tmp_path / "study", workers=1)
    files = sorted((tmp_path / "study" / "dicom").glob("*.dcm"))
    assert ingest._run_orthanc(files, 2, tmp_path, 0.0) > 0
    # The same file twice is one instance in Orthanc: a rate for images not kept is refused.
    with pytest.raises(RuntimeError, match="Orthanc kept 4 of 5 images"):
        ingest._run_orthanc([*files, files[0]], 1, tmp_path, 0.0)


def test_every_run_is_followed_by_a_sync_of_the_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    # storescp leaves its files unwritten: the next server must not pay for their writeback.
    events: list[str] = []
    fake_servers(monkeypatch, {**DRIFTING, "orthanc": [1.0, 1.0]}, events)
    ingest._rounds([], 1, Path("."), 2, 0.0, orthanc=True, quiet_s=9.0)
    sync = "sync 9.0"
    assert events == ["storescp", sync, "tuned", sync, "orthanc", sync, "ours", sync] * 2


@pytest.mark.skipif(shutil.which("storescp") is None, reason="needs DCMTK storescp")
def test_a_runs_output_is_kept_until_the_benchmark_ends(tmp_path: Path) -> None:
    # Deleting it at once would slow the next server's file creation on ext4 without a journal.
    write_study(generate(PhantomSpec(slices=3, seed=5), workers=1), tmp_path / "study", workers=1)
    files = sorted((tmp_path / "study" / "dicom").glob("*.dcm"))
    work = tmp_path / "work"
    work.mkdir()
    assert ingest._run_storescp(files, 1, work, False, 0.0) > 0
    assert len([p for p in work.rglob("*") if p.is_file()]) == 3


def _fake_root(tmp_path: Path, mounts: list[str], journal_task: str | None) -> Path:
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "mountinfo").write_text("\n".join(mounts) + "\n")
    device = root / "sys" / "devices" / "virtual" / "block" / "vdb"
    device.mkdir(parents=True)
    (root / "sys" / "dev" / "block").mkdir(parents=True)
    (root / "sys" / "dev" / "block" / "254:16").symlink_to(device)
    if journal_task is not None:
        (root / "sys" / "fs" / "ext4" / "vdb").mkdir(parents=True)
        (root / "sys" / "fs" / "ext4" / "vdb" / "journal_task").write_text(journal_task + "\n")
    return root


@pytest.mark.parametrize(
    ("journal_task", "expected"),
    [
        ("<none>", "ext4 without a journal (/dev/vdb)"),
        ("412", "ext4 with a journal (/dev/vdb)"),
        (None, "ext4 (/dev/vdb)"),
    ],
)
def test_the_filesystem_is_named_with_its_journal(
    tmp_path: Path, journal_task: str | None, expected: str
) -> None:
    data = tmp_path / "data dir"
    data.mkdir()
    escaped = str(data).replace(" ", "\\040")
    mounts = [
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
        f"40 22 254:16 / {escaped} rw,relatime shared:9 - ext4 /dev/vdb rw",
        "41 22 0:30 / /dev/shm rw shared:10 - tmpfs tmpfs rw",
    ]
    root = _fake_root(tmp_path, mounts, journal_task)
    assert describe_filesystem(data / "spool", root) == expected
    # The longest mount point holding the path wins; another type is named as it is.
    assert describe_filesystem(Path("/dev/shm/x"), root) == "tmpfs (tmpfs)"


@pytest.mark.skipif(shutil.which("storescp") is None, reason="needs DCMTK storescu and storescp")
def test_refuses_to_start_without_room_for_every_runs_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "a.dcm").write_bytes(b"\0" * 1000)
    real = shutil.disk_usage
    monkeypatch.setattr(
        ingest.shutil, "disk_usage", lambda path: real(path)._replace(free=(1 << 30) + 17_999)
    )
    monkeypatch.setattr(ingest, "_rounds", lambda *args: pytest.fail("ran without room"))
    parser = argparse.ArgumentParser()
    ingest.add_arguments(parser)
    # 1,000 bytes x 3 servers x 3 rounds x 2 association counts = 18,000 bytes, 1 byte short.
    args = parser.parse_args(["--study", str(study), "--repeats", "3"])
    assert ingest.run(args) == 2
    assert "needs 1.0 GiB free" in capsys.readouterr().err
