"""Takes a backend setting or a fault and gives stand-in engines: a fixed latency, a GPU that fails.

Nothing here runs in a hospital's daemon. `FixedLatencyBackend` stands in for a GPU whose batch
time is `latency_s_per_batch + per_slice_s * N`, so batching and scheduling can be tested for
timing without a model; its outputs are deterministic and tell which slice produced them.
`fake_backend` is the daemon's ``imaging_ai.backends`` entry ``fake`` (a worker's backend
setting ``fake:latency=...``). `FailingGpu` is the engine factory a daemon armed with
IMAGING_AI_FAULT=gpu:error gives its GPU workers (`imaging_ai_devkit.faults`): every batch on
the "GPU" raises the error a lost device gives, behind the daemon's own CPU fallback
(`select.load_engine`), so the tests can watch a study survive it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, Engine, FloatArray, check_batch
from imaging_ai.modelcard import ModelCard

# What ONNX Runtime's CUDA provider says when a kernel faults on a failing GPU.
CUDA_ERROR = "CUDA failure 700: an illegal memory access was encountered"


class FixedLatencyBackend:
    """Test-only backend: sleeps a fixed time per batch and returns deterministic outputs."""

    def __init__(
        self,
        latency_s_per_batch: float,
        per_slice_s: float = 0.0,
        *,
        max_batch_size: int = 32,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.latency_s_per_batch, self.per_slice_s = latency_s_per_batch, per_slice_s
        self.max_batch_size, self.sleep = max_batch_size, sleep

    @property
    def name(self) -> str:
        """Always `fixed-latency`."""
        return "fixed-latency"

    @property
    def device(self) -> str:
        """Always `fake`."""
        return "fake"

    def load(self, card: ModelCard, onnx_path: Path | None = None) -> FixedLatencyEngine:
        """An engine for `card`; no file is read."""
        return FixedLatencyEngine(self, card)


class FixedLatencyEngine:
    """Output channel c of slice n is filled with `c + mean(batch[n])`; `batches` logs sizes."""

    def __init__(self, backend: FixedLatencyBackend, card: ModelCard) -> None:
        self._backend, self._card = backend, card
        self.batches: list[int] = []
        self._lock = threading.Lock()
        self.info = BackendInfo(
            card.name, backend.name, backend.device, "fp32", backend.max_batch_size
        )

    @property
    def max_batch_size(self) -> int:
        """The backend's max batch size."""
        return self._backend.max_batch_size

    def infer(self, batch: FloatArray) -> FloatArray:
        """Sleep for the batch's latency and return [N, K, H, W] deterministic values."""
        check_batch(batch, self._card, self.max_batch_size)
        n = batch.shape[0]
        with self._lock:
            self.batches.append(n)
        self._backend.sleep(self._backend.latency_s_per_batch + self._backend.per_slice_s * n)
        channels = np.arange(self._card.output.channels, dtype=np.float32)
        values = channels[None, :] + batch.reshape(n, -1).mean(axis=1)[:, None]
        if self._card.task == "classification":  # one value per channel per patch
            out: FloatArray = values.astype(np.float32)
            return out
        shape = (n, self._card.output.channels, self._card.input.height, self._card.input.width)
        return np.broadcast_to(values[:, :, None, None], shape).astype(np.float32)

    def close(self) -> None:
        """Nothing to release."""


def fake_backend(setting: str) -> FixedLatencyBackend:
    """`fake:latency=0.05,per_slice=0.001,max_batch=32` as a FixedLatencyBackend.

    Raises
    ------
    EngineError
        An option other than latency, per_slice and max_batch.
    """
    items = [i.split("=", 1) for i in setting.removeprefix("fake:").split(",") if i]
    values = {k: float(v) for k, v in items}
    unknown = set(values) - {"latency", "per_slice", "max_batch"}
    if unknown:
        raise EngineError(f"backend = {setting!r}: unknown fake option(s) {sorted(unknown)}")
    max_batch = int(values.get("max_batch", 32))
    return FixedLatencyBackend(
        values.get("latency", 0.0), values.get("per_slice", 0.0), max_batch_size=max_batch
    )


class FailingGpuBackend:
    """Test-only: a backend on `device` whose engines load, then fail every batch."""

    def __init__(self, device: str, max_batch_size: int = 32) -> None:
        self._device, self._max = device, max_batch_size

    @property
    def name(self) -> str:
        """Always `failing-gpu`."""
        return "failing-gpu"

    @property
    def device(self) -> str:
        """The GPU it pretends to be, e.g. `cuda:0`."""
        return self._device

    def load(self, card: ModelCard, onnx_path: Path | None = None) -> FailingGpuEngine:
        """An engine for `card`; no file is read."""
        return FailingGpuEngine(BackendInfo(card.name, self.name, self._device, "fp16", self._max))


class FailingGpuEngine:
    """Raises EngineError with a CUDA error on every batch, as a lost GPU's engine does."""

    def __init__(self, info: BackendInfo) -> None:
        self.info = info

    @property
    def max_batch_size(self) -> int:
        """The batch size it claims."""
        return self.info.max_batch_size

    def infer(self, batch: FloatArray) -> FloatArray:
        """Always raises EngineError."""
        raise EngineError(f"{self.info.model}: {self.info.backend} failed: {CUDA_ERROR}")

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True)
class FailingGpu:
    """Test-only, picklable engine factory for worker processes: (card, device) -> Engine.

    On a GPU device the engine is `select.load_engine`'s, as the daemon builds it: the failing
    "GPU" engine wrapped with a real ONNX Runtime CPU session as its fallback. A CPU worker gets
    the plain CPU session.
    """

    cpu_threads: int = 0
    max_batch_size: int = 32

    def __call__(self, card: ModelCard, device: str) -> Engine:
        from imaging_ai.infer.ort import OrtBackend, OrtOptions
        from imaging_ai.infer.select import load_engine

        cpu = OrtOptions(intra_op_threads=self.cpu_threads, max_batch_size=self.max_batch_size)
        if device == "cpu":
            return OrtBackend(cpu).load(card)
        return load_engine(FailingGpuBackend(device, self.max_batch_size), card, cpu=cpu)
