"""Training data: takes phantom seeds, gives model inputs and soft targets, preprocessed as the
daemon preprocesses.

Every study is a random :class:`~imaging_ai_devkit.phantom.PhantomSpec` drawn from its seed
(thickness 1–5 mm, field of view, noise, habitus, kernel, contrast, nodule size, attenuation and
type), of which only some slices are rendered: random ones through the whole stack (lungs, apices,
upper abdomen, slices without lung) and ones through each nodule, so the detector sees enough
positives. Inputs go through :func:`imaging_ai.preprocess.prepare_array` with the very spec the
model card declares, so training sees what the daemon will feed the model. Targets are area
fractions on the model grid (one-hot labels resized with the same area-averaging resize), so the
networks learn partial-volume boundaries, which the daemon's linear upsampling of probabilities then
places between model pixels.

Only numpy and the pydicom-free parts of ``imaging_ai`` (phantom, preprocess; progress, with
tqdm) are imported, so this runs on the GPU machine too.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import numpy.typing as npt
from imaging_ai_devkit.phantom import PhantomSpec, PhantomVolume, generate

from imaging_ai.preprocess import (
    PreprocessSpec,
    context_indices,
    context_stride,
    prepare_array,
)
from imaging_ai.progress import progress as progress_bar

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
TRAIN_SMALL_SHARE = 0.4
"""Training studies with only 3.5-12 mm nodules (validation and test phantoms: 0.2); 6-10 mm
nodules are the ones a detector misses."""


def draw_spec(seed: int, slices: int | None = None, small_share: float = 0.2) -> PhantomSpec:
    """A random chest CT protocol and patient for ``seed`` (the same seed gives the same spec).

    Parameters
    ----------
    seed : int
        The phantom seed; it also chooses every protocol knob below, from its own stream.
    slices : int, optional
        Number of slices; default covers the chest at the drawn thickness.
    small_share : float
        Share of studies whose nodules are all 3.5-12 mm. Validation and test phantoms keep the
        default; training may ask for more (:data:`TRAIN_SMALL_SHARE`). Only this share changes:
        the same random draw decides, so every other knob of a seed stays as it was.

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
    small_only = rng.random() < small_share  # studies of small nodules teach the 4–8 mm range
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


def generate_study(
    seed: int, slices: Sequence[int] | None = None, small_share: float = 0.2
) -> PhantomVolume:
    """Generate the phantom of :func:`draw_spec`; fewer nodules if the lungs cannot hold them.

    Parameters
    ----------
    seed : int
        Phantom seed.
    slices : sequence of int, optional
        Slice indices to render (all by default); see :func:`imaging_ai_devkit.phantom.generate`.
    small_share : float
        See :func:`draw_spec`.
    """
    spec = draw_spec(seed, small_share=small_share)
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

    @property
    def channels(self) -> int:
        """Input channels: the slice, and its neighbours for a 2.5-D input."""
        return 2 * self.preprocess.context_slices + 1

    def inputs(self, vol: PhantomVolume) -> F16:
        """The daemon's preprocessing of every slice, ``(n, H, W)`` float16 (to save memory)."""
        spacing = vol.spacing_mm[:2]
        out = prepare_array(vol.hu, (spacing[0], spacing[1]), self.preprocess, np)
        return np.asarray(out[:, 0], dtype=np.float16)

    def context(self, vol: PhantomVolume, slices: Sequence[int]) -> npt.NDArray[np.intp]:
        """The phantom slices each of ``slices`` is stacked with, ``(len(slices), channels)``.

        The daemon stacks a slice with its neighbours in the loaded volume's order, which runs
        the other way from the phantom's (feet to head against head to feet), so the channel
        before the middle one is the phantom slice ``stride`` further on. The stride comes from
        the slice spacing exactly as :func:`imaging_ai.preprocess.prepare_slices` computes it.
        """
        n, k = vol.spec.slices, self.preprocess.context_slices
        stride = context_stride(vol.spacing_mm[2], self.preprocess.context_spacing_mm)
        loaded = context_indices(n, stride, k)[n - 1 - np.asarray(slices, dtype=np.intp)]
        rows: npt.NDArray[np.intp] = n - 1 - loaded
        return rows

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
        Nodule model inputs ``(n, C, H', W')`` (C = 1, or the slice and its neighbours) and
        nodule area fraction ``(n, H', W')``.
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


def study_samples(
    seed: int, lung: ModelGrid | None, nodule: ModelGrid, random_count: int = 14
) -> Samples:
    """Render the training slices of one study and preprocess them for both models.

    A 2.5-D nodule model also needs each slice's neighbours, which are rendered with it; the
    lung model takes only the slices themselves.

    Parameters
    ----------
    seed : int
        Phantom seed (see :func:`draw_spec`; training draws :data:`TRAIN_SMALL_SHARE`).
    lung : ModelGrid or None
        The lung model's grid; ``None`` leaves its arrays empty (training nodule-det alone).
    nodule : ModelGrid
        The nodule model's grid.
    random_count : int
        Slices drawn anywhere in the stack, besides those through nodules.
    """
    layout = generate_study(seed, slices=[], small_share=TRAIN_SMALL_SHARE)
    rng = np.random.default_rng([seed, 0x511CE])
    chosen = training_slices(layout, rng, random_count)
    rows = nodule.context(layout, chosen)
    needed = np.union1d(rows, chosen)
    vol = generate_study(seed, slices=needed.tolist(), small_share=TRAIN_SMALL_SHARE)
    where = np.searchsorted(needed, chosen)  # the chosen slices' places in the rendered ones
    nodule_x = nodule.inputs(vol)[np.searchsorted(needed, rows)]
    nodule_mask = vol.nodule_mask[where, None].astype(np.float32)
    empty = np.zeros(0, dtype=np.float16)
    lung_x = lung_y = empty
    if lung is not None:
        labels = vol.lung_labels[where]
        onehot = np.stack([labels == v for v in (0, 1, 2)], axis=1).astype(np.float32)
        lung_x = lung.inputs(replace(vol, hu=vol.hu[where]))
        lung_y = lung.fractions(onehot)
    return Samples(
        lung_x=lung_x,
        lung_y=lung_y,
        nodule_x=nodule_x,
        nodule_y=nodule.fractions(nodule_mask)[:, 0],
        seeds=np.full(len(chosen), seed, dtype=np.int64),
    )


_grids: tuple[ModelGrid | None, ModelGrid] | None = None
"""Set in the parent before forking, so workers need not unpickle it per task."""


def _worker(seed: int) -> Samples:
    assert _grids is not None
    return study_samples(seed, *_grids)


def build_samples(
    seeds: Sequence[int],
    lung: ModelGrid | None,
    nodule: ModelGrid,
    workers: int | None = None,
    deadline: float | None = None,
    progress: bool | None = None,
) -> Samples:
    """Generate and preprocess the training slices of many studies, one study per process.

    Parameters
    ----------
    seeds : sequence of int
        Phantom seeds; the output is in this order whatever the number of workers.
    lung, nodule : ModelGrid
        The two models' input grids (``lung`` may be ``None``: see :func:`study_samples`).
    workers : int, optional
        Processes; default every available CPU.
    deadline : float, optional
        A ``time.perf_counter()`` value: studies not finished by then are left out, so the
        output holds the first studies of ``seeds`` (a leased GPU's time is for training).
    progress : bool, optional
        A bar of the studies on stderr (True), none (False), or one when stderr is a terminal.
    """
    global _grids
    workers = workers or len(os.sched_getaffinity(0))
    _grids = (lung, nodule)
    bar = progress_bar(total=len(seeds), desc="phantoms", unit="study", force=progress)
    try:
        if workers <= 1:
            return Samples.concatenate(_until(map(_worker, seeds), deadline, bar.update))
        # Each process renders its study on one core; forking shares the code and the grids.
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            chunk = max(1, math.ceil(len(seeds) / (8 * workers)))
            parts = pool.imap(_worker, seeds, chunksize=chunk)
            return Samples.concatenate(_until(parts, deadline, bar.update))
    finally:
        bar.close()
        _grids = None


def _until(
    parts: Iterable[Samples], deadline: float | None, done: Callable[[], object]
) -> Iterator[Samples]:
    """``parts`` in order, up to the first after ``deadline`` (always at least one); ``done``
    is called as each arrives."""
    for i, part in enumerate(parts):
        if i and deadline is not None and time.perf_counter() > deadline:
            return
        done()
        yield part
