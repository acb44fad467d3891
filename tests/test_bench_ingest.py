"""The ingest benchmark's rounds: each round's ratio is taken between that round's runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from imaging_ai.bench import ingest
from imaging_ai.bench.orthanc import OrthancPacs
from imaging_ai.phantom import PhantomSpec, generate, write_study


def fake_servers(monkeypatch: pytest.MonkeyPatch, rates: dict[str, list[float]]) -> list[float]:
    """Each server's run gives its next rate from ``rates`` (storescp, tuned, orthanc, ours);
    the settle each run was given is appended to the list returned."""
    runs = {name: iter(values) for name, values in rates.items()}
    settles: list[float] = []

    def run(name: str, settle: float) -> float:
        settles.append(settle)
        return next(runs[name])

    monkeypatch.setattr(
        ingest,
        "_run_storescp",
        lambda files, n, work, tuned, settle: run("tuned" if tuned else "storescp", settle),
    )
    monkeypatch.setattr(ingest, "_run_orthanc", lambda files, n, work, s: run("orthanc", s))
    monkeypatch.setattr(ingest, "_run_daemon", lambda files, n, work, s: run("ours", s))
    return settles


def test_ratio_is_the_median_of_each_rounds_own_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine drifts: round 2 runs everything at half speed. Medians of the rates alone
    # would pair round 1's storescp with round 3's daemon; each round's own ratio does not.
    settles = fake_servers(
        monkeypatch,
        {
            "storescp": [800.0, 400.0, 700.0],
            "tuned": [1000.0, 500.0, 900.0],
            "ours": [600.0, 320.0, 420.0],
        },
    )
    row = ingest._rounds([], 4, Path("."), 3, 2.5)
    assert (row.storescp, row.tuned, row.ours) == (700.0, 900.0, 420.0)
    assert row.ratio == pytest.approx(0.75)  # rounds: 0.75, 0.80, 0.60
    assert row.ratio_tuned == pytest.approx(0.60)  # rounds: 0.60, 0.64, 0.467
    assert settles == [2.5] * 9  # every server, every round, the same pause


def test_orthanc_runs_in_each_round_with_its_own_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    settles = fake_servers(
        monkeypatch,
        {
            "storescp": [800.0, 400.0, 700.0],
            "tuned": [1000.0, 500.0, 900.0],
            "orthanc": [300.0, 100.0, 280.0],
            "ours": [600.0, 320.0, 420.0],
        },
    )
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
