"""cuda-python runtime calls in; checked streams, pinned host buffers and device buffers out.

Every `cuda.bindings.runtime` call returns a tuple `(err, *values)`; `CudaRuntime.call` checks
`err` on every one and raises EngineError naming the call, so a driver fault or an out-of-memory
surfaces where it happened. The runtime module can be injected (`tests.fakes.cudart_fake`
in tests); `benchmarks/device/engine_check.py` exercises this module on a real GPU.
"""

from __future__ import annotations

import ctypes
import importlib
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from imaging_ai.errors import EngineError

_HINTS = {
    "cudaErrorMemoryAllocation": "out of GPU memory",
    "cudaErrorNoDevice": "no GPU is visible (CUDA_VISIBLE_DEVICES?)",
    "cudaErrorInsufficientDriver": "the NVIDIA driver is older than the CUDA runtime",
}


@dataclass(frozen=True)
class DeviceInfo:
    """A GPU's identity as engine cache keys need it."""

    index: int
    name: str
    compute_capability: str
    total_memory: int


class CudaRuntime:
    """Checked wrappers around the `cuda.bindings.runtime` calls the engines use."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self.rt = module if module is not None else import_cudart()

    def call(self, what: str, result: tuple[Any, ...]) -> Any:
        """Check `(err, *values)` from a runtime call; return the value(s).

        Parameters
        ----------
        what : str
            The call's name, for the error message.
        result : tuple
            What the runtime call returned.

        Returns
        -------
        Any
            None, the one value, or a tuple of values.

        Raises
        ------
        EngineError
            `err` is not cudaSuccess.
        """
        err, *values = result
        if err != self.rt.cudaError_t.cudaSuccess:
            name = getattr(err, "name", None) or str(err)
            hint = _HINTS.get(name)
            raise EngineError(f"CUDA {what} failed: {name}" + (f" ({hint})" if hint else ""))
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def device_count(self) -> int:
        """Number of visible GPUs (raises EngineError when the driver is unusable)."""
        return int(self.call("cudaGetDeviceCount", self.rt.cudaGetDeviceCount()))

    def set_device(self, index: int) -> None:
        """Make GPU `index` current for the calling thread."""
        self.call("cudaSetDevice", self.rt.cudaSetDevice(index))

    def device_info(self, index: int) -> DeviceInfo:
        """Name, compute capability and memory of GPU `index`."""
        prop = self.call("cudaGetDeviceProperties", self.rt.cudaGetDeviceProperties(index))
        raw = prop.name
        name = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
        cc = f"{prop.major}.{prop.minor}"
        return DeviceInfo(index, name.strip(), cc, int(prop.totalGlobalMem))

    def create_stream(self) -> Stream:
        """A new non-blocking stream (never the legacy default stream)."""
        flags = self.rt.cudaStreamNonBlocking
        handle = self.call("cudaStreamCreateWithFlags", self.rt.cudaStreamCreateWithFlags(flags))
        return Stream(self, handle)

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        """`nbytes` of device memory (cudaMalloc)."""
        return DeviceBuffer(self, int(self.call("cudaMalloc", self.rt.cudaMalloc(nbytes))), nbytes)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        """`nbytes` of page-locked host memory (cudaMallocHost), so copies can be async."""
        ptr = int(self.call("cudaMallocHost", self.rt.cudaMallocHost(nbytes)))
        return PinnedBuffer(self, ptr, nbytes)

    def copy_to_device(
        self, dst: DeviceBuffer, src: PinnedBuffer, nbytes: int, stream: Stream
    ) -> None:
        """Enqueue a host→device copy of `nbytes` on `stream`."""
        _check_fits(nbytes, dst, src)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.call(
            "cudaMemcpyAsync H2D",
            self.rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, kind, stream.handle),
        )

    def copy_to_host(
        self, dst: PinnedBuffer, src: DeviceBuffer, nbytes: int, stream: Stream
    ) -> None:
        """Enqueue a device→host copy of `nbytes` on `stream`; read it after synchronising."""
        _check_fits(nbytes, dst, src)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.call(
            "cudaMemcpyAsync D2H",
            self.rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, kind, stream.handle),
        )

    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool, stream: Stream) -> None:
        """Enqueue a copy between raw addresses (a bound ONNX Runtime buffer, a shared slot).

        Host memory should be page-locked (`alloc_pinned` or `host_register`); from pageable
        memory the copy still happens, but staged by the driver and not asynchronously.
        """
        rt = self.rt.cudaMemcpyKind
        kind = rt.cudaMemcpyHostToDevice if to_device else rt.cudaMemcpyDeviceToHost
        what = "cudaMemcpyAsync " + ("H2D" if to_device else "D2H")
        self.call(what, self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream.handle))

    def host_register(self, ptr: int, nbytes: int) -> None:
        """Page-lock host memory that is already mapped (cudaHostRegister), for DMA copies."""
        self.call("cudaHostRegister", self.rt.cudaHostRegister(ptr, nbytes, 0))

    def host_unregister(self, ptr: int) -> None:
        """Undo `host_register` (before the memory is unmapped)."""
        self.call("cudaHostUnregister", self.rt.cudaHostUnregister(ptr))


def _check_fits(nbytes: int, *buffers: DeviceBuffer | PinnedBuffer) -> None:
    for buf in buffers:
        if buf.ptr == 0:
            raise ValueError("copy to or from a freed buffer")
        if nbytes > buf.nbytes:
            raise ValueError(f"copy of {nbytes} bytes exceeds a buffer of {buf.nbytes}")


class Stream:
    """A CUDA stream; `int(stream.handle)` is what TensorRT's execute_async_v3 takes."""

    def __init__(self, cuda: CudaRuntime, handle: Any) -> None:
        self.cuda, self.handle = cuda, handle

    @property
    def address(self) -> int:
        """The raw cudaStream_t value."""
        return int(self.handle)

    def synchronize(self) -> None:
        """Wait until all work enqueued on this stream has finished."""
        self.cuda.call("cudaStreamSynchronize", self.cuda.rt.cudaStreamSynchronize(self.handle))

    def close(self) -> None:
        """Destroy the stream (idempotent)."""
        if self.handle is not None:
            handle, self.handle = self.handle, None
            self.cuda.call("cudaStreamDestroy", self.cuda.rt.cudaStreamDestroy(handle))


class DeviceBuffer:
    """Device memory from cudaMalloc; `ptr` is what set_tensor_address takes."""

    def __init__(self, cuda: CudaRuntime, ptr: int, nbytes: int) -> None:
        self.cuda, self.ptr, self.nbytes = cuda, ptr, nbytes

    def close(self) -> None:
        """Free the memory (idempotent)."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self.cuda.call("cudaFree", self.cuda.rt.cudaFree(ptr))


class PinnedBuffer:
    """Page-locked host memory from cudaMallocHost, viewable as numpy arrays."""

    def __init__(self, cuda: CudaRuntime, ptr: int, nbytes: int) -> None:
        self.cuda, self.ptr, self.nbytes = cuda, ptr, nbytes

    def array(self, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        """A numpy view of the first `prod(shape)` items; it must not outlive the buffer.

        Parameters
        ----------
        dtype : numpy dtype
            Item type.
        shape : tuple[int, ...]
            View shape; must fit in the buffer.

        Returns
        -------
        numpy.ndarray
            Writable view over the pinned memory.
        """
        count = math.prod(shape)
        if not self.ptr or count * np.dtype(dtype).itemsize > self.nbytes:
            raise ValueError(f"a {shape} {np.dtype(dtype)} view does not fit {self.nbytes} bytes")
        raw = memoryview((ctypes.c_byte * self.nbytes).from_address(self.ptr)).cast("B")
        view: npt.NDArray[Any] = np.frombuffer(raw, dtype=np.dtype(dtype), count=count)
        return view.reshape(shape)

    def close(self) -> None:
        """Free the memory (idempotent); views taken earlier become invalid."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self.cuda.call("cudaFreeHost", self.cuda.rt.cudaFreeHost(ptr))


def import_cudart() -> ModuleType:
    """`cuda.bindings.runtime` (cuda-python >= 12.6), or EngineError saying what to install."""
    try:
        return importlib.import_module("cuda.bindings.runtime")
    except ImportError as exc:
        raise EngineError(f"cuda-python is not installed ({exc}); pip install cuda-python") from exc


def gpu_count(module: ModuleType | None = None) -> int:
    """Visible GPUs according to the CUDA runtime; 0 when cuda-python or the driver is missing.

    Parameters
    ----------
    module : ModuleType, optional
        A runtime module to use instead of `cuda.bindings.runtime`.

    Returns
    -------
    int
        The number of GPUs this process can use.
    """
    try:
        return CudaRuntime(module).device_count()
    except EngineError:
        return 0
