"""A ModelCard's ONNX in; a TensorRT engine plan built, cached per GPU and version, and loaded out.

Written against the TensorRT 10.x/11.x API as `shared/TENSORRT.md` gives it (nothing that 10
removed); the only version branch is precision: 10.x sets `BuilderFlag.FP16`, 11.x builds
strongly typed networks from an FP16-converted ONNX kept beside the plan. Plans live under
`data_dir/engines/<key>.plan`, where the key covers the model's sha256, the GPU name and
compute capability, the TensorRT version, the precision and the batch profile; any change
means a new key and a rebuild, done by `imaging-ai build-engines` or at worker start, never
while a study waits. Every build is checked against ONNX Runtime on the CPU before it is kept.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from imaging_ai.durable import write_atomic
from imaging_ai.errors import EngineError
from imaging_ai.infer.agreement import compare, hu_sensitivity
from imaging_ai.infer.base import BackendInfo, Engine, FloatArray, Precision, sample_batch
from imaging_ai.infer.cuda_mem import CudaRuntime, DeviceInfo
from imaging_ai.infer.fp16 import write_fp16_model
from imaging_ai.infer.ort import OrtBackend, OrtOptions
from imaging_ai.infer.trt_engine import TensorRTEngine
from imaging_ai.modelcard import ModelCard

log = logging.getLogger(__name__)

TOLERANCE: dict[Precision, float] = {"fp32": 1e-3, "fp16": 2e-2}


@dataclass(frozen=True)
class TensorRTOptions:
    """How to build and run TensorRT engines."""

    precision: Precision = "fp16"
    max_batch_size: int = 32
    opt_batch_size: int = 16
    workspace_bytes: int = 4 << 30
    streams: int = 1
    device_id: int = 0
    optimization_level: int | None = None  # None: TensorRT's default (3)
    build_missing: bool = True  # False: refuse to start without a prebuilt plan

    def validate(self) -> None:
        """Refuse what cannot be built; raises EngineError."""
        if self.precision == "int8":
            raise EngineError(
                "TensorRT INT8 is not supported yet: it needs a calibrator fed with real "
                "preprocessed slices and an accuracy check against FP32; use fp16"
            )
        if not 1 <= self.opt_batch_size <= self.max_batch_size:
            raise EngineError(
                f"opt_batch_size = {self.opt_batch_size}: expected 1..{self.max_batch_size}"
            )
        if self.streams < 1:
            raise EngineError(f"streams = {self.streams}: expected >= 1")


@dataclass(frozen=True)
class EngineKey:
    """What a plan depends on; a plan is reused only when every field matches."""

    model: str
    model_sha256: str
    gpu_name: str
    compute_capability: str
    trt_version: str
    precision: Precision
    profile: str  # "min-opt-max" batch sizes

    @property
    def stem(self) -> str:
        """File name stem: readable model and precision, then a digest of every field."""
        text = json.dumps(asdict(self), sort_keys=True).encode()
        return f"{self.model}-{self.precision}-{hashlib.sha256(text).hexdigest()[:24]}"


def engine_key(
    card: ModelCard, device: DeviceInfo, trt_version: str, options: TensorRTOptions
) -> EngineKey:
    """The cache key of `card` built with `options` on `device` by TensorRT `trt_version`.

    Parameters
    ----------
    card : ModelCard
        The model (its sha256 identifies the weights).
    device : DeviceInfo
        The GPU.
    trt_version : str
        `tensorrt.__version__`.
    options : TensorRTOptions
        Precision and batch profile.

    Returns
    -------
    EngineKey
        The key; `key.stem + ".plan"` is the plan's file name.
    """
    profile = f"1-{options.opt_batch_size}-{options.max_batch_size}"
    return EngineKey(
        card.name, card.sha256, device.name, device.compute_capability, trt_version,
        options.precision, profile,
    )  # fmt: skip


def trt_major(trt: Any) -> int:
    """The major version of a tensorrt module (10, 11, ...)."""
    return int(str(trt.__version__).split(".")[0])


def build_plan(
    trt: Any, card: ModelCard, onnx_path: Path, options: TensorRTOptions, timing_cache: Path
) -> bytes:
    """Build a serialised engine from an ONNX file, in the order TENSORRT.md gives.

    Parameters
    ----------
    trt : module
        `tensorrt` (or its fake).
    card : ModelCard
        The model; its input sets the optimisation profile.
    onnx_path : Path
        The ONNX to parse (on 11.x with FP16, the FP16-converted copy).
    options : TensorRTOptions
        Precision, workspace, batch profile.
    timing_cache : Path
        Timing cache file, loaded if present and saved after the build.

    Returns
    -------
    bytes
        The plan.

    Raises
    ------
    EngineError
        The parser reported errors (all of them are in the message) or the build failed.
    """
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is implied from 10 on
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"{card.name}: TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    _add_profile(builder, config, network, card, options)
    _load_timing_cache(config, timing_cache)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    if options.precision == "fp16" and trt_major(trt) < 11:
        config.set_flag(trt.BuilderFlag.FP16)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(f"{card.name}: TensorRT could not build the engine; see its log above")
    _save_timing_cache(config, timing_cache)
    return bytes(plan)


def _add_profile(
    builder: Any, config: Any, network: Any, card: ModelCard, options: TensorRTOptions
) -> None:
    # The card's single input (validate_against_onnx refuses others); only its batch varies.
    batches = (1, options.opt_batch_size, options.max_batch_size)
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        profile.set_shape(network.get_input(i).name, *[(n, *card.input_shape) for n in batches])
    if config.add_optimization_profile(profile) < 0:
        raise EngineError(f"{card.name}: TensorRT rejected the optimisation profile")


def _load_timing_cache(config: Any, path: Path) -> None:
    blob = path.read_bytes() if path.exists() else b""
    if not config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=False):
        # A cache from another GPU or version only costs build time: start a fresh one.
        log.warning("timing cache %s does not match this GPU/TensorRT; starting afresh", path)
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)


def _save_timing_cache(config: Any, path: Path) -> None:
    cache = config.get_timing_cache()
    if cache is not None:
        _write_atomic(path, bytes(cache.serialize()))


def _write_atomic(path: Path, data: bytes) -> None:
    """`imaging_ai.durable.write_atomic`, into ``path``'s folder made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module, or EngineError saying it is missing."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError as exc:
        raise EngineError(f"TensorRT is not installed ({exc})") from exc


class TensorRTBackend:
    """Builds (or reuses) cached plans under `data_dir/engines` and loads them on one GPU."""

    def __init__(
        self,
        data_dir: Path,
        options: TensorRTOptions | None = None,
        *,
        trt: Any = None,
        cudart: ModuleType | None = None,
    ) -> None:
        self.options = options or TensorRTOptions()
        self.options.validate()
        self.engines_dir = data_dir / "engines"
        self._trt = trt or import_tensorrt()
        self._cuda = CudaRuntime(cudart)
        self._gpu = self._cuda.device_info(self.options.device_id)

    @property
    def name(self) -> str:
        """Always `tensorrt`."""
        return "tensorrt"

    @property
    def device(self) -> str:
        """`cuda:<id>`."""
        return f"cuda:{self.options.device_id}"

    @property
    def gpu(self) -> DeviceInfo:
        """The GPU engines are built for."""
        return self._gpu

    def key(self, card: ModelCard) -> EngineKey:
        """The cache key of `card` on this GPU, TensorRT version and options."""
        return engine_key(card, self._gpu, str(self._trt.__version__), self.options)

    def plan_path(self, card: ModelCard) -> Path:
        """Where `card`'s plan is (or will be) cached."""
        return self.engines_dir / f"{self.key(card).stem}.plan"

    def load(self, card: ModelCard, onnx_path: Path | None = None) -> TensorRTEngine:
        """Load the cached plan, building it first if allowed, and warm the engine up.

        Parameters
        ----------
        card : ModelCard
            The model.
        onnx_path : Path, optional
            The ONNX file; the card's own by default.

        Returns
        -------
        TensorRTEngine
            Ready to run.

        Raises
        ------
        EngineError
            No plan and `build_missing` is off, or the build, the check or the load failed.
        """
        path = self.plan_path(card)
        if path.exists():
            engine = self._engine(card, path.read_bytes())
        elif self.options.build_missing:
            engine = self.build(card, onnx_path)
        else:
            raise EngineError(f"{card.name}: no engine at {path}; run `imaging-ai build-engines`")
        engine.warm_up()
        return engine

    def build(self, card: ModelCard, onnx_path: Path | None = None) -> TensorRTEngine:
        """Build the plan, check it against ONNX Runtime on the CPU, then cache it.

        Parameters
        ----------
        card : ModelCard
            The model.
        onnx_path : Path, optional
            The ONNX file; the card's own by default.

        Returns
        -------
        TensorRTEngine
            The freshly built engine (already loaded, not warmed up).
        """
        source = onnx_path or card.onnx_path
        parsed = source
        if self.options.precision == "fp16" and trt_major(self._trt) >= 11:
            fp16_name = f"{card.name}-{card.sha256[:16]}-fp16.onnx"
            parsed = write_fp16_model(source, self.engines_dir / fp16_name)
        key, started = self.key(card), time.monotonic()
        timing = self.engines_dir / f"timing-{self._gpu.compute_capability}-{key.trt_version}.cache"
        plan = build_plan(self._trt, card, parsed, self.options, timing)
        engine = self._engine(card, plan)
        max_diff = self._check(engine, card, source)
        meta = {**asdict(key), "onnx": str(parsed), "max_abs_diff_vs_cpu": max_diff}
        meta["build_seconds"] = round(time.monotonic() - started, 1)
        _write_atomic(self.engines_dir / f"{key.stem}.json", json.dumps(meta, indent=2).encode())
        _write_atomic(self.engines_dir / f"{key.stem}.plan", plan)
        log.info("built %s (max |diff| vs CPU %.2g)", key.stem, max_diff)
        return engine

    def _engine(self, card: ModelCard, plan: bytes) -> TensorRTEngine:
        device = f"{self.device} ({self._gpu.name})"
        info = BackendInfo(card.name, self.name, device, self.options.precision, 0)
        streams, device_id = self.options.streams, self.options.device_id
        return TensorRTEngine(self._trt, self._cuda, plan, card, streams, device_id, info)

    def _check(self, engine: TensorRTEngine, card: ModelCard, source: Path) -> float:
        # A smoke check of the build, not of the model: real accuracy needs real slices.
        batch = sample_batch(card, min(4, engine.max_batch_size))
        reference = OrtBackend(OrtOptions(max_batch_size=batch.shape[0])).load(card, source)
        try:
            want, got = reference.infer(batch), engine.infer(batch)
            problem = _disagreement(self.options.precision, card, reference, batch, want, got)
        finally:
            reference.close()
        if problem:
            engine.close()
            raise EngineError(
                f"{card.name}: the {self.options.precision} engine differs from ONNX Runtime on "
                f"the CPU ({problem}); the plan was not kept"
            )
        return float(np.max(np.abs(got - want)))


def _disagreement(
    precision: Precision,
    card: ModelCard,
    reference: Engine,
    batch: FloatArray,
    want: FloatArray,
    got: FloatArray,
) -> str:
    """Why `got` is not within the tolerance of `want` (the CPU's), or "" when it is.

    FP16 on a min-max card: the stated tolerance, no further than 1 HU of input noise moves
    the CPU's outputs (`infer.agreement`; a fixed bound refuses sound FP16 builds of models
    with nearly tied pixels). Otherwise `TOLERANCE`, relative to the outputs' magnitude.
    """
    if precision == "fp16" and card.preprocess.normalise == "minmax":
        try:
            found = compare(got, want, card)
        except ValueError as exc:  # NaN, or outputs of the wrong shape
            return str(exc)
        limit = hu_sensitivity(reference.infer, batch, want, card)
        return "" if found.within(limit) else f"{found}; 1 HU of input noise: {limit}"
    diff = float(np.max(np.abs(got - want)))
    allowed = TOLERANCE[precision] * max(1.0, float(np.max(np.abs(want))))
    return "" if diff <= allowed else f"max |diff| {diff:.3g}, allowed {allowed:.3g}"


@dataclass(frozen=True)
class BuildResult:
    """One model's outcome of `build_engines`."""

    model: str
    plan: Path
    built: bool  # False: the cached plan was reused
    seconds: float


def build_engines(
    cards: Iterable[ModelCard],
    data_dir: Path,
    options: TensorRTOptions | None = None,
    *,
    force: bool = False,
    trt: Any = None,
    cudart: ModuleType | None = None,
) -> list[BuildResult]:
    """Build (or find cached) TensorRT plans for every card on this GPU.

    Parameters
    ----------
    cards : Iterable[ModelCard]
        Validated models (`discover_models`), taken one at a time (a progress bar may wrap
        them).
    data_dir : Path
        The daemon's data folder; plans go under `data_dir/engines`.
    options : TensorRTOptions, optional
        Precision, batch profile, workspace, GPU.
    force : bool
        Rebuild even when a plan with the same key exists.
    trt, cudart : optional
        `tensorrt` and `cuda.bindings.runtime` modules to use instead of importing them.

    Returns
    -------
    list[BuildResult]
        One per card, in order.

    Raises
    ------
    EngineError
        TensorRT or cuda-python is missing, or a build or its check failed.
    """
    backend = TensorRTBackend(data_dir, options, trt=trt, cudart=cudart)
    results = []
    for card in cards:
        path, started = backend.plan_path(card), time.monotonic()
        built = force or not path.exists()
        if built:
            backend.build(card).close()
        results.append(BuildResult(card.name, path, built, time.monotonic() - started))
    return results
