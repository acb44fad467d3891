"""TensorRT backend control flow against the fake TensorRT API and the fake CUDA runtime."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imaging_ai.errors import EngineError
from imaging_ai.infer.cuda_mem import DeviceInfo
from imaging_ai.infer.tensorrt import (
    TensorRTBackend,
    TensorRTOptions,
    build_engines,
    engine_key,
)
from imaging_ai.infer.trt_engine import TensorRTEngine
from imaging_ai.modelcard import ModelCard, load_model_card
from tests.fakes.cudart_fake import CudaError, FakeCudart
from tests.fakes.trt_fake import make_fake_tensorrt
from tests.infer.tiny_model import TinyModel

SMALL = TensorRTOptions(precision="fp32", max_batch_size=8, opt_batch_size=4)


def backend(
    tmp_path: Path, version: str = "10.13.0", options: TensorRTOptions = SMALL, **fake: Any
) -> tuple[TensorRTBackend, Any, FakeCudart]:
    cudart = FakeCudart()
    trt = make_fake_tensorrt(version, cudart, **fake)
    return TensorRTBackend(tmp_path / "data", options, trt=trt, cudart=cudart), trt, cudart


def is_subsequence(wanted: list[str], calls: list[str]) -> bool:
    it = iter(calls)
    return all(any(call == w for call in it) for w in wanted)


def test_10x_build_follows_the_documented_order(tiny: TinyModel, tmp_path: Path) -> None:
    options = replace(SMALL, precision="fp16")
    be, trt, _ = backend(tmp_path, options=options)
    engine = be.load(tiny.card)
    order = [
        "Builder", "create_network(0)", "OnnxParser", "parse_from_file(model.onnx)",
        "create_builder_config", "set_memory_pool_limit(WORKSPACE)", "add_optimization_profile",
        "set_timing_cache", "set_flag(FP16)", "build_serialized_network",
        "create_execution_context", "execute_async_v3",
    ]  # fmt: skip
    assert is_subsequence(order, trt.calls), trt.calls
    assert trt.errors == []
    stem = be.key(tiny.card).stem
    assert (be.engines_dir / f"{stem}.plan").exists()
    meta = json.loads((be.engines_dir / f"{stem}.json").read_text())
    assert meta["model_sha256"] == tiny.card.sha256 and meta["max_abs_diff_vs_cpu"] < 1e-5
    assert list(be.engines_dir.glob("timing-9.0-10.13.0.cache"))
    assert engine.info.precision == "fp16" and engine.info.max_batch_size == 8
    engine.close()


def test_11x_fp16_builds_from_a_converted_onnx_without_the_flag(
    tiny: TinyModel, tmp_path: Path
) -> None:
    import onnx

    be, trt, _ = backend(tmp_path, "11.0.0", replace(SMALL, precision="fp16"))
    engine = be.load(tiny.card)
    parsed = [c for c in trt.calls if c.startswith("parse_from_file")]
    assert parsed == [f"parse_from_file(tiny-{tiny.card.sha256[:16]}-fp16.onnx)"]
    assert not any(c.startswith("set_flag") for c in trt.calls)
    weights = {w.data_type for w in trt.parsed[0].graph.initializer}
    assert weights == {onnx.TensorProto.FLOAT16}
    batch = tiny.batch(3)
    np.testing.assert_allclose(engine.infer(batch), tiny.expected(batch), atol=5e-3)
    engine.close()


def minmax_card(tiny: TinyModel, folder: Path) -> ModelCard:
    """The tiny model with a min-max window, as the shipped cards have."""
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(tiny.card.onnx_path.read_bytes())
    text = (tiny.card.folder / "model.toml").read_text()
    (folder / "model.toml").write_text(text.replace('normalise = "zscore"', 'normalise = "minmax"'))
    card = load_model_card(folder)
    assert card.preprocess.normalise == "minmax"
    return card


@pytest.mark.parametrize("version", ["10.13.0", "11.0.0"])
def test_an_fp16_build_is_kept_within_the_stated_tolerance_and_refused_outside_it(
    tiny: TinyModel, tmp_path: Path, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = minmax_card(tiny, tmp_path / "minmax")
    fp16 = replace(SMALL, precision="fp16")
    be, _, _ = backend(tmp_path / "kept", version, fp16)
    be.load(card).close()
    assert list(be.engines_dir.glob("*.plan"))
    # A plan whose outputs land a pixel off moves them further than 1 HU of input noise does.
    run = TensorRTEngine.infer
    monkeypatch.setattr(TensorRTEngine, "infer", lambda self, x: np.roll(run(self, x), 1, -1))
    be, _, _ = backend(tmp_path / "refused", version, fp16)
    with pytest.raises(EngineError, match="1 HU of input noise"):
        be.load(card)
    assert not list(be.engines_dir.glob("*.plan"))


@pytest.mark.parametrize("version", ["10.13.0", "11.0.0"])
def test_engine_output_matches_numpy_for_every_batch_size(
    tiny: TinyModel, tmp_path: Path, version: str
) -> None:
    be, trt, cudart = backend(tmp_path, version)
    engine = be.load(tiny.card)
    for n in (1, 3, 8):
        batch = tiny.batch(n, seed=n)
        np.testing.assert_allclose(engine.infer(batch), tiny.expected(batch), atol=1e-5)
    assert trt.errors == []
    engine.close()
    assert cudart.leaks() == {"device": 0, "pinned": 0, "streams": 0}


def test_lanes_run_batches_from_several_threads(tiny: TinyModel, tmp_path: Path) -> None:
    be, trt, _ = backend(tmp_path, options=replace(SMALL, streams=2))
    engine = be.load(tiny.card)
    results: dict[int, np.ndarray] = {}

    def work(n: int) -> None:
        results[n] = engine.infer(tiny.batch(n, seed=n))

    threads = [threading.Thread(target=work, args=(n,)) for n in (1, 2, 5, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, out in results.items():
        np.testing.assert_allclose(out, tiny.expected(tiny.batch(n, seed=n)), atol=1e-5)
    assert sorted(results) == [1, 2, 5, 7]
    assert trt.calls.count("create_execution_context") == 2  # one context per stream
    engine.close()


def test_a_cached_plan_is_reused_without_building(tiny: TinyModel, tmp_path: Path) -> None:
    first, trt, cudart = backend(tmp_path)
    first.load(tiny.card).close()
    again = TensorRTBackend(tmp_path / "data", SMALL, trt=trt, cudart=cudart)
    again.load(tiny.card).close()
    assert trt.builds == 1
    newer, newer_trt, _ = backend(tmp_path, "10.14.1")
    newer.load(tiny.card).close()
    assert newer_trt.builds == 1  # another TensorRT version: another key, a rebuild


def test_the_cache_key_changes_with_each_component(tiny: TinyModel) -> None:
    gpu = DeviceInfo(0, "NVIDIA H200", "9.0", 141 << 30)
    base = engine_key(tiny.card, gpu, "10.13.0", SMALL)
    variants = [
        engine_key(replace(tiny.card, sha256="0" * 64), gpu, "10.13.0", SMALL),
        engine_key(tiny.card, replace(gpu, name="NVIDIA H100 80GB HBM3"), "10.13.0", SMALL),
        engine_key(tiny.card, replace(gpu, compute_capability="8.9"), "10.13.0", SMALL),
        engine_key(tiny.card, gpu, "11.0.0", SMALL),
        engine_key(tiny.card, gpu, "10.13.0", replace(SMALL, precision="fp16")),
        engine_key(tiny.card, gpu, "10.13.0", replace(SMALL, max_batch_size=16)),
    ]
    stems = {base.stem, *(key.stem for key in variants)}
    assert len(stems) == 1 + len(variants)
    assert base.stem == engine_key(tiny.card, gpu, "10.13.0", SMALL).stem
    assert base.stem.startswith("tiny-fp32-")


def test_every_parser_error_is_reported(tiny: TinyModel, tmp_path: Path) -> None:
    be, _, _ = backend(tmp_path, unsupported_ops=("Conv", "Softmax"))
    with pytest.raises(EngineError) as info:
        be.load(tiny.card)
    assert "op: Conv" in str(info.value) and "op: Softmax" in str(info.value)
    assert not list(be.engines_dir.glob("*.plan"))


def test_a_failed_build_is_an_engine_error(
    tiny: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    be, trt, _ = backend(tmp_path)
    monkeypatch.setattr(trt.Builder, "build_serialized_network", lambda self, n, c: None)
    with pytest.raises(EngineError, match="could not build"):
        be.load(tiny.card)


def test_an_unreadable_plan_asks_for_a_rebuild(tiny: TinyModel, tmp_path: Path) -> None:
    be, _, _ = backend(tmp_path)
    be.plan_path(tiny.card).parent.mkdir(parents=True)
    be.plan_path(tiny.card).write_bytes(b"not a plan")
    with pytest.raises(EngineError, match="build-engines --force"):
        be.load(tiny.card)


def test_without_build_missing_a_missing_plan_refuses_to_start(
    tiny: TinyModel, tmp_path: Path
) -> None:
    be, trt, _ = backend(tmp_path, options=replace(SMALL, build_missing=False))
    with pytest.raises(EngineError, match="imaging-ai build-engines"):
        be.load(tiny.card)
    assert trt.builds == 0


def test_int8_is_refused_until_calibration_exists(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="INT8"):
        backend(tmp_path, options=replace(SMALL, precision="int8"))


def test_a_stale_timing_cache_is_replaced(tiny: TinyModel, tmp_path: Path) -> None:
    be, _, _ = backend(tmp_path)
    cache = be.engines_dir / "timing-9.0-10.13.0.cache"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(b"from another GPU")
    be.load(tiny.card).close()
    assert cache.read_bytes().startswith(b"FAKECACHE 10.13.0")


def test_a_cuda_fault_during_a_batch_is_an_engine_error(tiny: TinyModel, tmp_path: Path) -> None:
    be, _, cudart = backend(tmp_path)
    engine = be.load(tiny.card)
    cudart.fail_next("cudaMemcpyAsync", CudaError.cudaErrorIllegalAddress)
    with pytest.raises(EngineError, match="cudaErrorIllegalAddress"):
        engine.infer(tiny.batch(2))
    batch = tiny.batch(2)  # the lane is usable again
    np.testing.assert_allclose(engine.infer(batch), tiny.expected(batch), atol=1e-5)


def test_build_engines_builds_once_then_reuses(tiny: TinyModel, tmp_path: Path) -> None:
    cudart = FakeCudart()
    trt = make_fake_tensorrt("10.13.0", cudart)
    run = lambda force: build_engines(  # noqa: E731
        [tiny.card], tmp_path, SMALL, force=force, trt=trt, cudart=cudart
    )
    assert [r.built for r in run(False)] == [True]
    assert [r.built for r in run(False)] == [False]
    assert [r.built for r in run(True)] == [True]
    assert trt.builds == 2


class TestTheFakeRefusesTheOldApi:
    """The fake must fail where TensorRT 10/11 would, or the tests above prove nothing."""

    def test_removed_builder_and_config_calls(self) -> None:
        trt = make_fake_tensorrt("10.13.0")
        builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
        with pytest.raises(AttributeError, match="build_serialized_network"):
            _ = builder.build_engine
        config = builder.create_builder_config()
        with pytest.raises(AttributeError, match="set_memory_pool_limit"):
            config.max_workspace_size = 1 << 30

    def test_11x_has_no_fp16_flag_and_no_explicit_batch(self) -> None:
        trt = make_fake_tensorrt("11.0.0")
        with pytest.raises(AttributeError):
            _ = trt.BuilderFlag.FP16
        with pytest.raises(AttributeError):
            _ = trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH
        assert make_fake_tensorrt("10.13.0").BuilderFlag.FP16

    def test_execution_checks(self, tiny: TinyModel, tmp_path: Path) -> None:
        be, trt, cudart = backend(tmp_path)
        be.load(tiny.card).close()
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(be.plan_path(tiny.card).read_bytes())
        context = engine.create_execution_context()
        for removed in ("execute_v2", "execute_async_v2", "set_binding_shape"):
            with pytest.raises(AttributeError, match="removed in TensorRT 10"):
                getattr(context, removed)
        with pytest.raises(AttributeError, match="device_memory_size_v2"):
            _ = engine.device_memory_size
        assert not context.set_input_shape("image", (9, 1, 16, 16))  # profile max is 8
        assert context.set_input_shape("image", (2, 1, 16, 16))
        _, stream = cudart.cudaStreamCreateWithFlags(1)
        assert not context.execute_async_v3(int(stream))
        assert "has no address" in trt.errors[-1]
        _, ptr = cudart.cudaMalloc(16)  # too small for either tensor
        for name in ("image", "probabilities"):
            context.set_tensor_address(name, ptr)
        assert not context.execute_async_v3(int(stream))
        assert "is not device memory" in trt.errors[-1]
        assert not context.execute_async_v3(0)
        assert "default stream" in trt.errors[-1]
