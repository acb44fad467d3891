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
from imaging_ai import site
from imaging_ai.dicom import file_headers
from imaging_ai.dicom.times import dicom_datetime
from imaging_ai.errors import InvalidDataset, UnsupportedInput
from imaging_ai.modelcard import CodedConcept
from imaging_ai.outputs.uids import OutputUids
from imaging_ai.postprocess import Lesion

if TYPE_CHECKING:  # at run time only its attributes are read; importing it loads the engines
    from imaging_ai.analyse import Analysis

log = logging.getLogger(__name__)

MANUFACTURER = site.MANUFACTURER
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
# UCUM's case-sensitive code is "mL" (the liter's symbol is "L"; "l" is an alternative
# spelling). DICOM CID 7181 lists mL too, and HL7 and FHIR write it: one code everywhere.
ML = Unit("mL", "milliliter", "mL")
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
    def rounded(self) -> float:
        """The value to ``digits`` decimals as a number (DICOM DS, FHIR decimal)."""
        return round(self.value, self.digits)

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
    # The site's IANA zone ("" the host's): zone-less source times are read in it, and the
    # times this daemon writes without a zone (SEG and SR creation) are written in it.
    time_zone: str = ""

    @classmethod
    def from_analysis(cls, analysis: Analysis, **device: str) -> Algorithm:
        """The models in ``analysis.models``: the lung model first, as :func:`analyse` records.

        Keyword arguments set ``device_serial_number``, ``institution_name`` and
        ``time_zone``.
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
class Request:
    """One imaging service request the study fulfils: a Request Attributes Sequence item,
    or the data set's own attributes where it has none."""

    accession: str
    requested_procedure_id: str
    requested_procedure_description: str
    placer_order_number: str  # (0040,2016) Placer Order Number / Imaging Service Request
    filler_order_number: str  # (0040,2017) Filler Order Number / Imaging Service Request
    study_uid: str
    scheduled_procedure_step_id: str = ""  # an item's own only


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
    requests: tuple[Request, ...] = ()
    timezone_offset: str = ""  # (0008,0201) of the source, "+HHMM"; "" where it has none
    time_zone: str = ""  # the site's IANA zone, for times without an offset; "" the host's

    @property
    def placer_order_number(self) -> str:
        """The first request's placer order number; the accession number without one."""
        first = self.requests[0] if self.requests else None
        return (first.placer_order_number if first else "") or self.accession

    @property
    def filler_order_number(self) -> str:
        """The first request's filler order number; the accession number without one."""
        first = self.requests[0] if self.requests else None
        return (first.filler_order_number if first else "") or self.accession

    @property
    def requested_procedure_id(self) -> str:
        """The first request's Requested Procedure ID, or ""."""
        return self.requests[0].requested_procedure_id if self.requests else ""

    @property
    def name_parts(self) -> tuple[str, str, str, str, str]:
        """(family, given, middle, prefix, suffix) of the name's alphabetic group."""
        parts = (self.patient_name.split("=")[0].split("^") + [""] * 5)[:5]
        return parts[0], parts[1], parts[2], parts[3], parts[4]

    @property
    def study_datetime(self) -> datetime | date | None:
        """Study date and time, aware: in the source's Timezone Offset From UTC, else in the
        site's zone; the date alone where StudyTime is empty (a source may lack it, or it was
        emptied as invalid), so that no midnight is claimed; None without a valid date."""
        return dicom_datetime(
            self.study_date, self.study_time, self.timezone_offset, self.time_zone
        )


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


def institution_of(datasets: Sequence[Dataset]) -> str:
    """The source images' InstitutionName, for results where the site sets none ("" if
    the first source has none)."""
    return _text(datasets[0], "InstitutionName") if datasets else ""


def pin_clock(ds: Dataset, when: datetime) -> None:
    """Set the times highdicom reads from the clock to ``when`` (already in the site's zone:
    DICOM writes local times), so that rebuilding a job's object gives the same bytes, not
    only the same UIDs."""
    local = when
    ds.InstanceCreationDate = local.strftime("%Y%m%d")
    ds.InstanceCreationTime = local.strftime("%H%M%S")
    for item in ds.get("ContributingEquipmentSequence", []):
        item.ContributionDateTime = local.strftime("%Y%m%d%H%M%S")


def _text(ds: Dataset, keyword: str) -> str:
    return str(ds.get(keyword, "") or "").strip()


def requests(ds: Dataset) -> tuple[Request, ...]:
    """The requests a source header says it fulfils: one per Request Attributes Sequence
    item, each attribute the item lacks taken from the data set itself (where modalities
    write the accession number and some write the order numbers); without items, one
    request from the data set's own attributes if it has any of them."""
    items = list(ds.get("RequestAttributesSequence") or []) or [Dataset()]
    found = []
    for item in items:

        def value(keyword: str, item: Dataset = item) -> str:
            return _text(item, keyword) or _text(ds, keyword)

        found.append(
            Request(
                accession=value("AccessionNumber"),
                requested_procedure_id=value("RequestedProcedureID"),
                requested_procedure_description=value("RequestedProcedureDescription"),
                placer_order_number=value("PlacerOrderNumberImagingServiceRequest"),
                filler_order_number=value("FillerOrderNumberImagingServiceRequest"),
                study_uid=value("StudyInstanceUID"),
                scheduled_procedure_step_id=_text(item, "ScheduledProcedureStepID"),
            )
        )
    return tuple(
        r
        for r in found
        if r.accession or r.requested_procedure_id or r.placer_order_number or r.filler_order_number
    )


def study_info(ds: Dataset, time_zone: str = "") -> StudyInfo:
    """Patient and study attributes of one source header; ``time_zone`` is the site's
    (IANA name, "" for the host's), for its times without Timezone Offset From UTC."""

    def text(keyword: str) -> str:
        return _text(ds, keyword)

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
        requests=requests(ds),
        timezone_offset=text("TimezoneOffsetFromUTC"),
        time_zone=time_zone,
    )


# Decimals written everywhere (SR, HL7, FHIR, findings.json): what the voxels support. CT voxels
# are 0.5-1 mm wide, so an axis is known to about a tenth of a millimetre; a nodule's volume to
# about a cubic millimetre (0.001 mL: to one decimal a 5 mm nodule's 0.065 mL would read 0.1);
# a lung's (several litres) to a tenth of a millilitre.
AXIS_DIGITS, LESION_VOLUME_DIGITS, LUNG_VOLUME_DIGITS = 1, 3, 1


def lesion_quantities(lesion: Lesion) -> tuple[Quantity, ...]:
    """Long and short axis, volume and mean attenuation, rounded as in findings.json."""
    return (
        Quantity(LONG_AXIS, lesion.long_axis_mm, MM, AXIS_DIGITS),
        Quantity(SHORT_AXIS, lesion.short_axis_mm, MM, AXIS_DIGITS),
        Quantity(VOLUME, lesion.volume_ml, ML, LESION_VOLUME_DIGITS),
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
        quantities=(Quantity(VOLUME, volume_ml, ML, LUNG_VOLUME_DIGITS),),
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
        study=study_info(source_datasets[0], algorithm.time_zone),
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
