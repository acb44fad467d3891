"""Lung vessel and airway trees: take lung outlines and hilar roots, give tapered tube segments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from imaging_ai_devkit.phantom.sdf import Arr

ARTERY, VEIN, AIRWAY_WALL, AIRWAY_LUMEN = range(4)
CLASSES = 4
PointSdf = Callable[[Arr, Arr, Arr], Arr]


@dataclass(frozen=True)
class Tree:
    """Straight tube segments ``a[i] → b[i]`` of radius ``r[i]`` and branching generation."""

    a: Arr
    b: Arr
    r: Arr
    generation: npt.NDArray[np.int_]

    @staticmethod
    def concat(trees: list[Tree]) -> Tree:
        """All segments of several trees."""
        return Tree(
            np.concatenate([t.a for t in trees]),
            np.concatenate([t.b for t in trees]),
            np.concatenate([t.r for t in trees]),
            np.concatenate([t.generation for t in trees]),
        )


def sample_inside(
    sdf: PointSdf, box: tuple[Arr, Arr], count: int, rng: np.random.Generator, margin: float
) -> Arr:
    """``count`` uniform random points at least ``margin`` mm inside ``sdf`` within ``box``.

    Parameters
    ----------
    sdf : callable
        Signed distance at arrays of x, y, z.
    box : tuple of ndarray
        Lower and upper corners (x, y, z) to draw from.
    count : int
        Points wanted.
    rng : numpy.random.Generator
        Random source.
    margin : float
        Minimum depth inside the surface, mm.

    Returns
    -------
    ndarray
        ``(count, 3)`` points, or fewer if the shape is too small to find them.
    """
    lo, hi = box
    found: list[Arr] = []
    total = 0
    for _ in range(40):
        pts = lo + (hi - lo) * rng.random((max(4 * count, 256), 3))
        pts = pts[sdf(pts[:, 0], pts[:, 1], pts[:, 2]) < -margin]
        found.append(pts)
        total += len(pts)
        if total >= count:
            break
    return np.concatenate(found)[:count]


def grow_tree(
    root: Arr, root_radius: float, targets: Arr, rng: np.random.Generator, exponent: float = 3.0
) -> Tree:
    """Space-filling branching tree from ``root`` out to every target point.

    Each node splits the targets it serves in two across their longest axis (unevenly, as real
    bronchovascular trees do), steps part of the way towards each half's centroid, and gives each
    branch a radius from the number of targets it serves (Murray's law with ``exponent``).

    Parameters
    ----------
    root : ndarray
        Hilar starting point (3,).
    root_radius : float
        Radius of the first segments, mm.
    targets : ndarray
        ``(n, 3)`` end points spread through the lung.
    rng : numpy.random.Generator
        Random source for the uneven splits and step lengths.
    exponent : float
        Radius exponent: ``r ∝ served ** (1 / exponent)``.

    Returns
    -------
    Tree
        About ``2 n`` segments.
    """
    n = len(targets)
    segs: list[tuple[Arr, Arr, float, int]] = []
    stack: list[tuple[Arr, npt.NDArray[np.int_], int]] = [(root, np.arange(n), 0)]
    while stack:
        node, idx, gen = stack.pop()
        for group in _split(targets[idx], rng):
            served = idx[group]
            radius = root_radius * (len(served) / n) ** (1.0 / exponent)
            if len(served) == 1:
                segs.append((node, targets[served[0]], radius, gen))
                continue
            step = rng.uniform(0.3, 0.55)
            child = node + step * (targets[served].mean(axis=0) - node)
            segs.append((node, child, radius, gen))
            stack.append((child, served, gen + 1))
    return Tree(
        np.array([s[0] for s in segs]),
        np.array([s[1] for s in segs]),
        np.array([s[2] for s in segs]),
        np.array([s[3] for s in segs]),
    )


def _split(pts: Arr, rng: np.random.Generator) -> list[npt.NDArray[np.int_]]:
    """Indices of the two halves of ``pts`` across their principal axis (one half if single)."""
    if len(pts) == 1:
        return [np.zeros(1, dtype=int)]
    centred = pts - pts.mean(axis=0)
    # Elementwise products, not BLAS: thousands of tiny products are slower with its threads.
    cov = (centred[:, :, None] * centred[:, None, :]).sum(axis=0)
    axis = np.linalg.eigh(cov)[1][:, -1]
    proj = (centred * axis).sum(axis=1)
    order = np.argsort(proj)
    cut = int(np.clip(round(len(pts) * rng.uniform(0.3, 0.7)), 1, len(pts) - 1))
    return [order[:cut], order[cut:]]


def bronchi(arteries: Tree, min_radius: float, side: float) -> Tree:
    """Airways alongside the larger arteries (bronchovascular bundles), displaced sideways.

    Parameters
    ----------
    arteries : Tree
        Arterial tree of one lung.
    min_radius : float
        Arteries thinner than this have no visible airway beside them, mm.
    side : float
        -1 for the right lung, +1 for the left; airways sit medial and behind their arteries.
    """
    keep = arteries.r >= min_radius
    a, b, r = arteries.a[keep], arteries.b[keep], arteries.r[keep]
    direction = b - a
    direction /= np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-6)
    ref = np.array([-side, 1.0, 0.3]) / np.sqrt(2.09)
    perp = ref - (direction * ref).sum(axis=1, keepdims=True) * direction
    perp /= np.maximum(np.linalg.norm(perp, axis=1, keepdims=True), 1e-6)
    outer = 0.85 * r
    shift = perp * (r + outer + 0.5)[:, None]
    return Tree(a + shift, b + shift, outer, arteries.generation[keep])


def lumen(airways: Tree, thickening: float = 1.0) -> Tree:
    """The air inside ``airways``: their walls are 0.6 to 2 mm thick, thicker on larger ones.

    Parameters
    ----------
    airways : Tree
        Outer surface of the airways.
    thickening : float
        Scales every wall (bronchial wall thickening in smokers and asthma).
    """
    wall = np.clip((0.2 * airways.r + 0.5) * thickening, 0.6, 2.0)
    inner = np.maximum(airways.r - wall, 0.3 * airways.r)
    return Tree(airways.a, airways.b, inner, airways.generation)


@dataclass(frozen=True)
class Spheres:
    """Tubes as overlapping spheres sorted by z, ready to be cut by axial planes."""

    x: Arr
    y: Arr
    z: Arr
    r: Arr
    cls: npt.NDArray[np.int_]
    masked: npt.NDArray[np.bool_]
    """Peripheral spheres, clipped to the lung so that no branch pokes through the pleura."""
    r_max: float


def to_spheres(parts: list[tuple[Tree, int, float]], central_generations: int = 2) -> Spheres:
    """Sample every segment of every ``(tree, class, radius factor)`` with spheres.

    Spheres are spaced at about half their radius, which keeps the tube surface within a few
    percent of its radius; segments of generation ``central_generations`` and beyond are masked.
    """
    centres: list[Arr] = []
    radii: list[Arr] = []
    classes: list[npt.NDArray[np.int_]] = []
    masked: list[npt.NDArray[np.bool_]] = []
    for tree, cls, factor in parts:
        r = tree.r * factor
        length = np.linalg.norm(tree.b - tree.a, axis=1)
        count = np.ceil(length / np.clip(0.45 * r, 0.25, 1.5)).astype(int) + 1
        seg = np.repeat(np.arange(len(r)), count)
        start = np.cumsum(count) - count
        t = (np.arange(seg.size) - start[seg]) / np.maximum(count[seg] - 1, 1)
        pts = tree.a[seg] + t[:, None] * (tree.b[seg] - tree.a[seg])
        centres.append(pts)
        radii.append(r[seg])
        classes.append(np.full(seg.size, cls))
        masked.append(tree.generation[seg] >= central_generations)
    pts = np.concatenate(centres)
    order = np.argsort(pts[:, 2], kind="stable")
    r_all = np.concatenate(radii)[order].astype(np.float32)
    return Spheres(
        pts[order, 0].astype(np.float32),
        pts[order, 1].astype(np.float32),
        pts[order, 2].astype(np.float32),
        r_all,
        np.concatenate(classes)[order],
        np.concatenate(masked)[order],
        float(r_all.max(initial=0.0)),
    )


def segment_distance(points: Arr, tree: Tree) -> Arr:
    """Distance from each point (n, 3) to the surface of the nearest segment (n,)."""
    out = np.full(len(points), np.inf)
    ab = tree.b - tree.a
    length2 = np.maximum((ab * ab).sum(axis=1), 1e-9)
    for i, p in enumerate(points):
        t = np.clip(((p - tree.a) * ab).sum(axis=1) / length2, 0.0, 1.0)
        d = np.linalg.norm(tree.a + t[:, None] * ab - p, axis=1) - tree.r
        out[i] = d.min(initial=np.inf)
    return out
