"""Takes segment masks by slice and the source headers; gives a BINARY SEG's frames, encoded.

highdicom builds a SEG's Per-Frame Functional Groups as one pydicom Dataset tree per frame and
packs the pixels frame by frame; for a 300-slice CT with lungs that is about 630 frames and
half a second, and pydicom spends as long again writing the trees out. Here the frames are
made as highdicom makes them (same attributes, same order, same values, checked byte for byte
against highdicom in ``tests/outputs/test_encoded.py``), but:

- what a frame shares with the other segments' frames on the same slice (Derivation Image
  Sequence, Plane Position Sequence) is encoded once per slice with pydicom's own writer, and
  each frame's item is a join of encoded pieces; the sequence goes into the dataset as a raw
  (already encoded) element, which pydicom writes as it is;
- the pixels of each frame are bit-packed by numpy (little bit order, PS3.5 8.1.1).

Frame order is highdicom's: segment by segment, and within a segment the slices in the order
of their position along the slice normal; the second Dimension Index Value counts only slices
where any segment has a pixel.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import highdicom as hd
import numpy as np
from numpy.typing import NDArray
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset

from imaging_ai.outputs import encoding

# PS3.16 CID 7202, as highdicom writes it for a frame's source image.
_PURPOSE = hd.sr.CodedConcept("121322", "DCM", "Source image for image processing operation")
# DCM 113076 "Segmentation" (CID 7203), as highdicom derives a SEG frame; not codes.DCM's
# "Segmentation", which is the modality SEG.
_DERIVATION = hd.sr.CodedConcept("113076", "DCM", "Segmentation")


@dataclass(frozen=True)
class Frames:
    """A SEG's frames: functional groups as one raw element, pixels packed, and per segment
    the source images (indices into the sources) it has frames on, in frame order."""

    per_frame: RawDataElement
    pixel_data: bytes
    count: int
    sources_of_segment: Mapping[int, tuple[int, ...]]


def encode_frames(packed: Mapping[int, Mapping[int, bytes]], sources: Sequence[Dataset]) -> Frames:
    """Encode the frames of a BINARY SEG whose frames lie on single-frame ``sources``.

    Parameters
    ----------
    packed
        For each segment number, its frames by source index (slice), bit-packed
        (:func:`pack`): only slices where the segment has pixels.
    sources
        The source headers, one per slice, in the order ``packed`` indexes them.
    """
    order = slice_order(sources)
    used = sorted({k for by_slice in packed.values() for k in by_slice}, key=order.__getitem__)
    plane_index = {k: n for n, k in enumerate(used, start=1)}
    constant = _constant_pieces()
    # Frame Content Sequence with its Dimension Index Values (UL, two values) last: encoded
    # once, each frame's two numbers then written over the last 8 bytes.
    frame_content = _one_value_sequence(0x00209111, DataElement(0x00209157, "UL", [0, 0]))
    shared = {k: _shared_pieces(sources[k], constant) for k in used}
    items: list[bytes] = []
    pixels: list[bytes] = []
    sources_of: dict[int, tuple[int, ...]] = {}
    for number in sorted(packed):
        slices = sorted(packed[number], key=order.__getitem__)
        sources_of[number] = tuple(slices)
        segment_piece = _one_value_sequence(0x0062000A, DataElement(0x0062000B, "US", number))
        for k in slices:
            derivation, position = shared[k]
            content = frame_content[:-8] + struct.pack("<2I", number, plane_index[k])
            items.append(encoding.item(derivation, content, position, segment_piece))
            pixels.append(packed[number][k])
    raw = encoding.raw_sequence(0x52009230, items)  # PerFrameFunctionalGroupsSequence
    return Frames(raw, _pixel_data(pixels), len(items), sources_of)


def source_references(sources: Sequence[Dataset]) -> tuple[RawDataElement, RawDataElement]:
    """Source Image Sequence and Referenced Series Sequence (PS3.3 C.8.20.2, C.12.2) of a SEG
    on ``sources``, as highdicom's ``_add_source_image_references`` makes them: every source
    in order, and per series (in order of first appearance) its instances."""
    references: list[bytes] = []
    by_series: dict[str, list[bytes]] = {}
    for ds in sources:
        reference = encoding.item(
            encoding.uid(0x00081150, ds.SOPClassUID),  # ReferencedSOPClassUID
            encoding.uid(0x00081155, ds.SOPInstanceUID),  # ReferencedSOPInstanceUID
        )
        references.append(reference)
        by_series.setdefault(str(ds.SeriesInstanceUID), []).append(reference)
    series = [
        encoding.item(
            encoding.sequence(0x0008114A, instances),  # ReferencedInstanceSequence
            encoding.uid(0x0020000E, uid),  # SeriesInstanceUID
        )
        for uid, instances in by_series.items()
    ]
    return (
        encoding.raw_sequence(0x00082112, references),  # SourceImageSequence
        encoding.raw_sequence(0x00081115, series),  # ReferencedSeriesSequence
    )


def slice_order(sources: Sequence[Dataset]) -> dict[int, float]:
    """Each source's distance along the slice normal, by which highdicom orders the planes."""
    orientation = [float(v) for v in sources[0].ImageOrientationPatient]
    normal = hd.spatial.get_normal_vector(
        orientation, index_convention=hd.spatial.VOLUME_INDEX_CONVENTION
    )
    positions = np.array([[float(v) for v in ds.ImagePositionPatient] for ds in sources])
    return dict(enumerate((positions @ normal).tolist()))


def _constant_pieces() -> tuple[bytes, bytes, bytes]:
    """What every frame's derivation says alike: Derivation Code Sequence, Spatial Locations
    Preserved and Purpose of Reference Code Sequence, encoded."""
    return (
        encoding.element(DataElement(0x00089215, "SQ", [_DERIVATION])),
        encoding.element(DataElement(0x0028135A, "CS", "YES")),
        encoding.element(DataElement(0x0040A170, "SQ", [_PURPOSE])),
    )


def _shared_pieces(source: Dataset, constant: tuple[bytes, bytes, bytes]) -> tuple[bytes, bytes]:
    """The encoded Derivation Image and Plane Position Sequences of a frame on ``source``,
    laid out as highdicom's ``_get_pffg_item`` makes them (elements in tag order)."""
    derivation_code, preserved, purpose = constant
    reference = encoding.item(
        encoding.uid(0x00081150, source.SOPClassUID),  # ReferencedSOPClassUID
        encoding.uid(0x00081155, source.SOPInstanceUID),  # ReferencedSOPInstanceUID
        preserved,
        purpose,
    )
    source_images = encoding.sequence(0x00082112, [reference])  # SourceImageSequence
    derivation = encoding.sequence(0x00089124, [encoding.item(source_images, derivation_code)])
    position = hd.PlanePositionSequence(
        coordinate_system=hd.CoordinateSystemNames.PATIENT,
        image_position=source.ImagePositionPatient,
    )
    position_element = position[0]["ImagePositionPatient"]
    plane = encoding.sequence(0x00209113, [encoding.item(encoding.element(position_element))])
    return derivation, plane


def _one_value_sequence(tag: int, value: DataElement) -> bytes:
    """A sequence of one item holding one element (Frame Content, Segment Identification)."""
    return encoding.sequence(tag, [encoding.item(encoding.element(value))])


def pack(mask: NDArray[np.bool_]) -> bytes:
    """One frame, 1 bit per pixel, first pixel in the lowest bit (PS3.5 8.1.1). Frames are
    packed one by one, so every frame must fill whole bytes (``check_frame_size``)."""
    return np.packbits(mask.reshape(-1), bitorder="little").tobytes()


def check_frame_size(rows: int, columns: int) -> bool:
    """Whether frames of this size can be packed one by one: with a pixel count that is not a
    multiple of 8, PS3.5 packs the bits continuously across frames (a frame starts mid-byte)."""
    return (rows * columns) % 8 == 0


def _pixel_data(frames: list[bytes]) -> bytes:
    data = b"".join(frames)
    # highdicom pads odd-length Pixel Data with b"0"; the same pad keeps both writers' bytes
    # equal (readers ignore the bits after the last frame).
    return data + b"0" if len(data) % 2 else data
