"""A serialised TensorRT plan in; an Engine that runs batches on its own CUDA streams out.

Per `shared/TENSORRT.md`: one execution context per stream (`streams` lanes, each with its
own pinned host and device buffers sized for the largest batch), and per batch
`set_input_shape`, `set_tensor_address` for every I/O tensor, `execute_async_v3` on the
lane's non-default stream, then a synchronise before the output is read.
"""

from __future__ import annotations

import math
import queue
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import BackendInfo, FloatArray, check_batch, sample_batch
from imaging_ai.infer.cuda_mem import CudaRuntime, DeviceBuffer, PinnedBuffer, Stream
from imaging_ai.modelcard import ModelCard


@dataclass
class _Lane:
    """Everything one concurrent batch needs: a context, a stream and its buffers."""

    context: Any
    stream: Stream
    host_in: PinnedBuffer
    host_out: PinnedBuffer
    device: dict[str, DeviceBuffer]


@dataclass(frozen=True)
class _Tensor:
    name: str
    is_input: bool
    dtype: np.dtype[Any]


class TensorRTEngine:
    """A deserialised engine with `streams` lanes; `infer` may be called from that many threads."""

    def __init__(
        self, trt: Any, cuda: CudaRuntime, plan: bytes, card: ModelCard, streams: int,
        device_id: int, info: BackendInfo,
    ) -> None:  # fmt: skip
        self._trt, self._cuda, self._card, self._device_id = trt, cuda, card, device_id
        cuda.set_device(device_id)
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise EngineError(
                f"{card.name}: TensorRT could not deserialise the engine plan (built by another "
                "TensorRT version or for another GPU?); run `imaging-ai build-engines --force`"
            )
        self._tensors = self._io_tensors()
        self._max = self._profile_max_batch()
        self.info = replace(info, max_batch_size=self._max)
        self._lanes: queue.Queue[_Lane] = queue.Queue()
        self._all_lanes: list[_Lane] = []
        for _ in range(streams):
            lane = self._make_lane()
            self._all_lanes.append(lane)
            self._lanes.put(lane)

    def _io_tensors(self) -> dict[str, _Tensor]:
        engine, trt = self._engine, self._trt
        dtypes: dict[Any, np.dtype[Any]] = {
            trt.DataType.FLOAT: np.dtype(np.float32),
            trt.DataType.HALF: np.dtype(np.float16),
        }
        tensors: dict[str, _Tensor] = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            dtype = engine.get_tensor_dtype(name)
            if dtype not in dtypes:
                raise EngineError(f"{self._card.name}: tensor {name!r} has unsupported {dtype}")
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            tensors[name] = _Tensor(name, is_input, dtypes[dtype])
        for name, is_input in ((self._card.input.name, True), (self._card.output.name, False)):
            if name not in tensors or tensors[name].is_input != is_input:
                raise EngineError(f"{self._card.name}: the engine has no I/O tensor {name!r}")
        return tensors

    def _profile_max_batch(self) -> int:
        _, _, largest = self._engine.get_tensor_profile_shape(self._card.input.name, 0)
        return int(largest[0])

    def _make_lane(self) -> _Lane:
        context = self._engine.create_execution_context()
        if context is None:
            raise EngineError(f"{self._card.name}: no execution context (out of GPU memory?)")
        self._set_shape(context, self._max)
        nbytes = {
            name: math.prod(context.get_tensor_shape(name)) * t.dtype.itemsize
            for name, t in self._tensors.items()
        }
        device = {name: self._cuda.alloc_device(n) for name, n in nbytes.items()}
        return _Lane(
            context=context,
            stream=self._cuda.create_stream(),
            host_in=self._cuda.alloc_pinned(nbytes[self._card.input.name]),
            host_out=self._cuda.alloc_pinned(nbytes[self._card.output.name]),
            device=device,
        )

    def _set_shape(self, context: Any, n: int) -> None:
        shape = (n, *self._card.input_shape)
        if not context.set_input_shape(self._card.input.name, shape):
            raise EngineError(f"{self._card.name}: TensorRT refused input shape {shape}")

    @property
    def max_batch_size(self) -> int:
        """The optimisation profile's largest batch."""
        return self._max

    def infer(self, batch: FloatArray) -> FloatArray:
        """Run one batch on a free lane; CUDA and TensorRT failures become EngineError."""
        check_batch(batch, self._card, self._max)
        lane = self._lanes.get()
        try:
            return self._run(lane, batch)
        except RuntimeError as exc:  # what pybind11 makes of a C++ exception in TensorRT
            raise EngineError(f"{self._card.name}: TensorRT failed: {exc}") from exc
        finally:
            self._lanes.put(lane)

    def _run(self, lane: _Lane, batch: FloatArray) -> FloatArray:
        # The current device is per host thread, and callers' threads are not ours.
        self._cuda.set_device(self._device_id)
        name_in, name_out = self._card.input.name, self._card.output.name
        host_in = lane.host_in.array(self._tensors[name_in].dtype, batch.shape)
        host_in[...] = batch
        self._set_shape(lane.context, batch.shape[0])
        for name, buf in lane.device.items():
            if not lane.context.set_tensor_address(name, buf.ptr):
                raise EngineError(f"{self._card.name}: TensorRT refused the address of {name!r}")
        self._cuda.copy_to_device(lane.device[name_in], lane.host_in, host_in.nbytes, lane.stream)
        if not lane.context.execute_async_v3(lane.stream.address):
            raise EngineError(f"{self._card.name}: TensorRT execute_async_v3 failed")
        shape = tuple(int(d) for d in lane.context.get_tensor_shape(name_out))
        dtype = self._tensors[name_out].dtype
        nbytes = math.prod(shape) * dtype.itemsize
        self._cuda.copy_to_host(lane.host_out, lane.device[name_out], nbytes, lane.stream)
        lane.stream.synchronize()
        return lane.host_out.array(dtype, shape).astype(np.float32, copy=True)

    def warm_up(self) -> None:
        """Run a sample batch at the largest size on every lane, so no study pays for it."""
        for _ in self._all_lanes:
            self.infer(sample_batch(self._card, self._max))

    def close(self) -> None:
        """Free buffers and streams, then contexts, engine and runtime, in that order."""
        for lane in self._all_lanes:
            lane.stream.synchronize()
            lane.host_in.close()
            lane.host_out.close()
            for buf in lane.device.values():
                buf.close()
            lane.stream.close()
            lane.context = None
        self._all_lanes.clear()
        self._engine = self._runtime = None
