"""Model updates without downtime: a changed model folder is validated and swapped in; a broken
one leaves the running models in place with a clear error."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

from imaging_ai_devkit.bench.harness import ENGINES_DIR, DaemonProcess

from tests.conftest import wait_until


def test_reload_on_change_and_refusal_of_a_broken_card(tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    shutil.copytree(ENGINES_DIR, engines, ignore=shutil.ignore_patterns("README.md"))
    daemon = DaemonProcess(tmp_path / "d", engines_dir=engines)
    daemon.start()
    try:
        card = engines / "lung-seg" / "model.toml"
        text = card.read_text()
        version = next(line for line in text.splitlines() if line.startswith("version"))
        card.write_text(text.replace(version, 'version = "9.9.9"'))
        wait_until(lambda: "models reloaded: lung-seg 9.9.9" in daemon.log(), timeout_s=90)

        card.write_text(text.replace(version, 'version = "9.9.10"\nthreshhold = 1'))
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "model reload failed" in daemon.log(), timeout_s=90)
        assert "threshhold" in daemon.log()
        assert daemon.get("/healthz") == {"status": "alive"}
    finally:
        assert daemon.stop() == 0
