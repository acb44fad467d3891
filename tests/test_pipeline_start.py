"""The daemon's start order: the idle clocks of assembly run from when the DICOM port opens."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from imaging_ai_devkit.bench.harness import free_port

from imaging_ai import pipeline
from imaging_ai.config import load_config
from imaging_ai.db.session import utcnow


class _Started:
    """Stands in for a part of the daemon: remembers when `start` was called."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.at: datetime | None = None

    def start(self) -> None:
        self.at = utcnow()


def test_idle_clocks_start_when_the_dicom_port_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(
        f"[dicom]\nport = {free_port()}\n[http]\nport = {free_port()}\n"
        f'[storage]\ndata_dir = "{tmp_path / "data"}"\nmin_free_mb = 1\n'
    )
    card = SimpleNamespace(name="model", version="1")
    cards = SimpleNamespace(all=lambda: (card, card))
    engines = SimpleNamespace(
        start=lambda: None, lungs=card, nodules=card, cards=cards, backend="fake"
    )
    monkeypatch.setattr(pipeline, "EngineSet", lambda *args: engines)
    # Loading models and warming up encoders take seconds before the port opens.
    monkeypatch.setattr(pipeline, "warm_up_outputs", lambda *args: time.sleep(0.2) or 0.2)
    monkeypatch.setattr(pipeline, "Processor", _Started)
    daemon = pipeline.Daemon(load_config(path))
    receivers = _Started()
    monkeypatch.setattr(daemon, "receivers", receivers)
    for part in ("messages", "outbox", "models"):
        monkeypatch.setattr(daemon, part, _Started())
    monkeypatch.setattr(daemon.assembler, "start", lambda: None)
    daemon.start()
    assert receivers.at is not None
    assert daemon.assembler.started_at >= receivers.at
