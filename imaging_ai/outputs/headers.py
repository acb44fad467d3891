"""Takes the paths of source images; gives their headers as pydicom datasets (no pixel data).

The SEG and SR reference every source image, so the result writer reads every header again
after the volume was loaded: 300 with ``pydicom.dcmread`` take about 0.12 s on a quiet
machine, most of it in pydicom's element-by-element reader. For the plain case (a file with
a preamble, Explicit VR Little Endian, every element before Pixel Data of defined length and
of a VR pydicom keeps as read) this reads the file's first bytes and cuts them into the same
raw elements pydicom's reader makes, with ``struct``; pydicom decodes each value when it is
first used, as it does after ``dcmread``. Anything else is read by ``dcmread``.
``tests/outputs/test_headers.py`` compares both readers' datasets.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pydicom
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset, FileDataset, FileMetaDataset
from pydicom.tag import BaseTag
from pydicom.uid import ExplicitVRLittleEndian

from imaging_ai.errors import InvalidDataset

HEAD_BYTES = 16384  # a CT header is 1-4 KB; a longer one is read by pydicom
_PIXEL_TAGS = frozenset({0x7FE00008, 0x7FE00009, 0x7FE00010})  # where dcmread stops
_SPECIFIC_CHARACTER_SET = 0x00080005
_SHORT = struct.Struct("<HH2sH")
_LONG = struct.Struct("<L")
# Explicit VR: these have two reserved bytes and a 4-byte length (PS3.5 7.1.2).
_LONG_VRS = frozenset(
    {b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UR", b"UT", b"UV"}
)
_SHORT_VRS = frozenset(
    {b"AE", b"AS", b"AT", b"CS", b"DA", b"DS", b"DT", b"FD", b"FL", b"IS", b"LO", b"LT"}
    | {b"PN", b"SH", b"SL", b"SS", b"ST", b"TM", b"UI", b"UL", b"US"}
)
# UN (its VR may be replaced by the dictionary's) and anything unknown go to pydicom.
_VR_NAMES = {vr: vr.decode() for vr in _LONG_VRS | _SHORT_VRS}


def read_headers(paths: list[Path]) -> list[Dataset]:
    """Headers of the source files, each as ``dcmread(path, stop_before_pixels=True)`` gives.

    Raises
    ------
    InvalidDataset
        A file is not a readable DICOM file.
    """
    return [read_plain(path) or _dcmread(path) for path in paths]


def read_plain(path: Path) -> FileDataset | None:
    """The header of a plain file, or None where it is not plain (the caller uses pydicom)."""
    try:
        with open(path, "rb") as f:
            data = f.read(HEAD_BYTES)
    except OSError:
        return None  # pydicom then says what is wrong
    if data[128:132] != b"DICM":
        return None
    meta = _elements(data, 132, meta_only=True)
    if meta is None:
        return None
    elements, end = meta
    syntax = elements.get(BaseTag(0x00020010))  # TransferSyntaxUID
    if syntax is None or (syntax.value or b"").rstrip(b"\0 ") != ExplicitVRLittleEndian.encode():
        return None
    body = _elements(data, end, meta_only=False)
    if body is None:
        return None
    return _dataset(path, data[:128], FileMetaDataset(dict(elements)), body[0])


def _elements(
    data: bytes, offset: int, *, meta_only: bool
) -> tuple[dict[BaseTag, RawDataElement], int] | None:
    """Raw elements from ``offset``: the file meta group, or the data set up to Pixel Data.
    None where an element is not plain or the header runs past the bytes read."""
    found: dict[BaseTag, RawDataElement] = {}
    while offset + 8 <= len(data):
        group, element, vr, short = _SHORT.unpack_from(data, offset)
        tag = group << 16 | element
        if meta_only and group != 0x0002:
            return found, offset
        if tag in _PIXEL_TAGS:
            return found, offset
        name = _VR_NAMES.get(vr)
        if name is None:
            return None
        if vr in _LONG_VRS:
            if offset + 12 > len(data):
                return None
            (length,) = _LONG.unpack_from(data, offset + 8)
            start = offset + 12
        else:
            length, start = short, offset + 8
        if length == 0xFFFFFFFF or start + length > len(data):
            return None
        key = BaseTag(tag)  # what pydicom's Tag() gives for an int, without its checks
        found[key] = RawDataElement(
            key, name, length, data[start : start + length], start, False, True
        )
        offset = start + length
    return None  # no Pixel Data within the bytes read


def _dataset(
    path: Path, preamble: bytes, meta: FileMetaDataset, elements: dict[BaseTag, RawDataElement]
) -> FileDataset:
    """The data set as ``dcmread`` leaves it: character set decoded, the rest raw."""
    charset = elements.get(BaseTag(_SPECIFIC_CHARACTER_SET))
    held: dict[BaseTag, RawDataElement | DataElement] = dict(elements)
    encoding: str | list[str] = "iso8859"
    if charset is not None:
        decoded = pydicom.dataelem.convert_raw_data_element(charset)
        held[decoded.tag] = decoded
        encoding = pydicom.charset.convert_encodings(decoded.value)
    ds = FileDataset(str(path), Dataset(held), preamble, meta, False, True)
    ds.set_original_encoding(False, True, encoding)
    return ds


def _dcmread(path: Path) -> FileDataset:
    try:
        return pydicom.dcmread(path, stop_before_pixels=True)
    except (pydicom.errors.InvalidDicomError, OSError) as exc:
        raise InvalidDataset(f"file {path.name} is not a readable DICOM file ({exc})") from exc
