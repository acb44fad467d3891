"""A backend setting and what this host has in; the Backend to use, and CPU-fallback engines, out.

`auto` takes TensorRT when it imports and a GPU is visible, else ONNX Runtime's CUDA provider
when onnxruntime-gpu offers it and a GPU is visible, else ONNX Runtime on the CPU. A forced
setting that this host cannot honour is refused at start, with what is missing.
`FallbackEngine` keeps a study alive when the GPU fails mid-run: the batch is rerun on the CPU
and counted, for the status page and the study's record (`process` notes it on the job).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import (
    Backend,
    BackendInfo,
    Engine,
    FloatArray,
    check_batch,
    infer_into,
)
from imaging_ai.infer.cuda_mem import gpu_count
from imaging_ai.infer.ort import (
    PROVIDER_NAMES,
    OrtBackend,
    OrtOptions,
    available_providers,
    gpu_tuned,
)
from imaging_ai.infer.tensorrt import TensorRTBackend, TensorRTOptions
from imaging_ai.modelcard import ModelCard

log = logging.getLogger(__name__)

BackendSetting = Literal["auto", "tensorrt", "onnxruntime-cuda", "onnxruntime-cpu"]
BACKEND_SETTINGS: tuple[str, ...] = get_args(BackendSetting)
_CUDA_EP = PROVIDER_NAMES["cuda"]


@dataclass(frozen=True)
class Environment:
    """What this host offers for inference."""

    tensorrt: bool
    cuda_python: bool
    gpus: int
    ort_providers: tuple[str, ...]


def probe_environment() -> Environment:
    """Look (without loading any model) at what this host offers.

    Returns
    -------
    Environment
        Whether `tensorrt` and `cuda.bindings` import, how many GPUs are visible (from the CUDA
        runtime when cuda-python is there, else from the driver's /proc entries and
        CUDA_VISIBLE_DEVICES), and ONNX Runtime's providers.
    """
    cuda_python = _importable("cuda.bindings")
    gpus = gpu_count() if cuda_python else _driver_gpu_count()
    return Environment(_importable("tensorrt"), cuda_python, gpus, tuple(available_providers()))


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a missing parent package ("cuda") raises instead of returning None
        return False


def _driver_gpu_count() -> int:
    proc = Path("/proc/driver/nvidia/gpus")
    found = len(list(proc.iterdir())) if proc.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    ids = [v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]
    return min(found, len(ids))


def choose_backend(setting: str, env: Environment) -> str:
    """The backend name for a setting on a host.

    Parameters
    ----------
    setting : str
        "auto", "tensorrt", "onnxruntime-cuda" or "onnxruntime-cpu".
    env : Environment
        What the host offers (`probe_environment()`).

    Returns
    -------
    str
        One of the three backend names.

    Raises
    ------
    EngineError
        Unknown setting, or a forced backend that this host cannot run, saying what is missing.
    """
    if setting not in BACKEND_SETTINGS:
        raise EngineError(f"backend = {setting!r}: expected one of {', '.join(BACKEND_SETTINGS)}")
    missing = {
        "tensorrt": _missing_for_tensorrt(env),
        "onnxruntime-cuda": _missing_for_ort_cuda(env),
        "onnxruntime-cpu": None,
    }
    if setting == "auto":
        return next(name for name, lack in missing.items() if lack is None)
    lack = missing[setting]
    if lack is not None:
        raise EngineError(f"backend = {setting!r}, but {lack}; use backend = 'auto' or fix it")
    return setting


def _missing_for_tensorrt(env: Environment) -> str | None:
    if not env.tensorrt:
        return "the tensorrt package is not installed"
    if not env.cuda_python:
        return "cuda-python is not installed"
    return None if env.gpus else "no GPU is visible"


def _missing_for_ort_cuda(env: Environment) -> str | None:
    if _CUDA_EP not in env.ort_providers:
        return "onnxruntime has no CUDA provider (install onnxruntime-gpu)"
    return None if env.gpus else "no GPU is visible"


def make_backend(
    setting: str,
    data_dir: Path,
    *,
    env: Environment | None = None,
    trt: TensorRTOptions | None = None,
    ort_gpu: OrtOptions | None = None,
    ort_cpu: OrtOptions | None = None,
) -> Backend:
    """The Backend a setting selects on this host.

    Parameters
    ----------
    setting : str
        See `choose_backend`.
    data_dir : Path
        The daemon's data folder; TensorRT plans are cached under `data_dir/engines`.
    env : Environment, optional
        What the host offers; probed when not given.
    trt, ort_gpu, ort_cpu : optional
        Options for each kind of backend; the provider of `ort_gpu`/`ort_cpu` is overridden.

    Returns
    -------
    Backend
        Not yet loaded with any model.
    """
    name = choose_backend(setting, env or probe_environment())
    if name == "tensorrt":
        return TensorRTBackend(data_dir, trt)
    if name == "onnxruntime-cuda":
        return OrtBackend(gpu_tuned(replace(ort_gpu or OrtOptions(), provider="cuda")))
    return OrtBackend(replace(ort_cpu or OrtOptions(), provider="cpu"))


def load_engine(
    backend: Backend, card: ModelCard, *, cpu_fallback: bool = True, cpu: OrtOptions | None = None
) -> Engine:
    """Load `card` on `backend`; a GPU engine comes wrapped with a CPU fallback.

    Parameters
    ----------
    backend : Backend
        Where the model should run.
    card : ModelCard
        The model.
    cpu_fallback : bool
        Wrap GPU engines in a FallbackEngine (the CPU session is loaded now, at start).
    cpu : OrtOptions, optional
        Options of the CPU fallback session (threads).

    Returns
    -------
    Engine
        Warmed up.
    """
    engine = backend.load(card)
    if backend.device == "cpu" or not cpu_fallback:
        return engine
    options = replace(cpu or OrtOptions(), provider="cpu", max_batch_size=engine.max_batch_size)
    return FallbackEngine(engine, OrtBackend(options).load(card), card)


@dataclass(frozen=True)
class FallbackStats:
    """Fallback events of one engine, for the status page and the studies' records.

    `count` is every batch the CPU ran instead of the GPU: each one rerun after a failure, and
    each one sent straight to the CPU while `degraded`.
    """

    count: int = 0
    last_reason: str | None = None
    last_at: float | None = None  # time.time()
    degraded: bool = False


class FallbackEngine:
    """Runs on the primary (GPU) engine; reruns a failed batch on the CPU engine.

    After `max_consecutive_failures` failures in a row the GPU is taken as lost (a driver fault
    rarely heals) and every batch goes to the CPU until `reset()`; a single out-of-memory only
    costs that batch its speed.
    """

    def __init__(
        self,
        primary: Engine,
        fallback: Engine,
        card: ModelCard,
        *,
        max_consecutive_failures: int = 3,
    ) -> None:
        self._primary, self._fallback, self._card = primary, fallback, card
        self._limit = max_consecutive_failures
        self._stats = FallbackStats()
        self._consecutive = 0
        self._lock = threading.Lock()

    @property
    def max_batch_size(self) -> int:
        """The primary engine's largest batch."""
        return self._primary.max_batch_size

    @property
    def stats(self) -> FallbackStats:
        """Fallbacks so far."""
        return self._stats

    @property
    def info(self) -> BackendInfo:
        """The primary's figures plus fallback count, last reason and degraded state."""
        s = self._stats
        return replace(
            self._primary.info,
            fallbacks=s.count,
            last_fallback_reason=s.last_reason,
            degraded=s.degraded,
        )

    def infer(self, batch: FloatArray) -> FloatArray:
        """Run on the primary; on EngineError or MemoryError, run the same batch on the CPU."""
        check_batch(batch, self._card, self.max_batch_size)
        if self._try_primary():
            try:
                out = self._primary.infer(batch)
            except (EngineError, MemoryError) as exc:
                self._record(exc)
            else:
                self._succeeded()
                return out
        return self._fallback.infer(batch)

    def infer_into(self, inputs: Sequence[FloatArray], outputs: Sequence[FloatArray]) -> None:
        """`infer` for a batch in pieces, written in place (see `base.infer_into`)."""
        if self._try_primary():
            try:
                infer_into(self._primary, inputs, outputs)
            except (EngineError, MemoryError) as exc:
                self._record(exc)
            else:
                self._succeeded()
                return
        infer_into(self._fallback, inputs, outputs)

    def _try_primary(self) -> bool:
        """False while degraded; that batch then counts as one the CPU ran instead."""
        with self._lock:
            if self._stats.degraded:
                self._stats = replace(self._stats, count=self._stats.count + 1)
            return not self._stats.degraded

    def _succeeded(self) -> None:
        with self._lock:
            self._consecutive = 0

    def _record(self, exc: BaseException) -> None:
        with self._lock:
            self._consecutive += 1
            degraded = self._consecutive >= self._limit
            reason = f"{type(exc).__name__}: {exc}"
            self._stats = FallbackStats(self._stats.count + 1, reason, time.time(), degraded)
        info = self._primary.info
        log.warning("%s on %s failed, batch rerun on CPU: %s", self._card.name, info.device, reason)
        if degraded:
            log.error(
                "%s: %d GPU failures in a row; CPU only until reset", self._card.name, self._limit
            )

    def reset(self) -> None:
        """Try the primary engine again (after an operator fixed the GPU)."""
        with self._lock:
            self._consecutive = 0
            self._stats = replace(self._stats, degraded=False)

    def close(self) -> None:
        """Close both engines."""
        self._primary.close()
        self._fallback.close()
