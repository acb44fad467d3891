"""The inference interface: a Backend loads a ModelCard's ONNX into an Engine that maps batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from imaging_ai.modelcard import ModelCard

FloatArray = npt.NDArray[np.float32]
Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class BackendInfo:
    """What the status page shows for one loaded engine."""

    model: str
    backend: str
    device: str
    precision: Precision
    max_batch_size: int
    batch_sizes: tuple[int, ...] = ()
    fallbacks: int = 0
    last_fallback_reason: str | None = None
    degraded: bool = False


class Engine(Protocol):
    """One model loaded on one device; `infer` may be called from several threads."""

    @property
    def max_batch_size(self) -> int:
        """The largest batch `infer` accepts."""
        ...

    @property
    def info(self) -> BackendInfo:
        """Backend, device, precision and fallback figures for the status page."""
        ...

    def infer(self, batch: FloatArray) -> FloatArray:
        """Run a float32 batch [N, C, H, W] (N <= max_batch_size); returns float32 [N, K, ...]."""
        ...

    def close(self) -> None:
        """Release device memory, streams and sessions; the engine is unusable afterwards."""
        ...


class Backend(Protocol):
    """Something that turns a model card and its ONNX file into an Engine."""

    @property
    def name(self) -> str:
        """Backend name as settings spell it, e.g. "tensorrt" or "onnxruntime-cpu"."""
        ...

    @property
    def device(self) -> str:
        """The device the engines run on, e.g. "cpu" or "cuda:0"."""
        ...

    def load(self, card: ModelCard, onnx_path: Path | None = None) -> Engine:
        """Load the card's model (or `onnx_path`) and warm it up; raises EngineError."""
        ...


# A picklable callable (card, device) -> Engine: what a worker process loads instead of a backend.
EngineFactory = Callable[[ModelCard, str], Engine]


@dataclass(frozen=True)
class LoadedModel:
    """A model card with its engine, ready to run."""

    card: ModelCard
    engine: Engine


def check_batch(batch: FloatArray, card: ModelCard, max_batch_size: int) -> None:
    """Refuse a batch that does not fit the card, before any engine sees it.

    A wrong batch is the caller's bug, not an engine failure: raising ValueError here keeps
    `FallbackEngine` from mistaking it for a GPU fault and retrying it on the CPU.

    Parameters
    ----------
    batch : FloatArray
        The batch to check.
    card : ModelCard
        The model the batch is for.
    max_batch_size : int
        The engine's largest batch.

    Raises
    ------
    ValueError
        Wrong dtype, rank, slice shape, or too many slices.
    """
    if batch.dtype != np.float32:
        raise ValueError(f"{card.name}: batch dtype is {batch.dtype}, expected float32")
    if tuple(batch.shape[1:]) != card.input_shape:
        want = ("N", *card.input_shape)
        raise ValueError(f"{card.name}: batch shape {batch.shape}, expected {want}")
    if not 1 <= batch.shape[0] <= max_batch_size:
        raise ValueError(f"{card.name}: batch of {batch.shape[0]}, expected 1..{max_batch_size}")


def padded_size(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest of `sizes` that holds `n` slices.

    Parameters
    ----------
    n : int
        Slices in the batch.
    sizes : tuple[int, ...]
        Allowed batch sizes, ascending.

    Returns
    -------
    int
        The size to pad to.

    Raises
    ------
    ValueError
        `n` is larger than every size.
    """
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"batch of {n} is larger than the largest batch size {sizes[-1]}")


def pad_batch(batch: FloatArray, size: int) -> FloatArray:
    """`batch` followed by zero slices up to `size` (the batch itself when it is full).

    Parameters
    ----------
    batch : FloatArray
        [N, C, H, W] with N <= size.
    size : int
        The padded batch size.

    Returns
    -------
    FloatArray
        [size, C, H, W], C-contiguous.
    """
    if batch.shape[0] == size:
        return np.ascontiguousarray(batch)
    out = np.zeros((size, *batch.shape[1:]), dtype=np.float32)
    out[: batch.shape[0]] = batch
    return out


def batch_sizes_up_to(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below `max_batch_size`, then `max_batch_size` itself: (1, 2, 4, ..., max).

    Parameters
    ----------
    max_batch_size : int
        The largest batch, >= 1.

    Returns
    -------
    tuple[int, ...]
        Ascending batch sizes for padded, fixed-shape execution (CUDA graphs).
    """
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return (*sizes, max_batch_size)


def sample_batch(card: ModelCard, n: int, seed: int = 0) -> FloatArray:
    """A deterministic batch shaped and scaled like the card's preprocessed input.

    Used for warm-up and for the precision smoke check at build time; it is not a substitute
    for an accuracy check on real preprocessed slices.

    Parameters
    ----------
    card : ModelCard
        The model.
    n : int
        Slices.
    seed : int
        Random seed.

    Returns
    -------
    FloatArray
        [n, C, H, W]: uniform in [0, 1] for minmax cards, standard normal for zscore cards.
    """
    rng = np.random.default_rng(seed)
    shape = (n, *card.input_shape)
    if card.preprocess.normalise == "minmax":
        return rng.random(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32)


def write_pieces(outputs: FloatArray, pieces: Sequence[FloatArray]) -> None:
    """Copy [N, ...] `outputs` into consecutive pieces whose lengths add up to N.

    Raises
    ------
    ValueError
        The lengths or the slice shapes differ.
    """
    total = sum(len(p) for p in pieces)
    if len(outputs) != total or (pieces and outputs.shape[1:] != pieces[0].shape[1:]):
        shape = pieces[0].shape[1:] if pieces else ()
        raise ValueError(f"outputs {outputs.shape} do not fit {total} slices of {shape}")
    at = 0
    for piece in pieces:
        piece[...] = outputs[at : at + len(piece)]
        at += len(piece)


def infer_into(engine: Engine, inputs: Sequence[FloatArray], outputs: Sequence[FloatArray]) -> None:
    """Run the pieces of `inputs` as one batch and write its outputs into `outputs`, in order.

    The pieces are views of a worker's shared slots. An engine with its own `infer_into` (the
    ONNX Runtime GPU engine) copies each piece straight to and from the GPU; any other engine
    gets one concatenated batch from `infer`.

    Parameters
    ----------
    engine : Engine
        The model's engine.
    inputs : sequence of FloatArray
        [n_i, C, H, W] pieces; together one batch of at most `engine.max_batch_size`.
    outputs : sequence of FloatArray
        [n_i, K, h, w] pieces, as long as the inputs, written in place.
    """
    own = getattr(engine, "infer_into", None)
    if own is not None:
        own(inputs, outputs)
        return
    batch = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
    write_pieces(engine.infer(batch), outputs)


def check_pieces(
    inputs: Sequence[FloatArray],
    outputs: Sequence[FloatArray],
    card: ModelCard,
    max_batch_size: int,
    output_dims: tuple[int, ...],
) -> int:
    """Refuse input/output pieces that do not fit the model or each other; return N.

    Raises
    ------
    ValueError
        A piece with the wrong dtype or slice shape, unequal piece lengths, or a batch that
        is empty or larger than `max_batch_size`.
    """
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"{card.name}: {len(inputs)} input and {len(outputs)} output pieces")
    for x, y in zip(inputs, outputs, strict=True):
        if x.dtype != np.float32 or tuple(x.shape[1:]) != card.input_shape:
            shape = ("n", *card.input_shape)
            raise ValueError(f"{card.name}: input piece {x.dtype} {x.shape}, expected {shape}")
        if y.dtype != np.float32 or tuple(y.shape) != (len(x), *output_dims):
            dims = (len(x), *output_dims)
            raise ValueError(f"{card.name}: output piece {y.dtype} {y.shape}, expected {dims}")
    n = sum(len(x) for x in inputs)
    if not 1 <= n <= max_batch_size:
        raise ValueError(f"{card.name}: batch of {n}, expected 1..{max_batch_size}")
    return n
