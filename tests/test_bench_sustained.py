"""bench.sustained (devkit): the stream's sender stops at the budget and says what it sent."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from imaging_ai_devkit.bench.sustained import (
    Outcome,
    Sender,
    Sending,
    _most_at_once,
    _Run,
    _send_all,
    sender_line,
)


def studies(tmp_path: Path, n: int) -> list[tuple[str, tuple[list[Path], str]]]:
    out = []
    for i in range(n):
        folder = tmp_path / f"s{i}"
        folder.mkdir()
        (folder / "1.dcm").write_bytes(b"")
        out.append(("urgent", ([folder / "1.dcm"], f"1.2.{i}")))
    return out


def test_the_sender_sends_each_study_on_its_own_and_stops_at_the_budget(tmp_path: Path) -> None:
    sent: list[list[Path]] = []

    def send(hospital: Any, files: list[Path]) -> None:
        sent.append(files)

    record = _Run()
    stop_at = time.monotonic() + 0.25
    _send_all(None, Sender(send=send), studies(tmp_path, 5), [0.1] * 5, record, stop_at)  # type: ignore[arg-type]
    assert record.done.is_set()
    assert [s.uid for s in record.sent] == ["1.2.0", "1.2.1"]
    assert len(sent) == len(record.sendings) == 2
    assert not (tmp_path / "s0").exists() and (tmp_path / "s2").exists()


def test_the_sender_line_says_how_many_went_out_at_once() -> None:
    record = _Run(sendings=[Sending(300, 0.0, 2.0), Sending(300, 1.0, 3.0), Sending(300, 4, 5)])
    assert _most_at_once(record) == 2
    now = datetime(2026, 12, 1)
    outcomes = [
        Outcome("urgent", 300, 5.0, False, now + timedelta(seconds=s), now) for s in (0, 10)
    ]
    line = sender_line(record, outcomes)
    assert line.startswith("3 studies sent over 5.0 s, p50 2.0 s and 150 slices/s a study")
    assert line.endswith("at most 2 at once; results from first to last over 10.0 s")
    assert sender_line(_Run(), []) == "nothing sent"
