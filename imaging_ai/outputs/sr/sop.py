"""Takes an Analysis, its source headers and its SEG; gives a TID 1500 Measurement Report SR.

One TID 1411 volumetric ROI group per lesion and per lung, each pointing at its SEG segment
(and through it at the source images), with the tracking identifier and UID the SEG uses,
the finding and its site, the measurements in UCUM units (a lesion's classifier probability
as (111012, DCM, "Certainty of Finding"), from 0 to 1) and the model that made them. The
observer is the device (this daemon). The document is flagged PARTIAL, UNVERIFIED and
PRELIMINARY, says in words that it is AI-generated and not verified, and carries each caveat
on the input (thick or sparse slices) as a Comment.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import highdicom as hd
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid

from imaging_ai.dicom.times import local
from imaging_ai.modelcard import CodedConcept
from imaging_ai.outputs.common import (
    AI_STATEMENT,
    CT_CHEST,
    MANUFACTURER,
    Algorithm,
    Finding,
    ModelId,
    Quantity,
    dicom_code,
    findings,
    ordered_sources,
    pin_clock,
    with_type2,
)
from imaging_ai.outputs.seg import EncodedSegmentation
from imaging_ai.outputs.sr.classes import COMPREHENSIVE_3D, SR_IODS, sr_instance_uid
from imaging_ai.outputs.sr.references import placeholder, put_source_images
from imaging_ai.outputs.sr.requests import referenced_requests
from imaging_ai.outputs.uids import OutputUids

if TYPE_CHECKING:  # importing it loads the inference engines
    from imaging_ai.analyse import Analysis

SR_SERIES_NUMBER = 9102
QUALITATIVE_EVALUATIONS = CodedConcept("C0034375", "UMLS", "Qualitative Evaluations")


def build_measurement_report(
    analysis: Analysis,
    source_datasets: Sequence[Dataset],
    segmentation: hd.seg.Segmentation | EncodedSegmentation,
    algorithm: Algorithm,
    uids: OutputUids,
    *,
    impression: str = "",
    created: datetime | None = None,
    series_number: int = SR_SERIES_NUMBER,
    sr_class: str = COMPREHENSIVE_3D,
) -> hd.sr.Comprehensive3DSR | hd.sr.ComprehensiveSR:
    """Build the measurement report of one analysed series.

    Parameters
    ----------
    analysis
        Lesions and organ volumes.
    source_datasets
        Headers of the source images, in any order; they are recorded as evidence.
    segmentation
        The SEG of the same job (:func:`build_segmentation` or :func:`encode_segmentation`);
        groups reference its segments by tracking UID. A finding without a segment (a lung
        with no voxels) gets no group.
    algorithm
        Models (per group) and device (observer context).
    uids
        The job's UIDs: SeriesInstanceUID, SOPInstanceUID, tracking UIDs.
    impression
        Written as an Impression text beside the AI statement when given.
    created
        Content and series date/time; default now. Pass the job's time for identical rebuilds.
    series_number
        SeriesNumber of the SR series.
    sr_class
        The IOD (:mod:`~imaging_ai.outputs.sr.classes`): "comprehensive3d" or "comprehensive".
    """
    sources, _ = ordered_sources(analysis, source_datasets)
    encoded = isinstance(segmentation, EncodedSegmentation) and segmentation.segments is not None
    segments = referenced_segments(segmentation, placeholders=encoded)
    groups = [
        _group(finding, segments[finding.tracking_uid], algorithm)
        for finding in findings(analysis, uids)
        if finding.tracking_uid in segments
    ]
    report = hd.sr.MeasurementReport(
        observation_context=_observation_context(algorithm),
        procedure_reported=dicom_code(CT_CHEST),
        imaging_measurements=groups,
    )
    report[0].ContentSequence.append(_statements(algorithm, impression, analysis.caveats))
    when = local(created or datetime.now(UTC), algorithm.time_zone)
    seg = segmentation.dataset if isinstance(segmentation, EncodedSegmentation) else segmentation
    evidence = [with_type2(sources[0]), *sources[1:], seg]
    sr = _document(report[0], evidence, algorithm, uids, when, series_number, sr_class)
    pin_clock(sr, when)
    if isinstance(segmentation, EncodedSegmentation) and segmentation.segments is not None:
        put_source_images(sr, {s.number: s.sources for s in segmentation.segments})
    return sr


def _document(
    content: Dataset,
    evidence: list[Dataset],
    algorithm: Algorithm,
    uids: OutputUids,
    when: datetime,
    series_number: int,
    sr_class: str = COMPREHENSIVE_3D,
) -> hd.sr.Comprehensive3DSR | hd.sr.ComprehensiveSR:
    """The SR instance: PARTIAL, UNVERIFIED and PRELIMINARY, patient and study from evidence."""
    clock = when.time().replace(microsecond=0, tzinfo=None)
    return SR_IODS[sr_class](
        evidence=evidence,
        content=content,
        series_instance_uid=uids.sr_series,
        series_number=series_number,
        sop_instance_uid=sr_instance_uid(uids, sr_class),
        instance_number=1,
        manufacturer=MANUFACTURER,
        is_complete=False,
        is_final=False,
        is_verified=False,
        institution_name=algorithm.institution_name or None,
        series_description="AI nodule measurements (preliminary)",
        content_date=when.date(),
        content_time=clock,
        series_date=when.date(),
        series_time=clock,
        requested_procedures=referenced_requests(evidence[0]),
    )


def referenced_segments(
    segmentation: hd.seg.Segmentation | EncodedSegmentation, *, placeholders: bool = False
) -> dict[str, hd.sr.ReferencedSegment]:
    """Each segment as an SR reference to it and to the source images it has frames on, by
    tracking UID.

    An encoded SEG says which images each segment lies on; a highdicom one is searched frame
    by frame (``ReferencedSegment.from_segmentation``), which gives the same references.
    With ``placeholders``, each reference names the source series instead, for
    :func:`~imaging_ai.outputs.sr.references.put_source_images` to replace by the images.
    """
    if isinstance(segmentation, EncodedSegmentation) and segmentation.segments is not None:
        seg = segmentation.dataset
        return {
            s.tracking_uid: hd.sr.ReferencedSegment(
                sop_class_uid=seg.SOPClassUID,
                sop_instance_uid=seg.SOPInstanceUID,
                segment_number=s.number,
                source_images=None if placeholders else _source_images(s.sources),
                source_series=placeholder(str(s.sources[0].SeriesInstanceUID))
                if placeholders
                else None,
            )
            for s in segmentation.segments
        }
    found = segmentation.dataset if isinstance(segmentation, EncodedSegmentation) else segmentation
    if not isinstance(found, hd.seg.Segmentation):
        raise TypeError("an encoded SEG without its segments must be a highdicom Segmentation")
    return {
        str(
            found.get_segment_description(n).tracking_uid
        ): hd.sr.ReferencedSegment.from_segmentation(found, segment_number=n)
        for n in found.segment_numbers
    }


def _source_images(sources: Sequence[Dataset]) -> list[hd.sr.SourceImageForSegmentation]:
    return [hd.sr.SourceImageForSegmentation(ds.SOPClassUID, ds.SOPInstanceUID) for ds in sources]


def _group(
    finding: Finding, segment: hd.sr.ReferencedSegment, algorithm: Algorithm
) -> hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations:
    """TID 1411 for one finding, referencing its segment and the segment's source images."""
    model = algorithm.lungs if finding.lesion is None else algorithm.nodules
    return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(
            uid=finding.tracking_uid, identifier=finding.label
        ),
        referenced_segment=segment,
        finding_type=dicom_code(finding.type),
        finding_category=dicom_code(finding.category),
        algorithm_id=_algorithm_id(model),
        finding_sites=[hd.sr.FindingSite(dicom_code(finding.site))],
        measurements=_measurements(finding, algorithm),
    )


def _measurements(finding: Finding, algorithm: Algorithm) -> list[hd.sr.Measurement]:
    """The finding's measurements, then its probability where a classifier gave one."""
    measured = [_measurement(q) for q in finding.quantities]
    if finding.probability is None:
        return measured
    # The classifier is not the group's model (TID 4019 of the group): it is named here.
    judge = _algorithm_id(algorithm.candidates) if algorithm.candidates else None
    return [*measured, _measurement(finding.probability, judge)]


def _measurement(
    quantity: Quantity, algorithm_id: hd.sr.AlgorithmIdentification | None = None
) -> hd.sr.Measurement:
    # The group names the algorithm once (TID 4019); repeating it per measurement adds nothing.
    return hd.sr.Measurement(
        name=dicom_code(quantity.name),
        value=quantity.rounded,  # as HL7 and FHIR say it: not 15 digits the voxels lack
        unit=dicom_code(quantity.unit.concept),
        derivation=dicom_code(quantity.derivation) if quantity.derivation else None,
        algorithm_id=algorithm_id,
    )


def _algorithm_id(model: ModelId) -> hd.sr.AlgorithmIdentification:
    """TID 4019: the model's name and version, and the hash of its weights."""
    parameters = [f"onnx_sha256={model.sha256}"] if model.sha256 else None
    return hd.sr.AlgorithmIdentification(
        name=model.name, version=model.version, parameters=parameters
    )


def device_uid(algorithm: Algorithm) -> str:
    """Device Observer UID: stable per installation (derived from its serial number)."""
    return str(generate_uid(entropy_srcs=[MANUFACTURER, "device", algorithm.device_serial_number]))


def _observation_context(algorithm: Algorithm) -> hd.sr.ObservationContext:
    """TID 1001 with the device as the only observer: no person has seen this result."""
    device = hd.sr.DeviceObserverIdentifyingAttributes(
        uid=device_uid(algorithm),
        name=MANUFACTURER,
        manufacturer_name=MANUFACTURER,
        model_name=f"{algorithm.lungs.name} + {algorithm.nodules.name}"[:64],
        serial_number=algorithm.device_serial_number,
    )
    return hd.sr.ObservationContext(
        observer_device_context=hd.sr.ObserverContext(
            observer_type=codes.DCM.Device, observer_identifying_attributes=device
        )
    )


def _statements(
    algorithm: Algorithm, impression: str, caveats: Sequence[str] = ()
) -> hd.sr.ContainerContentItem:
    """TID 1500 Qualitative Evaluations: that this is AI-made and unverified, the impression,
    and what the input allows (each caveat a Comment)."""
    container = hd.sr.ContainerContentItem(
        name=dicom_code(QUALITATIVE_EVALUATIONS),
        relationship_type=hd.sr.RelationshipTypeValues.CONTAINS,
    )
    items = [
        hd.sr.TextContentItem(
            name=codes.DCM.Comment,
            value=f"{AI_STATEMENT} Made by {algorithm.summary}.",
            relationship_type=hd.sr.RelationshipTypeValues.CONTAINS,
        )
    ]
    if impression:
        items.append(
            hd.sr.TextContentItem(
                name=codes.DCM.Impression,
                value=impression,
                relationship_type=hd.sr.RelationshipTypeValues.CONTAINS,
            )
        )
    items.extend(
        hd.sr.TextContentItem(
            name=codes.DCM.Comment,
            value=caveat,
            relationship_type=hd.sr.RelationshipTypeValues.CONTAINS,
        )
        for caveat in caveats
    )
    container.ContentSequence = hd.sr.ContentSequence(items)
    return container
