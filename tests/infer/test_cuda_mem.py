"""cuda_mem against the fake CUDA runtime: checked return codes, async copies, cleanup."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from imaging_ai.errors import EngineError
from imaging_ai.infer.cuda_mem import CudaRuntime, gpu_count
from tests.fakes.cudart_fake import CudaError, FakeCudart


def test_round_trip_through_device_memory_on_a_stream() -> None:
    rt = FakeCudart()
    cuda = CudaRuntime(rt)
    stream = cuda.create_stream()
    assert stream.address != 0  # never the legacy default stream
    src, dst = cuda.alloc_pinned(4096), cuda.alloc_pinned(4096)
    device = cuda.alloc_device(4096)
    data = np.arange(1024, dtype=np.float32)
    src.array(np.float32, (1024,))[...] = data
    cuda.copy_to_device(device, src, 4096, stream)
    cuda.copy_to_host(dst, device, 4096, stream)
    assert not dst.array(np.float32, (1024,)).any()  # nothing has run before synchronising
    stream.synchronize()
    np.testing.assert_array_equal(dst.array(np.float32, (1024,)), data)
    for resource in (src, dst, device, stream):
        resource.close()
        resource.close()  # idempotent
    assert rt.leaks() == {"device": 0, "pinned": 0, "streams": 0}


def test_every_error_code_becomes_an_engine_error_naming_the_call() -> None:
    rt = FakeCudart()
    cuda = CudaRuntime(rt)
    rt.fail_next("cudaMalloc", CudaError.cudaErrorMemoryAllocation)
    with pytest.raises(EngineError, match=r"cudaMalloc failed: cudaErrorMemoryAllocation \(out"):
        cuda.alloc_device(16)
    stream = cuda.create_stream()
    rt.fail_next("cudaStreamSynchronize", CudaError.cudaErrorIllegalAddress)
    with pytest.raises(EngineError, match="cudaStreamSynchronize failed: cudaErrorIllegalAddress"):
        stream.synchronize()


def test_copies_are_bounds_checked() -> None:
    cuda = CudaRuntime(FakeCudart())
    stream, host, device = cuda.create_stream(), cuda.alloc_pinned(64), cuda.alloc_device(32)
    with pytest.raises(ValueError, match="exceeds"):
        cuda.copy_to_device(device, host, 64, stream)
    device.close()
    with pytest.raises(ValueError, match="freed"):
        cuda.copy_to_device(device, host, 16, stream)
    with pytest.raises(ValueError, match="does not fit"):
        host.array(np.float32, (17,))


def test_device_identity_and_count() -> None:
    cuda = CudaRuntime(FakeCudart(devices=2, name="NVIDIA H200", cc=(9, 0)))
    info = cuda.device_info(1)
    assert (info.name, info.compute_capability) == ("NVIDIA H200", "9.0")
    assert cuda.device_count() == 2
    assert gpu_count(FakeCudart(devices=0)) == 0


@pytest.mark.skipif(
    importlib.util.find_spec("cuda") is not None, reason="cuda-python is installed here"
)
def test_no_cuda_python_means_no_gpu() -> None:
    assert gpu_count() == 0


def test_registered_host_memory_copies_by_address_and_unregistered_is_refused() -> None:
    rt = FakeCudart()
    cuda = CudaRuntime(rt)
    stream, device = cuda.create_stream(), cuda.alloc_device(64)
    host = np.arange(16, dtype=np.float32)
    back = np.zeros(16, np.float32)
    with pytest.raises(EngineError, match="cudaMemcpyAsync H2D"):  # pageable: the fake refuses
        cuda.copy_async(device.ptr, host.ctypes.data, 64, True, stream)
    for array in (host, back):
        cuda.host_register(array.ctypes.data, array.nbytes)
    with pytest.raises(EngineError, match="cudaHostRegister"):
        cuda.host_register(host.ctypes.data, host.nbytes)  # twice
    cuda.copy_async(device.ptr, host.ctypes.data, 64, True, stream)
    cuda.copy_async(back.ctypes.data, device.ptr, 64, False, stream)
    stream.synchronize()
    np.testing.assert_array_equal(back, host)
    for array in (host, back):
        cuda.host_unregister(array.ctypes.data)
    assert rt.registered == {}
