"""Takes binary masks of a small box; gives distances, connected pieces, filled holes, growth.

The operations :mod:`imaging_ai.lesion_mask` segments a lesion with. SimpleITK's filters run
on one thread: the boxes are small, threads cost more than they save there, and the
multi-threaded labelling gave a few voxels more or less from one run to the next. SimpleITK is
imported in each function, as in :mod:`imaging_ai.postprocess`: the outputs' helper process
reads this package and need not load it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray


def _run(name: str, mask: NDArray[np.bool_], spacing: Sequence[float] = (1.0, 1.0, 1.0),
         **settings: Any) -> NDArray[Any]:  # fmt: skip
    """``mask`` through the SimpleITK filter ``name`` with ``settings`` (``Set<Key>`` calls)."""
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(mask.astype(np.uint8))
    image.SetSpacing(tuple(spacing)[: mask.ndim])  # type: ignore[no-untyped-call]
    step = getattr(sitk, name)()
    step.SetNumberOfThreads(1)
    for key, value in settings.items():
        getattr(step, f"Set{key}")(value)
    return np.asarray(sitk.GetArrayFromImage(step.Execute(image)))


def distance_to(
    mask: NDArray[np.bool_], spacing: tuple[float, float, float]
) -> NDArray[np.float32]:
    """Distance (mm) from each voxel's centre to the nearest centre of a voxel in ``mask``
    (infinite where ``mask`` is empty)."""
    if not mask.any():
        return np.full(mask.shape, np.inf, np.float32)
    signed = _run(
        "SignedMaurerDistanceMapImageFilter",
        mask,
        spacing,
        InsideIsPositive=False,
        SquaredDistance=False,
        UseImageSpacing=True,
    )
    # Outside the mask Maurer's map is the distance to the nearest voxel of it; inside, 0 is
    # what this function means.
    return np.asarray(np.maximum(signed, 0.0), dtype=np.float32)


def fill_holes(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``mask`` with what it encloses in 3-D (face-connected background) filled."""
    filled = _run("BinaryFillholeImageFilter", mask, FullyConnected=False, ForegroundValue=1)
    return filled.astype(bool)


def fill_holes_in_plane(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``mask`` with what it encloses on each slice filled."""
    out = mask.copy()
    for k in np.flatnonzero(mask.any(axis=(1, 2))):
        out[k] = _run("BinaryFillholeImageFilter", mask[k], FullyConnected=False, ForegroundValue=1)
    return out


def labels(mask: NDArray[np.bool_]) -> NDArray[np.integer[Any]]:
    """26-connected pieces of ``mask`` numbered 1, 2, ... (0 outside)."""
    return _run("ConnectedComponentImageFilter", mask, FullyConnected=True)


def piece_on(mask: NDArray[np.bool_], seed: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """The 26-connected piece of ``mask`` sharing the most voxels with ``seed`` (empty if none
    does)."""
    labelled = labels(mask)
    counts = np.bincount(labelled[seed], minlength=2)
    counts[0] = 0
    if not counts.any():
        return np.zeros(mask.shape, bool)
    return np.asarray(labelled == int(counts.argmax()))


def grow_pixel(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``mask`` and its four in-plane neighbours (of a slice, or of every slice)."""
    out = mask.copy()
    out[..., 1:, :] |= mask[..., :-1, :]
    out[..., :-1, :] |= mask[..., 1:, :]
    out[..., :, 1:] |= mask[..., :, :-1]
    out[..., :, :-1] |= mask[..., :, 1:]
    return out


def grow_slice(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``mask`` and the voxels above and below it."""
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    return out
