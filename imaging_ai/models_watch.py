"""Takes the engines folder and gives new loaded models when it changes, without downtime.

A new model version (a changed folder), SIGHUP or an admin action triggers a reload in the
background: every card is validated against its ONNX and the engines are loaded (TensorRT
plans built) before anything is swapped. The processor takes the new models for the next
study; studies already running finish with the models they started with, and each report
records the versions that produced it. A model that fails validation leaves the running
ones in place, with the error shown on the status page and in the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from imaging_ai.config import EnginesConfig
from imaging_ai.engine_set import EngineSet
from imaging_ai.errors import ImagingAIError

log = logging.getLogger(__name__)


def fingerprint(engines_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of every model file: cheap to poll."""
    files = sorted(p for p in engines_dir.glob("*/model.*") if p.is_file())
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


class ModelWatcher:
    """Polls the engines folder and reloads on change or on request."""

    def __init__(
        self,
        config: EnginesConfig,
        data_dir: Path,
        swap: Callable[[EngineSet], None],
        poll_s: float = 5.0,
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        self.swap = swap
        self.poll_s = poll_s
        self.last_error = ""
        self._seen = fingerprint(Path(config.dir))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Poll in a background thread."""
        self._thread = threading.Thread(target=self._run, name="model-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def request_reload(self) -> None:
        """Reload now, in the background (SIGHUP, admin action)."""
        threading.Thread(target=self.reload, name="model-reload", daemon=True).start()

    def reload(self) -> bool:
        """Validate and load the models; swap them in only if everything loaded."""
        with self._lock:
            seen = fingerprint(Path(self.config.dir))
            try:
                engines = EngineSet(self.config, self.data_dir)
                engines.start()
            except (ImagingAIError, OSError) as exc:
                self.last_error = f"model reload failed; still running the previous models: {exc}"
                log.error("%s", self.last_error)
                self._seen = seen
                return False
            self._seen, self.last_error = seen, ""
            self.swap(engines)
            names = ", ".join(f"{c.name} {c.version}" for c in engines.cards.all())
            log.info("models reloaded: %s on %s", names, engines.backend)
            return True

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                changed = fingerprint(Path(self.config.dir)) != self._seen
            except OSError as exc:
                log.warning("cannot read engines folder %s: %s", self.config.dir, exc)
                continue
            if changed:
                log.info("engines folder changed; reloading models")
                self.reload()
