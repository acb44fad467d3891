"""Test-only: a fake `cuda.bindings.runtime` whose "device" memory is host memory.

Names (cudaMalloc, cudaError_t, ...) follow the real module so code under test cannot tell.

It keeps the real module's calling convention (every call returns `(err, *values)`, errors are
`CudaError` members) and its asynchrony: copies and kernels enqueued on a stream run only at
`cudaStreamSynchronize`, so code that reads an output before synchronising reads stale data,
as it would on a GPU. It refuses what our engines must never do: copies outside an allocation,
async copies from pageable (non-pinned) host memory, double frees; `fail_next` injects errors.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any


class CudaError(enum.IntEnum):
    """The subset of CUDA runtime error codes the fake returns."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorIllegalAddress = 700


class MemcpyKind(enum.IntEnum):
    """Copy directions, as in the real module."""

    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


class StreamHandle:
    """A stream handle; `int()` gives its address as TensorRT wants it."""

    def __init__(self, address: int) -> None:
        self._address = address

    def __int__(self) -> int:
        return self._address


@dataclass
class DeviceProp:
    """The fields of cudaDeviceProp the engines read."""

    name: bytes
    major: int
    minor: int
    totalGlobalMem: int


_OK = CudaError.cudaSuccess
_BAD = CudaError.cudaErrorInvalidValue


class FakeCudart(ModuleType):
    """Stands in for `cuda.bindings.runtime`; pass it to CudaRuntime or put it in sys.modules."""

    cudaError_t = CudaError
    cudaMemcpyKind = MemcpyKind
    cudaStream_t = StreamHandle
    cudaStreamDefault = 0
    cudaStreamNonBlocking = 1

    def __init__(self, devices: int = 1, name: str = "NVIDIA H200", cc: tuple[int, int] = (9, 0)):
        super().__init__("cuda.bindings.runtime")
        self.devices, self.gpu_name, self.cc = devices, name, cc
        self.device_mem: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.pinned_mem: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.registered: dict[int, int] = {}  # cudaHostRegister: address -> bytes
        self.queues: dict[int, list[Callable[[], None]]] = {}
        self.failures: dict[str, CudaError] = {}
        self.calls: list[str] = []
        self._ids = itertools.count(0x7F00)

    def fail_next(self, call: str, error: CudaError) -> None:
        """Make the next `call` (e.g. "cudaMalloc") return `error`."""
        self.failures[call] = error

    def _enter(self, call: str) -> CudaError:
        self.calls.append(call)
        return self.failures.pop(call, _OK)

    def cudaGetDeviceCount(self) -> tuple[CudaError, int]:
        err = self._enter("cudaGetDeviceCount")
        if err == _OK and not self.devices:
            err = CudaError.cudaErrorNoDevice
        return err, self.devices

    def cudaSetDevice(self, device: int) -> tuple[CudaError]:
        err = self._enter("cudaSetDevice")
        return (err if err != _OK or 0 <= device < self.devices else _BAD,)

    def cudaGetDeviceProperties(self, device: int) -> tuple[CudaError, DeviceProp]:
        err = self._enter("cudaGetDeviceProperties")
        prop = DeviceProp(self.gpu_name.encode() + b"\0" * 8, *self.cc, 141 << 30)
        return (err if err != _OK or 0 <= device < self.devices else _BAD), prop

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[CudaError, StreamHandle]:
        err = self._enter("cudaStreamCreateWithFlags")
        stream = StreamHandle(next(self._ids) << 8)
        if err == _OK:
            self.queues[int(stream)] = []
        return err, stream

    def cudaStreamSynchronize(self, stream: StreamHandle | int) -> tuple[CudaError]:
        err = self._enter("cudaStreamSynchronize")
        queue = self.queues.get(int(stream))
        if err != _OK or queue is None:
            return (err if err != _OK else _BAD,)
        while queue:
            queue.pop(0)()
        return (_OK,)

    def cudaStreamDestroy(self, stream: StreamHandle | int) -> tuple[CudaError]:
        err = self._enter("cudaStreamDestroy")
        return (err if err != _OK or self.queues.pop(int(stream), None) is not None else _BAD,)

    def cudaMalloc(self, size: int) -> tuple[CudaError, int]:
        return self._alloc("cudaMalloc", self.device_mem, size)

    def cudaMallocHost(self, size: int) -> tuple[CudaError, int]:
        return self._alloc("cudaMallocHost", self.pinned_mem, size)

    def _alloc(self, call: str, pool: dict[int, Any], size: int) -> tuple[CudaError, int]:
        err = self._enter(call)
        if err != _OK or size <= 0:
            return (err if err != _OK else _BAD), 0
        buf = ctypes.create_string_buffer(size)
        pool[ctypes.addressof(buf)] = buf
        return _OK, ctypes.addressof(buf)

    def cudaFree(self, ptr: int) -> tuple[CudaError]:
        err = self._enter("cudaFree")
        return (err if err != _OK or self.device_mem.pop(ptr, None) is not None else _BAD,)

    def cudaFreeHost(self, ptr: int) -> tuple[CudaError]:
        err = self._enter("cudaFreeHost")
        return (err if err != _OK or self.pinned_mem.pop(ptr, None) is not None else _BAD,)

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> tuple[CudaError]:
        err = self._enter("cudaHostRegister")
        if err != _OK or size <= 0 or self._host_ok(ptr, 1):
            return (err if err != _OK else _BAD,)  # registering twice is an error in CUDA too
        self.registered[ptr] = size
        return (_OK,)

    def cudaHostUnregister(self, ptr: int) -> tuple[CudaError]:
        err = self._enter("cudaHostUnregister")
        return (err if err != _OK or self.registered.pop(ptr, None) is not None else _BAD,)

    def _host_ok(self, ptr: int, count: int) -> bool:
        """Page-locked host memory: from cudaMallocHost or registered."""
        if _inside(self.pinned_mem, ptr, count):
            return True
        return any(base <= ptr and ptr + count <= base + n for base, n in self.registered.items())

    def cudaMemcpyAsync(
        self, dst: int, src: int, count: int, kind: MemcpyKind, stream: StreamHandle | int
    ) -> tuple[CudaError]:
        err = self._enter("cudaMemcpyAsync")
        to_device = kind == MemcpyKind.cudaMemcpyHostToDevice
        if err != _OK or kind not in (
            MemcpyKind.cudaMemcpyHostToDevice,
            MemcpyKind.cudaMemcpyDeviceToHost,
        ):
            return (err if err != _OK else _BAD,)
        device, host = (dst, src) if to_device else (src, dst)
        queue = self.queues.get(int(stream))
        if queue is None or not _inside(self.device_mem, device, count):
            return (_BAD,)
        if not self._host_ok(host, count):
            return (_BAD,)

        def copy() -> None:
            ctypes.memmove(dst, src, count)

        queue.append(copy)
        return (_OK,)

    # What the fake TensorRT uses to reach "device" memory and to run work on a stream.

    def device_bytes(self, ptr: int, count: int) -> memoryview | None:
        """A writable view of `count` device bytes at `ptr`, or None if outside an allocation."""
        if not _inside(self.device_mem, ptr, count):
            return None
        return memoryview((ctypes.c_char * count).from_address(ptr)).cast("B")

    def enqueue(self, stream: int, work: Callable[[], None]) -> bool:
        """Queue `work` on `stream` (False for an unknown stream, such as the default one)."""
        queue = self.queues.get(stream)
        if queue is None:
            return False
        queue.append(work)
        return True

    def leaks(self) -> dict[str, int]:
        """Allocations and streams not yet freed, by kind."""
        counts = {"device": len(self.device_mem), "pinned": len(self.pinned_mem)}
        return {**counts, "streams": len(self.queues)}


def _inside(pool: dict[int, ctypes.Array[ctypes.c_char]], ptr: int, count: int) -> bool:
    return any(base <= ptr and ptr + count <= base + len(buf) for base, buf in pool.items())
