"""Model cards and batches in; inference engines (TensorRT, ONNX Runtime) and their outputs out.

Modules: `base` (the Engine/Backend interface), `ort` (ONNX Runtime: CPU, CUDA, TensorRT
provider), `tensorrt` and `trt_engine` (TensorRT plans: build, cache, run), `cuda_mem`
(cuda-python streams and buffers), `select` (backend choice, CPU fallback), `cli`
(`imaging-ai build-engines`). Test-only: `fake`, `trt_fake`, `cudart_fake`. Nothing here
imports pydicom or SQLAlchemy, so the GPU check script runs where those are absent.
"""

from imaging_ai.infer.base import Backend, BackendInfo, Engine, FloatArray, Precision

__all__ = ["Backend", "BackendInfo", "Engine", "FloatArray", "Precision"]
