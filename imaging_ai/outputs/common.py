"""Shared by the result builders: takes an Analysis and source headers, gives findings and a Report.

The same findings (lesions and lungs, each with its measurements, codes and tracking UID) feed
DICOM SR, HL7 v2 and FHIR, so the three say the same thing in the same units.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import highdicom as hd
import numpy as np
from numpy.typing import NDArray
from pydicom.dataset import Dataset

import imaging_ai
from imaging_ai.dicom import file_headers
from imaging_ai.errors import InvalidDataset, UnsupportedInput
from imaging_ai.modelcard import CodedConcept
from imaging_ai.outputs.uids import OutputUids
from imaging_ai.postprocess import Lesion

if TYPE_CHECKING:  # at run time only its attributes are read; importing it loads the engines
    from imaging_ai.analyse import Analysis

log = logging.getLogger(__name__)

MANUFACTURER = "imaging-ai"
AI_STATEMENT = "AI-generated preliminary result; not verified by a radiologist."

# Coded concepts written alike to SEG, SR, HL7 (OBX-3) and FHIR (Observation.code).
ANATOMICAL_STRUCTURE = CodedConcept("91723000", "SCT", "Anatomical Structure")
ABNORMAL_STRUCTURE = CodedConcept("49755003", "SCT", "Morphologically Abnormal Structure")
RIGHT_LUNG = CodedConcept("3341006", "SCT", "Right lung")
LEFT_LUNG = CodedConcept("44029006", "SCT", "Left lung")
LUNG = CodedConcept("39607008", "SCT", "Lung")
NODULE = CodedConcept("27925004", "SCT", "Nodule")
FINDING_SITE = CodedConcept("363698007", "SCT", "Finding Site")
FINDING = CodedConcept("121071", "DCM", "Finding")
ARTIFICIAL_INTELLIGENCE = CodedConcept("123110", "DCM", "Artificial Intelligence")
CT_CHEST = CodedConcept("24627-2", "LN", "CT Chest")
LONG_AXIS = CodedConcept("103339001", "SCT", "Long axis")
SHORT_AXIS = CodedConcept("103340004", "SCT", "Short axis")
VOLUME = CodedConcept("118565006", "SCT", "Volume")
ATTENUATION = CodedConcept("112031", "DCM", "Attenuation Coefficient")
MEAN = CodedConcept("373098007", "SCT", "Mean")
# The candidate classifier's probability that a lesion is a nodule. PS3.16 defines 111012 as
# "the likelihood that the finding detected is in fact the type of finding identified" (the
# CAD templates' term); 111047 "Probability of cancer" would claim malignancy, which it is not.
CERTAINTY_OF_FINDING = CodedConcept("111012", "DCM", "Certainty of Finding")
SIDE_SITES = {"right": RIGHT_LUNG, "left": LEFT_LUNG, "": LUNG}


@dataclass(frozen=True)
class Unit:
    """A UCUM unit: its code (as HL7 and FHIR write it) and how DICOM names it."""

    code: str
    meaning: str
    dicom_code: str

    @property
    def concept(self) -> CodedConcept:
        """The unit as a DICOM coded concept (scheme UCUM)."""
        return CodedConcept(self.dicom_code, "UCUM", self.meaning)


MM = Unit("mm", "millimeter", "mm")
# UCUM accepts both; DICOM's unit tables write "ml", HL7/FHIR usage prefers "mL".
ML = Unit("mL", "milliliter", "ml")
HU = Unit("[hnsf'U]", "Hounsfield unit", "[hnsf'U]")
# UCUM's unity: a probability as a fraction from 0 to 1 (DICOM CID 7181 names it "no units").
UNITY = Unit("1", "no units", "1")


@dataclass(frozen=True)
class Quantity:
    """One measurement: what, how much, in which unit; ``digits`` is the precision in text."""

    name: CodedConcept
    value: float
    unit: Unit
    digits: int
    derivation: CodedConcept | None = None

    @property
    def text(self) -> str:
        """The value rounded for people (HL7 NM, FHIR decimal), as in findings.json."""
        return f"{self.value:.{self.digits}f}"

    @property
    def label(self) -> str:
        """A short human name, e.g. "Mean Attenuation Coefficient"."""
        prefix = f"{self.derivation.meaning} " if self.derivation else ""
        return prefix + self.name.meaning


@dataclass(frozen=True)
class Finding:
    """A measured region: one lesion or one lung, with its tracking identity."""

    key: str  # stable within a job: "nodule-1", "right-lung"
    label: str  # "Nodule 1", "Right lung"
    category: CodedConcept
    type: CodedConcept
    site: CodedConcept
    tracking_uid: str
    quantities: tuple[Quantity, ...]
    lesion: Lesion | None = field(default=None, compare=False)
    # Certainty of Finding: the classifier's probability (lesions, where a classifier ran).
    probability: Quantity | None = None


@dataclass(frozen=True)
class ModelId:
    """A model's identity as recorded with every result."""

    name: str
    version: str
    sha256: str = ""


@dataclass(frozen=True)
class Algorithm:
    """What made the results: the two models and the device (this daemon) that ran them."""

    lungs: ModelId
    nodules: ModelId
    device_serial_number: str = "imaging-ai"
    # The candidate classifier that decided which of the nodule model's candidates to report.
    candidates: ModelId | None = None
    institution_name: str = ""
    software_version: str = imaging_ai.__version__

    @classmethod
    def from_analysis(cls, analysis: Analysis, **device: str) -> Algorithm:
        """The models in ``analysis.models``: the lung model first, as :func:`analyse` records.

        Keyword arguments set ``device_serial_number`` and ``institution_name``.
        """
        models = [
            ModelId(m["name"], m["version"], m.get("sha256", "")) for m in analysis.models.values()
        ]
        if not 1 <= len(models) <= 3:
            raise ValueError(
                f"expected the lung, the nodule and the candidate model, got {len(models)} models"
            )
        extra = models[2] if len(models) == 3 else None
        return cls(models[0], models[min(1, len(models) - 1)], candidates=extra, **device)

    @property
    def summary(self) -> str:
        """One line naming the software and both models with their versions."""
        used = (self.lungs, self.nodules, *([self.candidates] if self.candidates else []))
        models = ", ".join(f"{m.name} {m.version}" for m in used)
        return f"{MANUFACTURER} {self.software_version} ({models})"


@dataclass(frozen=True)
class StudyInfo:
    """Patient and study attributes of the source series, as DICOM wrote them."""

    study_uid: str
    series_uid: str
    accession: str
    patient_id: str
    issuer_of_patient_id: str
    patient_name: str  # DICOM PN: family^given^middle^prefix^suffix
    birth_date: str  # YYYYMMDD or ""
    sex: str  # M, F, O or ""
    study_date: str
    study_time: str
    study_description: str

    @property
    def name_parts(self) -> tuple[str, str, str, str, str]:
        """(family, given, middle, prefix, suffix) of the name's alphabetic group."""
        parts = (self.patient_name.split("=")[0].split("^") + [""] * 5)[:5]
        return parts[0], parts[1], parts[2], parts[3], parts[4]

    @property
    def study_datetime(self) -> datetime | date | None:
        """Study date and time in the scanner's local time (naive); the date alone where
        StudyTime is empty (a source may lack it, or it was emptied as invalid), so that no
        midnight is claimed; None without a valid date."""
        try:
            day = datetime.strptime(self.study_date, "%Y%m%d")
        except ValueError:
            return None
        if not self.study_time:
            return day.date()
        clock = (self.study_time.split(".")[0] + "000000")[:6]
        try:
            return datetime.strptime(self.study_date + clock, "%Y%m%d%H%M%S")
        except ValueError:
            return day.date()


@dataclass(frozen=True)
class Report:
    """Everything a report to RIS says: study, findings, impression, who made it and when."""

    study: StudyInfo
    findings: tuple[Finding, ...]
    impression: str
    algorithm: Algorithm
    uids: OutputUids
    created: datetime
    # What the input allows, in words (thick or sparse slices); empty when nothing limits it.
    caveats: tuple[str, ...] = ()

    @property
    def conclusion(self) -> str:
        """The impression, followed by any caveat it does not already say."""
        missing = [c for c in self.caveats if c not in self.impression]
        return " ".join([self.impression, *missing]) if missing else self.impression


@dataclass(frozen=True)
class SourceHeaders:
    """The source files' headers, their invalid demographics emptied, and a note for each."""

    datasets: list[Dataset]
    notes: tuple[str, ...]


def source_headers(paths: Iterable[Path]) -> SourceHeaders:
    """Headers (no pixel data) of the source files, ready to encode into every result.

    Patient and study dates, times and names that are not valid DICOM are emptied
    (:func:`~imaging_ai.dicom.file_headers.clean_demographics`); the notes say which, without
    the values, for the study's record.
    """
    datasets = file_headers.read_headers(list(paths))
    return SourceHeaders(datasets, file_headers.clean_demographics(datasets))


def read_headers(paths: Iterable[Path]) -> list[Dataset]:
    """:func:`source_headers`' datasets, its notes logged: to reference them in SEG and SR."""
    found = source_headers(paths)
    for note in found.notes:
        log.warning("source headers: %s", note)
    return found.datasets


def ordered_sources(
    analysis: Analysis, datasets: Sequence[Dataset]
) -> tuple[list[Dataset], NDArray[np.intp] | None]:
    """The source headers highdicom needs, and the order of label planes to match them.

    Single-frame images come back in volume order (order None: the planes already match).
    One multi-frame image comes back alone, with the order that puts the volume's planes in
    its frame order.
    """
    volume = analysis.volume
    by_uid = {str(ds.SOPInstanceUID): ds for ds in datasets}
    missing = sorted(set(volume.sop_instance_uids) - set(by_uid))
    if missing:
        raise InvalidDataset(
            f"{len(missing)} source image(s) of series {volume.series_instance_uid} are not "
            f"among the {len(datasets)} headers given (e.g. {missing[0]})"
        )
    unique = list(dict.fromkeys(volume.sop_instance_uids))
    if len(unique) == len(volume.sop_instance_uids):
        return [by_uid[u] for u in unique], None
    if len(unique) > 1:
        raise UnsupportedInput("a series of several multi-frame images cannot be referenced yet")
    frames = np.asarray(volume.frame_numbers)
    if sorted(frames.tolist()) != list(range(1, int(by_uid[unique[0]].NumberOfFrames) + 1)):
        raise UnsupportedInput(
            f"image {unique[0]} has frames outside the volume (e.g. localizers); "
            "cannot map the segmentation onto its frames"
        )
    return [by_uid[unique[0]]], np.argsort(frames)


_TYPE2 = (
    *("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "AccessionNumber"),
    *("StudyID", "StudyDate", "StudyTime", "ReferringPhysicianName"),
)


def with_type2(ds: Dataset) -> Dataset:
    """A copy with the patient/study attributes that derived objects copy (Type 2: may be
    empty, must be present), so a sparse source header does not fail the build."""
    if all(keyword in ds for keyword in _TYPE2):
        return ds
    # A deep copy: a shallow copy of a pydicom Dataset shares its elements with the caller's.
    complete = copy.deepcopy(ds)
    for keyword in _TYPE2:
        if keyword not in complete:
            setattr(complete, keyword, "")
    return complete


def pin_clock(ds: Dataset, when: datetime) -> None:
    """Set the times highdicom reads from the clock to ``when`` (local time, as DICOM writes
    times), so that rebuilding a job's object gives the same bytes, not only the same UIDs."""
    local = when.astimezone()
    ds.InstanceCreationDate = local.strftime("%Y%m%d")
    ds.InstanceCreationTime = local.strftime("%H%M%S")
    for item in ds.get("ContributingEquipmentSequence", []):
        item.ContributionDateTime = local.strftime("%Y%m%d%H%M%S")


def study_info(ds: Dataset) -> StudyInfo:
    """Patient and study attributes of one source header."""

    def text(keyword: str) -> str:
        return str(ds.get(keyword, "") or "").strip()

    return StudyInfo(
        study_uid=text("StudyInstanceUID"),
        series_uid=text("SeriesInstanceUID"),
        accession=text("AccessionNumber"),
        patient_id=text("PatientID"),
        issuer_of_patient_id=text("IssuerOfPatientID"),
        patient_name=text("PatientName"),
        birth_date=text("PatientBirthDate"),
        sex=text("PatientSex").upper(),
        study_date=text("StudyDate"),
        study_time=text("StudyTime"),
        study_description=text("StudyDescription"),
    )


def lesion_quantities(lesion: Lesion) -> tuple[Quantity, ...]:
    """Long and short axis, volume and mean attenuation, rounded as in findings.json."""
    return (
        Quantity(LONG_AXIS, lesion.long_axis_mm, MM, 2),
        Quantity(SHORT_AXIS, lesion.short_axis_mm, MM, 2),
        Quantity(VOLUME, lesion.volume_ml, ML, 4),
        Quantity(ATTENUATION, lesion.mean_hu, HU, 1, derivation=MEAN),
    )


def lesion_probability(lesion: Lesion) -> Quantity | None:
    """The classifier's probability as a Certainty of Finding from 0 to 1; None if none ran."""
    if lesion.probability is None:
        return None
    return Quantity(CERTAINTY_OF_FINDING, lesion.probability, UNITY, 3)


def findings(analysis: Analysis, uids: OutputUids) -> tuple[Finding, ...]:
    """Each lesion (largest first), then each lung with its volume, with tracking UIDs."""
    lesions = tuple(_lesion_finding(lesion, uids) for lesion in analysis.lesions)
    organs = tuple(
        _lung_finding(side, analysis.organ_volumes_ml.get(f"{side} lung", 0.0), uids)
        for side in ("right", "left")
    )
    return lesions + organs


def _lesion_finding(lesion: Lesion, uids: OutputUids) -> Finding:
    key = f"nodule-{lesion.number}"
    return Finding(
        key=key,
        label=f"Nodule {lesion.number}",
        category=ABNORMAL_STRUCTURE,
        type=NODULE,
        site=SIDE_SITES.get(lesion.side, LUNG),
        tracking_uid=uids.tracking_uid(key),
        quantities=lesion_quantities(lesion),
        lesion=lesion,
        probability=lesion_probability(lesion),
    )


def _lung_finding(side: str, volume_ml: float, uids: OutputUids) -> Finding:
    key = f"{side}-lung"
    return Finding(
        key=key,
        label=f"{side.capitalize()} lung",
        category=ANATOMICAL_STRUCTURE,
        type=SIDE_SITES[side],
        site=SIDE_SITES[side],
        tracking_uid=uids.tracking_uid(key),
        quantities=(Quantity(VOLUME, volume_ml, ML, 1),),
    )


def build_report(
    analysis: Analysis,
    source_datasets: Sequence[Dataset],
    algorithm: Algorithm,
    uids: OutputUids,
    impression: str,
    created: datetime | None = None,
) -> Report:
    """The report that HL7 and FHIR render.

    Parameters
    ----------
    analysis
        What the models found, and the input's caveats.
    source_datasets
        Headers of the source series; patient and study attributes come from the first.
    algorithm
        The models and device, named in the report.
    uids
        The job's output UIDs (tracking UIDs, SEG and SR instances the report points to).
    impression
        The one-line impression (see :func:`imaging_ai.process.impression`).
    created
        When the results were made (timezone-aware); default now. Pass the stored report
        time so that a rebuilt message is the same message.
    """
    if not source_datasets:
        raise InvalidDataset("no source headers to take patient and study attributes from")
    return Report(
        study=study_info(source_datasets[0]),
        findings=findings(analysis, uids),
        impression=impression,
        algorithm=algorithm,
        uids=uids,
        created=created or datetime.now(UTC),
        caveats=tuple(analysis.caveats),
    )


def dicom_code(concept: CodedConcept) -> hd.sr.CodedConcept:
    """A model-card style concept as highdicom's coded concept."""
    return hd.sr.CodedConcept(concept.code, concept.scheme, concept.meaning)
