"""Training data: takes phantom seeds, gives model inputs and soft targets, preprocessed as the
daemon preprocesses.

Every study is a random :class:`~imaging_ai.phantom.PhantomSpec` drawn from its seed (thickness
1–5 mm, field of view, noise, habitus, kernel, contrast, nodule size, attenuation and type), of
which only some slices are rendered: random ones through the whole stack (lungs, apices, upper
abdomen, slices without lung) and ones through each nodule, so the detector sees enough positives.
Inputs go through :func:`imaging_ai.preprocess.prepare_array` with the very spec the model card
declares, so training sees what the daemon will feed the model. Targets are area fractions on the
model grid (one-hot labels resized with the same area-averaging resize), so the networks learn
partial-volume boundaries, which the daemon's linear upsampling of probabilities then places
between model pixels.

Only numpy and the pydicom-free parts of ``imaging_ai`` (phantom, preprocess) are imported, so this
runs on the GPU machine too.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import numpy.typing as npt

from imaging_ai.phantom import PhantomSpec, PhantomVolume, generate
from imaging_ai.preprocess import PreprocessSpec, prepare_array

F16 = npt.NDArray[np.float16]
F32 = npt.NDArray[np.float32]

# Seed ranges: training, validation (thresholds, min volume) and test (the card's figures) never
# overlap, so the card's figures come from phantoms no training or tuning step has seen.
TRAIN_SEEDS = range(100_000, 200_000)
VALIDATION_SEEDS = range(200_000, 300_000)
TEST_SEEDS = range(300_000, 400_000)
THICKNESSES_MM = (1.0, 1.0, 1.25, 1.25, 1.5, 2.0, 2.5, 3.0, 5.0)
"""Drawn uniformly from this list: thin slices are the usual chest protocol, 5 mm still occurs."""
CHEST_SPAN_MM = (250.0, 340.0)
"""Stack length: apex to upper abdomen, with some studies shorter or longer."""


def draw_spec(seed: int, slices: int | None = None) -> PhantomSpec:
    """A random chest CT protocol and patient for ``seed`` (the same seed gives the same spec).

    Parameters
    ----------
    seed : int
        The phantom seed; it also chooses every protocol knob below, from its own stream.
    slices : int, optional
        Number of slices; default covers the chest at the drawn thickness.

    Returns
    -------
    PhantomSpec
        Slice thickness 1–5 mm, pixel spacing left to the phantom (fitted to the body) or
        0.55–0.95 mm (a tight or wide field of view), noise from the phantom's dose model or
        5–60 HU, patient scale 0.75–1.45, any kernel, contrast in 40 %, 3–12 nodules of 3.5–30 mm
        (sometimes only small ones), solid attenuation -60 to 90 HU, 10–45 % sub-solid and
        10–40 % juxtapleural nodules.
    """
    rng = np.random.default_rng([seed, 0x7A1])
    thickness = float(rng.choice(THICKNESSES_MM))
    n = slices or max(16, round(rng.uniform(*CHEST_SPAN_MM) / thickness))
    small_only = rng.random() < 0.2  # studies full of small nodules teach the 4–8 mm range
    return PhantomSpec(
        slices=n,
        seed=seed,
        nodules=int(rng.integers(3, 13)),
        slice_thickness_mm=thickness,
        pixel_spacing_mm=None if rng.random() < 0.5 else round(float(rng.uniform(0.55, 0.95)), 3),
        noise_hu=None if rng.random() < 0.6 else round(float(rng.uniform(5.0, 60.0)), 1),
        patient_scale=round(float(rng.uniform(0.75, 1.45)), 3),
        kernel=("soft", "standard", "sharp")[int(rng.integers(3))],
        contrast=bool(rng.random() < 0.4),
        nodule_diameter_range_mm=(3.5, 12.0) if small_only else (3.5, 30.0),
        nodule_hu=round(float(rng.uniform(-60.0, 90.0)), 1),
        subsolid_fraction=round(float(rng.uniform(0.1, 0.45)), 3),
        juxtapleural_fraction=round(float(rng.uniform(0.1, 0.4)), 3),
    )


def generate_study(seed: int, slices: Sequence[int] | None = None) -> PhantomVolume:
    """Generate the phantom of :func:`draw_spec`; fewer nodules if the lungs cannot hold them.

    Parameters
    ----------
    seed : int
        Phantom seed.
    slices : sequence of int, optional
        Slice indices to render (all by default); see :func:`imaging_ai.phantom.generate`.
    """
    spec = draw_spec(seed)
    while True:
        try:
            return generate(spec, slices=slices, workers=1)
        except ValueError:  # "cannot fit N nodules": a small patient or a short slab
            if spec.nodules == 0:
                raise
            spec = replace(spec, nodules=spec.nodules - 1)


def training_slices(vol: PhantomVolume, rng: np.random.Generator, random_count: int) -> list[int]:
    """Slices to render: ``random_count`` anywhere in the stack, plus up to three per nodule.

    Parameters
    ----------
    vol : PhantomVolume
        The study, generated with no slices (only its geometry and nodules are read).
    rng : numpy.random.Generator
        Chooses the slices.
    random_count : int
        Slices drawn uniformly over the whole stack.
    """
    z = vol.geometry.z
    chosen = set(rng.choice(len(z), size=min(random_count, len(z)), replace=False).tolist())
    for nodule in vol.nodules:
        through = np.flatnonzero(np.abs(z - nodule.centre[2]) <= 0.5 * nodule.diameter)
        if through.size == 0:
            through = np.array([int(np.argmin(np.abs(z - nodule.centre[2])))])
        chosen.update(rng.choice(through, size=min(3, through.size), replace=False).tolist())
    return sorted(int(k) for k in chosen)


@dataclass(frozen=True)
class ModelGrid:
    """Input size and preprocessing of one model, as its card declares them."""

    preprocess: PreprocessSpec

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of the model input."""
        height, width = self.preprocess.input_size
        return int(height), int(width)

    def inputs(self, vol: PhantomVolume) -> F16:
        """The daemon's preprocessing of every slice, ``(n, H, W)`` float16 (to save memory)."""
        spacing = vol.spacing_mm[:2]
        out = prepare_array(vol.hu, (spacing[0], spacing[1]), self.preprocess, np)
        return np.asarray(out[:, 0], dtype=np.float16)

    def fractions(self, masks: F32) -> F16:
        """Area fraction of each ``(n, C, rows, cols)`` 0/1 mask on the model grid, float16.

        The resize is the daemon's own (through a [0, 1] window that changes nothing), so the
        targets line up with the inputs pixel for pixel.
        """
        n, c = masks.shape[:2]
        identity = PreprocessSpec(0.5, 1.0, "minmax", "none", 0.0, self.size)
        flat = masks.reshape(n * c, *masks.shape[2:])
        out = prepare_array(flat, (1.0, 1.0), identity, np)
        return np.asarray(out.reshape(n, c, *self.size), dtype=np.float16)


@dataclass(frozen=True)
class Samples:
    """Preprocessed slices of many studies, ready for training.

    Attributes
    ----------
    lung_x, lung_y : ndarray
        Lung model inputs ``(n, H, W)`` and area fractions of background, right and left lung
        ``(n, 3, H, W)``.
    nodule_x, nodule_y : ndarray
        Nodule model inputs ``(n, H', W')`` and nodule area fraction ``(n, H', W')``.
    seeds : ndarray
        The phantom seed of each slice.
    """

    lung_x: F16
    lung_y: F16
    nodule_x: F16
    nodule_y: F16
    seeds: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.seeds)

    @staticmethod
    def concatenate(parts: Iterable[Samples]) -> Samples:
        """One set from several."""
        items = list(parts)
        arrays = (np.concatenate([getattr(p, f.name) for p in items]) for f in fields(Samples))
        return Samples(*arrays)


def study_samples(seed: int, lung: ModelGrid, nodule: ModelGrid, random_count: int = 14) -> Samples:
    """Render the training slices of one study and preprocess them for both models.

    Parameters
    ----------
    seed : int
        Phantom seed (see :func:`draw_spec`).
    lung, nodule : ModelGrid
        The two models' input grids.
    random_count : int
        Slices drawn anywhere in the stack, besides those through nodules.
    """
    layout = generate_study(seed, slices=[])
    rng = np.random.default_rng([seed, 0x511CE])
    vol = generate_study(seed, slices=training_slices(layout, rng, random_count))
    onehot = np.stack([vol.lung_labels == v for v in (0, 1, 2)], axis=1).astype(np.float32)
    nodule_mask = vol.nodule_mask[:, None].astype(np.float32)
    return Samples(
        lung_x=lung.inputs(vol),
        lung_y=lung.fractions(onehot),
        nodule_x=nodule.inputs(vol),
        nodule_y=nodule.fractions(nodule_mask)[:, 0],
        seeds=np.full(len(vol.indices), seed, dtype=np.int64),
    )


_grids: tuple[ModelGrid, ModelGrid] | None = None
"""Set in the parent before forking, so workers need not unpickle it per task."""


def _worker(seed: int) -> Samples:
    assert _grids is not None
    return study_samples(seed, *_grids)


def build_samples(
    seeds: Sequence[int], lung: ModelGrid, nodule: ModelGrid, workers: int | None = None
) -> Samples:
    """Generate and preprocess the training slices of many studies, one study per process.

    Parameters
    ----------
    seeds : sequence of int
        Phantom seeds; the output is in this order whatever the number of workers.
    lung, nodule : ModelGrid
        The two models' input grids.
    workers : int, optional
        Processes; default every available CPU.
    """
    global _grids
    workers = workers or len(os.sched_getaffinity(0))
    _grids = (lung, nodule)
    try:
        if workers <= 1:
            return Samples.concatenate(_worker(s) for s in seeds)
        # Each process renders its study on one core; forking shares the code and the grids.
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            chunk = max(1, math.ceil(len(seeds) / (4 * workers)))
            return Samples.concatenate(pool.imap(_worker, seeds, chunksize=chunk))
    finally:
        _grids = None
