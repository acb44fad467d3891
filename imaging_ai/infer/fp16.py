"""An FP32 ONNX model in; an FP16 copy (float32 inputs and outputs kept) out.

TensorRT 11 takes precision from the ONNX model itself (networks are strongly typed), and the
ONNX Runtime CUDA provider runs FP16 only from an FP16 model, so both convert here. The
conversion is ONNX Runtime's own (`onnxruntime.transformers.float16`): no extra dependency.
Inputs and outputs stay float32 so callers, buffers and IO bindings do not change.
"""

from __future__ import annotations

from pathlib import Path

from imaging_ai.durable import write_atomic
from imaging_ai.errors import EngineError


def fp16_model_bytes(onnx_path: Path) -> bytes:
    """The serialised FP16 version of an FP32 ONNX model.

    Parameters
    ----------
    onnx_path : Path
        The FP32 model.

    Returns
    -------
    bytes
        The FP16 model; graph inputs and outputs remain float32 (Cast nodes are inserted).

    Raises
    ------
    EngineError
        The `onnx` package or ONNX Runtime's converter is missing.
    """
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise EngineError(f"FP16 conversion needs onnx and onnxruntime ({exc})") from exc
    model = onnx.load(str(onnx_path))
    converted = convert_float_to_float16(model, keep_io_types=True)
    return bytes(converted.SerializeToString())


def write_fp16_model(onnx_path: Path, dest: Path) -> Path:
    """Write the FP16 version of `onnx_path` to `dest` atomically, unless it is already there.

    Parameters
    ----------
    onnx_path : Path
        The FP32 model.
    dest : Path
        Where the FP16 model goes; its name should carry the source model's hash, because an
        existing file is reused as is.

    Returns
    -------
    Path
        `dest`.
    """
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # fsynced before the rename: a file already there is reused unread, so a crash must not
    # leave an empty one under the final name.
    return write_atomic(dest, fp16_model_bytes(onnx_path))
