"""Takes the lung segmentation's label map; gives lungs that are lungs: each side one 3-D
connected region, without the trachea and main bronchi, nothing left in the stomach, the colon or
outside the thorax.

A lung model that sees air labels air: `lung-seg` includes parts of the trachea and the main
bronchi (3,752 voxels of TotalSegmentator's trachea on LIDC-IDRI-0001). They are found from the
HU by :func:`imaging_ai.airways.central_airways` and set to background first, so that what they
cut off the lung goes with the stray components below.

A lung is one connected air-filled organ on each side. On real CT the lung model also labels
some gas under the diaphragm (stomach, colon) and, rarely, air outside the chest; those regions
are never connected to the lung itself (the diaphragm and the chest wall lie between), so each
side keeps its largest 26-connected component only. On LIDC-IDRI-0001 this removed 1,016
stomach and 2,450 colon voxels (TotalSegmentator's labels) and no lobe voxel.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from imaging_ai.airways import central_airways
from imaging_ai.postprocess import SIDES
from imaging_ai.volume import Volume


def lungs_only(labels: NDArray[np.uint8], volume: Volume) -> NDArray[np.uint8]:
    """``labels`` without the central airways, each side cut to its largest component.

    Parameters
    ----------
    labels
        The lung model's label map on ``volume``'s grid (RIGHT_LUNG, LEFT_LUNG); modified in
        place and returned.
    volume
        The CT volume it was made from.
    """
    airways = central_airways(volume, labels)
    if airways is not None:
        airways.remove_from(labels)
    return largest_per_side(labels)


def largest_per_side(labels: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """``labels`` with each lung side (RIGHT_LUNG, LEFT_LUNG) cut to its largest 26-connected
    component; other label values are left as they are. Modifies ``labels`` in place and
    returns it."""
    import SimpleITK as sitk  # the daemon has it loaded (volume building); see postprocess

    image = sitk.GetImageFromArray(labels)
    for value in SIDES:
        # SimpleITK's wrappers carry no annotations.
        side = sitk.BinaryThreshold(image, value, value, 1, 0)  # type: ignore[no-untyped-call]
        parts = sitk.RelabelComponent(  # type: ignore[no-untyped-call]
            sitk.ConnectedComponent(side, True)  # type: ignore[no-untyped-call]
        )
        stray = (sitk.GetArrayViewFromImage(parts) > 1) & (labels == value)
        labels[stray] = 0
    return labels
