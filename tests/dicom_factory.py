"""Small valid instances for tests that must not depend on the phantom generator: CT images,
and the other instances a CT study holds (a dose SR, a localizer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    CTImageStorage,
    ExplicitVRLittleEndian,
    XRayRadiationDoseSRStorage,
    generate_uid,
)


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


def _code(value: str, scheme: str, meaning: str) -> Dataset:
    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = value, scheme, meaning
    return item


def _file(ds: Dataset, sop_class: str) -> Dataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta, ds.SOPClassUID = meta, sop_class
    return ds


def dose_sr(path: Path, of: Dataset, series_number: int = 997) -> Path:
    """A minimal X-Ray Radiation Dose SR (TID 10011, CT Radiation Dose) of ``of``'s study."""
    ds = _file(Dataset(), XRayRadiationDoseSRStorage)
    for keyword in ("StudyInstanceUID", "PatientName", "PatientID", "AccessionNumber"):
        setattr(ds, keyword, of.get(keyword, ""))
    ds.StudyDate, ds.StudyTime, ds.StudyID = of.get("StudyDate", ""), "093000", "1"
    ds.ReferringPhysicianName, ds.PatientBirthDate, ds.PatientSex = "", "", "O"
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = generate_uid(), series_number, 1
    ds.Modality, ds.Manufacturer = "SR", "Scanner Vendor"
    ds.ContentDate, ds.ContentTime = ds.StudyDate, ds.StudyTime
    ds.CompletionFlag, ds.VerificationFlag = "COMPLETE", "UNVERIFIED"
    ds.ValueType, ds.ContinuityOfContent = "CONTAINER", "SEPARATE"
    ds.ConceptNameCodeSequence = [_code("113701", "DCM", "X-Ray Radiation Dose Report")]
    template = Dataset()
    template.MappingResource, template.TemplateIdentifier = "DCMR", "10011"
    ds.ContentTemplateSequence = [template]
    procedure = Dataset()
    procedure.RelationshipType, procedure.ValueType = "HAS CONCEPT MOD", "CODE"
    procedure.ConceptNameCodeSequence = [_code("121058", "DCM", "Procedure reported")]
    procedure.ConceptCodeSequence = [_code("77477000", "SCT", "Computed Tomography X-Ray")]
    ds.ContentSequence = [procedure]
    ds.save_as(path, enforce_file_format=True)
    return path


def localizer(path: Path, of: Dataset, series_number: int = 998) -> Path:
    """A one-image CT localizer (scout, ImageType LOCALIZER, coronal) of ``of``'s study."""
    ds = ct_dataset(str(of.StudyInstanceUID), generate_uid(), 0, int(of.Rows))
    for keyword in ("PatientName", "PatientID", "AccessionNumber", "StudyDate"):
        setattr(ds, keyword, of.get(keyword, ""))
    ds.FrameOfReferenceUID = of.FrameOfReferenceUID
    ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 0.0, -1.0]
    ds.SeriesNumber = series_number
    ds.save_as(path, enforce_file_format=True)
    return path
