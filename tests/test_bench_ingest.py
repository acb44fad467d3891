"""The ingest benchmark's rounds: each round's ratio is taken between that round's runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from imaging_ai.bench import ingest


def test_ratio_is_the_median_of_each_rounds_own_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine drifts: round 2 runs everything at half speed. Medians of the rates alone
    # would pair round 1's storescp with round 3's daemon; each round's own ratio does not.
    storescp = iter([800.0, 400.0, 700.0])
    tuned = iter([1000.0, 500.0, 900.0])
    ours = iter([600.0, 320.0, 420.0])
    settles: list[float] = []

    def fake_storescp(
        files: list[Path], n: int, work: Path, is_tuned: bool, settle: float
    ) -> float:
        settles.append(settle)
        return next(tuned if is_tuned else storescp)

    def fake_daemon(files: list[Path], n: int, work: Path, settle: float) -> float:
        settles.append(settle)
        return next(ours)

    monkeypatch.setattr(ingest, "_run_storescp", fake_storescp)
    monkeypatch.setattr(ingest, "_run_daemon", fake_daemon)
    row = ingest._rounds([], 4, Path("."), 3, 2.5)
    assert (row.storescp, row.tuned, row.ours) == (700.0, 900.0, 420.0)
    assert row.ratio == pytest.approx(0.75)  # rounds: 0.75, 0.80, 0.60
    assert row.ratio_tuned == pytest.approx(0.60)  # rounds: 0.60, 0.64, 0.467
    assert settles == [2.5] * 9  # every server, every round, the same pause
