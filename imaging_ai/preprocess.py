"""A Volume and a model card's preprocessing spec in, model input slices (N, C, H, W) out.

Every step is written once against an array module ``xp`` (numpy on the CPU, CuPy in
:mod:`imaging_ai.preprocess_gpu`), so both paths run the same algorithm: filters and resizing
are sums of weighted neighbours, with weights and indices built once in numpy and added in the
same order on either device.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast, get_args

import numpy as np
from numpy.typing import NDArray

from imaging_ai.errors import ModelError

if TYPE_CHECKING:  # a type only: model cards import this module where pydicom is absent
    from imaging_ai.volume import Volume

Array: TypeAlias = Any  # numpy.ndarray on the CPU path, cupy.ndarray on the GPU path
Normalise = Literal["minmax", "zscore"]
Denoise = Literal["none", "gaussian", "median", "bilateral"]
_DTYPES = ("float32", "float16")
# Slices processed at once on the CPU: small enough to stay in cache, and bounds the copies
# that median and bilateral filters hold (one per neighbour offset).
_CHUNK = 8


@dataclass(frozen=True)
class PreprocessSpec:
    """How a model wants its input, as its card says.

    ``denoise_sigma_mm`` is the Gaussian's standard deviation for ``gaussian``, the spatial
    standard deviation for ``bilateral`` (whose intensity one is ``denoise_range_hu``), and the
    neighbourhood radius for ``median``; millimetres become voxels with the in-plane spacing.
    ``input_size`` is (height, width). ``zscore`` uses the mean and standard deviation of the
    whole windowed volume, so a slice's values do not depend on which batch it travels in.
    ``context_slices`` > 0 gives a 2.5-D input (see :func:`add_context`): each slice with that
    many neighbours on either side, ``context_spacing_mm`` apart (0: adjacent slices).
    """

    window_center: float
    window_width: float
    normalise: Normalise
    denoise: Denoise
    denoise_sigma_mm: float
    input_size: tuple[int, int]
    dtype: str = "float32"
    denoise_range_hu: float = 40.0
    context_slices: int = 0
    context_spacing_mm: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        if not self.window_width > 0:
            problems.append(f"window_width must be > 0, not {self.window_width}")
        if self.normalise not in get_args(Normalise):
            problems.append(
                f"normalise must be one of {get_args(Normalise)}, not {self.normalise!r}"
            )
        if self.denoise not in get_args(Denoise):
            problems.append(f"denoise must be one of {get_args(Denoise)}, not {self.denoise!r}")
        if self.denoise != "none" and not self.denoise_sigma_mm > 0:
            problems.append(f"denoise_sigma_mm must be > 0, not {self.denoise_sigma_mm}")
        if self.denoise == "bilateral" and not self.denoise_range_hu > 0:
            problems.append(f"denoise_range_hu must be > 0, not {self.denoise_range_hu}")
        if len(self.input_size) != 2 or min(self.input_size) < 1:
            problems.append(f"input_size must be two positive integers, not {self.input_size}")
        if self.dtype not in _DTYPES:
            problems.append(f"dtype must be one of {_DTYPES}, not {self.dtype!r}")
        if self.context_slices < 0 or self.context_spacing_mm < 0:
            problems.append(
                f"context_slices and context_spacing_mm must be >= 0, not "
                f"{self.context_slices} and {self.context_spacing_mm}"
            )
        if problems:
            raise ModelError("invalid preprocessing: " + "; ".join(problems))

    @property
    def window(self) -> tuple[float, float]:
        """The HU range kept: (center - width/2, center + width/2)."""
        return (
            self.window_center - self.window_width / 2,
            self.window_center + self.window_width / 2,
        )


@dataclass(frozen=True)
class Taps:
    """A 1-D linear map along one axis: ``out[o] = sum_t weight[t, o] * in[index[t, o]]``."""

    index: NDArray[np.intp]
    weight: NDArray[np.float32]


def prepare_slices(volume: Volume, spec: PreprocessSpec) -> NDArray[np.floating[Any]]:
    """Turn a volume into a model's input: HU → denoise → window → normalise → resize.

    Parameters
    ----------
    volume
        The series, in HU.
    spec
        The model card's preprocessing.

    Returns
    -------
    numpy.ndarray
        Shape (slices, C, H, W), dtype ``spec.dtype`` (float32 unless the card says float16),
        C-contiguous for an NCHW input; C is 1, or ``2 * spec.context_slices + 1`` for a 2.5-D
        input (:func:`add_context`). :func:`resize_back` maps outputs to the source grid.
    """
    spacing_xy = (volume.spacing_mm[0], volume.spacing_mm[1])
    out = prepare_array(volume.hu, spacing_xy, spec, np, threads=cpu_threads())
    if spec.context_slices:
        stride = context_stride(volume.spacing_mm[2], spec.context_spacing_mm)
        out = add_context(out, stride, spec.context_slices, np)
    return cast(NDArray[np.floating[Any]], out)


def cpu_threads() -> int:
    """Threads for the CPU stages' array work: this process's cores, at most 8 (beyond that
    these memory-bound loops gain little, and other studies and workers share the host)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cores or 1))


def context_stride(slice_spacing_mm: float, context_spacing_mm: float) -> int:
    """Slices between a slice and its context neighbour: ``context_spacing_mm`` in whole slices.

    Rounded to the nearest whole number of slices (halves up) and at least one, so a 3 mm
    context is 3 slices at 1 mm, 2 at 1.25-2 mm and 1 from 2.5 mm on; 0 mm means adjacent.
    """
    if context_spacing_mm <= 0 or slice_spacing_mm <= 0:
        return 1
    return max(1, math.floor(context_spacing_mm / slice_spacing_mm + 0.5))


def context_indices(count: int, stride: int, context_slices: int) -> NDArray[np.intp]:
    """``(count, 2k + 1)``: for each slice, the slices its 2.5-D input is made of, in order.

    Row ``i`` is ``i - k*stride, ..., i, ..., i + k*stride``, clipped to the volume, so a slice
    at either end repeats itself where the volume has no neighbour (as edge padding does).
    """
    offsets = stride * np.arange(-context_slices, context_slices + 1)
    indices: NDArray[np.intp] = np.clip(np.arange(count)[:, None] + offsets, 0, count - 1)
    return indices


def add_context(slices: Array, stride: int, context_slices: int, xp: ModuleType) -> Array:
    """Stack each prepared slice ``(N, 1, H, W)`` with its neighbours as channels.

    Channels follow the volume's slice order (along the slice normal: feet to head for a
    standard axial series), the slice itself in the middle: the usual 2.5-D input of nnU-Net-
    or MONAI-style networks. Returns ``(N, 2 * context_slices + 1, H, W)``, an array of ``xp``.
    """
    index = context_indices(slices.shape[0], stride, context_slices)
    return slices[:, 0][xp.asarray(index)]


def prepare_array(
    hu: Array,
    spacing_xy: tuple[float, float],
    spec: PreprocessSpec,
    xp: ModuleType,
    chunk: int = _CHUNK,
    threads: int = 1,
) -> Array:
    """Run the maths of :func:`prepare_slices` with the array module ``xp``.

    Parameters
    ----------
    hu
        HU as ``(slices, rows, cols)``; it may live on the host while ``xp`` is CuPy.
    spacing_xy
        In-plane spacing in mm: between columns (x), between rows (y).
    spec
        The model card's preprocessing.
    xp
        ``numpy`` or ``cupy``.
    chunk
        Slices moved and filtered at a time. Every step but the z-score statistics works per
        slice, so the chunk size bounds memory without changing results.
    threads
        Chunks prepared at once (numpy releases the GIL in these loops); the results do not
        depend on it.

    Returns
    -------
    Array
        ``(slices, 1, H, W)`` of ``spec.dtype``, an array of ``xp``.
    """
    count = hu.shape[0]
    low, high = spec.window
    minmax = (np.float32(low), np.float32(1.0 / (high - low)))
    out = xp.empty((count, 1, *spec.input_size), dtype=spec.dtype)
    windowed = None if spec.normalise == "minmax" else xp.empty(hu.shape, dtype=xp.float32)

    def window(start: int) -> None:
        part = xp.asarray(hu[start : start + chunk], dtype=xp.float32)
        part = xp.clip(_denoise(part, spacing_xy, spec, xp), np.float32(low), np.float32(high))
        if windowed is None:  # min-max needs nothing of the whole volume: carry on at once
            finish(start, part, minmax)
        else:
            windowed[start : start + chunk] = part

    def finish(start: int, part: Array, norm: tuple[np.float32, np.float32]) -> None:
        part -= norm[0]
        part *= norm[1]
        out[start : start + chunk, 0] = _resize(part, spec.input_size, xp)

    starts = range(0, count, chunk)
    _each(starts, window, threads)
    if windowed is not None:
        zscore = _zscore(windowed, xp, chunk)
        _each(starts, lambda start: finish(start, windowed[start : start + chunk], zscore), threads)
    return out


def _each(starts: range, work: Callable[[int], None], threads: int) -> None:
    """Run ``work`` for every chunk start, on up to ``threads`` threads."""
    if threads <= 1 or len(starts) <= 1:
        for start in starts:
            work(start)
        return
    with ThreadPoolExecutor(min(threads, len(starts)), thread_name_prefix="preprocess") as pool:
        for done in [pool.submit(work, start) for start in starts]:
            done.result()


def _zscore(windowed: Array, xp: ModuleType, chunk: int) -> tuple[np.float32, np.float32]:
    """The (shift, scale) that ``(x - shift) * scale`` normalises the windowed volume with."""
    total = total_sq = 0.0
    for start in range(0, windowed.shape[0], chunk):
        part = windowed[start : start + chunk]
        total += float(part.sum(dtype=xp.float64))
        total_sq += float((part * part).sum(dtype=xp.float64))
    mean = total / windowed.size
    std = math.sqrt(max(total_sq / windowed.size - mean * mean, 0.0))
    return np.float32(mean), np.float32(1.0 / std if std > 1e-3 else 1.0)  # flat: nothing to scale


def resize_back(outputs: NDArray[Any], volume: Volume) -> NDArray[Any]:
    """Map model outputs on the model's grid back to the volume's in-plane grid.

    Parameters
    ----------
    outputs
        Shape (slices, C, H, W) or (slices, H, W). Floating values are taken as probabilities
        and resized linearly (area-averaged where the source grid is coarser); integer or bool
        values as labels, resized by nearest neighbour so no new label appears.
    volume
        The volume the inputs were prepared from.

    Returns
    -------
    numpy.ndarray
        Shape (slices, C, rows, cols) or (slices, rows, cols), the dtype of ``outputs``.

    Raises
    ------
    ModelError
        The outputs do not have one entry per slice of the volume.
    """
    if outputs.ndim not in (3, 4) or outputs.shape[0] != volume.hu.shape[0]:
        raise ModelError(
            f"model output has shape {outputs.shape}; expected {volume.hu.shape[0]} slices "
            "as (slices, C, H, W) or (slices, H, W)"
        )
    rows, cols = volume.hu.shape[1:]
    if np.issubdtype(outputs.dtype, np.floating):
        resized = cast(NDArray[Any], _resize(outputs, (rows, cols), np))
        return resized.astype(outputs.dtype, copy=False)
    y = _nearest_index(outputs.shape[-2], rows)
    x = _nearest_index(outputs.shape[-1], cols)
    return outputs.take(y, axis=-2).take(x, axis=-1)


def _denoise(
    x: Array, spacing_xy: tuple[float, float], spec: PreprocessSpec, xp: ModuleType
) -> Array:
    """Apply the card's in-plane (2-D, per slice) filter to a float32 ``(slices, rows, cols)``."""
    sigma = (spec.denoise_sigma_mm / spacing_xy[1], spec.denoise_sigma_mm / spacing_xy[0])
    if spec.denoise == "gaussian":
        along_rows = _convolve(x, _gaussian_kernel(sigma[0]), 1, xp)
        return _convolve(along_rows, _gaussian_kernel(sigma[1]), 2, xp)
    if spec.denoise == "median":
        return _median(x, (max(1, round(sigma[0])), max(1, round(sigma[1]))), xp)
    if spec.denoise == "bilateral":
        return _bilateral(x, sigma, spec.denoise_range_hu, xp)
    return x


def _resize(x: Array, size: tuple[int, int], xp: ModuleType) -> Array:
    """Resize the last two axes: area averaging to shrink (antialiased), linear to enlarge."""
    x = apply_taps(x, resize_taps(x.shape[-2], size[0]), x.ndim - 2, xp)
    return apply_taps(x, resize_taps(x.shape[-1], size[1]), x.ndim - 1, xp)


def apply_taps(x: Array, taps: Taps | None, axis: int, xp: ModuleType) -> Array:
    """Apply a 1-D linear map along ``axis``; ``None`` is the identity."""
    if taps is None:
        return x
    shape = [1] * x.ndim
    shape[axis] = taps.index.shape[1]
    index, weight = xp.asarray(taps.index), xp.asarray(taps.weight)
    out = x.take(index[0], axis=axis) * weight[0].reshape(shape)
    for t in range(1, len(taps.index)):
        out += x.take(index[t], axis=axis) * weight[t].reshape(shape)
    return out


def _gaussian_kernel(sigma: float) -> NDArray[np.float32] | None:
    """A sampled, normalised Gaussian of ``sigma`` voxels, truncated at 3 sigma."""
    if sigma < 0.1:  # narrower than a tenth of a voxel changes nothing measurable
        return None
    offsets = np.arange(-max(1, math.ceil(3 * sigma)), max(1, math.ceil(3 * sigma)) + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    normalised: NDArray[np.float32] = (kernel / kernel.sum()).astype(np.float32)
    return normalised


def _convolve(x: Array, kernel: NDArray[np.float32] | None, axis: int, xp: ModuleType) -> Array:
    """Convolve along ``axis`` with an odd, symmetric kernel; edges mirrored as by :func:`_reflect`.

    Sliding a window over one padded copy reads memory in order, which a gather per tap
    (:func:`apply_taps`) would not.
    """
    if kernel is None:
        return x
    n, radius = x.shape[axis], len(kernel) // 2
    padded = x.take(xp.asarray(_reflect(np.arange(-radius, n + radius), n)), axis=axis)
    window = [slice(None)] * x.ndim
    out = None
    for t, weight in enumerate(kernel.tolist()):
        window[axis] = slice(t, t + n)
        term = padded[tuple(window)] * np.float32(weight)
        out = term if out is None else xp.add(out, term, out=out)
    return out


def resize_taps(n_in: int, n_out: int) -> Taps | None:
    """Pixel-centre-aligned resampling: box-filter overlap when shrinking, linear when enlarging."""
    if n_in == n_out:
        return None
    scale = n_in / n_out
    out = np.arange(n_out)
    if scale > 1:
        start, end = out * scale, (out + 1) * scale
        first = np.floor(start).astype(np.intp)
        taps = np.arange(math.ceil(scale) + 1)[:, None]
        i = first[None, :] + taps
        overlap = np.minimum(end, i + 1) - np.maximum(start, i)
        weight = np.clip(overlap, 0.0, None) / scale
        used = weight.max(axis=1) > 0  # exact factors leave the last tap empty everywhere
        return Taps(np.minimum(i, n_in - 1)[used], weight[used].astype(np.float32))
    source = np.clip((out + 0.5) * scale - 0.5, 0.0, n_in - 1)
    low = np.floor(source).astype(np.intp)
    frac = source - low
    index = np.stack([low, np.minimum(low + 1, n_in - 1)])
    return Taps(index, np.stack([1 - frac, frac]).astype(np.float32))


def _nearest_index(n_in: int, n_out: int) -> NDArray[np.intp]:
    """Source index of each output pixel's centre, for labels."""
    source = np.floor((np.arange(n_out) + 0.5) * (n_in / n_out)).astype(np.intp)
    clipped: NDArray[np.intp] = np.minimum(source, n_in - 1)
    return clipped


def _reflect(i: NDArray[np.intp], n: int) -> NDArray[np.intp]:
    """Mirror indices about the edges, repeating the edge pixel (``d c b a | a b c d``)."""
    m = np.mod(i, 2 * n)
    mirrored: NDArray[np.intp] = np.where(m >= n, 2 * n - 1 - m, m)
    return mirrored


def _neighbours(
    x: Array, radius: tuple[int, int], xp: ModuleType
) -> Iterator[tuple[int, int, Array]]:
    """Yield every in-plane shift within ``radius`` as (dy, dx, shifted view), edges mirrored."""
    (rows, cols), (ry, rx) = x.shape[1:], radius
    padded = x.take(xp.asarray(_reflect(np.arange(-ry, rows + ry), rows)), axis=1)
    padded = padded.take(xp.asarray(_reflect(np.arange(-rx, cols + rx), cols)), axis=2)
    for dy in range(-ry, ry + 1):
        for dx in range(-rx, rx + 1):
            yield dy, dx, padded[:, ry + dy : ry + dy + rows, rx + dx : rx + dx + cols]


def _median(x: Array, radius: tuple[int, int], xp: ModuleType) -> Array:
    # Neighbours on the last axis: partitioning contiguous runs is about twice as fast.
    stack = xp.empty((*x.shape, (2 * radius[0] + 1) * (2 * radius[1] + 1)), dtype=xp.float32)
    for n, (_, _, shifted) in enumerate(_neighbours(x, radius, xp)):
        stack[..., n] = shifted
    middle = stack.shape[-1] // 2  # odd count: the median is one of the values
    stack.partition(middle, axis=-1)
    return stack[..., middle]


def _bilateral(x: Array, sigma: tuple[float, float], range_hu: float, xp: ModuleType) -> Array:
    """Edge-preserving smoothing: neighbours weighted by distance and by HU difference."""
    radius = (max(1, math.ceil(2 * sigma[0])), max(1, math.ceil(2 * sigma[1])))
    total = xp.zeros_like(x)
    norm = xp.zeros_like(x)
    weight = xp.empty_like(x)
    for dy, dx, shifted in _neighbours(x, radius, xp):
        spatial = math.exp(-0.5 * ((dy / sigma[0]) ** 2 + (dx / sigma[1]) ** 2))
        xp.subtract(shifted, x, out=weight)
        weight *= weight
        weight *= np.float32(-0.5 / range_hu**2)
        xp.exp(weight, out=weight)
        weight *= np.float32(spatial)
        norm += weight
        weight *= shifted
        total += weight
    total /= norm
    return total
