"""Small valid CT instances for tests that must not depend on the phantom generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid


def ct_series(
    outdir: Path,
    slices: int = 5,
    size: int = 64,
    study_uid: str | None = None,
    series_uid: str | None = None,
    **attributes: object,
) -> list[Path]:
    """Write ``slices`` CT images of one series; extra keyword arguments become attributes."""
    outdir.mkdir(parents=True, exist_ok=True)
    study_uid = study_uid or generate_uid()
    series_uid = series_uid or generate_uid()
    paths = []
    for i in range(slices):
        ds = ct_dataset(study_uid, series_uid, i, size)
        for keyword, value in attributes.items():
            setattr(ds, keyword, value)
        path = outdir / f"CT{i:04d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    return paths


def ct_dataset(study_uid: str, series_uid: str, index: int, size: int = 64) -> Dataset:
    """One CT image with geometry, rescale and UIDs."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.FrameOfReferenceUID = study_uid
    ds.Modality = "CT"
    ds.PatientName = "TEST^PATIENT"
    ds.PatientID = "TEST-ID-1"
    ds.AccessionNumber = "ACC0001"
    ds.StudyDate = "20261130"
    ds.SeriesNumber = 1
    ds.InstanceNumber = index + 1
    ds.ImagePositionPatient = [-100.0, -100.0, -2.5 * index]
    ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    ds.PixelSpacing = [0.7, 0.7]
    ds.SliceThickness = 2.5
    ds.Rows = size
    ds.Columns = size
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 1
    ds.RescaleIntercept = 0
    ds.RescaleSlope = 1
    rng = np.random.default_rng(index)
    ds.PixelData = rng.integers(-1000, 1000, (size, size), dtype=np.int16).tobytes()
    return ds
