"""Takes an Analysis and its source CT headers; gives the study's DICOM SEG (highdicom, BINARY).

Segments, numbered from 1 in this order and only where they have voxels: right lung, left
lung, then one segment per lesion (largest first), each with the tracking UID that the SR and
the FHIR report use for the same finding. Lung segments exclude lesion voxels, as the label map
does, and the lung volumes that SR, HL7 and FHIR report are measured over these same voxels
(``analyse``: a TID 1411 measurement is of the region its group references).

The General Series module's Request Attributes Sequence names the requests of the source
series (accession, requested procedure and step): the SEG answers the same orders.

Empty frames are omitted: a nodule spans a few slices of hundreds, so most frames of most
segments are empty (a 300-slice study with six nodules: 424 of 2400 frames, 14 instead of 80
MB). Every frame kept carries its own plane position and a reference to the source image it
was derived from (Derivation Image Sequence), so viewers that place frames by position or by
reference align them. A viewer that assumed frame i lies on source image i would not;
``omit_empty_frames=False`` writes every frame of every segment for such a viewer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

import highdicom as hd
import numpy as np
from numpy.typing import NDArray
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.valuerep import format_number_as_ds

from imaging_ai.dicom.times import local
from imaging_ai.errors import UnsupportedInput
from imaging_ai.outputs.common import (
    ARTIFICIAL_INTELLIGENCE,
    LUNG,
    MANUFACTURER,
    Algorithm,
    Finding,
    ModelId,
    dicom_code,
    findings,
    ordered_sources,
    pin_clock,
    requests,
    with_type2,
)
from imaging_ai.outputs.seg.frames import check_frame_size, encode_frames, pack, source_references
from imaging_ai.outputs.uids import OutputUids
from imaging_ai.postprocess import LEFT_LUNG, RIGHT_LUNG, Lesion

if TYPE_CHECKING:  # importing it loads the inference engines
    from imaging_ai.analyse import Analysis

SEG_SERIES_NUMBER = 9101
SEG_LABEL = "AI_LUNG_NODULES"  # ContentLabel is CS: upper case, at most 16 characters
SEG_DESCRIPTION = "AI-generated lung and nodule segmentation, preliminary"
_COLOURS = {"right-lung": "royalblue", "left-lung": "seagreen"}
_ORGAN_LABELS = {"right-lung": RIGHT_LUNG, "left-lung": LEFT_LUNG}
_LESION_COLOUR = "orangered"


@dataclass(frozen=True)
class SegmentRef:
    """One segment of a SEG as its SR group references it: number, tracking UID, and the
    source images it has frames on (in frame order)."""

    number: int
    tracking_uid: str
    sources: tuple[Dataset, ...]


@dataclass(frozen=True)
class EncodedSegmentation:
    """A SEG ready to write (its frames already encoded) and what the SR needs of it."""

    dataset: Dataset
    # None where highdicom encoded the frames: the SR then reads them from the dataset.
    segments: tuple[SegmentRef, ...] | None


def build_segmentation(
    analysis: Analysis,
    source_datasets: Sequence[Dataset],
    algorithm: Algorithm,
    uids: OutputUids,
    *,
    created: datetime | None = None,
    omit_empty_frames: bool = True,
    series_number: int = SEG_SERIES_NUMBER,
) -> hd.seg.Segmentation:
    """Build the SEG of one analysed series, as a highdicom Segmentation.

    Parameters
    ----------
    analysis
        Label map (volume order) and lesions.
    source_datasets
        Headers of the source images, in any order (``read_headers``); every image of the
        volume must be among them.
    algorithm
        Models (named per segment) and device (Manufacturer, serial number).
    uids
        The job's UIDs: SeriesInstanceUID, SOPInstanceUID and tracking UIDs.
    created
        Content and series date/time; default now. Pass the job's time for identical rebuilds.
    omit_empty_frames
        See the module docstring.
    series_number
        SeriesNumber of the SEG series.

    Raises
    ------
    UnsupportedInput
        Nothing was segmented (no lung and no lesion), or the source images cannot be mapped.
    InvalidDataset
        A source image of the volume is missing from ``source_datasets``.
    """
    if omit_empty_frames:
        encoded = encode_segmentation(
            analysis, source_datasets, algorithm, uids, created=created, series_number=series_number
        )
        # Reading the encoded frames back builds highdicom's frame index for its queries.
        return hd.seg.Segmentation.from_dataset(encoded.dataset, copy=False)
    sources, plane_order = ordered_sources(analysis, source_datasets)
    labels, descriptions = segment_label_map(analysis, algorithm, uids)
    pixels = labels if plane_order is None else labels[plane_order]
    return reference_segmentation(
        sources, pixels, descriptions, algorithm, uids, created, series_number, False
    )


def encode_segmentation(
    analysis: Analysis,
    source_datasets: Sequence[Dataset],
    algorithm: Algorithm,
    uids: OutputUids,
    *,
    created: datetime | None = None,
    series_number: int = SEG_SERIES_NUMBER,
) -> EncodedSegmentation:
    """The SEG of :func:`build_segmentation` (empty frames omitted), with its frames encoded
    by :mod:`~imaging_ai.outputs.seg.frames` rather than by highdicom frame by frame.

    highdicom still builds everything but the frames, from a stand-in label map with one
    pixel of each segment; the frames then replace the stand-in's. A multi-frame source, or
    frames that do not fill whole bytes, take highdicom's own path.
    """
    sources, plane_order = ordered_sources(analysis, source_datasets)
    by_key = {f.key: f for f in findings(analysis, uids)}
    kept = _kept(analysis)
    descriptions = [
        _description(number, by_key[key], _model(by_key[key], algorithm))
        for number, key in enumerate(kept, start=1)
    ]
    if not descriptions:
        raise UnsupportedInput(
            "the models found neither lung nor lesion: there is nothing to segment"
        )
    rows, columns = analysis.labels.shape[1:]
    if plane_order is not None or not check_frame_size(rows, columns):
        labels, _ = segment_label_map(analysis, algorithm, uids)
        pixels = labels if plane_order is None else labels[plane_order]
        seg = reference_segmentation(
            sources, pixels, descriptions, algorithm, uids, created, series_number, True
        )
        return EncodedSegmentation(seg, None)
    # The stand-in lies on the first source only: highdicom checks each source against the
    # IOD tables (a millisecond each), and what the other sources give is set here after.
    stand_in = np.zeros((1, rows, columns), np.uint8 if len(kept) < 256 else np.uint16)
    stand_in[0].flat[: len(kept)] = np.arange(1, len(kept) + 1)
    seg = reference_segmentation(
        sources[:1], stand_in, descriptions, algorithm, uids, created, series_number, True
    )
    _spacing_between_slices(seg, sources)
    for element in source_references(sources):
        seg[element.tag] = element
    frames = encode_frames(_packed_frames(analysis, by_key, kept), sources)
    seg.NumberOfFrames = frames.count
    seg[frames.per_frame.tag] = frames.per_frame
    # OB, as pydicom resolves "OB or OW" for 1-bit pixels when highdicom's SEG is written.
    seg.add(DataElement(0x7FE00010, "OB", frames.pixel_data))  # PixelData
    # Written as Explicit VR Little Endian in highdicom's character set: saying so up front
    # lets pydicom write the encoded frames as they are instead of decoding them first.
    seg.set_original_encoding(False, True, seg._character_set)
    segments = tuple(
        SegmentRef(n, by_key[kept[n - 1]].tracking_uid, tuple(sources[k] for k in slices))
        for n, slices in sorted(frames.sources_of_segment.items())
    )
    return EncodedSegmentation(seg, segments)


def reference_segmentation(
    sources: list[Dataset],
    pixels: NDArray[np.integer],
    descriptions: list[hd.seg.SegmentDescription],
    algorithm: Algorithm,
    uids: OutputUids,
    created: datetime | None,
    series_number: int,
    omit_empty_frames: bool,
) -> hd.seg.Segmentation:
    """The SEG as highdicom builds it from a label map of segment numbers (``pixels``, in the
    order of ``sources`` or of one multi-frame source's frames)."""
    when = local(created or datetime.now(UTC), algorithm.time_zone)
    seg = hd.seg.Segmentation(
        source_images=[with_type2(sources[0]), *sources[1:]],
        pixel_array=pixels,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=descriptions,
        series_instance_uid=uids.seg_series,
        series_number=series_number,
        sop_instance_uid=uids.seg_instance,
        instance_number=1,
        manufacturer=MANUFACTURER,
        manufacturer_model_name=MANUFACTURER,
        software_versions=algorithm.software_version,
        device_serial_number=algorithm.device_serial_number,
        content_label=SEG_LABEL,
        content_description=SEG_DESCRIPTION,
        # Type 2 in Content Identification; readers (dcmqi) warn without it. No person made
        # this content, so the creator is the software, as the SR's observer is the device;
        # the caret makes it a family name (dciodvfy calls a bare name the retired PN form).
        content_creator_name=f"{MANUFACTURER}^",
        series_description="AI lung and nodule segmentation (preliminary)",
        institution_name=algorithm.institution_name or None,
        content_date=when.date(),
        content_time=when.time().replace(microsecond=0, tzinfo=None),
        series_date=when.date(),
        series_time=when.time().replace(microsecond=0, tzinfo=None),
        omit_empty_frames=omit_empty_frames,
    )
    pin_clock(seg, when)
    _request_attributes(seg, sources[0])
    _pin_dimension_organization(seg, uids.uid("seg-dimension-organization"))
    return seg


def _request_attributes(seg: hd.seg.Segmentation, source: Dataset) -> None:
    """Request Attributes Sequence (Type 3) of the source's requests, with the values the
    source has (every attribute of an item is Type 3 or 1C on the source having it). The
    Request Attributes Macro has no placer or filler order number (dciodvfy: "not present in
    standard DICOM IOD"): those are in the SR's Referenced Request Sequence only."""
    items = []
    for request in requests(source):
        item = Dataset()
        values = {
            "AccessionNumber": request.accession,
            "StudyInstanceUID": request.study_uid,
            "RequestedProcedureDescription": request.requested_procedure_description,
            "RequestedProcedureID": request.requested_procedure_id,
            "ScheduledProcedureStepID": request.scheduled_procedure_step_id,
        }
        for keyword, value in values.items():
            if value:
                setattr(item, keyword, value)
        items.append(item)
    if items:
        seg.RequestAttributesSequence = DicomSequence(items)


def _spacing_between_slices(seg: hd.seg.Segmentation, sources: Sequence[Dataset]) -> None:
    """Spacing Between Slices as highdicom sets it for a SEG on all ``sources``: copied from
    the first source if it has one (the stand-in had that too), else derived from every
    source's position where they are evenly spaced."""
    measures = seg.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    if "SpacingBetweenSlices" in sources[0]:
        return
    measures.pop("SpacingBetweenSlices", None)  # what one plane gave, if anything
    spacing, _ = hd.spatial.get_volume_positions(
        image_positions=[ds.ImagePositionPatient for ds in sources],
        image_orientation=seg.SharedFunctionalGroupsSequence[0]
        .PlaneOrientationSequence[0]
        .ImageOrientationPatient,
    )
    if spacing is not None:
        measures.SpacingBetweenSlices = format_number_as_ds(spacing)


def _pin_dimension_organization(seg: hd.seg.Segmentation, uid: str) -> None:
    """highdicom draws a random Dimension Organization UID; the job's own keeps rebuilds equal."""
    for item in seg.DimensionOrganizationSequence:
        item.DimensionOrganizationUID = uid
    for item in seg.DimensionIndexSequence:
        item.DimensionOrganizationUID = uid


def _kept(analysis: Analysis) -> list[str]:
    """Keys of the findings that get a segment, in segment number order: lungs with voxels,
    then lesions with voxels."""
    organs = [("right-lung", RIGHT_LUNG), ("left-lung", LEFT_LUNG)]
    kept = [key for key, value in organs if _holds(analysis.labels, value)]
    return kept + [f"nodule-{lesion.number}" for lesion in analysis.lesions if lesion.voxels]


def _model(finding: Finding, algorithm: Algorithm) -> ModelId:
    return algorithm.lungs if finding.lesion is None else algorithm.nodules


def segment_label_map(
    analysis: Analysis, algorithm: Algorithm, uids: OutputUids
) -> tuple[NDArray[np.integer], list[hd.seg.SegmentDescription]]:
    """A label map of segment numbers and the segments' descriptions, skipping empty ones."""
    by_key = {f.key: f for f in findings(analysis, uids)}
    kept = _kept(analysis)
    dtype = np.uint8 if len(kept) < 256 else np.uint16
    organ_lut = np.zeros(256, dtype)
    for number, key in enumerate(kept, start=1):
        if by_key[key].lesion is None:
            organ_lut[_ORGAN_LABELS[key]] = number
    # One pass maps every organ label to its segment number; lesion voxels are set after.
    out = cast(NDArray[np.integer], organ_lut[analysis.labels])
    descriptions = []
    for number, key in enumerate(kept, start=1):
        finding = by_key[key]
        if finding.lesion is not None:
            out[tuple(finding.lesion.voxel_index.T)] = number
        descriptions.append(_description(number, finding, _model(finding, algorithm)))
    return out, descriptions


def _packed_frames(
    analysis: Analysis, by_key: dict[str, Finding], kept: list[str]
) -> dict[int, dict[int, bytes]]:
    """The non-empty frames of each segment, bit-packed, by slice: the frames of the label map
    of :func:`_segments` without building it (mapping all 78 M voxels takes a tenth of a
    second; a lung is one comparison per slice, a lesion a few slices of its own voxels).

    As in that label map, a voxel of several lesions belongs to the last, and lesion voxels
    are not lung."""
    labels = analysis.labels
    lesions = [(n, by_key[key].lesion) for n, key in enumerate(kept, start=1)]
    lesion_planes = _lesion_planes(
        [(n, lesion) for n, lesion in lesions if lesion is not None], labels.shape[1:]
    )
    packed: dict[int, dict[int, bytes]] = {}
    for number, lesion in lesions:
        if lesion is None:
            packed[number] = _organ_frames(labels, _ORGAN_LABELS[kept[number - 1]], lesion_planes)
    for k, plane in lesion_planes.items():
        for number in np.unique(plane[plane > 0]).tolist():
            packed.setdefault(number, {})[k] = pack(plane == number)
    return {n: packed[n] for n in sorted(packed)}


def _organ_frames(
    labels: NDArray[np.uint8], value: int, lesion_planes: dict[int, NDArray[np.integer]]
) -> dict[int, bytes]:
    frames = {}
    for k in range(len(labels)):
        mask = labels[k] == value
        if k in lesion_planes:
            mask &= lesion_planes[k] == 0
        if mask.any():
            frames[k] = pack(mask)
    return frames


def _lesion_planes(
    lesions: list[tuple[int, Lesion]], shape: tuple[int, ...]
) -> dict[int, NDArray[np.integer]]:
    """Slices with lesion voxels: a plane of segment numbers each, later lesions last."""
    dtype = np.uint8 if len(lesions) < 255 else np.uint16
    planes: dict[int, NDArray[np.integer]] = {}
    for number, lesion in lesions:
        k, j, i = lesion.voxel_index.T
        for z in np.unique(k).tolist():
            plane = planes.setdefault(z, np.zeros(shape, dtype))
            at = k == z
            plane[j[at], i[at]] = number
    return planes


def _holds(labels: NDArray[np.uint8], value: int, slab: int = 8) -> bool:
    """Whether any voxel has ``value``, looking a slab of slices at a time: an organ is found
    within its first slices, not after comparing all 78 M voxels (np.bincount over them takes
    a second by itself)."""
    return any((labels[k : k + slab] == value).any() for k in range(0, len(labels), slab))


def _description(number: int, finding: Finding, model: ModelId) -> hd.seg.SegmentDescription:
    lesion = finding.lesion is not None
    return hd.seg.SegmentDescription(
        segment_number=number,
        segment_label=finding.label,
        segmented_property_category=dicom_code(finding.category),
        segmented_property_type=dicom_code(finding.type),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=algorithm_identification(model),
        tracking_uid=finding.tracking_uid,
        tracking_id=finding.label,
        anatomic_regions=[dicom_code(LUNG)] if lesion else None,
        primary_anatomic_structures=[dicom_code(finding.site)]
        if lesion and finding.site != LUNG
        else None,
        display_color=hd.color.CIELabColor.from_string(_COLOURS.get(finding.key, _LESION_COLOUR)),
    )


def algorithm_identification(model: ModelId) -> hd.AlgorithmIdentificationSequence:
    """Algorithm Identification Sequence for a model: name, version, family AI, weights hash."""
    return hd.AlgorithmIdentificationSequence(
        name=model.name,
        family=dicom_code(ARTIFICIAL_INTELLIGENCE),
        version=model.version,
        source=MANUFACTURER,
        parameters={"onnx_sha256": model.sha256} if model.sha256 else None,
    )
