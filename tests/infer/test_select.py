"""Backend selection from what the host offers, and CPU fallback when the GPU engine fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, Engine, FloatArray
from imaging_ai.infer.ort import OrtBackend, OrtOptions
from imaging_ai.infer.select import (
    Environment,
    FallbackEngine,
    choose_backend,
    load_engine,
    make_backend,
)
from imaging_ai.modelcard import ModelCard
from tests.infer.tiny_model import TinyModel

CUDA_EP = ("CUDAExecutionProvider", "CPUExecutionProvider")
CPU_EP = ("CPUExecutionProvider",)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (Environment(tensorrt=True, cuda_python=True, gpus=1, ort_providers=CUDA_EP), "tensorrt"),
        (Environment(True, True, 0, CUDA_EP), "onnxruntime-cpu"),
        (Environment(True, False, 1, CUDA_EP), "onnxruntime-cuda"),
        (Environment(False, True, 2, CUDA_EP), "onnxruntime-cuda"),
        (Environment(False, True, 2, CPU_EP), "onnxruntime-cpu"),
        (Environment(False, False, 0, CPU_EP), "onnxruntime-cpu"),
    ],
)
def test_auto_prefers_tensorrt_then_ort_cuda_then_cpu(env: Environment, expected: str) -> None:
    assert choose_backend("auto", env) == expected


@pytest.mark.parametrize(
    ("setting", "env", "reason"),
    [
        ("tensorrt", Environment(False, True, 1, CUDA_EP), "tensorrt package"),
        ("tensorrt", Environment(True, False, 1, CUDA_EP), "cuda-python"),
        ("tensorrt", Environment(True, True, 0, CUDA_EP), "no GPU"),
        ("onnxruntime-cuda", Environment(False, False, 1, CPU_EP), "onnxruntime-gpu"),
        ("onnxruntime-cuda", Environment(False, False, 0, CUDA_EP), "no GPU"),
        ("onnx", Environment(False, False, 0, CPU_EP), "expected one of"),
    ],
)
def test_a_forced_backend_the_host_lacks_is_refused(
    setting: str, env: Environment, reason: str
) -> None:
    with pytest.raises(EngineError, match=reason):
        choose_backend(setting, env)


def test_forced_settings_that_the_host_has() -> None:
    env = Environment(True, True, 1, CUDA_EP)
    for setting in ("tensorrt", "onnxruntime-cuda", "onnxruntime-cpu"):
        assert choose_backend(setting, env) == setting


def test_make_backend_for_the_cpu(tmp_path: Path) -> None:
    env = Environment(False, False, 0, CPU_EP)
    cpu = OrtOptions(intra_op_threads=2)
    be = make_backend("auto", tmp_path, env=env, ort_cpu=cpu)
    assert isinstance(be, OrtBackend) and be.name == "onnxruntime-cpu" and be.device == "cpu"
    assert be.options.intra_op_threads == 2


def test_make_backend_for_onnxruntime_cuda_uses_the_tuned_gpu_options(tmp_path: Path) -> None:
    env = Environment(False, True, 1, CUDA_EP)
    be = make_backend("auto", tmp_path, env=env, ort_gpu=OrtOptions(precision="fp16"))
    assert isinstance(be, OrtBackend) and be.name == "onnxruntime-cuda"
    assert be.options.io_binding and be.options.prefer_nhwc and be.options.precision == "fp16"


class BrokenGpuEngine:
    """A GPU engine that fails the way a driver fault or an OOM surfaces."""

    def __init__(self, error: BaseException | None) -> None:
        self.error, self.calls = error, 0
        self.info = BackendInfo("tiny", "tensorrt", "cuda:0", "fp16", 8)

    max_batch_size = 8

    def infer(self, batch: FloatArray) -> FloatArray:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return np.zeros((batch.shape[0], 3, 16, 16), np.float32)

    def close(self) -> None:
        pass


def cpu_engine(tiny: TinyModel) -> Engine:
    return OrtBackend(OrtOptions(max_batch_size=8)).load(tiny.card)


def test_a_failing_gpu_batch_is_rerun_on_the_cpu_and_counted(tiny: TinyModel) -> None:
    gpu = BrokenGpuEngine(EngineError("CUDA cudaMemcpyAsync failed: cudaErrorIllegalAddress"))
    engine = FallbackEngine(gpu, cpu_engine(tiny), tiny.card)
    batch = tiny.batch(4)
    np.testing.assert_allclose(engine.infer(batch), tiny.expected(batch), atol=1e-5)
    info = engine.info
    assert info.fallbacks == 1 and "cudaErrorIllegalAddress" in (info.last_fallback_reason or "")
    assert info.backend == "tensorrt" and not info.degraded
    assert engine.stats.last_at is not None


def test_out_of_memory_falls_back_too(tiny: TinyModel) -> None:
    engine = FallbackEngine(BrokenGpuEngine(MemoryError("oom")), cpu_engine(tiny), tiny.card)
    engine.infer(tiny.batch(1))
    assert engine.info.fallbacks == 1


def test_repeated_failures_degrade_to_cpu_until_reset(tiny: TinyModel) -> None:
    gpu = BrokenGpuEngine(EngineError("driver"))
    engine = FallbackEngine(gpu, cpu_engine(tiny), tiny.card, max_consecutive_failures=2)
    for _ in range(4):
        engine.infer(tiny.batch(1))
    # Two reruns after failures, then two batches sent straight to the CPU: all four count,
    # so a study that runs while the GPU is lost is recorded as run on the CPU too.
    assert gpu.calls == 2 and engine.info.degraded and engine.info.fallbacks == 4
    gpu.error = None
    engine.reset()
    engine.infer(tiny.batch(1))
    assert gpu.calls == 3 and not engine.info.degraded


def test_a_success_resets_the_consecutive_count(tiny: TinyModel) -> None:
    gpu = BrokenGpuEngine(EngineError("transient"))
    engine = FallbackEngine(gpu, cpu_engine(tiny), tiny.card, max_consecutive_failures=2)
    engine.infer(tiny.batch(1))
    gpu.error = None
    engine.infer(tiny.batch(1))
    gpu.error = EngineError("transient")
    engine.infer(tiny.batch(1))
    assert not engine.info.degraded and engine.info.fallbacks == 2


def test_a_bad_batch_is_not_mistaken_for_a_gpu_failure(tiny: TinyModel) -> None:
    gpu = BrokenGpuEngine(None)
    engine = FallbackEngine(gpu, cpu_engine(tiny), tiny.card)
    with pytest.raises(ValueError):
        engine.infer(np.zeros((2, 1, 8, 8), np.float32))
    assert gpu.calls == 0 and engine.info.fallbacks == 0


def test_load_engine_wraps_gpu_engines_only(tiny: TinyModel) -> None:
    class FakeGpuBackend:
        name, device = "tensorrt", "cuda:0"

        def load(self, card: ModelCard, onnx_path: Path | None = None) -> Engine:
            return BrokenGpuEngine(EngineError("boom"))

    wrapped = load_engine(FakeGpuBackend(), tiny.card)
    assert isinstance(wrapped, FallbackEngine) and wrapped.max_batch_size == 8
    wrapped.infer(tiny.batch(2))
    assert wrapped.info.fallbacks == 1
    plain = load_engine(OrtBackend(), tiny.card)
    assert not isinstance(plain, FallbackEngine)


def test_a_failing_gpu_batch_in_pieces_is_rerun_on_the_cpu_into_the_same_pieces(
    tiny: TinyModel,
) -> None:
    gpu = BrokenGpuEngine(EngineError("CUDA cudaMemcpyAsync failed: cudaErrorIllegalAddress"))
    engine = FallbackEngine(gpu, cpu_engine(tiny), tiny.card)
    batch = tiny.batch(4)
    out = np.full((4, 3, 16, 16), np.nan, np.float32)
    engine.infer_into([batch[:1], batch[1:]], [out[:1], out[1:]])
    np.testing.assert_allclose(out, tiny.expected(batch), atol=1e-5)
    assert gpu.calls == 1 and engine.stats.count == 1
