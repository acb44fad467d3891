"""One axial plane being painted: takes shapes and HU, gives HU, lung, nodule and structure maps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from imaging_ai_devkit.phantom.sdf import Arr, Shape, occupancy
from imaging_ai_devkit.phantom.structures import structure_of

AIR_HU = -1000.0


@dataclass(frozen=True)
class Grid:
    """In-plane sampling: ``n`` × ``n`` square pixels of ``spacing`` mm; x along columns, y rows.

    ``x0`` and ``y0`` are the patient coordinates of the centre of pixel (0, 0), as in
    ImagePositionPatient for the identity orientation.
    """

    n: int
    spacing: float
    x0: float
    y0: float

    @property
    def xs(self) -> Arr:
        """Column centres in mm."""
        return (self.x0 + self.spacing * np.arange(self.n)).astype(np.float32)

    @property
    def ys(self) -> Arr:
        """Row centres in mm."""
        return (self.y0 + self.spacing * np.arange(self.n)).astype(np.float32)


@dataclass(frozen=True)
class Window:
    """A rectangle of the canvas with the patient coordinates of its pixels (broadcastable)."""

    rows: slice
    cols: slice
    x: Arr
    y: Arr

    @property
    def index(self) -> tuple[slice, slice]:
        """Index into a full-plane array."""
        return self.rows, self.cols


class Canvas:
    """Full-plane buffers for one sub-slice; reused from one sub-slice to the next."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self._xs = grid.xs
        self._ys = grid.ys
        shape = (grid.n, grid.n)
        self.hu = np.full(shape, AIR_HU, dtype=np.float32)
        self.lung = np.zeros(shape, dtype=np.float32)
        self.nodule = np.zeros(shape, dtype=np.float32)
        self.body_q = np.full(shape, 2.0, dtype=np.float32)
        """Normalised radius in the body ellipse (1 at the skin); drives cupping and noise."""
        self.label = np.zeros(shape, dtype=np.uint8)
        """Structure label (:mod:`.structures`) of what covers each pixel most."""

    def reset(self) -> None:
        """Fill with air and clear the masks."""
        self.hu.fill(AIR_HU)
        self.lung.fill(0.0)
        self.nodule.fill(0.0)
        self.body_q.fill(2.0)
        self.label.fill(0)

    def window(self, bounds: Sequence[float], margin: float = 2.0) -> Window | None:
        """Pixels within ``margin`` mm of ``bounds`` (x0, x1, y0, y1, ...); None if off-plane."""
        g = self.grid
        c0 = max(0, math.floor((bounds[0] - margin - g.x0) / g.spacing))
        c1 = min(g.n, math.ceil((bounds[1] + margin - g.x0) / g.spacing) + 1)
        r0 = max(0, math.floor((bounds[2] - margin - g.y0) / g.spacing))
        r1 = min(g.n, math.ceil((bounds[3] + margin - g.y0) / g.spacing) + 1)
        if c0 >= c1 or r0 >= r1:
            return None
        return Window(slice(r0, r1), slice(c0, c1), self._xs[None, c0:c1], self._ys[r0:r1, None])

    def shape_window(self, shape: Shape, z: float) -> Window | None:
        """Window of a shape's bounds if the plane at ``z`` cuts them."""
        b = shape.bounds
        if not b[4] - 1.0 <= z <= b[5] + 1.0:
            return None
        return self.window(b)

    def blend(self, win: Window, alpha: Arr, value: Arr | float) -> None:
        """Mix ``value`` into the HU plane with weight ``alpha`` (partial volume)."""
        target = self.hu[win.index]
        target += alpha * (value - target)

    def mark(self, win: Window, alpha: Arr, label: int) -> None:
        """Label the pixels that ``alpha`` covers at least half (later paint wins, as for HU)."""
        target = self.label[win.index]
        target[np.broadcast_to(alpha >= 0.5, target.shape)] = label

    def occupancy(self, shape: Shape, z: float) -> tuple[Window, Arr] | None:
        """Window and partial-volume occupancy of a shape on the plane at ``z``."""
        win = self.shape_window(shape, z)
        if win is None:
            return None
        return win, occupancy(shape.sdf(win.x, win.y, z), self.grid.spacing)


@dataclass(frozen=True)
class Planes:
    """Unit-variance texture planes of one sub-slice: fine (about 2 mm) and coarse (12 mm)."""

    fine: Arr
    coarse: Arr

    def texture(self, win: Window, fine: float, coarse: float) -> Arr | float:
        """HU texture on a window: ``fine`` and ``coarse`` are the amplitudes."""
        if fine == 0.0 and coarse == 0.0:
            return 0.0
        return fine * self.fine[win.index] + coarse * self.coarse[win.index]


class Painter(Protocol):
    """Something that paints itself onto a sub-slice."""

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint onto ``canvas`` at patient ``z``."""
        ...


@dataclass(frozen=True)
class Part:
    """A shape filled with one tissue: mean HU plus fine and coarse texture amplitudes."""

    name: str
    shape: Shape
    hu: float
    fine: float = 0.0
    coarse: float = 0.0

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Blend the tissue in with its partial-volume occupancy."""
        got = canvas.occupancy(self.shape, z)
        if got is not None:
            win, alpha = got
            canvas.blend(win, alpha, self.hu + planes.texture(win, self.fine, self.coarse))
            canvas.mark(win, alpha, structure_of(self.name))
