"""Takes a CT file's bytes and gives what a volume needs of it (UIDs, geometry, rescale, stored
pixels) without pydicom, or None where the file is anything but the plain case.

pydicom's full parse of a 300-slice series was most of the 0.9 s "load" stage on the GPU host
(issue 7). The plain case is a single-frame CT Image Storage instance in implicit or explicit VR
little endian whose elements before Pixel Data all have a defined length, with single-valued
numbers and ASCII text where they are expected: walking those elements with the byte codec
(``imaging_ai.dicom.codec``) and viewing Pixel Data in place costs a few microseconds. Anything
else (multi-frame, compressed, localizers, undefined-length sequences, a missing or odd value)
answers None and the caller reads the file with pydicom, which also gives the error messages;
``tests/dicom/test_slice_read.py`` checks both paths give identical frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from imaging_ai.dicom import codec
from imaging_ai.dicom.codec import PIXEL_DATA, UNDEFINED_LENGTH

_EXPLICIT, _IMPLICIT = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2"
CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
_SERIES_INSTANCE_UID = 0x0020000E
# The elements a volume needs, by tag; their values are kept as raw bytes while walking.
_TEXT = {
    0x00080008: "ImageType",
    0x00080016: "SOPClassUID",
    0x00080018: "SOPInstanceUID",
    0x00080060: "Modality",
    0x00180050: "SliceThickness",
    0x00181120: "GantryDetectorTilt",
    0x0020000D: "StudyInstanceUID",
    0x0020000E: "SeriesInstanceUID",
    0x00200032: "ImagePositionPatient",
    0x00200037: "ImageOrientationPatient",
    0x00200052: "FrameOfReferenceUID",
    0x00280004: "PhotometricInterpretation",
    0x00280008: "NumberOfFrames",
    0x00280030: "PixelSpacing",
    0x00281052: "RescaleIntercept",
    0x00281053: "RescaleSlope",
}
_US = {
    0x00280002: "SamplesPerPixel",
    0x00280010: "Rows",
    0x00280011: "Columns",
    0x00280100: "BitsAllocated",
    0x00280101: "BitsStored",
    0x00280103: "PixelRepresentation",
}


@dataclass(frozen=True)
class PlainSlice:
    """One plain CT image: the attributes a volume needs, and its stored pixels (rows, cols)."""

    values: dict[str, Any]
    pixels: NDArray[Any]

    def get(self, keyword: str, default: Any = None) -> Any:
        """The value of ``keyword`` as pydicom would give it (str, int, or a list of them)."""
        return self.values.get(keyword, default)


def series_uid(path: Path) -> str | None:
    """The file's SeriesInstanceUID from its first bytes, or None where pydicom must read it."""
    with path.open("rb") as f:
        head = f.read(codec.FILE_HEAD_BYTES)
    raw = _walk(head, stop_at=_SERIES_INSTANCE_UID)
    text = None if raw is None else codec.ascii_text(raw.get(_SERIES_INSTANCE_UID, b""))
    return text or None


def read_plain(path: Path) -> PlainSlice | None:
    """The file as a PlainSlice, or None where it is not the plain case (see the module)."""
    data = path.read_bytes()
    raw = _walk(data, stop_at=PIXEL_DATA)
    if raw is None or PIXEL_DATA not in raw:
        return None
    values = _values(raw)
    if values is None or not _plain(values):
        return None
    pixels = _pixels(raw[PIXEL_DATA], values)
    return None if pixels is None else PlainSlice(values, pixels)


Raw = dict[int, bytes | memoryview]
# The elements a volume needs: their values are kept as raw bytes while walking.
_WANTED = frozenset(_TEXT) | frozenset(_US)


def _walk(data: bytes, stop_at: int) -> Raw | None:
    """Raw values of the wanted elements up to `stop_at` (kept), or None for the unusual.

    Pixel Data is kept as a memoryview: the pixels are then viewed, not copied.
    """
    start = _dataset_start(data)
    if start is None:
        return None
    offset, syntax = start
    explicit = syntax == _EXPLICIT
    try:
        walked = codec.walk(data, offset, len(data), explicit=explicit, kept=_WANTED, stop=stop_at)
        if walked is None:
            return None  # a sequence to walk item by item, or truncated
        raw: Raw = {tag: value for tag, (_, _, value) in walked.elements.items()}
        if walked.stop < 0:
            return raw if stop_at != PIXEL_DATA else None
        found = codec.element_at(data, walked.stop, len(data), explicit=explicit)
    except codec.UnknownVR:
        return None  # pydicom reads it (as implicit VR) or says what is wrong
    if found is None:
        return None
    tag, _, at, length = found
    if length == UNDEFINED_LENGTH or at + length > len(data):
        return None  # encapsulated pixels, or truncated
    if tag == stop_at:
        raw[tag] = memoryview(data)[at : at + length]
    return raw


def _dataset_start(data: bytes) -> tuple[int, str] | None:
    """Where the data set starts after the file meta group, and its transfer syntax."""
    if data[128:132] != b"DICM":
        return None
    try:
        walked = codec.walk(
            data,
            codec.PREAMBLE_BYTES,
            len(data),
            explicit=True,
            kept=(codec.TRANSFER_SYNTAX_UID,),
            stop=codec.FILE_META_END,
        )
    except codec.UnknownVR:
        return None
    if walked is None or walked.stop < 0:
        return None
    syntax_element = walked.elements.get(codec.TRANSFER_SYNTAX_UID)
    if syntax_element is None:
        return None
    syntax = codec.ascii_text(syntax_element[2]) or ""
    return (walked.stop, syntax) if syntax in (_EXPLICIT, _IMPLICIT) else None


def _values(raw: Raw) -> dict[str, Any] | None:
    """Decoded values by keyword; None if any is not ASCII or a US is not two bytes."""
    values: dict[str, Any] = {}
    for tag, keyword in _TEXT.items():
        if tag in raw:
            text = codec.ascii_text(raw[tag])
            if text is None:
                return None
            if text:
                values[keyword] = text.split("\\") if "\\" in text else text
    for tag, keyword in _US.items():
        if tag in raw:
            value = codec.number(raw[tag], "US")
            if value is None:
                return None
            values[keyword] = value
    return values


def _plain(values: dict[str, Any]) -> bool:
    """Single-frame MONOCHROME2 CT, not a localizer, with every attribute a volume needs."""
    image_type = values.get("ImageType", [])
    image_type = image_type if isinstance(image_type, list) else [image_type]
    required = ("SOPInstanceUID", "StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID")
    return (
        values.get("Modality") == "CT"
        and values.get("SOPClassUID") == CT_IMAGE_STORAGE
        and "LOCALIZER" not in [str(v).upper() for v in image_type]
        and values.get("SamplesPerPixel", 1) == 1
        and values.get("PhotometricInterpretation", "MONOCHROME2") == "MONOCHROME2"
        and values.get("NumberOfFrames", "1") == "1"
        and values.get("BitsAllocated") in (8, 16, 32)
        and all(k in values for k in (*required, "Rows", "Columns", "BitsStored"))
        and "PixelRepresentation" in values
    )


def _pixels(data: bytes | memoryview, values: dict[str, Any]) -> NDArray[Any] | None:
    """Stored values (rows, cols) viewed in place, unused high bits cleared; None if short."""
    rows, cols, bits = values["Rows"], values["Columns"], values["BitsAllocated"]
    signed = values["PixelRepresentation"] == 1
    dtype = np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
    if len(data) < rows * cols * dtype.itemsize or rows * cols == 0:
        return None  # pydicom's path says what is wrong
    raw = np.frombuffer(data, dtype=dtype, count=rows * cols)
    stored = values["BitsStored"]
    if stored < bits:  # the bits above BitsStored may hold overlays; the standard ignores them
        raw = raw & ((1 << stored) - 1) if not signed else (raw << bits - stored) >> bits - stored
    return raw.reshape(rows, cols)
