"""A 300-slice 512×512 analysis with its source headers, built without pixel data (for timing)."""

from __future__ import annotations

import numpy as np
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid

from imaging_ai.analyse import Analysis
from imaging_ai.postprocess import LEFT_LUNG, LESION, RIGHT_LUNG, measure, organ_volumes_ml
from imaging_ai.volume import Volume
from tests.dicom_factory import ct_dataset


def large_study(
    slices: int = 300, size: int = 512, lesions: int = 6
) -> tuple[Analysis, list[Dataset]]:
    """Lungs over the middle two thirds of the slices and ``lesions`` small cubes."""
    study, series, frame_of_reference = generate_uid(), generate_uid(), generate_uid()
    headers = []
    for i in range(slices):
        ds = ct_dataset(study, series, i, size)
        del ds.PixelData
        ds.FrameOfReferenceUID = frame_of_reference  # the factory reuses the study UID
        headers.append(ds)
    # The factory steps z by -2.5 mm per instance; the volume runs along +z.
    headers = headers[::-1]
    hu = np.broadcast_to(np.float32(-850.0), (slices, size, size))
    volume = Volume(
        hu=hu,
        origin_mm=(-100.0, -100.0, -2.5 * (slices - 1)),
        spacing_mm=(0.7, 0.7, 2.5),
        direction=np.eye(3),
        sop_instance_uids=tuple(str(ds.SOPInstanceUID) for ds in headers),
        series_instance_uid=series,
        study_instance_uid=study,
        frame_of_reference_uid=str(headers[0].FrameOfReferenceUID),
    )
    rows, cols = np.mgrid[:size, :size]
    right = ((cols - 0.33 * size) / (0.2 * size)) ** 2 + ((rows - size / 2) / (0.3 * size)) ** 2 < 1
    left = ((cols - 0.67 * size) / (0.2 * size)) ** 2 + ((rows - size / 2) / (0.3 * size)) ** 2 < 1
    lungs = np.zeros((slices, size, size), np.uint8)
    lungs[slices // 6 : slices * 5 // 6, right] = RIGHT_LUNG
    lungs[slices // 6 : slices * 5 // 6, left] = LEFT_LUNG
    found = []
    for n in range(lesions):
        k, r, c = slices // 4 + 25 * n, size // 2, int(size * (0.3 if n % 2 else 0.7))
        idx = np.argwhere(np.ones((4, 8, 8), bool)) + np.array([k, r, c])
        found.append(measure(n + 1, idx, np.ones(len(idx), np.float32), volume, lungs))
    labels = lungs.copy()
    for lesion in found:
        labels[tuple(lesion.voxel_index.T)] = LESION
    models = {
        "lung-seg": {"name": "lung-seg", "version": "0.1.0", "sha256": ""},
        "nodule-det": {"name": "nodule-det", "version": "0.2.0", "sha256": ""},
    }
    analysis = Analysis(volume, labels, tuple(found), organ_volumes_ml(lungs, volume), models)
    return analysis, headers
