"""Takes an analysis; gives one key image per finding (``key-<number>.png``): the slice through
its centre in a lung window with its outline, whole and enlarged side by side.

They are for people checking a finding on the status page in a second (a vessel, the
diaphragm, bowel gas), not for PACS: they are written beside the job's result files and are
never delivered. Reported findings are outlined in yellow, candidates that were not reported
in blue; the lungs as segmented are outlined in green on the whole slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from PIL import Image

from imaging_ai.postprocess import LEFT_LUNG, LESION, RIGHT_LUNG, Lesion
from imaging_ai.render import Colour, key_image, png_bytes, side_by_side

if TYPE_CHECKING:
    # Only a type here: the web app names key images without loading the analysis' stack.
    from imaging_ai.analyse import Analysis

REPORTED: Colour = (255, 214, 0)
NOT_REPORTED: Colour = (64, 160, 255)
LUNGS: Colour = (0, 150, 70)
# The whole slice is shown at most this wide or high; the enlarged part about CLOSE_UP_PX.
FULL_MAX_PX = 512
CLOSE_UP_PX = 256
# The enlarged part shows at least this many slice pixels around the finding (about 45 mm at
# 0.7 mm pixels), and the finding with half its size again on each side.
CLOSE_UP_MIN_PX = 64
# Candidates that were not reported get key images up to this many, the most probable first:
# on real scans the detector proposes dozens, and each image costs about 8 ms of CPU on the
# results' write path. Every reported finding gets one.
MAX_NOT_REPORTED = 12
# What a key image is called: nothing else is ever served from a result folder.
KEY_IMAGE_NAME = re.compile(r"key-([0-9]{1,9})\.png")
# Labels inside the lungs as segmented (lesions were written over lung voxels).
_IN_LUNGS = np.isin(np.arange(256), (RIGHT_LUNG, LEFT_LUNG, LESION))


def findings(analysis: Analysis) -> tuple[Lesion, ...]:
    """What the status page lists: every candidate, or the reported lesions where the
    analysis had no candidate stage."""
    return analysis.candidates or analysis.lesions


def drawn(analysis: Analysis) -> tuple[Lesion, ...]:
    """The findings that get a key image: every reported one, then the ``MAX_NOT_REPORTED``
    most probable of the others (all of them where no classifier gave probabilities)."""
    listed = findings(analysis)
    others = sorted(
        (x for x in listed if not x.reported),
        key=lambda x: -(x.probability or 0.0),
    )[:MAX_NOT_REPORTED]
    keep = {id(x) for x in others}
    return tuple(x for x in listed if x.reported or id(x) in keep)


def key_image_name(number: int) -> str:
    """The file name of a finding's key image."""
    return f"key-{number}.png"


def centre_slice(lesion: Lesion) -> int:
    """The slice through the lesion's centre: its voxels' mean slice, or where a lesion does
    not cross that slice (a curved one), the slice holding most of its voxels."""
    k = lesion.voxel_index[:, 0]
    middle = int(np.rint(k.mean()))
    if np.any(k == middle):
        return middle
    values, counts = np.unique(k, return_counts=True)
    return int(values[np.argmax(counts)])


def lesion_key_image(analysis: Analysis, lesion: Lesion) -> Image.Image:
    """One finding's key image: the whole centre slice and an enlarged part, side by side.

    Parameters
    ----------
    analysis
        The analysis the lesion belongs to (its volume and label map).
    lesion
        One of :func:`findings`; it needs its voxels.

    Returns
    -------
    PIL.Image.Image
        A palette image at most ``FULL_MAX_PX`` high.
    """
    k = centre_slice(lesion)
    hu = analysis.volume.hu[k]
    on_slice = lesion.voxel_index[lesion.voxel_index[:, 0] == k]
    mask = np.zeros(hu.shape, bool)
    mask[on_slice[:, 1], on_slice[:, 2]] = True
    colour = REPORTED if lesion.reported else NOT_REPORTED
    row, col = (float(x) for x in on_slice[:, 1:].mean(axis=0))
    extent = int(np.ptp(on_slice[:, 1:], axis=0).max()) + 1
    lungs = _IN_LUNGS.take(analysis.labels[k])
    whole = _whole_slice(hu, [(lungs, LUNGS), (mask, colour)], (row, col, colour), extent)
    box = _close_up_box(row, col, extent, hu.shape)
    zoom = max(1, CLOSE_UP_PX // (box[2] - box[0]))
    close = key_image(hu, [(mask, colour)], crop=box, scale=zoom)
    return side_by_side([whole, close])


def render_key_images(analysis: Analysis) -> list[tuple[str, bytes]]:
    """``(file name, PNG)`` for each finding of :func:`drawn` that has voxels."""
    return [
        (key_image_name(lesion.number), png_bytes(lesion_key_image(analysis, lesion)))
        for lesion in drawn(analysis)
        if len(lesion.voxel_index)
    ]


def write_key_images(
    analysis: Analysis, directory: Path, save: Callable[[Path, bytes], Path]
) -> list[Path]:
    """Render every finding's key image and write it into ``directory``.

    Parameters
    ----------
    analysis
        The study's analysis.
    directory
        The job's result folder (it exists).
    save
        Writes one file and returns its path: the result files' atomic write
        (:func:`imaging_ai.outputs.files.write_results` passes its own).

    Returns
    -------
    list[Path]
        The files written, in the order of :func:`findings`.
    """
    return [save(directory / name, data) for name, data in render_key_images(analysis)]


def _whole_slice(
    hu: NDArray[np.float32],
    overlays: Sequence[tuple[NDArray[np.bool_], Colour]],
    marker: tuple[float, float, Colour],
    extent: int,
) -> Image.Image:
    """The slice at most FULL_MAX_PX, with a circle around the finding so that a small one
    is found at a glance."""
    scale = min(1.0, FULL_MAX_PX / max(hu.shape))
    radius = max(10.0, extent * scale / 2 + 8)
    return key_image(hu, overlays, scale=scale, markers=[marker], marker_radius=radius)


def _close_up_box(
    row: float, col: float, extent: int, shape: Sequence[int]
) -> tuple[int, int, int, int]:
    """A square around (row, col), slid to stay on the slice where the slice is big enough."""
    side = min(max(CLOSE_UP_MIN_PX, 2 * extent), *shape[:2])
    row0 = int(np.clip(round(row - side / 2), 0, shape[0] - side))
    col0 = int(np.clip(round(col - side / 2), 0, shape[1] - side))
    return row0, col0, row0 + side, col0 + side
