"""A ModelCard and its ONNX file in; an ONNX Runtime engine (CPU, CUDA or TensorRT provider) out.

`OrtOptions.provider` picks the execution provider; what `get_available_providers()` lists
decides whether it can load, and the session is checked afterwards because ONNX Runtime
silently falls back to the CPU when a GPU provider's libraries are missing. CUDA graphs need
fixed input addresses and shapes, so `OrtBoundEngine` binds one input/output pair per padded
batch size (1, 2, 4, ..., max) and gives each its own graph id.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import (
    BackendInfo,
    Engine,
    FloatArray,
    Precision,
    batch_sizes_up_to,
    check_batch,
    check_pieces,
    pad_batch,
    padded_size,
    sample_batch,
    write_pieces,
)
from imaging_ai.infer.cuda_mem import CudaRuntime
from imaging_ai.infer.fp16 import fp16_model_bytes
from imaging_ai.modelcard import ModelCard

log = logging.getLogger(__name__)

OrtProvider = Literal["cpu", "cuda", "tensorrt"]
PROVIDER_NAMES: dict[OrtProvider, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
ProviderConfig = list[str | tuple[str, dict[str, str]]]


@dataclass(frozen=True)
class OrtOptions:
    """How to run a model with ONNX Runtime."""

    provider: OrtProvider = "cpu"
    device_id: int = 0
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    allow_spinning: bool = True  # False: idle pool threads sleep at once instead of spinning
    precision: Precision = "fp32"
    prefer_nhwc: bool = False
    cuda_graph: bool = False
    io_binding: bool = False  # implied by cuda_graph
    max_batch_size: int = 32
    gpu_mem_limit_bytes: int = 0  # 0: no limit
    trt_cache_dir: Path | None = None
    trt_workspace_bytes: int = 4 << 30

    def validate(self) -> None:
        """Refuse combinations ONNX Runtime cannot run; raises EngineError."""
        if self.precision == "int8":
            raise EngineError("INT8 is not supported: it needs calibration on real slices")
        gpu_only = {"fp16": self.precision == "fp16", "prefer_nhwc": self.prefer_nhwc}
        gpu_only["cuda_graph"] = self.cuda_graph
        for option, wanted in gpu_only.items():
            if wanted and self.provider == "cpu":
                raise EngineError(f"onnxruntime {option} needs the cuda or tensorrt provider")
        if self.max_batch_size < 1:
            raise EngineError(f"max_batch_size = {self.max_batch_size}: expected >= 1")


# CUDA graphs in the daemon's GPU engines (see `gpu_tuned`).
GPU_CUDA_GRAPHS = False


def gpu_tuned(options: OrtOptions) -> OrtOptions:
    """The options the daemon runs ONNX Runtime's CUDA provider with.

    IO binding with page-locked copies straight from and into the workers' shared slots, and
    NHWC kernels for FP16: together the fastest on an H200 (docs/benchmarks.md, "Engines on
    one H200"); CUDA graphs per `GPU_CUDA_GRAPHS`.
    """
    if options.provider != "cuda":
        return options
    nhwc = options.prefer_nhwc or options.precision == "fp16"
    graphs = options.cuda_graph or GPU_CUDA_GRAPHS
    return replace(options, io_binding=True, prefer_nhwc=nhwc, cuda_graph=graphs)


def import_ort() -> ModuleType:
    """The `onnxruntime` module (imported on first use, so importing this module is cheap)."""
    return importlib.import_module("onnxruntime")


def available_providers(ort: ModuleType | None = None) -> list[str]:
    """Execution providers this ONNX Runtime build offers (GPU ones only with onnxruntime-gpu).

    Parameters
    ----------
    ort : ModuleType, optional
        The onnxruntime module, for tests.

    Returns
    -------
    list[str]
        e.g. ["CUDAExecutionProvider", "CPUExecutionProvider"].
    """
    return list((ort or import_ort()).get_available_providers())


def provider_config(options: OrtOptions, card: ModelCard) -> ProviderConfig:
    """The `providers=` list for an InferenceSession, most preferred first.

    Parameters
    ----------
    options : OrtOptions
        Provider and its options.
    card : ModelCard
        The model (its input name and size set the TensorRT provider's profile).

    Returns
    -------
    list
        Provider names, or (name, options) pairs; the CPU provider always comes last.
    """
    providers: ProviderConfig = []
    if options.provider == "tensorrt":
        providers.append((PROVIDER_NAMES["tensorrt"], _trt_ep_options(options, card)))
    if options.provider in ("cuda", "tensorrt"):
        cuda = {"device_id": str(options.device_id), "cudnn_conv_algo_search": "EXHAUSTIVE"}
        if options.prefer_nhwc:
            cuda["prefer_nhwc"] = "1"
        if options.cuda_graph:
            cuda["enable_cuda_graph"] = "1"
        if options.gpu_mem_limit_bytes:
            cuda["gpu_mem_limit"] = str(options.gpu_mem_limit_bytes)
        providers.append((PROVIDER_NAMES["cuda"], cuda))
    providers.append(PROVIDER_NAMES["cpu"])
    return providers


def _trt_ep_options(options: OrtOptions, card: ModelCard) -> dict[str, str]:
    def shape(n: int) -> str:
        return f"{card.input.name}:{n}x" + "x".join(map(str, card.input_shape))

    trt = {
        "device_id": str(options.device_id),
        "trt_fp16_enable": str(options.precision == "fp16"),
        "trt_max_workspace_size": str(options.trt_workspace_bytes),
        "trt_profile_min_shapes": shape(1),
        "trt_profile_opt_shapes": shape(options.max_batch_size),
        "trt_profile_max_shapes": shape(options.max_batch_size),
    }
    if options.trt_cache_dir is not None:
        trt |= {"trt_engine_cache_enable": "True", "trt_timing_cache_enable": "True"}
        trt["trt_engine_cache_path"] = str(options.trt_cache_dir)
        trt["trt_timing_cache_path"] = str(options.trt_cache_dir)
    return trt


def ort_errors(ort: ModuleType) -> tuple[type[BaseException], ...]:
    """The exception types an ONNX Runtime run raises for a runtime or device failure."""
    state = importlib.import_module(f"{ort.__name__}.capi.onnxruntime_pybind11_state")
    names = ["Fail", "RuntimeException", "EPFail", "InvalidArgument", "NotImplemented"]
    names += ["NoSuchFile", "InvalidGraph", "InvalidProtobuf"]
    found = tuple(getattr(state, n) for n in names if hasattr(state, n))
    return (*found, RuntimeError, MemoryError)


class OrtBackend:
    """Loads models into ONNX Runtime sessions with one provider configuration."""

    def __init__(self, options: OrtOptions | None = None, *, ort: ModuleType | None = None):
        self.options = options or OrtOptions()
        self._ort = ort

    @property
    def name(self) -> str:
        """`onnxruntime-` + provider: `onnxruntime-cpu`, `-cuda` or `-tensorrt`."""
        return f"onnxruntime-{self.options.provider}"

    @property
    def device(self) -> str:
        """`cpu` or `cuda:<id>`."""
        return "cpu" if self.options.provider == "cpu" else f"cuda:{self.options.device_id}"

    def load(self, card: ModelCard, onnx_path: Path | None = None) -> Engine:
        """Create the session, check its provider really loaded, and warm it up.

        Parameters
        ----------
        card : ModelCard
            The model.
        onnx_path : Path, optional
            The ONNX file; the card's own by default.

        Returns
        -------
        Engine
            An `OrtBoundEngine` when CUDA graphs or IO binding are on, else an `OrtEngine`.

        Raises
        ------
        EngineError
            The provider is not available or did not load, or the session failed.
        """
        self.options.validate()
        ort = self._ort or import_ort()
        wanted = PROVIDER_NAMES[self.options.provider]
        if wanted not in available_providers(ort):
            raise EngineError(f"{wanted} is not in this onnxruntime build; install onnxruntime-gpu")
        path = onnx_path or card.onnx_path
        model = fp16_model_bytes(path) if self._converts_fp16() else str(path)
        session = self._session(ort, model, card)
        info = BackendInfo(card.name, self.name, self.device, self.options.precision, 0)
        bound = self.options.cuda_graph or self.options.io_binding
        engine: OrtEngine | OrtBoundEngine
        if bound:
            engine = OrtBoundEngine(session, card, self.options, ort, info)
        else:
            engine = OrtEngine(session, card, self.options.max_batch_size, ort, info)
        engine.warm_up()
        return engine

    def _converts_fp16(self) -> bool:
        # The TensorRT provider takes FP16 as a builder flag on the FP32 model instead.
        return self.options.precision == "fp16" and self.options.provider == "cuda"

    def _session(self, ort: ModuleType, model: bytes | str, card: ModelCard) -> Any:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = self.options.intra_op_threads
        so.inter_op_num_threads = 1
        if not self.options.allow_spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        if self.options.provider == "cpu":
            # A memory pattern is planned per input shape, and each keeps its own block in
            # the CPU arena: batches of every size from 1 to 32 took a worker from 1.56 to
            # 3.1 GiB. Without patterns the arena reuses its chunks (1.62 GiB, flat), at the
            # same speed per slice (tests/test_memory_flat.py; docs/benchmarks.md, "Inference
            # worker memory on the CPU").
            so.enable_mem_pattern = False
        providers = provider_config(self.options, card)
        errors: tuple[type[BaseException], ...] = (*ort_errors(ort), OSError)
        try:
            session = ort.InferenceSession(model, sess_options=so, providers=providers)
        except errors as exc:
            raise EngineError(f"{card.name}: ONNX Runtime could not load the model: {exc}") from exc
        got = session.get_providers()
        if got[0] != PROVIDER_NAMES[self.options.provider]:
            raise EngineError(
                f"{card.name}: {PROVIDER_NAMES[self.options.provider]} did not load (missing CUDA "
                f"or cuDNN libraries?); the session would run on {got}"
            )
        return session


class OrtEngine:
    """A plain ONNX Runtime session: numpy in, numpy out, any batch size up to the maximum."""

    def __init__(
        self, session: Any, card: ModelCard, max_batch: int, ort: ModuleType, info: BackendInfo
    ) -> None:
        self._session, self._card, self._max = session, card, max_batch
        self._errors = ort_errors(ort)
        self._info = replace(info, max_batch_size=max_batch)

    @property
    def max_batch_size(self) -> int:
        """The largest batch `infer` accepts."""
        return self._max

    @property
    def info(self) -> BackendInfo:
        """Backend figures for the status page."""
        return self._info

    def infer(self, batch: FloatArray) -> FloatArray:
        """Run one batch; ONNX Runtime failures become EngineError."""
        check_batch(batch, self._card, self._max)
        feeds = {self._card.input.name: np.ascontiguousarray(batch)}
        try:
            (out,) = self._session.run([self._card.output.name], feeds)
        except self._errors as exc:
            raise EngineError(f"{self._card.name}: {self._info.backend} failed: {exc}") from exc
        return np.asarray(out, dtype=np.float32)

    def warm_up(self) -> None:
        """Run one sample slice so the first study does not pay for lazy initialisation."""
        self.infer(sample_batch(self._card, 1))

    def close(self) -> None:
        """Drop the session."""
        self._session = None


_stages = threading.local()


def last_stages() -> tuple[int, int, int] | None:
    """Nanoseconds of copy in, run and copy out of this thread's last IO-bound batch, read once.

    For tracing where a worker's batch time goes (`imaging_ai.workers.BatchTrace`); None when
    this thread ran no `OrtBoundEngine` batch since the last call.
    """
    stages: tuple[int, int, int] | None = getattr(_stages, "last", None)
    _stages.last = None
    return stages


@dataclass
class _Slot:
    size: int
    binding: Any
    input: Any
    output: Any
    run_options: Any


class PieceCopier:
    """Copies a batch's pieces between host arrays and one device buffer, on a private stream.

    Each piece is one cudaMemcpyAsync; the stream is synchronised before a copy returns, so the
    ONNX Runtime run that follows (on its own stream) sees the data, and the outputs are in
    the host pieces when `to_host` returns. Host pieces should be page-locked (a worker's
    registered shared slots): then each copy is DMA at PCIe speed.
    """

    def __init__(self, cuda: CudaRuntime, device_id: int) -> None:
        cuda.set_device(device_id)
        self._cuda, self._stream = cuda, cuda.create_stream()

    def to_device(self, dst: int, pieces: Sequence[FloatArray]) -> None:
        """Copy the pieces, one after another, to device address `dst`."""
        keep = [np.ascontiguousarray(p) for p in pieces]  # alive until the copies are done
        for piece in keep:
            self._cuda.copy_async(dst, piece.ctypes.data, piece.nbytes, True, self._stream)
            dst += piece.nbytes
        self._stream.synchronize()

    def to_host(self, src: int, pieces: Sequence[FloatArray]) -> None:
        """Fill the pieces, one after another, from device address `src`."""
        for piece in pieces:
            if not piece.flags.c_contiguous:
                raise ValueError("output pieces must be C-contiguous")
            self._cuda.copy_async(piece.ctypes.data, src, piece.nbytes, False, self._stream)
            src += piece.nbytes
        self._stream.synchronize()

    def close(self) -> None:
        """Destroy the stream."""
        self._stream.close()


def piece_copier(options: OrtOptions) -> PieceCopier | None:
    """A copier for a GPU session when cuda-python is there; None for the CPU (or without it)."""
    if options.provider == "cpu":
        return None
    try:
        return PieceCopier(CudaRuntime(), options.device_id)
    except EngineError as exc:
        log.warning("IO binding without cuda-python copies (slower, pageable): %s", exc)
        return None


def bound_sizes(max_batch_size: int, device: str) -> tuple[int, ...]:
    """The padded batch sizes an IO-bound session runs: on a GPU only the largest.

    ONNX Runtime's CUDA provider re-plans its convolutions whenever a session's input shape
    differs from its previous run's: on an H200 every run after a change of batch size took
    350 ms (lung-seg) and 600-1,600 ms (nodule-det) instead of 3 and 9 ms, whatever the
    cuDNN cache held, and under the batchers' mixed sizes those runs left the GPU idle 60% of
    the time (`benchmarks/device/run_tail.py`; CHANGELOG.md, 2026-12-01, "Why the GPU idled").
    Padding every batch to the largest costs at most one full batch's run (9 ms) for a short
    one. On the CPU a shape change costs nothing, and padding would cost the padded slices'
    compute.
    """
    if device == "cpu":
        return batch_sizes_up_to(max_batch_size)
    return (max_batch_size,)


class OrtBoundEngine:
    """Fixed input/output buffers per padded batch size; replays CUDA graphs when enabled.

    On a GPU the batch's pieces are copied straight into the bound device input and the
    outputs straight out into the caller's arrays (`infer_into`): no stacking, no output
    allocation, and DMA when the host memory is page-locked.
    """

    def __init__(
        self, session: Any, card: ModelCard, options: OrtOptions, ort: ModuleType, info: BackendInfo
    ) -> None:
        self._session, self._card, self._errors = session, card, ort_errors(ort)
        device = "cpu" if options.provider == "cpu" else "cuda"
        self._sizes = bound_sizes(options.max_batch_size, device)
        self._info = replace(info, max_batch_size=self._sizes[-1], batch_sizes=self._sizes)
        self._out_dims = self._output_dims()
        self._slots = {
            size: self._slot(ort, options, device, size, graph_id)
            for graph_id, size in enumerate(self._sizes, start=1)  # id 0 is ORT's own
        }
        self._graphs = options.cuda_graph
        self._copier = piece_copier(options)
        self._lock = threading.Lock()  # one binding per size: runs must not interleave

    def _output_dims(self) -> tuple[int, ...]:
        name = self._card.output.name
        shape = next(o.shape for o in self._session.get_outputs() if o.name == name)
        if not all(isinstance(d, int) for d in shape[1:]):
            raise EngineError(
                f"{self._card.name}: IO binding and CUDA graphs need output {name!r} to have a "
                f"fixed shape apart from the batch axis; the model declares {shape}"
            )
        return tuple(shape[1:])

    def _slot(
        self, ort: ModuleType, options: OrtOptions, device: str, size: int, graph_id: int
    ) -> _Slot:
        make = ort.OrtValue.ortvalue_from_shape_and_type
        x = make((size, *self._card.input_shape), np.float32, device, options.device_id)
        x.update_inplace(np.zeros((size, *self._card.input_shape), np.float32))  # padding rows
        y = make((size, *self._out_dims), np.float32, device, options.device_id)
        binding = self._session.io_binding()
        binding.bind_ortvalue_input(self._card.input.name, x)
        binding.bind_ortvalue_output(self._card.output.name, y)
        run_options = ort.RunOptions()
        if options.cuda_graph:
            run_options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return _Slot(size, binding, x, y, run_options)

    @property
    def max_batch_size(self) -> int:
        """The largest padded batch size."""
        return self._sizes[-1]

    @property
    def info(self) -> BackendInfo:
        """Backend figures for the status page."""
        return self._info

    def infer(self, batch: FloatArray) -> FloatArray:
        """Pad the batch to the next bound size, run it, and return the first N results."""
        check_batch(batch, self._card, self.max_batch_size)
        out = np.empty((len(batch), *self._out_dims), np.float32)
        self.infer_into([batch], [out])
        return out

    def infer_into(self, inputs: Sequence[FloatArray], outputs: Sequence[FloatArray]) -> None:
        """Run the pieces of `inputs` as one batch; write the outputs into `outputs` in place.

        Raises
        ------
        ValueError
            The pieces do not fit the model or each other.
        EngineError
            ONNX Runtime or a CUDA copy failed.
        """
        n = check_pieces(inputs, outputs, self._card, self.max_batch_size, self._out_dims)
        slot = self._slots[padded_size(n, self._sizes)]
        with self._lock:
            try:
                t0 = time.perf_counter_ns()
                self._copy_in(slot, inputs, n)
                t1 = time.perf_counter_ns()
                self._session.run_with_iobinding(slot.binding, slot.run_options)
                t2 = time.perf_counter_ns()
                self._copy_out(slot, outputs, n)
                _stages.last = (t1 - t0, t2 - t1, time.perf_counter_ns() - t2)
            except self._errors as exc:
                raise EngineError(f"{self._card.name}: {self._info.backend} failed: {exc}") from exc

    def _copy_in(self, slot: _Slot, inputs: Sequence[FloatArray], n: int) -> None:
        if self._copier is not None:
            self._copier.to_device(slot.input.data_ptr(), inputs)
        else:
            batch = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
            slot.input.update_inplace(pad_batch(batch, slot.size))

    def _copy_out(self, slot: _Slot, outputs: Sequence[FloatArray], n: int) -> None:
        if self._copier is not None:
            self._copier.to_host(slot.output.data_ptr(), outputs)
        else:
            write_pieces(slot.output.numpy()[:n], outputs)

    def run_on_device(self, n: int) -> None:
        """Run the bound batch for `n` slices on what its device input holds (benchmarks)."""
        slot = self._slots[padded_size(n, self._sizes)]
        with self._lock:
            self._session.run_with_iobinding(slot.binding, slot.run_options)

    def warm_up(self) -> None:
        """Run every bound size twice: ONNX Runtime captures a CUDA graph on the second run."""
        for size in self._sizes:
            for _ in range(2 if self._graphs else 1):
                self.infer(sample_batch(self._card, size))

    def close(self) -> None:
        """Drop bindings, buffers, the copy stream and the session."""
        self._slots.clear()
        if self._copier is not None:
            self._copier.close()
            self._copier = None
        self._session = None
