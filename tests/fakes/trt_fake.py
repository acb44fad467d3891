"""Test-only: a fake `tensorrt` module (10.x or 11.x API) that checks how it is called.

It follows `shared/TENSORRT.md`: the calls TensorRT 10 removed (`build_engine`,
`max_workspace_size`, binding indices, `execute_v2`, `set_binding_shape`, ...) raise
AttributeError naming their replacement; 11.x has no FP16/INT8 builder flags and no
EXPLICIT_BATCH. Like the real library it returns None or False and logs an error where it
does so (`fake.errors`): a build without an optimisation profile for a dynamic input, a shape
outside the profile, an execute with a tensor lacking an address. Two checks are project rules
that real TensorRT only warns about, marked "[rule]": a workspace limit must be set, and
execute_async_v3 must not use the default stream.

It does not optimise anything: a "plan" is the parsed ONNX model plus a header, and execution
reads the inputs from the fake CUDA runtime's "device" memory, runs the model with ONNX Runtime
on the CPU, and writes the outputs back when the stream is synchronised. FP16 builds therefore
compute in FP32 here.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tests.fakes.cudart_fake import FakeCudart

_MAGIC = b"FAKETRT1\n"
_REMOVED = {
    "build_engine": "build_serialized_network",
    "max_workspace_size": "set_memory_pool_limit(MemoryPoolType.WORKSPACE, n)",
    "max_batch_size": "an optimisation profile over the batch axis",
    "num_bindings": "num_io_tensors",
    "get_binding_index": "get_tensor_name",
    "get_binding_name": "get_tensor_name",
    "get_binding_shape": "get_tensor_shape",
    "get_binding_dtype": "get_tensor_dtype",
    "binding_is_input": "get_tensor_mode",
    "get_profile_shape": "get_tensor_profile_shape",
    "device_memory_size": "device_memory_size_v2",
    "set_binding_shape": "set_input_shape",
    "execute": "execute_async_v3",
    "execute_v2": "set_tensor_address + execute_async_v3",
    "execute_async": "execute_async_v3",
    "execute_async_v2": "set_tensor_address + execute_async_v3",
}


class Dims(tuple[int, ...]):
    """Shape as TensorRT returns it; -1 marks a dynamic dim."""


class _Strict:
    """Unknown attributes raise, as on pybind objects; removed ones name their replacement."""

    trt: ClassVar[Any]  # the FakeTensorRT this class belongs to
    _settable: ClassVar[frozenset[str]] = frozenset()

    def __getattr__(self, name: str) -> Any:
        if name in _REMOVED:
            raise AttributeError(f"{name} was removed in TensorRT 10: use {_REMOVED[name]}")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in self._settable:
            self.__getattr__(name)
        object.__setattr__(self, name, value)


class Logger(_Strict):
    """trt.Logger(min_severity)."""

    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self, min_severity: int = 2) -> None:
        self._min_severity = min_severity


class ITensor(_Strict):
    """A network or engine I/O tensor."""

    _settable = frozenset({"name", "shape", "dtype"})

    def __init__(self, name: str, shape: Sequence[int], dtype: Any) -> None:
        self.name, self.shape, self.dtype = name, Dims(shape), dtype


class INetworkDefinition(_Strict):
    """What the ONNX parser fills: inputs and outputs with -1 for dynamic dims."""

    def __init__(self) -> None:
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self._onnx = b""

    num_inputs = property(lambda self: len(self._inputs))
    num_outputs = property(lambda self: len(self._outputs))

    def get_input(self, i: int) -> ITensor:
        return self._inputs[i]

    def get_output(self, i: int) -> ITensor:
        return self._outputs[i]


class ParserError:
    """One parser error: desc(), node(), str()."""

    def __init__(self, desc: str, node: int = -1) -> None:
        self._desc, self._node = desc, node

    def desc(self) -> str:
        return self._desc

    def node(self) -> int:
        return self._node

    def __str__(self) -> str:
        return f"In node {self._node}: {self._desc}"


class OnnxParser(_Strict):
    """trt.OnnxParser(network, logger): parse_from_file, num_errors, get_error(i)."""

    def __init__(self, network: INetworkDefinition, logger: Logger) -> None:
        self._network = network
        self._errors: list[ParserError] = []
        self.trt.calls.append("OnnxParser")

    num_errors = property(lambda self: len(self._errors))

    def get_error(self, i: int) -> ParserError:
        return self._errors[i]

    def clear_errors(self) -> None:
        self._errors.clear()

    def parse_from_file(self, path: str) -> bool:
        import onnx
        from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

        self.trt.calls.append(f"parse_from_file({Path(path).name})")
        try:
            model = onnx.load(path)
        except (OSError, DecodeError) as exc:
            self._errors.append(ParserError(f"Failed to parse ONNX model from file: {exc}"))
            return False
        for i, node in enumerate(model.graph.node):
            if node.op_type in self.trt.unsupported_ops:
                desc = f"UNSUPPORTED_NODE: No importer registered for op: {node.op_type}"
                self._errors.append(ParserError(desc, i))
        if self._errors:
            return False
        _fill_network(self.trt, self._network, model)
        self.trt.parsed.append(model)
        return True


def _fill_network(trt: FakeTensorRT, network: INetworkDefinition, model: Any) -> None:
    weights = {w.name for w in model.graph.initializer}
    dtypes = {1: trt.DataType.FLOAT, 10: trt.DataType.HALF}
    pairs = ((model.graph.input, network._inputs), (model.graph.output, network._outputs))
    for values, out in pairs:
        for v in values:
            if v.name not in weights:
                dims = [d.dim_value or -1 for d in v.type.tensor_type.shape.dim]
                out.append(ITensor(v.name, dims, dtypes[v.type.tensor_type.elem_type]))
    network._onnx = model.SerializeToString()


class IOptimizationProfile(_Strict):
    """set_shape(name, min, opt, max) for each dynamic input."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[Dims, Dims, Dims]] = {}
        self._valid = True

    def set_shape(
        self, name: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]
    ) -> None:
        lo, mid, hi = Dims(min), Dims(opt), Dims(max)
        same_rank = len(lo) == len(mid) == len(hi)
        if not (same_rank and all(1 <= a <= b <= c for a, b, c in zip(lo, mid, hi, strict=True))):
            self.trt.errors.append(
                f"set_shape({name}): need 1 <= min <= opt <= max: {lo} {mid} {hi}"
            )
            self._valid = False
        self._shapes[name] = (lo, mid, hi)


class ITimingCache(_Strict):
    def __init__(self, blob: bytes, version: str) -> None:
        self._blob, self._version = blob, version

    def serialize(self) -> memoryview:
        return memoryview(self._blob)


class IBuilderConfig(_Strict):
    """Memory pools, flags, profiles and the timing cache."""

    _settable = frozenset({"builder_optimization_level", "profiling_verbosity"})

    def __init__(self) -> None:
        self._pools: dict[Any, int] = {}
        self._flags: set[Any] = set()
        self._profiles: list[IOptimizationProfile] = []
        self._cache: ITimingCache | None = None
        self.builder_optimization_level = 3

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self.trt.calls.append(f"set_memory_pool_limit({pool.name})")
        self._pools[pool] = size

    def set_flag(self, flag: Any) -> None:
        if not isinstance(flag, self.trt.BuilderFlag):
            raise TypeError(f"set_flag takes a trt.BuilderFlag, not {flag!r}")
        self.trt.calls.append(f"set_flag({flag.name})")
        self._flags.add(flag)

    def get_flag(self, flag: Any) -> bool:
        return flag in self._flags

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self.trt.calls.append("add_optimization_profile")
        if not profile._valid or not profile._shapes:
            return -1
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, blob: bytes) -> ITimingCache:
        return ITimingCache(bytes(blob), self.trt.__version__)

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self.trt.calls.append("set_timing_cache")
        stale = bool(cache._blob) and not cache._blob.startswith(self.trt.cache_header)
        if stale and not ignore_mismatch:
            return False
        self._cache = cache if not stale else ITimingCache(b"", self.trt.__version__)
        return True

    def get_timing_cache(self) -> ITimingCache | None:
        return self._cache


class Builder(_Strict):
    """trt.Builder(logger): networks, configs, profiles, build_serialized_network."""

    def __init__(self, logger: Logger) -> None:
        self.trt.calls.append("Builder")

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        self.trt.calls.append(f"create_network({flags})")
        network: INetworkDefinition = self.trt.INetworkDefinition()
        return network

    def create_builder_config(self) -> IBuilderConfig:
        self.trt.calls.append("create_builder_config")
        config: IBuilderConfig = self.trt.IBuilderConfig()
        return config

    def create_optimization_profile(self) -> IOptimizationProfile:
        profile: IOptimizationProfile = self.trt.IOptimizationProfile()
        return profile

    def build_serialized_network(
        self, network: INetworkDefinition, config: IBuilderConfig
    ) -> memoryview | None:
        self.trt.calls.append("build_serialized_network")
        problem = self._problem(network, config)
        if problem:
            self.trt.errors.append(problem)
            return None
        self.trt.builds += 1
        if config._cache is not None:
            config._cache._blob = self.trt.cache_header + str(self.trt.builds).encode()
        profile = config._profiles[0]._shapes
        header: dict[str, Any] = {
            "version": self.trt.__version__,
            "flags": sorted(f.name for f in config._flags),
        }
        header["profile"] = {k: [list(d) for d in v] for k, v in profile.items()}
        return memoryview(_MAGIC + json.dumps(header).encode() + b"\n" + network._onnx)

    def _problem(self, network: INetworkDefinition, config: IBuilderConfig) -> str | None:
        if not network._inputs:
            return "network has no inputs (was the ONNX file parsed?)"
        if self.trt.MemoryPoolType.WORKSPACE not in config._pools:
            return "[rule] no workspace limit: call set_memory_pool_limit(WORKSPACE, n)"
        for tensor in network._inputs:
            if -1 in tensor.shape and not any(tensor.name in p._shapes for p in config._profiles):
                return (
                    "Network has dynamic or shape inputs, but no optimization profile has been "
                    f"defined ({tensor.name})."
                )
        return None


class Runtime(_Strict):
    """trt.Runtime(logger).deserialize_cuda_engine(plan)."""

    def __init__(self, logger: Logger) -> None:
        pass

    def deserialize_cuda_engine(self, plan: bytes) -> ICudaEngine | None:
        blob = bytes(plan)
        if not blob.startswith(_MAGIC):
            self.trt.errors.append("deserialize_cuda_engine: not a serialized engine")
            return None
        header_line, onnx_bytes = blob[len(_MAGIC) :].split(b"\n", 1)
        header = json.loads(header_line)
        if header["version"] != self.trt.__version__:
            self.trt.errors.append(f"engine plan built with TensorRT {header['version']}")
            return None
        engine: ICudaEngine = self.trt.ICudaEngine(header, onnx_bytes)
        return engine


class ICudaEngine(_Strict):
    """ICudaEngine: I/O tensors by name, profile shapes, execution contexts."""

    def __init__(self, header: dict[str, Any], onnx_bytes: bytes) -> None:
        import onnx

        self._onnx = onnx_bytes
        model = onnx.load_from_string(onnx_bytes)
        network = INetworkDefinition()
        _fill_network(self.trt, network, model)
        self._inputs: dict[str, ITensor] = {t.name: t for t in network._inputs}
        self._outputs: dict[str, ITensor] = {t.name: t for t in network._outputs}
        self._profile = {k: tuple(Dims(d) for d in v) for k, v in header["profile"].items()}
        self._symbols = _symbols(model)

    num_io_tensors = property(lambda self: len(self._inputs) + len(self._outputs))
    device_memory_size_v2 = property(lambda self: 1 << 20)
    num_optimization_profiles = property(lambda self: 1)

    def get_tensor_name(self, i: int) -> str:
        return [*self._inputs, *self._outputs][i]

    def _tensor(self, name: str) -> ITensor:
        return self._inputs.get(name) or self._outputs[name]

    def get_tensor_mode(self, name: str) -> Any:
        mode = self.trt.TensorIOMode
        if name in self._inputs:
            return mode.INPUT
        return mode.OUTPUT if name in self._outputs else mode.NONE

    def get_tensor_dtype(self, name: str) -> Any:
        return self._tensor(name).dtype

    def get_tensor_shape(self, name: str) -> Dims:
        return self._tensor(name).shape

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        if profile_index != 0 or name not in self._profile:
            raise RuntimeError(f"get_tensor_profile_shape({name!r}, {profile_index}): no input")
        return list(self._profile[name])

    def create_execution_context(self) -> IExecutionContext:
        self.trt.calls.append("create_execution_context")
        context: IExecutionContext = self.trt.IExecutionContext(self)
        return context


def _symbols(model: Any) -> dict[str, list[str]]:
    """Each I/O tensor's dim names, so output shapes can follow input shapes."""
    values = [*model.graph.input, *model.graph.output]
    return {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in values}


class IExecutionContext(_Strict):
    """IExecutionContext: set_input_shape, set_tensor_address, execute_async_v3."""

    def __init__(self, engine: ICudaEngine) -> None:
        self._engine = engine
        self._shapes: dict[str, Dims] = {}
        self._addresses: dict[str, int] = {}
        self._session: Any = None

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        dims, profile = Dims(shape), self._engine._profile.get(name)
        if profile is None or len(dims) != len(profile[0]):
            self.trt.errors.append(f"set_input_shape({name!r}, {dims}): no such input or rank")
            return False
        lo, hi = profile[0], profile[2]
        if not all(a <= d <= b for a, d, b in zip(lo, dims, hi, strict=True)):
            self.trt.errors.append(f"set_input_shape({name!r}, {dims}): outside {lo}..{hi}")
            return False
        self._shapes[name] = dims
        return True

    def get_tensor_shape(self, name: str) -> Dims:
        if name in self._shapes:
            return self._shapes[name]
        known: dict[str, int] = {}
        for tensor, dims in self._shapes.items():
            known |= {s: d for s, d in zip(self._engine._symbols[tensor], dims, strict=True) if s}
        declared = zip(
            self._engine._symbols[name], self._engine.get_tensor_shape(name), strict=True
        )
        return Dims(known.get(s, -1) if d == -1 else d for s, d in declared)

    def set_tensor_address(self, name: str, address: int) -> bool:
        if self._engine.get_tensor_mode(name) == self.trt.TensorIOMode.NONE:
            self.trt.errors.append(f"set_tensor_address({name!r}): no such tensor")
            return False
        self._addresses[name] = int(address)
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        self.trt.calls.append("execute_async_v3")
        problem = self._problem(int(stream_handle))
        if problem:
            self.trt.errors.append(problem)
            return False
        assert self.trt.cudart is not None  # _problem checked it
        queued: bool = self.trt.cudart.enqueue(int(stream_handle), self._run)
        return queued

    def _problem(self, stream: int) -> str | None:
        if stream == 0:
            return "[rule] execute_async_v3 on the default stream"
        if self.trt.cudart is None:
            return "the fake TensorRT executes only with a FakeCudart"
        for name in self._engine._inputs:
            if name not in self._shapes:
                return f"input {name!r} has no shape: call set_input_shape first"
        for i in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(i)
            if name not in self._addresses:
                return f"tensor {name!r} has no address: set one for every I/O tensor"
            if self._view(name) is None:
                shape = self.get_tensor_shape(name)
                return (
                    f"tensor {name!r}: {self._addresses[name]:#x} is not device memory for {shape}"
                )
        return None

    def _view(self, name: str) -> np.ndarray[Any, Any] | None:
        half = self._engine.get_tensor_dtype(name) == self.trt.DataType.HALF
        dtype = np.dtype(np.float16 if half else np.float32)
        shape = tuple(self.get_tensor_shape(name))
        assert self.trt.cudart is not None
        nbytes = int(np.prod(shape)) * dtype.itemsize
        raw = self.trt.cudart.device_bytes(self._addresses[name], nbytes)
        return None if raw is None else np.frombuffer(raw, dtype=dtype).reshape(shape)

    def _run(self) -> None:
        import onnxruntime

        if self._session is None:
            cpu = ["CPUExecutionProvider"]
            self._session = onnxruntime.InferenceSession(self._engine._onnx, providers=cpu)
        feeds = {name: np.array(self._view(name)) for name in self._engine._inputs}
        names = list(self._engine._outputs)
        for name, value in zip(names, self._session.run(names, feeds), strict=True):
            view = self._view(name)
            assert view is not None
            view[...] = value


class FakeTensorRT:
    """Builds the module object; its classes share this state (calls, errors, builds)."""

    def __init__(self, version: str, cudart: FakeCudart | None, unsupported_ops: Sequence[str]):
        self.__version__ = version
        self.cudart, self.unsupported_ops = cudart, set(unsupported_ops)
        self.calls: list[str] = []
        self.errors: list[str] = []
        self.parsed: list[Any] = []
        self.builds = 0
        self.cache_header = f"FAKECACHE {version}\n".encode()

    def __getattr__(self, name: str) -> Any:
        # Enums and classes are set by make_fake_tensorrt; this only tells mypy they exist.
        raise AttributeError(f"tensorrt has no attribute {name!r}")


def make_fake_tensorrt(
    version: str = "10.13.0", cudart: FakeCudart | None = None, unsupported_ops: Sequence[str] = ()
) -> Any:
    """A module-like fake of `tensorrt` `version` (10.x or 11.x).

    Parameters
    ----------
    version : str
        The `__version__` to imitate; the major version decides flags and enums.
    cudart : FakeCudart, optional
        The fake CUDA runtime whose memory and streams execution uses.
    unsupported_ops : Sequence[str]
        ONNX op types the parser rejects, one error per node.

    Returns
    -------
    Any
        An object to pass as the `tensorrt` module (or to put in `sys.modules`); `calls`,
        `errors`, `builds` and `parsed` record what happened.
    """
    trt = FakeTensorRT(version, cudart, unsupported_ops)
    major = int(version.split(".")[0])
    flags = ["REFIT", "STRIP_PLAN", "VERSION_COMPATIBLE"]
    flags += ["FP16", "INT8", "BF16"] if major < 11 else []
    make_enum: Any = enum.Enum  # mypy cannot follow an Enum built from a computed list
    network_flags = ["EXPLICIT_BATCH", "STRONGLY_TYPED"] if major < 11 else ["STRONGLY_TYPED"]
    enums: dict[str, Any] = {
        "BuilderFlag": make_enum("BuilderFlag", flags),
        "NetworkDefinitionCreationFlag": enum.IntEnum("NetworkFlag", network_flags, start=0),
        "MemoryPoolType": enum.Enum("MemoryPoolType", ["WORKSPACE", "TACTIC_SHARED_MEMORY"]),
        "TensorIOMode": enum.Enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"]),
        "DataType": enum.Enum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL"]),
    }
    for name, value in enums.items():
        setattr(trt, name, value)
    classes = (Logger, Builder, OnnxParser, Runtime, INetworkDefinition, IOptimizationProfile)
    for cls in (*classes, IBuilderConfig, ITimingCache, ICudaEngine, IExecutionContext, ITensor):
        setattr(trt, cls.__name__, type(cls.__name__, (cls,), {"trt": trt}))
    return trt
