"""Takes a CT volume and its lung labels; gives the central airways (trachea and main bronchi),
found at the source resolution, so the lungs can leave them out.

A lung model that sees air labels air: on LIDC-IDRI-0001 `lung-seg` called 3,752 voxels of the
trachea right lung. The trachea is the one round column of air in the middle of the neck and
upper chest, and the main bronchi continue it below the carina, so they are found without a
model, by following that column slice by slice from head to feet:

1. **Seed.** In the upper slices, the air components (HU below :data:`LUMEN_HU`, 2×2 averaged)
   of a trachea's size and roundness near the body's left-right middle; the longest run of
   slices that holds one, moving little from slice to slice, is the trachea.
2. **Follow.** From there, down and up, each slice's air below a threshold half way between the
   trachea's lumen and the lung parenchyma (3×3 averaged, so noise does not break the lumen)
   is split into connected pieces; a piece that overlaps an airway of the slice before
   continues it. The trachea splitting into two pieces is the carina; a main bronchus
   splitting again (the lobar bronchi), reaching :data:`MAX_BRONCHUS_MM` below the carina, or
   thinning away ends that branch.
3. **Leak control.** A piece much larger than the airway it continues (grown more than
   :data:`MAX_GROWTH` times, or larger than :data:`MAX_AREA_MM2`) is lung parenchyma reached
   through a thin wall or emphysema, not airway: it is not taken, and that branch ends.

The mask is the lumen grown in-plane by :data:`RIM_MM` into voxels still below :data:`RIM_HU`
(the partial-volume rim a lung model also calls lung). It looks only at windows around the
airway: 0.4 to 0.5 s a study on two cores (LIDC-IDRI-0001, RIDER Lung CT, a 300-slice phantom).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import SimpleITK as sitk
from numpy.typing import NDArray

from imaging_ai.volume import Volume

LUMEN_HU = -950.0
"""Air in the seed search: the trachea's lumen, below the lung parenchyma (about -870)."""
RIM_HU = -500.0
"""The lumen's rim taken with it: partial volume of air and wall, never the wall itself."""
RIM_MM = 1.4
"""How far the rim reaches in-plane (at least one pixel). On LIDC-IDRI-0001 one pixel (0.7 mm)
left 641 of `lung-seg`'s 3,752 trachea voxels labelled lung, two left 309."""
SEARCH_MM = 100.0
"""How far below the first slice the trachea is looked for."""
MIN_RUN_MM = 12.0
"""The trachea must show in consecutive slices over at least this length."""
TRACHEA_AREA_MM2 = (40.0, 600.0)
"""A trachea's lumen in one slice: 7 to 28 mm across."""
MAX_AREA_MM2 = 700.0
MAX_GROWTH = 2.0
"""A piece larger than this times the airway it continues (its largest piece of the last
:data:`HISTORY` slices, plus 40 mm²) is a leak."""
HISTORY = 3
MIN_BRANCH_MM2 = 6.0
"""Pieces smaller than this are noise, and a branch thinner than this has ended."""
MAX_BRONCHUS_MM = 45.0
"""Main bronchi are followed at most this far (along the slices) below the carina."""
WINDOW_MM = 25.0


@dataclass(frozen=True)
class Airways:
    """The central airways: a mask inside a box of the volume."""

    box: tuple[slice, slice, slice]
    mask: NDArray[np.bool_]
    carina_slice: int | None = None
    threshold_hu: float = LUMEN_HU

    @property
    def voxels(self) -> int:
        """How many voxels the airways hold."""
        return int(self.mask.sum())

    def full(self, shape: tuple[int, ...]) -> NDArray[np.bool_]:
        """The mask on the whole volume's grid."""
        out = np.zeros(shape, bool)
        out[self.box] = self.mask
        return out

    def remove_from(self, labels: NDArray[np.uint8]) -> NDArray[np.uint8]:
        """``labels`` with the airways set to background (in place; returned)."""
        labels[self.box][self.mask] = 0
        return labels


@dataclass
class _Branch:
    """One airway being followed: its piece in the last slice taken."""

    mask: NDArray[np.bool_]  # on the whole slice
    generation: int  # 0 trachea, 1 main bronchus
    below_carina_mm: float = 0.0
    areas_mm2: tuple[float, ...] = ()  # its last few pieces' areas, the latest last


def central_airways(volume: Volume, lungs: NDArray[np.uint8]) -> Airways | None:
    """The trachea and main bronchi of ``volume``, or None where no trachea is in view.

    Parameters
    ----------
    volume
        The CT volume (HU, slices in any order along the body's axis).
    lungs
        Its lung label map (any non-zero value is lung); gives the parenchyma's level.
    """
    hu = volume.hu
    order = _head_to_feet(volume)
    seed = _find_trachea(hu, order, volume.spacing_mm)
    if seed is None:
        return None
    start, mask = seed
    threshold = _threshold(hu, lungs, start, mask)
    pieces = _follow(hu, order, start, mask, volume.spacing_mm, threshold, down=True)
    pieces += _follow(hu, order, start, mask, volume.spacing_mm, threshold, down=False)
    carina = next((k for k, _, gen in pieces if gen == 1), None)
    rim = max(1, round(RIM_MM / volume.spacing_mm[0]))
    return _assemble(hu, [(k, m) for k, m, _ in pieces], carina, threshold, rim)


def _head_to_feet(volume: Volume) -> NDArray[np.intp]:
    """Slice indices from the head down (LPS: +z is the head)."""
    n = volume.hu.shape[0]
    z_first = volume.index_to_lps([0.0, 0.0, 0.0])[2]
    z_last = volume.index_to_lps([0.0, 0.0, float(n - 1)])[2]
    ordered = np.arange(n)
    return ordered[::-1] if z_last > z_first else ordered


def _components(binary: NDArray[np.bool_]) -> tuple[NDArray[np.int32], NDArray[np.intp]]:
    """2-D 8-connected components: the label image and each label's pixel count (index 0 is
    the background)."""
    # SimpleITK's wrappers carry no annotations.
    image = sitk.GetImageFromArray(binary.astype(np.uint8))
    labelled = sitk.ConnectedComponent(image, True)  # type: ignore[no-untyped-call]
    labels = sitk.GetArrayFromImage(labelled).astype(np.int32)
    return labels, np.bincount(labels.ravel())


def _find_trachea(
    hu: NDArray[np.float32], order: NDArray[np.intp], spacing: tuple[float, float, float]
) -> tuple[int, NDArray[np.bool_]] | None:
    """The slice to start from (the lowest of the longest run of trachea-like pieces in the
    upper slices) and the trachea's lumen there, on the whole slice; None if no run."""
    dz = spacing[2]
    pixel_mm2 = 4.0 * spacing[0] * spacing[1]  # on the 2x2-averaged slice
    reach = min(len(order), max(3, int(SEARCH_MM / dz)))
    found: list[tuple[int, NDArray[np.float64], NDArray[np.bool_]] | None] = []
    stride = max(1, round(2.0 / dz))  # about every 2 mm
    dz *= stride
    for k in order[:reach:stride]:
        piece = _trachea_in_slice(hu[k], pixel_mm2, spacing)
        found.append(None if piece is None else (int(k), *piece))
    best: list[tuple[int, NDArray[np.float64], NDArray[np.bool_]]] = []
    run: list[tuple[int, NDArray[np.float64], NDArray[np.bool_]]] = []
    for item in found:
        if item is not None and (not run or _moved_mm(run[-1][1], item[1], spacing) < 8.0):
            run.append(item)
        else:
            run = [item] if item is not None else []
        if len(run) > len(best):
            best = list(run)
    if len(best) * dz < MIN_RUN_MM or len(best) < 2:
        return None
    k, _, small = best[-1]
    mask = np.kron(small, np.ones((2, 2), bool)).astype(bool)
    rows, cols = hu.shape[1], hu.shape[2]
    full = np.zeros((rows, cols), bool)
    full[: mask.shape[0], : mask.shape[1]] = mask[:rows, :cols]
    return k, full & (hu[k] < RIM_HU)


def _moved_mm(a: NDArray[np.float64], b: NDArray[np.float64], spacing: tuple[float, ...]) -> float:
    return float(np.hypot((a[0] - b[0]) * 2 * spacing[1], (a[1] - b[1]) * 2 * spacing[0]))


def _trachea_in_slice(
    slice_hu: NDArray[np.float32], pixel_mm2: float, spacing: tuple[float, float, float]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]] | None:
    """The trachea-like piece of one slice on its 2×2-averaged grid: (centre, mask)."""
    rows, cols = (slice_hu.shape[0] // 2) * 2, (slice_hu.shape[1] // 2) * 2
    small = (
        slice_hu[0:rows:2, 0:cols:2] + slice_hu[1:rows:2, 0:cols:2]
        + slice_hu[0:rows:2, 1:cols:2] + slice_hu[1:rows:2, 1:cols:2]
    ) / np.float32(4.0)  # fmt: skip
    body_cols = np.nonzero((small > RIM_HU).sum(axis=0) > 2)[0]
    if len(body_cols) < 10:
        return None
    middle, width = body_cols.mean(), body_cols[-1] - body_cols[0] + 1
    labels, counts = _components(small < LUMEN_HU)
    low, high = TRACHEA_AREA_MM2
    # Sizes first, from the counts: noise makes hundreds of specks a slice, a few are sized.
    sized = np.nonzero((counts * pixel_mm2 >= low) & (counts * pixel_mm2 <= high))[0]
    best, best_off, centre = 0, 0.2 * width, np.zeros(2)
    for label in sized[sized > 0]:
        rr, cc = np.nonzero(labels == label)
        off = abs(float(cc.mean()) - middle)
        if off < best_off and _round_inside(rr, cc, small.shape):
            best, best_off, centre = int(label), off, np.array([rr.mean(), cc.mean()])
    if best == 0:
        return None
    return centre, labels == best


def _round_inside(rr: NDArray[np.intp], cc: NDArray[np.intp], shape: tuple[int, ...]) -> bool:
    """Whether a piece (its pixels' rows and columns) keeps off the image's edge (air outside
    the body reaches it) and is round (a lung apex or air between folds is not)."""
    if rr.min() == 0 or cc.min() == 0 or rr.max() == shape[0] - 1 or cc.max() == shape[1] - 1:
        return False
    extent = max(int(cc.max() - cc.min()), int(rr.max() - rr.min())) + 1
    return len(rr) >= 0.45 * np.pi * (extent / 2.0) ** 2


def _threshold(
    hu: NDArray[np.float32], lungs: NDArray[np.uint8], k: int, lumen: NDArray[np.bool_]
) -> float:
    """Half way between the trachea's lumen and the lung parenchyma, kept to -960..-880 HU."""
    air = float(np.median(hu[k][lumen])) if lumen.any() else -1000.0
    sample = lungs[::3, ::4, ::4] > 0
    parenchyma = float(np.median(hu[::3, ::4, ::4][sample])) if sample.any() else -850.0
    return float(np.clip((air + parenchyma) / 2.0, -960.0, -880.0))


def _box_mean(image: NDArray[np.float32]) -> NDArray[np.float32]:
    """3×3 mean (edges repeated)."""
    padded = np.pad(image, 1, mode="edge")
    out = np.zeros_like(image)
    rows, cols = image.shape
    for dr in range(3):
        for dc in range(3):
            out += padded[dr : dr + rows, dc : dc + cols]
    return out / np.float32(9.0)


def _window(
    masks: list[NDArray[np.bool_]], reach: int, shape: tuple[int, ...]
) -> tuple[slice, slice]:
    """A box around every mask, grown by ``reach`` pixels."""
    union = np.logical_or.reduce(masks)
    r = np.nonzero(union.any(axis=1))[0]
    c = np.nonzero(union.any(axis=0))[0]
    return (
        slice(max(int(r[0]) - reach, 0), min(int(r[-1]) + reach + 1, shape[0])),
        slice(max(int(c[0]) - reach, 0), min(int(c[-1]) + reach + 1, shape[1])),
    )


def _grow(mask: NDArray[np.bool_], pixels: int) -> NDArray[np.bool_]:
    """A square dilation by ``pixels`` (separable, cheap)."""
    out = mask.copy()
    for _ in range(2):  # rows, then (transposed) columns
        grown = out.copy()
        for shift in range(1, pixels + 1):
            grown[shift:] |= out[:-shift]
            grown[:-shift] |= out[shift:]
        out = grown.T
    return out.copy()  # back in the caller's layout, C-ordered


def _follow(
    hu: NDArray[np.float32],
    order: NDArray[np.intp],
    start: int,
    lumen: NDArray[np.bool_],
    spacing: tuple[float, float, float],
    threshold: float,
    *,
    down: bool,
) -> list[tuple[int, NDArray[np.bool_], int]]:
    """Airway pieces (slice, mask on the slice, generation) from ``start`` on, one way."""
    position = int(np.nonzero(order == start)[0][0])
    steps = order[position:] if down else order[position - 1 :: -1] if position else order[:0]
    pixel_mm2 = spacing[0] * spacing[1]
    reach = int(np.ceil(WINDOW_MM / spacing[0]))
    overlap = max(1, round(0.6 * spacing[2] / spacing[0]))
    branches = [_Branch(lumen, 0, areas_mm2=(float(lumen.sum()) * pixel_mm2,))]
    out: list[tuple[int, NDArray[np.bool_], int]] = []
    for k in steps:
        if not branches:
            break
        box = _window([b.mask for b in branches], reach, hu.shape[1:])
        air = _box_mean(hu[k][box]) < threshold
        labels, counts = _components(air)
        alive = []
        for branch in branches:
            taken = _continue(branch, box, labels, counts, overlap, pixel_mm2, down)
            if taken is None:
                continue
            for piece in taken:
                area = float(piece.sum()) * pixel_mm2
                recent = (*branch.areas_mm2[-(HISTORY - 1) :], area)
                child = _Branch(piece, branch.generation, branch.below_carina_mm, recent)
                if len(taken) > 1:
                    if branch.generation >= 1:
                        break  # lobar bronchi: this branch ends here
                    child.generation = 1
                if child.generation == 1:
                    child.below_carina_mm += spacing[2]
                    if child.below_carina_mm > MAX_BRONCHUS_MM:
                        continue
                alive.append(child)
                out.append((int(k), piece, child.generation))
        branches = alive
    return out


def _continue(
    branch: _Branch,
    box: tuple[slice, slice],
    labels: NDArray[np.int32],
    counts: NDArray[np.intp],
    overlap: int,
    pixel_mm2: float,
    down: bool,
) -> list[NDArray[np.bool_]] | None:
    """The pieces of this slice that continue ``branch``; None when it ends (lost, thinned
    away, or a leak)."""
    near = _grow(branch.mask[box], overlap)
    touching = np.unique(labels[near & (labels > 0)])
    ids = [i for i in touching if counts[i] * pixel_mm2 >= MIN_BRANCH_MM2]
    if not ids:
        return None
    before = max(branch.areas_mm2)
    pieces = []
    for i in ids:
        area = counts[i] * pixel_mm2
        if area > MAX_AREA_MM2 or area > MAX_GROWTH * before + 40.0:
            return None  # lung parenchyma reached: a leak, not airway
        full = np.zeros(branch.mask.shape, bool)
        full[box] = labels == i
        pieces.append(full)
    if not down and len(pieces) > 1:
        pieces = [max(pieces, key=lambda p: int(p.sum()))]
    return pieces


def _assemble(
    hu: NDArray[np.float32],
    pieces: list[tuple[int, NDArray[np.bool_]]],
    carina: int | None,
    threshold: float,
    rim: int,
) -> Airways | None:
    """The pieces as one mask in a box, each grown ``rim`` pixels into its rim below RIM_HU."""
    if not pieces:
        return None
    ks = [k for k, _ in pieces]
    union = np.logical_or.reduce([m for _, m in pieces])
    r, c = np.nonzero(union)
    box = (
        slice(min(ks), max(ks) + 1),
        slice(max(int(r.min()) - rim, 0), min(int(r.max()) + rim + 1, union.shape[0])),
        slice(max(int(c.min()) - rim, 0), min(int(c.max()) + rim + 1, union.shape[1])),
    )
    mask = np.zeros(tuple(b.stop - b.start for b in box), bool)
    for k, piece in pieces:
        local = piece[box[1], box[2]]
        edge = _grow(local, rim) & (hu[k][box[1], box[2]] < RIM_HU)
        mask[k - box[0].start] |= local | edge
    return Airways(box, mask, carina, threshold)
