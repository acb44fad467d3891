"""Test-only: a fixed-latency backend for scheduler tests, a GPU that fails, and tiny ONNX models
for engine tests.

Nothing here runs in a hospital's daemon. `FixedLatencyBackend` stands in for a GPU whose batch
time is `latency_s_per_batch + per_slice_s * N`, so batching and scheduling can be tested for
timing without a model; its outputs are deterministic and tell which slice produced them.
`FailingGpu` is the engine factory a daemon armed with IMAGING_AI_FAULT=gpu:error gives its
GPU workers: every batch on the "GPU" raises the error a lost device gives, behind the daemon's
own CPU fallback (`select.load_engine`), so the tests can watch a study survive it.
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


def write_conv_softmax_onnx(
    path: Path,
    *,
    in_channels: int = 1,
    classes: int = 3,
    size: tuple[int, int] = (16, 16),
    batch_dim: str | int = "batch",
    input_name: str = "image",
    output_name: str = "probabilities",
    seed: int = 0,
) -> tuple[FloatArray, FloatArray]:
    """Test-only: write a 1x1 Conv + Softmax(axis=1) ONNX model with known weights.

    Parameters
    ----------
    path : Path
        Where to write the model.
    in_channels, classes : int
        Input channels and output classes.
    size : tuple[int, int]
        Height and width, declared fixed.
    batch_dim : str or int
        A symbol for a dynamic batch axis, or an int to declare a fixed batch (for negative tests).
    input_name, output_name : str
        Tensor names.
    seed : int
        Seed of the random weights.

    Returns
    -------
    tuple[FloatArray, FloatArray]
        Weights [classes, in_channels] and bias [classes], to compute the expected output.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((classes, in_channels, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(classes).astype(np.float32)
    x = helper.make_tensor_value_info(
        input_name, TensorProto.FLOAT, [batch_dim, in_channels, *size]
    )
    y = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch_dim, classes, *size])
    nodes = [
        helper.make_node("Conv", [input_name, "weight", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], [output_name], axis=1),
    ]
    inits = [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")]
    graph = helper.make_graph(nodes, "conv_softmax", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # readable by every onnxruntime this project supports
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return weight[:, :, 0, 0], bias
