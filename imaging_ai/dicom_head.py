"""Takes the first bytes of a C-STORE data set and gives the few attributes the receiver keeps.

pydicom's ``read_dataset`` and attribute access cost about 0.45 ms of CPU per CT image, the
largest share of a receiver's Python time. This walks the top-level elements with ``struct``
and decodes only the ones asked for. It covers the common case (little endian, sequences of defined
length, a default, Latin-1 or UTF-8 character set, single values)
and answers None for anything else, for which the caller reads the data set with pydicom.
Results equal pydicom's (``tests/test_dicom_head.py`` compares them). Bytes that pydicom would
read otherwise than this, or not at all, are refused (``InvalidDataset``): VR bytes that are no
VR, and first bytes that contradict the transfer syntax (``check_start``).
"""

from __future__ import annotations

import struct
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from pydicom import Dataset
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.uid import UID, ExplicitVRLittleEndian, ImplicitVRLittleEndian
from pydicom.valuerep import VR

from imaging_ai.errors import InvalidDataset

PIXEL_DATA = 0x7FE00010
UNDEFINED_LENGTH = 0xFFFFFFFF
_NO_PIXEL_DATA = -1  # `_walk` met no Pixel Data
_SPECIFIC_CHARACTER_SET = 0x00080005
_REQUEST_ATTRIBUTES_SEQUENCE = 0x00400275
# Explicit VR little endian: these VRs have two reserved bytes and a 4-byte length.
LONG_VRS = frozenset(
    {
        b"OB",
        b"OD",
        b"OF",
        b"OL",
        b"OV",
        b"OW",
        b"SQ",
        b"SV",
        b"UC",
        b"UN",
        b"UR",
        b"UT",
        b"UV",
    }
)
# The VRs of PS3.5 (pydicom's table, so that both readers know the same ones).
VRS = frozenset(vr.value.encode() for vr in VR if len(vr.value) == 2)
# Bytes of an explicit VR element's tag, VR and length (12 for LONG_VRS), by its VR bytes.
_HEADER_LENGTH = {vr: 12 if vr in LONG_VRS else 8 for vr in VRS}
# A data set that starts with these is a Part-10 file: a 128-byte preamble and 'DICM'.
START_BYTES = 132
_TEXT_VRS = {
    "AE",
    "AS",
    "CS",
    "DA",
    "DT",
    "LO",
    "LT",
    "PN",
    "SH",
    "ST",
    "TM",
    "UC",
    "UI",
    "UR",
    "UT",
}
_CHARSETS = {"": "iso8859", "ISO_IR 6": "iso8859", "ISO_IR 100": "latin_1", "ISO_IR 192": "UTF8"}
_TAG_LENGTH = struct.Struct("<HHL")
_ITEM = (0xFFFE, 0xE000)
_TAG_VR_LENGTH = struct.Struct("<HH2sH")
_LONG_LENGTH = struct.Struct("<L")
# The attributes of the image that say how long Pixel Data must be.
_IMAGE_KEYWORDS = ("Rows", "Columns", "NumberOfFrames", "BitsAllocated", "SamplesPerPixel")


@dataclass(frozen=True)
class PixelFacts:
    """Where Pixel Data's value starts and how long it is, and what the image needs."""

    value_tell: int | None  # from the start of the data set
    length: int | None  # None or UNDEFINED_LENGTH (encapsulated) when unknown
    needed: int  # bytes the image attributes call for


class HeadValues:
    """Decoded attribute values by keyword, read like a pydicom Dataset (``get``, attributes)."""

    def __init__(self, values: dict[str, Any], pixel: PixelFacts) -> None:
        self._values = values
        self.pixel = pixel

    def get(self, keyword: str, default: Any = None) -> Any:
        """The value of ``keyword``, or ``default`` when the data set lacks it."""
        return self._values.get(keyword, default)

    def __getattr__(self, keyword: str) -> Any:
        try:
            return self._values[keyword]
        except KeyError:
            raise AttributeError(keyword) from None


class Reader:
    """Reads the given keywords (and the image attributes) from data sets' first bytes."""

    def __init__(self, keywords: tuple[str, ...]) -> None:
        wanted = set(keywords) | set(_IMAGE_KEYWORDS)
        self._tags: dict[int, tuple[str, str]] = {}  # tag: (keyword, VR)
        for keyword in sorted(wanted):
            tag = tag_for_keyword(keyword)
            if tag is None:
                raise ValueError(f"{keyword!r} is not a DICOM keyword")
            self._tags[tag] = (keyword, dictionary_VR(tag))
        # Elements whose bytes `read` keeps: the wanted ones and those that say how to decode.
        self._kept = frozenset(self._tags) | {_SPECIFIC_CHARACTER_SET, _REQUEST_ATTRIBUTES_SEQUENCE}

    def read(self, head: bytes, syntax: str) -> HeadValues | None:
        """The attributes before Pixel Data in ``head``, or None where pydicom must read it."""
        if syntax == ExplicitVRLittleEndian:
            explicit = True
        elif syntax == ImplicitVRLittleEndian:
            explicit = False
        else:
            return None
        walked = _walk(head, explicit, 0, len(head), self._kept)
        if walked is None or walked[1] == _NO_PIXEL_DATA:
            return None  # Pixel Data is not in these bytes, or pydicom must read them
        raw, value_tell, length = walked
        return self._values(raw, explicit, value_tell, length)

    def _values(
        self, raw: dict[int, bytes], explicit: bool, value_tell: int, length: int
    ) -> HeadValues | None:
        charset = raw.pop(_SPECIFIC_CHARACTER_SET, b"").decode("ascii", "replace").strip(" \0")
        encoding = _CHARSETS.get(charset)
        if encoding is None:
            return None
        values = self._decode_all(raw, encoding)
        sequence = raw.pop(_REQUEST_ATTRIBUTES_SEQUENCE, None)
        if values is None:
            return None
        if sequence is not None:
            items = self._items(sequence, explicit, encoding)
            if items is None:
                return None
            values["RequestAttributesSequence"] = items
        head = HeadValues(values, PixelFacts(value_tell, length, 0))
        head.pixel = PixelFacts(value_tell, length, needed_bytes(head))
        return head

    def _decode_all(self, raw: dict[int, bytes], encoding: str) -> dict[str, Any] | None:
        values: dict[str, Any] = {}
        for tag, data in raw.items():
            if tag not in self._tags:
                continue
            keyword, vr = self._tags[tag]
            value = _decode(data, vr, encoding)
            if value is _UNREADABLE:
                return None
            if value is not None:
                values[keyword] = value
        return values

    def _items(self, data: bytes, explicit: bool, encoding: str) -> list[HeadValues] | None:
        """The items of a sequence of defined length, with the wanted attributes of each."""
        items: list[HeadValues] = []
        offset = 0
        while offset < len(data):
            if offset + 8 > len(data):
                return None
            group, element, length = _TAG_LENGTH.unpack_from(data, offset)
            offset += 8
            if (group, element) != _ITEM or length == UNDEFINED_LENGTH:
                return None
            end = offset + length
            try:
                walked = _walk(data, explicit, offset, end, self._tags)
            except InvalidDataset:
                return None  # pydicom reads an item that switched to implicit VR as such
            if walked is None or walked[1] != _NO_PIXEL_DATA:
                return None
            values = self._decode_all(walked[0], encoding)
            if values is None:
                return None
            items.append(HeadValues(values, PixelFacts(None, None, 0)))
            offset = end
        return items


def _walk(
    data: bytes, explicit: bool, start: int, end: int, kept: Container[int]
) -> tuple[dict[int, bytes], int, int] | None:
    """The values of the ``kept`` elements from ``start`` to ``end``, then where Pixel Data's
    value starts and its length (``_NO_PIXEL_DATA``, 0 when the range ends without it).

    None where pydicom must read the data set instead: an element of undefined length (a
    sequence to walk item by item), one cut off by ``end``, or one after Pixel Data's tag.
    Explicit VR bytes that are no VR raise ``InvalidDataset``: pydicom would read that element
    as implicit VR or fail on its value, so the two readers would disagree.
    One loop, no generator: a CT header has ~90 elements before Pixel Data, and a
    generator's step per element was half of the header's reading time.
    """
    raw: dict[int, bytes] = {}
    offset = start
    while offset < end:
        if offset + 8 > end:
            return None
        if explicit:
            group, element, vr, length = _TAG_VR_LENGTH.unpack_from(data, offset)
            try:
                header = _HEADER_LENGTH[vr]
            except KeyError:
                raise _unknown_vr(group << 16 | element, vr) from None
            if header == 12:
                if offset + 12 > end:
                    return None
                (length,) = _LONG_LENGTH.unpack_from(data, offset + 8)
            offset += header
        else:
            group, element, length = _TAG_LENGTH.unpack_from(data, offset)
            offset += 8
        tag = group << 16 | element
        if tag == PIXEL_DATA:
            return raw, offset, length
        if length == UNDEFINED_LENGTH or tag > PIXEL_DATA or offset + length > end:
            return None
        if tag in kept:
            raw[tag] = data[offset : offset + length]
        offset += length
    return raw, _NO_PIXEL_DATA, 0


def check_start(head: bytes | bytearray, syntax: str) -> None:
    """Refuse a data set whose first bytes contradict its transfer syntax.

    Parameters
    ----------
    head : bytes
        The data set's first bytes (``START_BYTES`` of them, or all there are).
    syntax : str
        The transfer syntax of the presentation context it came on.

    Raises
    ------
    InvalidDataset
        It starts with a Part-10 preamble and 'DICM', or its first element is explicit VR on
        an implicit VR transfer syntax, or the reverse. Explicit or implicit is decided by
        pydicom's rule: bytes 4 and 5 are both capital letters in an explicit VR element.
    """
    uid = UID(syntax)
    if not uid.is_transfer_syntax or uid.is_deflated or len(head) < 6:
        return  # deflated bytes say nothing until inflated
    if head[128:132] == b"DICM":
        raise InvalidDataset("data set starts with a preamble and 'DICM' (a Part-10 file)")
    explicit = 0x40 < head[4] < 0x5B and 0x40 < head[5] < 0x5B
    if explicit and uid.is_implicit_VR:
        raise InvalidDataset("data set is explicit VR but the transfer syntax is implicit VR")
    if not explicit and not uid.is_implicit_VR:
        raise InvalidDataset("data set is implicit VR but the transfer syntax is explicit VR")


def check_vrs(ds: Dataset) -> None:
    """Refuse a data set read by pydicom whose top-level explicit VR bytes are no VR.

    The same refusal as the fast reader's, for the data sets pydicom reads instead.
    Elements already decoded are not looked at (pydicom decoded them with a VR it knows).

    Raises
    ------
    InvalidDataset
        Naming the first element whose VR is unknown.
    """
    # Not `for elem in ds` (it decodes every element) nor ds.elements() (it reads deferred ones).
    for tag in list(ds.keys()):
        elem = ds.get_item(tag, keep_deferred=True)
        if isinstance(elem, RawDataElement) and not elem.is_implicit_VR:
            # None: pydicom took bytes that are not letters for a switch to implicit VR.
            vr = None if elem.VR is None else elem.VR.encode("latin_1")
            if vr not in VRS:
                raise _unknown_vr(int(elem.tag), vr)


def _unknown_vr(tag: int, vr: bytes | None) -> InvalidDataset:
    """The refusal of an element whose VR bytes are no VR (None: not even letters)."""
    shown = "that are not letters" if vr is None else repr(vr)
    return InvalidDataset(
        f"element ({tag >> 16:04X},{tag & 0xFFFF:04X}) has VR bytes {shown}, not a VR"
    )


def needed_bytes(source: Any) -> int:
    """Bytes of native Pixel Data that a data set's image attributes call for."""
    frames = int(source.get("NumberOfFrames") or 1)
    bytes_per_sample = (int(source.get("BitsAllocated") or 16) + 7) // 8
    samples = int(source.get("SamplesPerPixel") or 1)
    pixels = int(source.get("Rows") or 0) * int(source.get("Columns") or 0)
    return pixels * frames * samples * bytes_per_sample


_UNREADABLE = object()


def _decode(data: bytes, vr: str, encoding: str) -> Any:
    """One element's value as pydicom gives it (str, int), None when empty, else _UNREADABLE."""
    if vr == "US":
        if len(data) == 0:
            return None
        return struct.unpack("<H", data)[0] if len(data) == 2 else _UNREADABLE
    if vr == "IS":
        text = data.decode("ascii", "replace").strip(" \0")
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            return _UNREADABLE
    if vr not in _TEXT_VRS or b"\\" in data:
        return _UNREADABLE  # a binary or multi-valued value: pydicom's reading applies
    if vr == "UI":
        text = data.decode("ascii", "replace").rstrip("\0 ")
    else:
        try:
            text = data.decode(encoding).rstrip("\0 ")
        except UnicodeDecodeError:
            return _UNREADABLE
    return text or None
