"""Takes model outputs on the model's grid; gives them on the volume's in-plane grid, in part.

:func:`imaging_ai.preprocess.resize_back` maps a whole study's outputs to 512×512: for lung-seg
that is 300 × 3 × 512 × 512 floats, most of them far from any label edge, and for nodule-det
300 × 512 × 512 floats that are nearly all far below the threshold. :class:`MapBack` gives the
same values, bit for bit, only where they are needed: a window (a box of voxels), scattered
voxels, or the spread of a per-pixel code to the voxels whose every tap agrees on it. Each
method multiplies and adds the same float32 numbers in the same order as ``resize_back``; it
only computes fewer of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from imaging_ai.errors import ModelError
from imaging_ai.preprocess import Taps, apply_taps, resize_taps
from imaging_ai.volume import Volume


@dataclass(frozen=True)
class MapBack:
    """The in-plane map from a model's output grid to a volume's grid, one axis at a time.

    ``rows`` and ``cols`` are the taps :func:`imaging_ai.preprocess.resize_back` applies along
    the rows and then the columns (``None`` where the sizes already match).
    """

    rows: Taps | None
    cols: Taps | None
    size: tuple[int, int]

    @classmethod
    def of(cls, outputs: NDArray[Any], volume: Volume) -> MapBack:
        """The map for outputs (slices, C, h, w) of a model run on every slice of ``volume``.

        Raises
        ------
        ModelError
            The outputs do not have one entry per slice of the volume.
        """
        if outputs.ndim != 4 or outputs.shape[0] != volume.hu.shape[0]:
            raise ModelError(
                f"model output has shape {outputs.shape}; expected {volume.hu.shape[0]} slices "
                "as (slices, C, H, W)"
            )
        rows, cols = volume.hu.shape[1:]
        h, w = outputs.shape[2:]
        return cls(resize_taps(h, rows), resize_taps(w, cols), (rows, cols))

    def window(self, outputs: NDArray[Any], rows: slice, cols: slice) -> NDArray[Any]:
        """``resize_back(outputs)[..., rows, cols]`` for outputs (n, C, h, w), any n slices."""
        row_taps, row_read = _part(self.rows, rows, self.size[0])
        col_taps, col_read = _part(self.cols, cols, self.size[1])
        x = outputs[..., row_read, col_read]
        x = apply_taps(x, row_taps, x.ndim - 2, np)
        x = apply_taps(x, col_taps, x.ndim - 1, np)
        out: NDArray[Any] = np.asarray(x).astype(outputs.dtype, copy=False)
        return out

    def at(
        self,
        outputs: NDArray[Any],
        s: NDArray[np.intp],
        r: NDArray[np.intp],
        c: NDArray[np.intp],
    ) -> NDArray[Any]:
        """``resize_back(outputs)[s, :, r, c]``: (n, C) for n voxels (slice, row, col)."""
        flat: NDArray[Any] = np.ascontiguousarray(outputs).reshape(-1)
        channels, h, w = outputs.shape[1:]
        base = s.astype(np.intp) * (channels * h * w)
        planes = (np.arange(channels, dtype=np.intp) * (h * w))[None, :]

        def along_rows(col: NDArray[np.intp]) -> NDArray[Any]:
            if self.rows is None:
                same: NDArray[Any] = flat[(base + r * w + col)[:, None] + planes]
                return same
            index, weight = self.rows.index[:, r], self.rows.weight[:, r]
            out: NDArray[Any] = (
                flat[(base + index[0] * w + col)[:, None] + planes] * weight[0][:, None]
            )
            for t in range(1, len(index)):
                out += flat[(base + index[t] * w + col)[:, None] + planes] * weight[t][:, None]
            return out

        if self.cols is None:
            values = along_rows(c)
        else:
            index, weight = self.cols.index[:, c], self.cols.weight[:, c]
            values = along_rows(index[0]) * weight[0][:, None]
            for t in range(1, len(index)):
                values += along_rows(index[t]) * weight[t][:, None]
        return values.astype(outputs.dtype, copy=False)

    def spread(self, codes: NDArray[Any], sentinel: int) -> NDArray[Any]:
        """Per-pixel codes (n, h, w) on the volume's grid: a voxel takes the code its taps all
        have, and ``sentinel`` where they differ (taps of zero weight count too)."""
        out = codes
        for axis, taps in ((1, self.rows), (2, self.cols)):
            if taps is None:
                continue
            first = out.take(taps.index[0], axis=axis)
            for t in range(1, len(taps.index)):
                first[out.take(taps.index[t], axis=axis) != first] = sentinel
            out = first
        return out

    def span(self, first: int, last: int, axis: int) -> slice:
        """The voxels along ``axis`` (0: rows, 1: columns) that read model pixels first..last."""
        taps = self.rows if axis == 0 else self.cols
        if taps is None:
            return slice(first, last + 1)
        reads = (taps.index.min(axis=0) <= last) & (taps.index.max(axis=0) >= first)
        touched = np.flatnonzero(reads)
        return slice(int(touched[0]), int(touched[-1]) + 1)


def _part(taps: Taps | None, part: slice, size: int) -> tuple[Taps | None, slice]:
    """The taps of the voxels ``part`` of one axis, and the model pixels they read."""
    if taps is None:
        return None, part
    index, weight = taps.index[:, part], taps.weight[:, part]
    if index.shape[1] == 0:
        raise ModelError(f"empty window {part} of an axis of {size}")
    low, high = int(index.min()), int(index.max())
    return Taps(index - low, weight), slice(low, high + 1)
