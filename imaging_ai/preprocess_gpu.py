"""A Volume and a preprocessing spec in, model input on the GPU (CuPy) out, and a CPU/GPU check.

The maths is :func:`imaging_ai.preprocess.prepare_array` with ``xp=cupy``: the same kernels,
taps and order of operations as the CPU path. CuPy is imported only when a function here runs,
so the package imports on machines without it.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from imaging_ai.errors import EngineError
from imaging_ai.preprocess import (
    PreprocessSpec,
    add_context,
    context_stride,
    prepare_array,
    prepare_slices,
)
from imaging_ai.volume import Volume

# Largest |CPU - GPU| allowed after normalisation. Both paths run the same float32 operations in
# the same order; what differs is exp() in the bilateral filter (an ulp or two) and the
# summation order of the z-score statistics, both far below this.
GPU_TOLERANCE = 1e-4
# Slices per step on the GPU: large enough to keep it busy, small enough that a bilateral or
# median filter's per-offset copies of a 512×512 chunk stay in the hundreds of MB.
GPU_CHUNK = 64


@dataclass(frozen=True)
class Parity:
    """How far the GPU path's output is from the CPU path's, and how long each took."""

    max_abs_diff: float
    tolerance: float
    cpu_seconds: float
    gpu_seconds: float

    @property
    def agrees(self) -> bool:
        """Whether the difference is within the tolerance."""
        return self.max_abs_diff <= self.tolerance


def cupy_module() -> ModuleType:
    """Import CuPy, or say plainly that the GPU preprocessing path is unavailable.

    Raises
    ------
    EngineError
        CuPy is not installed or no CUDA device can be used.
    """
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        raise EngineError(f"GPU preprocessing needs CuPy, which is not installed ({exc})") from exc
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise EngineError(f"GPU preprocessing found no usable CUDA device ({exc})") from exc
    return cupy


def prepare_slices_gpu(volume: Volume, spec: PreprocessSpec) -> Any:
    """Run :func:`imaging_ai.preprocess.prepare_slices` on the current CUDA device.

    Parameters
    ----------
    volume
        The series, in HU, on the host.
    spec
        The model card's preprocessing.

    Returns
    -------
    cupy.ndarray
        Shape (slices, C, H, W) as :func:`~imaging_ai.preprocess.prepare_slices` gives it, dtype
        ``spec.dtype``, on the current device, so an inference engine can read it without a copy
        back to the host.
    """
    cupy = cupy_module()
    spacing_xy = (volume.spacing_mm[0], volume.spacing_mm[1])
    out = prepare_array(volume.hu, spacing_xy, spec, cupy, chunk=GPU_CHUNK)
    if spec.context_slices:
        stride = context_stride(volume.spacing_mm[2], spec.context_spacing_mm)
        out = add_context(out, stride, spec.context_slices, cupy)
    return out


def compare_cpu_gpu(
    volume: Volume, spec: PreprocessSpec, tolerance: float = GPU_TOLERANCE
) -> Parity:
    """Prepare a volume on the CPU and on the GPU and report the largest difference.

    Parameters
    ----------
    volume
        Any volume; real data shows more than a phantom.
    spec
        The preprocessing to compare.
    tolerance
        The largest absolute difference accepted, in normalised units.

    Returns
    -------
    Parity
        ``max_abs_diff`` over all output values, and each path's wall time (the GPU one warm,
        excluding CuPy's first-call kernel compilation, including the host-to-device copy).
    """
    cupy = cupy_module()
    started = time.perf_counter()
    on_cpu = prepare_slices(volume, spec)
    cpu_seconds = time.perf_counter() - started
    prepare_slices_gpu(volume, spec)  # compiles CuPy's kernels for these shapes
    cupy.cuda.Device().synchronize()
    started = time.perf_counter()
    on_gpu = prepare_slices_gpu(volume, spec)
    cupy.cuda.Device().synchronize()
    gpu_seconds = time.perf_counter() - started
    difference = np.abs(cupy.asnumpy(on_gpu).astype(np.float32) - on_cpu.astype(np.float32))
    return Parity(float(difference.max()), tolerance, cpu_seconds, gpu_seconds)
