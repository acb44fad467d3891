"""ONNX Runtime backend: CPU results against numpy, padded IO binding, provider options."""

from __future__ import annotations

import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from imaging_ai.errors import EngineError
from imaging_ai.infer.base import batch_sizes_up_to, pad_batch, padded_size
from imaging_ai.infer.cuda_mem import CudaRuntime
from imaging_ai.infer.fp16 import fp16_model_bytes
from imaging_ai.infer.ort import (
    GPU_CUDA_GRAPHS,
    OrtBackend,
    OrtOptions,
    PieceCopier,
    bound_sizes,
    gpu_tuned,
    last_stages,
    provider_config,
)
from tests.fakes.cudart_fake import FakeCudart
from tests.infer.tiny_model import TinyModel


@pytest.mark.parametrize("n", [1, 3, 8])
def test_cpu_inference_matches_numpy(tiny: TinyModel, n: int) -> None:
    engine = OrtBackend(OrtOptions(intra_op_threads=1, max_batch_size=8)).load(tiny.card)
    batch = tiny.batch(n)
    out = engine.infer(batch)
    assert out.dtype == np.float32 and out.shape == (n, 3, 16, 16)
    np.testing.assert_allclose(out, tiny.expected(batch), atol=1e-5)
    assert engine.info.backend == "onnxruntime-cpu" and engine.info.device == "cpu"
    engine.close()


def test_io_binding_pads_to_fixed_sizes_and_returns_only_real_slices(tiny: TinyModel) -> None:
    options = OrtOptions(io_binding=True, max_batch_size=5)
    engine = OrtBackend(options).load(tiny.card)
    assert engine.info.batch_sizes == (1, 2, 4, 5)
    for n in (1, 3, 5):
        batch = tiny.batch(n, seed=n)
        np.testing.assert_allclose(engine.infer(batch), tiny.expected(batch), atol=1e-5)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (np.zeros((2, 1, 16, 16), np.float64), "dtype"),
        (np.zeros((2, 1, 8, 16), np.float32), "shape"),
        (np.zeros((9, 1, 16, 16), np.float32), "batch of 9"),
    ],
)
def test_a_wrong_batch_is_a_value_error(tiny: TinyModel, batch: np.ndarray, match: str) -> None:
    engine = OrtBackend(OrtOptions(max_batch_size=8)).load(tiny.card)
    with pytest.raises(ValueError, match=match):
        engine.infer(batch)


def test_batch_size_helpers() -> None:
    assert batch_sizes_up_to(32) == (1, 2, 4, 8, 16, 32)
    assert batch_sizes_up_to(24) == (1, 2, 4, 8, 16, 24)
    assert batch_sizes_up_to(1) == (1,)
    assert padded_size(3, (1, 2, 4)) == 4
    with pytest.raises(ValueError):
        padded_size(5, (1, 2, 4))
    padded = pad_batch(np.ones((3, 1, 2, 2), np.float32), 4)
    assert padded.shape == (4, 1, 2, 2) and padded[3].sum() == 0


def test_gpu_sessions_run_one_padded_size_and_cpu_sessions_every_power_of_two() -> None:
    # A change of input shape made ONNX Runtime's CUDA provider re-plan: 350-1,600 ms a run.
    assert bound_sizes(64, "cuda") == (64,)
    assert bound_sizes(64, "cpu") == (1, 2, 4, 8, 16, 32, 64)


def test_cuda_provider_options(tiny: TinyModel) -> None:
    options = OrtOptions(provider="cuda", device_id=1, prefer_nhwc=True, cuda_graph=True)
    config = provider_config(options, tiny.card)
    assert config[-1] == "CPUExecutionProvider"
    name, cuda = config[0]
    assert name == "CUDAExecutionProvider"
    assert cuda["device_id"] == "1"
    assert cuda["prefer_nhwc"] == "1" and cuda["enable_cuda_graph"] == "1"


def test_tensorrt_provider_options(tiny: TinyModel, tmp_path: Path) -> None:
    options = OrtOptions(
        provider="tensorrt", precision="fp16", max_batch_size=8, trt_cache_dir=tmp_path
    )
    name, trt = provider_config(options, tiny.card)[0]
    assert name == "TensorrtExecutionProvider"
    assert trt["trt_fp16_enable"] == "True"
    assert trt["trt_profile_min_shapes"] == "image:1x1x16x16"
    assert trt["trt_profile_max_shapes"] == "image:8x1x16x16"
    assert trt["trt_engine_cache_path"] == str(tmp_path)
    assert [p if isinstance(p, str) else p[0] for p in provider_config(options, tiny.card)] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (OrtOptions(precision="fp16"), "fp16 needs"),
        (OrtOptions(cuda_graph=True), "cuda_graph needs"),
        (OrtOptions(provider="cuda", precision="int8"), "INT8"),
    ],
)
def test_impossible_options_are_refused(tiny: TinyModel, options: OrtOptions, match: str) -> None:
    with pytest.raises(EngineError, match=match):
        OrtBackend(options).load(tiny.card)


def test_a_missing_gpu_provider_is_refused(tiny: TinyModel) -> None:
    fake_ort = types.ModuleType("onnxruntime")
    fake_ort.get_available_providers = lambda: ["CPUExecutionProvider"]
    with pytest.raises(EngineError, match="onnxruntime-gpu"):
        OrtBackend(OrtOptions(provider="cuda"), ort=fake_ort).load(tiny.card)


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_a_silent_cpu_fallback_of_the_session_is_refused(tiny: TinyModel) -> None:
    # onnxruntime-gpu lists CUDA even when libcudnn is missing, then quietly runs on the CPU.
    lying = types.ModuleType("onnxruntime")
    lying.__dict__.update(onnxruntime.__dict__)
    lying.__name__ = "onnxruntime"
    lying.get_available_providers = lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(EngineError, match="did not load"):
        OrtBackend(OrtOptions(provider="cuda"), ort=lying).load(tiny.card)


def test_fp16_conversion_keeps_float32_io_and_stays_close(tiny: TinyModel) -> None:
    import onnx

    data = fp16_model_bytes(tiny.card.onnx_path)
    model = onnx.load_from_string(data)
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [onnx.TensorProto.FLOAT]
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [onnx.TensorProto.FLOAT]
    assert {w.data_type for w in model.graph.initializer} == {onnx.TensorProto.FLOAT16}
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    batch = tiny.batch(2)
    (out,) = session.run(None, {"image": batch})
    np.testing.assert_allclose(out, tiny.expected(batch), atol=5e-3)


def test_io_binding_runs_a_batch_in_pieces_into_output_pieces(tiny: TinyModel) -> None:
    engine = OrtBackend(OrtOptions(io_binding=True, max_batch_size=8)).load(tiny.card)
    batch = tiny.batch(5, seed=3)
    out = np.full((5, 3, 16, 16), np.nan, np.float32)
    engine.infer_into([batch[:2], batch[2:]], [out[:2], out[2:]])  # type: ignore[attr-defined]
    np.testing.assert_allclose(out, tiny.expected(batch), atol=1e-5)
    with pytest.raises(ValueError, match="output piece"):
        engine.infer_into([batch[:2]], [out[:3]])  # type: ignore[attr-defined]


def test_piece_copier_moves_pieces_through_one_device_buffer() -> None:
    rt = FakeCudart()
    cuda = CudaRuntime(rt)
    copier = PieceCopier(cuda, 0)
    device = cuda.alloc_device(5 * 4 * 8)
    host = np.arange(40, dtype=np.float32).reshape(5, 8)
    back = np.zeros_like(host)
    for array in (host, back):
        cuda.host_register(array.ctypes.data, array.nbytes)
    copier.to_device(device.ptr, [host[:2], host[2:]])
    copier.to_host(device.ptr, [back[:3], back[3:]])
    np.testing.assert_array_equal(back, host)
    with pytest.raises(ValueError, match="C-contiguous"):
        copier.to_host(device.ptr, [back[:, :4]])
    copier.close()


def test_the_daemon_runs_the_cuda_provider_with_io_binding_and_nhwc_for_fp16() -> None:
    tuned = gpu_tuned(OrtOptions(provider="cuda", precision="fp16"))
    assert tuned.io_binding and tuned.prefer_nhwc
    assert tuned.cuda_graph == GPU_CUDA_GRAPHS
    fp32 = gpu_tuned(OrtOptions(provider="cuda"))
    assert fp32.io_binding and not fp32.prefer_nhwc
    assert gpu_tuned(OrtOptions()) == OrtOptions()  # the CPU provider is left alone


def test_pool_threads_can_be_told_not_to_spin(tiny: TinyModel) -> None:
    key = "session.intra_op.allow_spinning"
    quiet = OrtBackend(OrtOptions(intra_op_threads=2, allow_spinning=False)).load(tiny.card)
    default = OrtBackend(OrtOptions(intra_op_threads=2)).load(tiny.card)
    assert quiet._session.get_session_options().get_session_config_entry(key) == "0"  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="does not have"):  # ONNX Runtime's default: spin
        default._session.get_session_options().get_session_config_entry(key)  # type: ignore[attr-defined]
    batch = tiny.batch(2)
    np.testing.assert_allclose(quiet.infer(batch), tiny.expected(batch), atol=1e-5)


def test_a_bound_batch_leaves_its_copy_and_run_times_for_its_thread_once(tiny: TinyModel) -> None:
    engine = OrtBackend(OrtOptions(io_binding=True, max_batch_size=4)).load(tiny.card)
    last_stages()  # the warm-up's
    engine.infer(tiny.batch(3))
    stages = last_stages()
    assert stages is not None and len(stages) == 3 and all(ns >= 0 for ns in stages)
    assert stages[1] > 0  # the run
    assert last_stages() is None  # taken once
    with ThreadPoolExecutor(1) as other:
        other.submit(engine.infer, tiny.batch(1)).result()
    assert last_stages() is None  # another thread's batch
