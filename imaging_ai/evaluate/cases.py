"""Takes a CASES folder; gives each case's image as a Volume with its reference lungs and lesions.

A case is a sub-folder holding the image as a DICOM series folder ``image/`` or one volume file
``image.nii.gz`` / ``image.nrrd`` / ``image.mha``, and optionally:

- ``lungs.nii.gz``: 1 right lung, 2 left lung, on any grid (resampled nearest-neighbour);
- the lesions, one of: ``lesions.nii.gz`` (each 26-connected component one lesion),
  ``lesions.xml`` (LIDC reader XML), or an RTSTRUCT / DICOM SEG file;
- ``case.toml``: ``lesion_file`` (the RTSTRUCT or SEG, relative to the case) and
  ``lesion_roi`` (the ROI / segment name, or a list of names: each one lesion).

A case without a lesion reference is scored as a scan without lesions: every finding reported
on it is a false positive. Without ``lungs.nii.gz`` its Dice is left out.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import SimpleITK as sitk
from numpy.typing import NDArray
from pydicom.uid import generate_uid

from imaging_ai.errors import UnsupportedInput
from imaging_ai.evaluate.contours import rtstruct_lesions, seg_lesions
from imaging_ai.evaluate.lidc import lidc_lesions
from imaging_ai.evaluate.metrics import ReferenceLesion, reference_from_voxels
from imaging_ai.postprocess import connected_components
from imaging_ai.volume import Volume, group_series, load_series, pick_series

VOLUME_FILES = ("image.nii.gz", "image.nrrd", "image.mha")


@dataclass(frozen=True, eq=False)
class Case:
    """One evaluation case: its image and whatever references it has."""

    name: str
    folder: Path
    volume: Volume
    lungs: NDArray[np.uint8] | None
    lesions: tuple[ReferenceLesion, ...] | None

    @property
    def relevant_lesions(self) -> tuple[ReferenceLesion, ...]:
        """The lesions a detector is scored on (irrelevant findings left out)."""
        return tuple(lesion for lesion in self.lesions or () if lesion.relevant)


def find_cases(folder: Path) -> list[Path]:
    """The case folders under ``folder``, sorted by name.

    Raises
    ------
    UnsupportedInput
        No sub-folder holds an image.
    """
    cases = sorted(p for p in folder.iterdir() if p.is_dir() and _has_image(p))
    if not cases:
        raise UnsupportedInput(
            f"no case in {folder}: expected sub-folders holding image/ or one of "
            + ", ".join(VOLUME_FILES)
        )
    return cases


def _has_image(folder: Path) -> bool:
    return (folder / "image").is_dir() or any((folder / f).is_file() for f in VOLUME_FILES)


def load_case(folder: Path) -> Case:
    """Load a case's image and references, all on the image's grid."""
    volume = load_image(folder)
    lungs_file = folder / "lungs.nii.gz"
    lungs = label_map_on(sitk.ReadImage(str(lungs_file)), volume) if lungs_file.exists() else None
    return Case(folder.name, folder, volume, lungs, load_lesions(folder, volume))


def load_image(folder: Path) -> Volume:
    """The case's image: the DICOM series in ``image/`` or the single volume file."""
    if (folder / "image").is_dir():
        files = sorted(p for p in (folder / "image").rglob("*") if p.is_file())
        series = group_series(files)
        if not series:
            raise UnsupportedInput(f"no DICOM series in {folder / 'image'}")
        return load_series(series[pick_series(series)])
    for name in VOLUME_FILES:
        if (folder / name).is_file():
            return volume_from_file(folder / name)
    raise UnsupportedInput(f"no image in {folder}")


# SimpleITK's wrappers carry no annotations (the ignores below).
def volume_from_file(path: Path) -> Volume:
    """A Volume from a NIfTI / NRRD / MetaImage file (SimpleITK gives LPS geometry)."""
    image = sitk.ReadImage(str(path), sitk.sitkFloat32)
    if image.GetDimension() != 3:  # type: ignore[no-untyped-call]
        raise UnsupportedInput(f"{path.name} is not a 3-D volume")
    hu = sitk.GetArrayFromImage(image).astype(np.float32)  # [k, j, i]
    # Files carry no DICOM identity: stable made-up UIDs, derived from the file's name.
    name = str(path.resolve())
    return Volume(
        hu=hu,
        origin_mm=_triple(image.GetOrigin()),  # type: ignore[no-untyped-call]
        spacing_mm=_triple(image.GetSpacing()),  # type: ignore[no-untyped-call]
        direction=np.asarray(image.GetDirection(), np.float64).reshape(3, 3),  # type: ignore[no-untyped-call]
        sop_instance_uids=tuple(
            generate_uid(entropy_srcs=[name, str(k)]) for k in range(hu.shape[0])
        ),
        series_instance_uid=generate_uid(entropy_srcs=[name, "series"]),
        study_instance_uid=generate_uid(entropy_srcs=[name, "study"]),
        frame_of_reference_uid=generate_uid(entropy_srcs=[name, "frame of reference"]),
    )


def _triple(values: tuple[float, ...]) -> tuple[float, float, float]:
    return float(values[0]), float(values[1]), float(values[2])


def grid_image(volume: Volume) -> sitk.Image:
    """An empty SimpleITK image with the volume's grid and geometry (a resampling target)."""
    k, j, i = volume.hu.shape
    image = sitk.Image(int(i), int(j), int(k), sitk.sitkUInt8)  # type: ignore[no-untyped-call]
    image.SetOrigin(volume.origin_mm)  # type: ignore[no-untyped-call]
    image.SetSpacing(volume.spacing_mm)  # type: ignore[no-untyped-call]
    image.SetDirection(tuple(float(x) for x in volume.direction.ravel()))  # type: ignore[no-untyped-call]
    return image


def label_map_on(labels: sitk.Image, volume: Volume) -> NDArray[np.uint8]:
    """A label map resampled nearest-neighbour onto the volume's grid, [k, j, i]."""
    moved = sitk.Resample(
        sitk.Cast(labels, sitk.sitkUInt8),  # type: ignore[no-untyped-call]
        grid_image(volume),
        sitk.Transform(),  # type: ignore[no-untyped-call]
        sitk.sitkNearestNeighbor,
        0,
        sitk.sitkUInt8,
    )
    return sitk.GetArrayFromImage(moved).astype(np.uint8)


def load_lesions(folder: Path, volume: Volume) -> tuple[ReferenceLesion, ...] | None:
    """The case's reference lesions, or None when it has no lesion reference."""
    settings = _case_settings(folder)
    if "lesion_file" in settings:
        return _dicom_lesions(folder / str(settings["lesion_file"]), settings, volume)
    if (folder / "lesions.nii.gz").exists():
        return mask_lesions(sitk.ReadImage(str(folder / "lesions.nii.gz")), volume)
    if (folder / "lesions.xml").exists():
        return tuple(lidc_lesions((folder / "lesions.xml").read_bytes(), volume))
    for path in sorted(folder.glob("*.dcm")):
        return _dicom_lesions(path, settings, volume)
    return None


def _case_settings(folder: Path) -> dict[str, Any]:
    path = folder / "case.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _dicom_lesions(
    path: Path, settings: dict[str, Any], volume: Volume
) -> tuple[ReferenceLesion, ...]:
    """Lesions from an RTSTRUCT or SEG file; ``lesion_roi`` names the ROIs / segments."""
    ds = pydicom.dcmread(path)
    roi = settings.get("lesion_roi")
    names = [roi] if isinstance(roi, str) else list(roi) if roi else None
    if ds.Modality == "RTSTRUCT":
        return tuple(rtstruct_lesions(ds, volume, names))
    if ds.Modality == "SEG":
        return tuple(seg_lesions(path, volume, names))
    raise UnsupportedInput(f"{path.name} is {ds.Modality}, not an RTSTRUCT or SEG")


def mask_lesions(mask: sitk.Image, volume: Volume) -> tuple[ReferenceLesion, ...]:
    """Each 26-connected component of a lesion mask (any grid) is one lesion."""
    on_grid = label_map_on(mask, volume) > 0
    parts = connected_components(on_grid, volume, min_voxels=1)
    return tuple(
        reference_from_voxels(f"lesion {n}", idx, volume) for n, idx in enumerate(parts, start=1)
    )
