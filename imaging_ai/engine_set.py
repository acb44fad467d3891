"""Takes the engines config and gives a running worker pool, a batcher per model, and per-study
engines that carry the study's priority into every batch.

An engine set is what a model reload swaps: the new set is started (cards validated, workers
up, engines warmed) before it replaces the old one, and the old one stops only when the last
study that started on it has finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from imaging_ai import faults
from imaging_ai.analyse import Models, discover_cards
from imaging_ai.assemble import RANKS
from imaging_ai.batch import Batcher, BatchingEngine
from imaging_ai.batch_policy import BatchingConfig
from imaging_ai.config import EnginesConfig
from imaging_ai.errors import ConfigError, EngineError, StartupError
from imaging_ai.infer.base import LoadedModel
from imaging_ai.modelcard import ModelCard
from imaging_ai.schedule import Claim
from imaging_ai.worker_pool import WorkerPool
from imaging_ai.workers import PoolConfig, WorkerSpec

log = logging.getLogger(__name__)


def batching_config(config: EnginesConfig) -> BatchingConfig:
    """The batchers' knobs from [engines], with errors naming the keys."""
    try:
        return BatchingConfig(
            max_batch_size=config.max_batch_size,
            preferred_batch_sizes=config.preferred_batch_sizes,
            max_queue_delay_ms=config.max_queue_delay_ms,
            max_pending=config.max_pending_slices,
        )
    except ValueError as exc:
        raise ConfigError(f"[engines] batching: {exc}") from exc


@dataclass
class _Usage:
    users: int = 0
    retired: bool = False


class EngineSet:
    """Cards, a worker pool and one batcher per model."""

    def __init__(self, config: EnginesConfig, data_dir: Path) -> None:
        self.config = config
        self.cards = discover_cards(config)
        self.lungs, self.nodules = self.cards.lungs, self.cards.nodules
        spec = WorkerSpec(
            model_dirs=tuple(c.folder for c in self.cards.all()),
            backend=config.backend,
            data_dir=data_dir,
            cpu_threads=config.cpu_threads,
            precision=config.precision,
            max_batch_size=config.max_batch_size,
        )
        gpus = None if config.gpus < 0 else config.gpus
        factory = faults.engine_factory(config.cpu_threads, config.max_batch_size)
        if factory is not None:  # test only (IMAGING_AI_FAULT): e.g. a GPU worker whose GPU fails
            spec, gpus = replace(spec, factory=factory), gpus or 1
        self.pool = WorkerPool(
            spec, PoolConfig(gpus=gpus, cpu_workers=config.cpu_workers, depth=config.worker_depth)
        )
        knobs = batching_config(config)
        self.batchers = {c.name: Batcher(c.name, knobs, self.pool) for c in self.cards.all()}
        self._usage = _Usage()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the workers (engines loaded and warmed), then the batchers and their arenas.

        Raises
        ------
        StartupError
            A worker could not load the models, or shared memory cannot hold the arenas.
        """
        self.pool.start()
        try:
            for batcher in self.batchers.values():
                batcher.start()
                if batcher.arena_ref is not None:
                    self.pool.attach(batcher.arena_ref)
        except EngineError as exc:
            self.stop()
            raise StartupError(str(exc)) from exc

    @property
    def backend(self) -> str:
        """The backend the lung model runs on (as the workers report it)."""
        return self.pool.info(self.lungs.name).backend

    @contextmanager
    def models_for(self, claim: Claim) -> Iterator[Models]:
        """Engines for one study: its slices enter every batch with its rank and deadline."""
        with self._lock:
            self._usage.users += 1
        try:
            rank, deadline = RANKS[claim.priority], claim.deadline.timestamp()

            def loaded(card: ModelCard) -> LoadedModel:
                engine = BatchingEngine(
                    self.batchers[card.name], rank, deadline, study=claim.study_uid
                )
                return LoadedModel(card, engine)

            extra = self.cards.candidates
            yield Models(
                loaded(self.lungs),
                loaded(self.nodules),
                self.backend,
                loaded(extra) if extra else None,
            )
        finally:
            with self._lock:
                self._usage.users -= 1
                done = self._usage.retired and self._usage.users == 0
            if done:
                self.stop()

    def retire(self) -> None:
        """Stop once no study uses this set any more (after a swap)."""
        with self._lock:
            self._usage.retired = True
            idle = self._usage.users == 0
        if idle:
            self.stop()

    def stop(self) -> None:
        """Drain the batchers, then stop the workers."""
        for batcher in self.batchers.values():
            batcher.stop()
        self.pool.stop()

    def fallbacks(self) -> int:
        """Batches the workers ran on the CPU because their GPU engine failed, so far."""
        return sum(w.fallbacks for w in self.pool.status())

    def status(self) -> dict[str, Any]:
        """Workers and batchers for the status page."""
        return {
            "workers": [
                {**asdict(w), "memory_bytes": _rss_bytes(w.pid)} for w in self.pool.status()
            ],
            "batchers": {
                name: {
                    "pending": b.pending,
                    "peak_pending": b.peak_pending,
                    "batches": b.batches,
                    "slots_in_use": b.slots[0],
                    "slots": b.slots[1],
                }
                for name, b in self.batchers.items()
            },
            "models": {
                c.name: {"version": c.version, "sha256": c.sha256[:12]} for c in self.cards.all()
            },
        }


def _rss_bytes(pid: int | None) -> int | None:
    """Resident memory of a worker process (Linux /proc), or None where it cannot be read."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
