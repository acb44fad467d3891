"""Takes DICOM elements and items; gives them encoded (Explicit VR Little Endian), to join.

A SEG or SR of a 300-slice study repeats one small structure hundreds of times (a frame's
functional groups, a reference to a source image) where only a UID or a position changes.
pydicom writes each repetition as a tree of Datasets, element by element. Here each distinct
piece is encoded once, by pydicom's own element writer, and items and sequences are joined
from pieces, with their lengths, as PS3.5 7.5 lays them out and as pydicom lays them out
(defined lengths, no delimiters). The result goes into the dataset as one raw element, which
pydicom writes as it is (:func:`mark_encoded`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_data_element
from pydicom.tag import Tag

_ITEM_TAG = b"\xfe\xff\x00\xe0"  # (FFFE,E000)


def element(elem: DataElement, encodings: str | list[str] | None = None) -> bytes:
    """One element (any VR, sequences included) as pydicom writes it."""
    buffer = DicomBytesIO()
    buffer.is_little_endian, buffer.is_implicit_VR = True, False
    write_data_element(buffer, elem, encodings)
    return buffer.getvalue()


def uid(tag: int, value: str) -> bytes:
    """A UI element, laid out as pydicom lays it out (value padded with NUL to even length).

    Hundreds are needed per object (two per source image) and pydicom's writer takes 30 µs
    for each; the layout is fixed (PS3.5 7.1.2, 9.1), and the tests compare it with pydicom's.
    """
    data = value.encode("ascii")
    if len(data) % 2:
        data += b"\0"
    return struct.pack("<HH2sH", tag >> 16, tag & 0xFFFF, b"UI", len(data)) + data


def item(*pieces: bytes) -> bytes:
    """A sequence item made of encoded elements, given in tag order."""
    return b"".join((_ITEM_TAG, struct.pack("<I", sum(map(len, pieces))), *pieces))


def sequence(tag: int, items: Iterable[bytes]) -> bytes:
    """An SQ element of encoded items."""
    value = b"".join(items)
    return b"".join((struct.pack("<HH", tag >> 16, tag & 0xFFFF), b"SQ\0\0", _length(value), value))


def raw_sequence(tag: int, items: Iterable[bytes]) -> RawDataElement:
    """An SQ element of encoded items, to put into a dataset as it is."""
    value = b"".join(items)
    return RawDataElement(Tag(tag), "SQ", len(value), value, 0, False, True)


def mark_encoded(ds: Dataset) -> None:
    """Say that ``ds`` is Explicit VR Little Endian in its own character set: pydicom then
    writes its raw elements as they are, where otherwise it would decode and re-encode them."""
    ds.set_original_encoding(False, True, ds._character_set)


def _length(value: bytes) -> bytes:
    return struct.pack("<I", len(value))
