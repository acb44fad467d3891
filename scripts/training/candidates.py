"""Candidate-classifier training data: takes phantom seeds (and real development scans'
detector candidates), gives 3-D patches of HU with a label each: nodule or one of the things a
detector fires on in real chest CT.

Patches are cut by :func:`imaging_ai.candidates.extract_patch`, the daemon's own resampling, at
the card's spacings; they are kept in HU (float16) and windowed only when a batch is made, with
:func:`imaging_ai.candidates.normalise_patches`, as the daemon does.

Phantoms: positives are every nodule's centre (jittered by up to a quarter of its diameter, at
most 2 mm); negatives are voxels of each structure class of the phantom's ``structures`` truth
within 10 mm of the lungs (vessels, airways, chest wall, diaphragm and the abdomen under it,
bone, streaks, bowel, atelectasis, mediastinum) and plain lung parenchyma, away from every
nodule. Only numpy and the pydicom-free parts of ``imaging_ai`` are imported (phantom,
candidates), so this runs on the GPU machine.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from imaging_ai_devkit.phantom import PhantomVolume
from imaging_ai_devkit.phantom.structures import AIRWAY, STRUCTURE_NAMES, VESSEL

from imaging_ai.candidates import extract_patch

PATCH_SIZE = (32, 32, 32)
PATCH_SPACINGS_MM = (1.0, 2.5)
"""Channel 0 sees 32 mm around the candidate at 1 mm, channel 1 80 mm at 2.5 mm: the nodule
itself, and what it sits in (a vessel tree, the diaphragm's dome, a rib, bowel)."""
NODULE = 1
NEGATIVE_PER_CLASS = 6
PARENCHYMA = len(STRUCTURE_NAMES)  # the "kind" of a negative in plain lung
REAL = PARENCHYMA + 1  # the kind of a real scan's false candidate
KIND_NAMES = {**STRUCTURE_NAMES, PARENCHYMA: "parenchyma", REAL: "real-ct candidate", 0: "nodule"}


def volume_patches(
    hu: npt.NDArray[np.float32],
    spacing_mm: tuple[float, float, float],
    centres: npt.NDArray[np.float64],
) -> npt.NDArray[np.float16]:
    """HU patches ``(n, channels, 32, 32, 32)`` centred on ``centres`` (slice, row, column)."""
    out = np.empty((len(centres), len(PATCH_SPACINGS_MM), *PATCH_SIZE), np.float16)
    for n, centre in enumerate(centres):
        for c, spacing in enumerate(PATCH_SPACINGS_MM):
            out[n, c] = extract_patch(hu, spacing_mm, centre, PATCH_SIZE, spacing)
    return out


def _index_of(vol: PhantomVolume, lps: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Continuous (slice, row, column) of LPS points in a phantom's rendered stack."""
    grid, z = vol.geometry.grid, vol.geometry.z[vol.indices]
    k = np.interp(-lps[:, 2], -z, np.arange(len(z)))  # z falls from head to feet
    return np.stack(
        [k, (lps[:, 1] - grid.y0) / grid.spacing, (lps[:, 0] - grid.x0) / grid.spacing], axis=1
    )


def phantom_samples(
    vol: PhantomVolume, rng: np.random.Generator
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8], npt.NDArray[np.uint8]]:
    """Patch centres (slice, row, column), labels (1 nodule, 0 not) and kinds of one phantom."""
    d, t = vol.geometry.grid.spacing, vol.geometry.thickness
    scale = np.array([t, d, d])
    centres, labels, kinds = [], [], []
    nodule_at = _index_of(vol, vol.nodule_centres_mm) if vol.nodules else np.zeros((0, 3))
    for centre, diameter in zip(nodule_at, vol.nodule_diameters_mm, strict=True):
        if not 0 <= centre[0] <= len(vol.indices) - 1:
            continue
        # A mass falls apart into several detector components, each off its centre.
        reach = 0.3 * diameter if diameter > 25.0 else min(2.0, diameter / 4.0)
        for _ in range(3 if diameter <= 25.0 else 6):
            jitter = rng.uniform(-1, 1, 3) * reach / scale
            centres.append(centre + jitter)
            labels.append(NODULE)
            kinds.append(0)
    near = _near_lungs(vol.lung_labels > 0, scale, 10.0)
    away = _away_from(nodule_at, vol.nodule_diameters_mm, vol.hu.shape, scale)
    inside = vol.lung_labels > 0
    pools = [(kind, (vol.structures == kind) & near & away) for kind in STRUCTURE_NAMES if kind]
    # What the detector fires on most in real lungs: vessels and airways inside them.
    pools += [(kind, (vol.structures == kind) & inside & away) for kind in (VESSEL, AIRWAY)] * 2
    pools.append((PARENCHYMA, (vol.structures == 0) & inside & away))
    for kind, pool in pools:
        where = np.flatnonzero(pool)
        if where.size == 0:
            continue
        picked = rng.choice(where, size=min(NEGATIVE_PER_CLASS, where.size), replace=False)
        centres.extend(np.stack(np.unravel_index(picked, pool.shape), axis=1).astype(float))
        labels.extend([0] * len(picked))
        kinds.extend([kind] * len(picked))
    return (
        np.asarray(centres, np.float64).reshape(-1, 3),
        np.asarray(labels, np.int8),
        np.asarray(kinds, np.uint8),
    )


def _near_lungs(
    lungs: npt.NDArray[np.bool_], scale: npt.NDArray[np.float64], mm: float
) -> npt.NDArray[np.bool_]:
    """Lungs grown by about ``mm`` (a box dilation, separable and cheap)."""
    out = lungs.copy()
    for axis, step in enumerate(scale):
        reach = int(np.ceil(mm / step))
        grown = out.copy()
        for shift in range(1, reach + 1):
            grown |= np.roll(out, shift, axis) | np.roll(out, -shift, axis)
        out = grown
    return out


def _away_from(
    centres: npt.NDArray[np.float64],
    diameters: npt.NDArray[np.float64],
    shape: tuple[int, ...],
    scale: npt.NDArray[np.float64],
) -> npt.NDArray[np.bool_]:
    """False within a nodule's radius + 5 mm of its centre."""
    out = np.ones(shape, bool)
    for centre, diameter in zip(centres, diameters, strict=True):
        reach = diameter / 2.0 + 5.0
        low = np.maximum(np.floor(centre - reach / scale).astype(int), 0)
        high = np.minimum(np.ceil(centre + reach / scale).astype(int) + 1, shape)
        if np.any(high <= low):
            continue
        grids = np.meshgrid(
            *[np.arange(lo, hi) for lo, hi in zip(low, high, strict=True)], indexing="ij"
        )
        dist2 = sum(((g - c) * s) ** 2 for g, c, s in zip(grids, centre, scale, strict=True))
        out[low[0] : high[0], low[1] : high[1], low[2] : high[2]] &= dist2 > reach**2
    return out
