"""Takes model probabilities on the source grid; gives label maps, 3-D lesions, measurements."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from imaging_ai.lesion_mask import refine_lesion
from imaging_ai.mapback import MapBack
from imaging_ai.modelcard import Label, ModelCard
from imaging_ai.preprocess import cpu_threads
from imaging_ai.volume import Volume

# Values of the combined label map written by `imaging-ai infer` and used for SEG segments.
RIGHT_LUNG = 1
LEFT_LUNG = 2
LESION = 3
SIDES = {RIGHT_LUNG: "right", LEFT_LUNG: "left"}


@dataclass(frozen=True)
class Lesion:
    """One 3-D lesion, measured in patient coordinates (DICOM LPS, millimetres)."""

    number: int
    centre_mm: tuple[float, float, float]
    long_axis_mm: float
    short_axis_mm: float
    volume_ml: float
    mean_hu: float
    max_hu: float
    max_probability: float
    side: str
    slices: tuple[int, int]
    voxels: int
    voxel_index: NDArray[np.intp] = field(repr=False, compare=False)
    # The candidate classifier's probability that this is a nodule (None: no classifier ran),
    # and whether it passed the classifier card's operating point and so is reported.
    probability: float | None = None
    reported: bool = True
    # Centre (slice, row, column; continuous) of the detector's component before the lesion was
    # segmented from HU: what the candidate classifier looks at, whatever the segmentation does.
    detection_index: tuple[float, float, float] | None = field(default=None, compare=False)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready form (rounded for people, not for maths)."""
        return {
            "number": self.number,
            "centre_mm": [round(c, 2) for c in self.centre_mm],
            # As every result writes them (outputs.common.lesion_quantities).
            "long_axis_mm": round(self.long_axis_mm, 1),
            "short_axis_mm": round(self.short_axis_mm, 1),
            "volume_ml": round(self.volume_ml, 3),
            "mean_hu": round(self.mean_hu, 1),
            "max_hu": round(self.max_hu, 1),
            "max_probability": round(self.max_probability, 3),
            "location": f"{self.side} lung" if self.side else "lung",
            "slices": list(self.slices),
            "probability": None if self.probability is None else round(self.probability, 3),
            "reported": self.reported,
        }


def segment_labels(probabilities: NDArray[Any], card: ModelCard) -> NDArray[np.uint8]:
    """Label map (slices, rows, cols) from per-class probabilities (slices, C, rows, cols).

    Softmax outputs take the most probable class where it passes its label's threshold;
    sigmoid outputs threshold each label's channel on its own.
    """
    out = np.zeros((probabilities.shape[0], *probabilities.shape[2:]), dtype=np.uint8)
    if card.output.kind == "softmax":
        best = probabilities.argmax(axis=1)
        for label in card.labels:
            hit = (best == label.channel) & (probabilities[:, label.channel] >= label.threshold)
            out[hit] = label.value
        return out
    for label in card.labels:
        out[_probability(probabilities, label, card) >= label.threshold] = label.value
    return out


def _probability(outputs: NDArray[Any], label: Label, card: ModelCard) -> NDArray[Any]:
    return as_probability(outputs[:, label.channel], card)


def as_probability(channel: NDArray[Any], card: ModelCard) -> NDArray[Any]:
    """A channel of the card's outputs as probabilities (logits through the sigmoid)."""
    if card.output.kind == "logits":
        return np.asarray(1.0 / (1.0 + np.exp(-channel)))
    return channel


def labels_on_volume_grid(
    outputs: NDArray[Any],
    card: ModelCard,
    volume: Volume,
    relabel: NDArray[np.uint8] | None = None,
) -> NDArray[np.uint8]:
    """``relabel[segment_labels(resize_back(outputs, volume), card)]``, mapping back only near
    edges.

    A voxel on the volume's grid is a weighted mean (weights >= 0, summing to 1) of a few model
    pixels, its taps. Where every tap falls in the same cell of the labelling (same most
    probable class, same side of every threshold) by more than ``_MARGIN``, so does the mean,
    and the voxel takes that cell's label; only the voxels near a label's edge are mapped back
    and labelled in full. Outputs that are not float32 are mapped back whole. Slabs of slices
    are labelled on several threads.

    Parameters
    ----------
    outputs
        (slices, C, h, w) on the model's grid, one entry per slice of ``volume``.
    card
        The segmentation model's card.
    volume
        The source geometry.
    relabel
        256 values: what each label value becomes (default: itself).
    """
    back = MapBack.of(outputs, volume)
    relabel = np.arange(256, dtype=np.uint8) if relabel is None else relabel
    out = np.empty(volume.hu.shape, np.uint8)

    def label(start: int) -> None:
        part = slice(start, start + _SLAB)
        out[part] = relabel[_labels(outputs[part], card, back)]

    with ThreadPoolExecutor(cpu_threads(), thread_name_prefix="postprocess") as pool:
        list(pool.map(label, range(0, len(out), _SLAB)))
    return out


# Slices labelled at once: a slab's 512x512 labels and codes stay within a few tens of MB.
_SLAB = 16


def _labels(outputs: NDArray[Any], card: ModelCard, back: MapBack) -> NDArray[np.uint8]:
    """Labels on the volume's grid of a slab of slices (see :func:`labels_on_volume_grid`)."""
    if outputs.dtype != np.float32:
        return segment_labels(
            back.window(outputs, slice(0, back.size[0]), slice(0, back.size[1])), card
        )
    cells, values = _cells(outputs, card)
    sentinel = len(values)
    spread = back.spread(cells, sentinel)
    out: NDArray[np.uint8] = np.append(values, np.uint8(0))[spread]
    edge = np.flatnonzero(spread == sentinel)
    if edge.size:
        s, r, c = np.unravel_index(edge, out.shape)
        exact = back.at(outputs, s, r, c)
        np.put(out, edge, segment_labels(exact[:, :, None, None], card)[:, 0, 0])
    return out


# How far a model pixel must be from a class boundary or a threshold to decide the voxels it
# feeds: far above the float32 rounding of a weighted mean of probabilities (about 1e-7), far
# below what separates two outputs a card would tell apart.
_MARGIN = 1e-4


def _cells(
    outputs: NDArray[np.float32], card: ModelCard
) -> tuple[NDArray[np.integer[Any]], NDArray[np.uint8]]:
    """Each model pixel's cell of the labelling, or the number of cells where it lies within
    ``_MARGIN`` of a boundary; and the label value of each cell.

    A cell is which labels pass (a bit each) and, for softmax, the most probable class.
    """
    labels = card.labels
    width = 1 << len(labels)
    softmax = card.output.kind == "softmax"
    count = width * (outputs.shape[1] if softmax else 1)
    dtype = np.uint8 if count < 255 else np.int64
    cell = np.zeros((outputs.shape[0], *outputs.shape[2:]), dtype)
    robust = np.ones(cell.shape, bool)
    if softmax:
        best, top, second = _top_two(outputs)
        robust &= top - second > _MARGIN
        cell += (best * width).astype(dtype)
        for bit, label in enumerate(labels):
            on = best == label.channel
            robust &= ~on | (np.abs(top - label.threshold) > _MARGIN)
            cell[on & (top >= label.threshold)] += dtype(1 << bit)
    else:
        for bit, label in enumerate(labels):
            probability = _probability(outputs, label, card)
            robust &= np.abs(probability - label.threshold) > _MARGIN
            cell[probability >= label.threshold] += dtype(1 << bit)
    cell[~robust] = count
    values = np.zeros(count, np.uint8)
    for code in range(count):
        for bit, label in enumerate(labels):
            if code % width & (1 << bit):
                values[code] = label.value  # the last label that passes wins, as above
    return cell, values


def _top_two(
    outputs: NDArray[np.float32],
) -> tuple[NDArray[np.intp], NDArray[np.float32], NDArray[np.float32]]:
    """Per pixel: the most probable class (the first on a tie, as argmax), its probability and
    the next highest probability over the classes (equal to it on a tie)."""
    best = np.zeros((outputs.shape[0], *outputs.shape[2:]), np.intp)
    top = outputs[:, 0].copy()
    second = np.full_like(top, -np.inf)
    for channel in range(1, outputs.shape[1]):
        value = outputs[:, channel]
        above = value > top
        np.maximum(second, np.where(above, top, value), out=second)
        np.maximum(top, value, out=top)
        best[above] = channel
    return best, top, second


def detect_lesions(
    probabilities: NDArray[Any],
    card: ModelCard,
    volume: Volume,
    lungs: NDArray[np.uint8],
    refine: bool = True,
) -> list[Lesion]:
    """Group a detection model's per-slice probabilities into measured 3-D lesions.

    Only boxes around the model pixels within ``_MARGIN`` of the threshold or above are mapped
    back to the volume's grid: a voxel is a weighted mean of its taps, so outside them none can
    pass. Components are numbered as over the whole volume: largest first, ties in the order of
    their first voxel.

    Parameters
    ----------
    probabilities
        (slices, C, h, w) on the model's grid or the source grid.
    card
        The detection model's card: its first label gives the threshold and minimum volume.
    volume
        Source geometry and HU.
    lungs
        The lung label map (RIGHT_LUNG / LEFT_LUNG), used to name each lesion's side and to
        keep a lesion's edge off the chest wall.
    refine
        Segment each lesion from the HU around its component (:func:`measure`); False
        measures the components as the heat map gives them (the analysis then segments only
        the candidates it reports, with :func:`segment_reported`).
    """
    label = card.labels[0]
    back = MapBack.of(probabilities, volume)
    near = _probability(probabilities, label, card) >= label.threshold - _MARGIN
    min_voxels = max(1, int(label.min_volume_mm3 / (volume.voxel_volume_ml * 1000.0)))
    found: list[tuple[NDArray[np.intp], NDArray[Any]]] = []
    channel = slice(label.channel, label.channel + 1)
    for slices, rows, cols in _boxes(near, back):
        window = back.window(probabilities[slices, channel], rows, cols)
        prob = as_probability(window[:, 0], card)
        offset = np.array([slices.start, rows.start, cols.start])
        for idx in connected_components(prob >= label.threshold, volume, min_voxels):
            found.append((idx + offset, prob[tuple(idx.T)]))
    found.sort(key=lambda item: (-len(item[0]), tuple(item[0][0])))

    def measured(item: tuple[int, tuple[NDArray[np.intp], NDArray[Any]]]) -> Lesion:
        number, (idx, prob) = item
        return measure(number, idx, prob, volume, lungs, refine)

    # Segmenting a lesion takes 10-90 ms, mostly in SimpleITK and numpy, which release the
    # GIL: real scans give dozens of candidates, measured on several threads.
    with ThreadPoolExecutor(cpu_threads(), thread_name_prefix="lesions") as pool:
        return list(pool.map(measured, enumerate(found, start=1)))


def segment_reported(
    lesions: Sequence[Lesion], volume: Volume, lungs: NDArray[np.uint8]
) -> list[Lesion]:
    """The reported lesions segmented from the HU around their detection component and measured
    again (:func:`measure` with ``refine``); the others stay as the heat map gave them.

    ``lesions`` come from :func:`detect_lesions` with ``refine=False``, so each one's voxels are
    its component. Only what is reported is worth the 10-130 ms a segmentation costs: RIDER's
    79 candidates took 10.9 s of a 236-slice study's 32.7 s when every one was segmented.
    """

    def measured(lesion: Lesion) -> Lesion:
        if not lesion.reported:
            return lesion
        probability = np.array([lesion.max_probability])
        again = measure(lesion.number, lesion.voxel_index, probability, volume, lungs, True)
        return replace(again, probability=lesion.probability, reported=True)

    with ThreadPoolExecutor(cpu_threads(), thread_name_prefix="lesions") as pool:
        return list(pool.map(measured, lesions))


def _boxes(near: NDArray[np.bool_], back: MapBack) -> Iterator[tuple[slice, slice, slice]]:
    """Boxes on the source grid that hold every voxel fed by a ``near`` model pixel: one per
    run of slices that have any, so that no component crosses from one box to another."""
    on = np.flatnonzero(near.any(axis=(1, 2)))
    runs = np.split(on, np.flatnonzero(np.diff(on) > 1) + 1) if on.size else []
    for run in runs:
        part = near[run[0] : run[-1] + 1]
        rows = np.flatnonzero(part.any(axis=(0, 2)))
        cols = np.flatnonzero(part.any(axis=(0, 1)))
        yield (
            slice(int(run[0]), int(run[-1]) + 1),
            back.span(int(rows[0]), int(rows[-1]), 0),
            back.span(int(cols[0]), int(cols[-1]), 1),
        )


def connected_components(
    mask: NDArray[np.bool_], volume: Volume, min_voxels: int
) -> list[NDArray[np.intp]]:
    """Voxel indices (n, 3: slice, row, col) of each 26-connected component, largest first."""
    # Imported here: the outputs' helper process reads this module's Lesion and need not load
    # SimpleITK (~110 MB resident); the daemon has loaded it already (analyse.py).
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(mask.astype(np.uint8))
    # SimpleITK's wrappers carry no annotations.
    image.SetSpacing(volume.spacing_mm)  # type: ignore[no-untyped-call]
    labelled = sitk.ConnectedComponent(image, True)  # type: ignore[no-untyped-call]
    labelled = sitk.RelabelComponent(  # type: ignore[no-untyped-call]
        labelled, minimumObjectSize=min_voxels, sortByObjectSize=True
    )
    array = sitk.GetArrayViewFromImage(labelled)
    flat = np.flatnonzero(array)
    values = array.ravel()[flat]
    order = np.argsort(values, kind="stable")
    groups = np.split(flat[order], np.flatnonzero(np.diff(values[order])) + 1)
    return [np.stack(np.unravel_index(g, array.shape), axis=1) for g in groups if g.size]


def measure(
    number: int,
    idx: NDArray[np.intp],
    probability: NDArray[Any],
    volume: Volume,
    lungs: NDArray[np.uint8],
    refine: bool = True,
) -> Lesion:
    """Measure one detection component (its voxels and their probabilities): centre,
    RECIST-style axes, volume, HU and side.

    With ``refine`` the lesion is first segmented from the HU around the component
    (:func:`imaging_ai.lesion_mask.refine_lesion`): its voxels and volume are the lesion's,
    not the heat map's. The probability stays the component's.
    """
    seed = idx.mean(axis=0)
    detection_index = (float(seed[0]), float(seed[1]), float(seed[2]))
    if refine:
        found = refine_lesion(volume, idx, lungs)
        idx, volume_ml = found.index, found.volume_ml
    else:
        volume_ml = len(idx) * volume.voxel_volume_ml
    s, r, c = idx[:, 0], idx[:, 1], idx[:, 2]
    centre = volume.index_to_lps(np.stack([c, r, s], axis=1).mean(axis=0))
    hu = volume.hu[s, r, c]
    long_axis, short_axis = axial_diameters(idx, volume)
    return Lesion(
        number=number,
        centre_mm=(float(centre[0]), float(centre[1]), float(centre[2])),
        long_axis_mm=long_axis,
        short_axis_mm=short_axis,
        volume_ml=volume_ml,
        mean_hu=float(hu.mean()),
        max_hu=float(hu.max()),
        max_probability=float(probability.max()),
        detection_index=detection_index,
        side=_side(idx, lungs),
        slices=(int(s.min()), int(s.max())),
        voxels=len(idx),
        voxel_index=idx,
    )


class Axes(NamedTuple):
    """In-plane long and short axis (mm) of a lesion on one slice, and the long axis's unit
    direction in the image plane (along the rows, along the columns)."""

    long_mm: float
    short_mm: float
    direction: tuple[float, float]


def axial_diameters(idx: NDArray[np.intp], volume: Volume) -> tuple[float, float]:
    """Long and short axis (mm) as radiologists measure: on the slice where the long axis is
    longest, the longest in-plane chord, and the longest chord perpendicular to it."""
    best = (0.0, 0.0)
    for k in np.unique(idx[:, 0]):
        axes = slice_axes(idx[idx[:, 0] == k], volume)
        if axes.long_mm > best[0]:
            best = (axes.long_mm, axes.short_mm)
    return best


def slice_axes(idx: NDArray[np.intp], volume: Volume) -> Axes:
    """Long and short axis of a lesion's voxels (slice, row, col) on one slice."""
    return _axes(_slice_points_mm(idx, volume))


def _slice_points_mm(idx: NDArray[np.intp], volume: Volume) -> NDArray[np.float64]:
    """The lesion's outline in-plane (mm): the midpoints of its voxels' edges, hull only.

    A mask says which voxel centres lie inside the lesion; its boundary lies between an inside
    centre and the next outside one, and the midpoint of that step (where marching squares
    puts the contour of a 0/1 mask) is within half a voxel of it. Between these points the
    phantom nodules' axes come within 0.6 voxel of their continuous shapes' (about 0.2 voxel
    long on average: a diameter is a maximum); between voxel corners, as before, they came
    out up to a voxel long, and a one-voxel lesion 1.4 voxels across.
    """
    dx, dy = volume.spacing_mm[0], volume.spacing_mm[1]
    rows, cols = _row_ends(idx[:, 1], idx[:, 2])
    centres = np.stack([cols * dx, rows * dy], axis=1).astype(np.float64)
    offsets = np.array([[-dx, 0.0], [dx, 0.0], [0.0, -dy], [0.0, dy]]) / 2.0
    edges = (centres[:, None, :] + offsets[None, :, :]).reshape(-1, 2)
    return _hull(edges)


def _row_ends(
    rows: NDArray[np.intp], cols: NDArray[np.intp]
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """The first and last voxel of each row: every other voxel's edges lie between theirs, so
    the hull is theirs (a segmented lesion holds thousands of voxels a slice; the hull's
    loop in Python took most of the time its measurement did)."""
    order = np.lexsort((cols, rows))
    rows, cols = rows[order], cols[order]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    last = np.r_[first[1:], len(rows)] - 1
    return np.r_[rows[first], rows[last]], np.r_[cols[first], cols[last]]


def _hull(points: NDArray[np.float64]) -> NDArray[np.float64]:
    """Convex hull vertices (monotone chain); diameters only depend on the hull."""
    pts = np.unique(points, axis=0)
    if len(pts) < 3:
        return pts
    # Python floats: the same IEEE doubles as numpy's scalars, at a fraction of the overhead.
    coords: list[tuple[float, float]] = [(x, y) for x, y in pts.tolist()]

    def half(seq: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        for p in seq:
            while len(out) >= 2 and _cross(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out

    lower, upper = half(coords), half(coords[::-1])
    return np.array(lower[:-1] + upper[:-1], dtype=np.float64)


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _axes(hull: NDArray[np.float64]) -> Axes:
    if len(hull) < 2:
        return Axes(0.0, 0.0, (1.0, 0.0))
    diff = hull[:, None, :] - hull[None, :, :]
    dist = np.hypot(diff[..., 0], diff[..., 1])
    i, j = np.unravel_index(int(dist.argmax()), dist.shape)
    long_axis = float(dist[i, j])
    direction = (hull[j] - hull[i]) / long_axis
    normal = np.array([-direction[1], direction[0]])
    short_axis = _longest_chord(hull @ direction, hull @ normal)
    return Axes(long_axis, short_axis, (float(direction[0]), float(direction[1])))


def _longest_chord(u: NDArray[np.float64], v: NDArray[np.float64]) -> float:
    """Longest chord of a convex polygon along v, i.e. perpendicular to the u axis.

    The chord length is concave in u, so its maximum lies at one of the vertices' u.
    """
    best = 0.0
    u2, v2 = np.roll(u, -1), np.roll(v, -1)
    for t in u:
        crosses = (np.minimum(u, u2) <= t) & (t <= np.maximum(u, u2))
        span = u2 - u
        flat = crosses & (np.abs(span) < 1e-12)
        steep = crosses & ~flat
        at = v[steep] + (t - u[steep]) * (v2[steep] - v[steep]) / span[steep]
        values = np.concatenate([at, v[flat], v2[flat]])
        if values.size:
            best = max(best, float(values.max() - values.min()))
    return best


def _side(idx: NDArray[np.intp], lungs: NDArray[np.uint8]) -> str:
    values = lungs[idx[:, 0], idx[:, 1], idx[:, 2]]
    counts = {side: int((values == v).sum()) for v, side in SIDES.items()}
    if not any(counts.values()):
        return _nearest_side(idx, lungs)
    return max(counts, key=lambda k: counts[k])


def _nearest_side(idx: NDArray[np.intp], lungs: NDArray[np.uint8]) -> str:
    """A lesion outside both lung masks (e.g. on the pleura) takes the side of the nearer lung."""
    centre = idx.mean(axis=0)
    best, side = np.inf, ""
    for value, name in SIDES.items():
        where = np.argwhere(lungs[round(float(centre[0]))] == value)
        if where.size:
            d = float(np.min(np.hypot(*(where - centre[1:]).T)))
            if d < best:
                best, side = d, name
    return side


def organ_volumes_ml(labels: NDArray[np.uint8], volume: Volume) -> dict[str, float]:
    """Volume of each lung in mL (counted by slabs on several threads: a 300-slice label map
    is 78 MB, which one thread takes ~0.1 s to compare and count twice)."""

    def count(start: int) -> list[int]:
        part = labels[start : start + _SLAB]
        return [int(np.count_nonzero(part == value)) for value in SIDES]

    totals = [0] * len(SIDES)
    with ThreadPoolExecutor(cpu_threads(), thread_name_prefix="volumes") as pool:
        for counts in pool.map(count, range(0, len(labels), _SLAB)):
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
    return {
        f"{side} lung": float(n * volume.voxel_volume_ml)
        for side, n in zip(SIDES.values(), totals, strict=True)
    }
