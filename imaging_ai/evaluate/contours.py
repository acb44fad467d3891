"""Takes an RTSTRUCT or DICOM SEG and the image's Volume; gives its named ROIs as lesion masks.

RTSTRUCT contours (closed planar polygons in patient millimetres) are rasterised onto the image's
slices by their position along the slice normal; several contours of one ROI on one slice are
combined exclusive-or, so an inner contour is a hole (as treatment planning systems draw them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw
from pydicom.dataset import Dataset

from imaging_ai.errors import InvalidDataset
from imaging_ai.evaluate.metrics import ReferenceLesion, reference_from_voxels
from imaging_ai.volume import Volume


def fill_polygons(
    polygons: Sequence[NDArray[np.float64]], shape: tuple[int, ...], *, xor: bool = False
) -> NDArray[np.bool_]:
    """The pixels inside the polygons ((n, 2) arrays of x = column, y = row), outline included.

    Combined as a union, or exclusive-or with ``xor`` (inner polygons become holes).
    """
    out = np.zeros(shape, bool)
    for polygon in polygons:
        image = Image.new("1", (shape[1], shape[0]), 0)
        points = [(float(x), float(y)) for x, y in polygon]
        if len(points) == 1:
            image.putpixel((round(points[0][0]), round(points[0][1])), 1)
        elif points:
            ImageDraw.Draw(image).polygon(points, fill=1, outline=1)
        drawn = np.asarray(image, dtype=bool)
        out = out ^ drawn if xor else out | drawn
    return out


def rtstruct_lesions(
    ds: Dataset, volume: Volume, names: Sequence[str] | None
) -> list[ReferenceLesion]:
    """Each named ROI of an RTSTRUCT as one lesion (all ROIs when it has only one).

    Raises
    ------
    InvalidDataset
        A named ROI is missing, or no name was given and the RTSTRUCT has several ROIs.
    """
    numbers = {str(r.ROIName): int(r.ROINumber) for r in ds.StructureSetROISequence}
    wanted = _names(names, list(numbers), "RTSTRUCT ROI")
    contours = {int(c.ReferencedROINumber): c for c in ds.get("ROIContourSequence", [])}
    lesions = []
    for name in wanted:
        item = contours.get(numbers[name])
        voxels = _roi_voxels(item, volume) if item is not None else np.zeros((0, 3), np.intp)
        if not len(voxels):
            raise InvalidDataset(f"RTSTRUCT ROI {name!r} has no contour on the image's slices")
        lesions.append(reference_from_voxels(name, voxels, volume))
    return lesions


def _names(names: Sequence[str] | None, present: list[str], what: str) -> list[str]:
    if names is None:
        if len(present) != 1:
            raise InvalidDataset(
                f"name the lesion's {what} (lesion_roi in case.toml); present: {present}"
            )
        return present
    missing = [n for n in names if n not in present]
    if missing:
        raise InvalidDataset(f"{what} {missing} not found; present: {present}")
    return list(names)


def _roi_voxels(item: Dataset, volume: Volume) -> NDArray[np.intp]:
    """The voxels inside one ROI's contours, slice by slice."""
    by_slice: dict[int, list[NDArray[np.float64]]] = {}
    for contour in item.get("ContourSequence", []):
        xyz = np.asarray(contour.ContourData, np.float64).reshape(-1, 3)
        ijk = volume.lps_to_index(xyz)
        k = round(float(ijk[:, 2].mean()))
        if 0 <= k < volume.hu.shape[0]:
            by_slice.setdefault(k, []).append(ijk[:, :2])
    parts = []
    for k, polygons in sorted(by_slice.items()):
        rows, cols = np.nonzero(fill_polygons(polygons, volume.hu.shape[1:], xor=True))
        parts.append(np.stack([np.full_like(rows, k), rows, cols], axis=1))
    return np.concatenate(parts).astype(np.intp) if parts else np.zeros((0, 3), np.intp)


def seg_lesions(path: Path, volume: Volume, names: Sequence[str] | None) -> list[ReferenceLesion]:
    """Each named segment of a DICOM SEG (by label or description) as one lesion.

    The SEG must reference the image's instances (as a SEG made on that series does).
    """
    import highdicom as hd

    seg = hd.seg.segread(path)
    by_name: dict[str, int] = {}
    for item in seg.SegmentSequence:
        for key in ("SegmentDescription", "SegmentLabel"):
            by_name.setdefault(str(item.get(key, "")), int(item.SegmentNumber))
    by_name.pop("", None)
    wanted = _names(names, list(by_name), "SEG segment")
    lesions = []
    for name in wanted:
        pixels = seg.get_pixels_by_source_instance(
            source_sop_instance_uids=list(volume.sop_instance_uids),
            segment_numbers=[by_name[name]],
            assert_missing_frames_are_empty=True,
            # Many SEGs leave Spatial Locations Preserved out (RIDER's does); the frames still
            # name the source instance they were drawn on, which is what is indexed here.
            ignore_spatial_locations=True,
        )
        voxels = np.argwhere(pixels[..., 0] > 0).astype(np.intp)
        if not len(voxels):
            raise InvalidDataset(f"SEG segment {name!r} is empty on the image's slices")
        lesions.append(reference_from_voxels(name, voxels, volume))
    return lesions
