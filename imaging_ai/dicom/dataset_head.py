"""Takes the first bytes of a C-STORE data set and gives the few attributes the receiver keeps.

pydicom's ``read_dataset`` and attribute access cost about 0.45 ms of CPU per CT image, the
largest share of a receiver's Python time. This walks the top-level elements with the byte codec
(``imaging_ai.dicom.codec``) and decodes only the ones asked for. It covers the common case
(little endian, sequences of defined length, a default, Latin-1 or UTF-8 character set, single
values) and answers None for anything else, for which the caller reads the data set with
pydicom. Results equal pydicom's (``tests/dicom/test_dataset_head.py`` compares them). Bytes that
pydicom would read otherwise than this, or not at all, are refused (``InvalidDataset``): VR
bytes that are no VR, and first bytes that contradict the transfer syntax (``check_start``).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from pydicom import Dataset
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.uid import UID, ExplicitVRLittleEndian, ImplicitVRLittleEndian

from imaging_ai.dicom import codec
from imaging_ai.dicom.codec import PIXEL_DATA, UNDEFINED_LENGTH, UnknownVR
from imaging_ai.errors import InvalidDataset

_NO_PIXEL_DATA = -1  # `_walk` met no Pixel Data
_REQUEST_ATTRIBUTES_SEQUENCE = 0x00400275
# A data set that starts with these is a Part-10 file: a 128-byte preamble and 'DICM'.
START_BYTES = codec.PREAMBLE_BYTES
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
        self._kept = frozenset(self._tags) | {
            codec.SPECIFIC_CHARACTER_SET,
            _REQUEST_ATTRIBUTES_SEQUENCE,
        }

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
        self, raw: dict[int, codec.Element], explicit: bool, value_tell: int, length: int
    ) -> HeadValues | None:
        charset = raw.pop(codec.SPECIFIC_CHARACTER_SET, None)
        encoding = codec.charset_encoding(None if charset is None else charset[2])
        if encoding is None:
            return None
        values = self._decode_all(raw, encoding)
        sequence = raw.pop(_REQUEST_ATTRIBUTES_SEQUENCE, None)
        if values is None:
            return None
        if sequence is not None:
            items = self._items(sequence[2], explicit, encoding)
            if items is None:
                return None
            values["RequestAttributesSequence"] = items
        head = HeadValues(values, PixelFacts(value_tell, length, 0))
        head.pixel = PixelFacts(value_tell, length, needed_bytes(head))
        return head

    def _decode_all(self, raw: dict[int, codec.Element], encoding: str) -> dict[str, Any] | None:
        values: dict[str, Any] = {}
        for tag, (_, _, data) in raw.items():
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
            found = codec.element_at(data, offset, len(data), explicit=False)  # item tags: no VR
            if found is None:
                return None
            tag, _, start, length = found
            if tag != codec.ITEM or length == UNDEFINED_LENGTH:
                return None
            end = start + length
            try:
                walked = _walk(data, explicit, start, end, self._tags)
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
) -> tuple[dict[int, codec.Element], int, int] | None:
    """The values of the ``kept`` elements from ``start`` to ``end``, then where Pixel Data's
    value starts and its length (``_NO_PIXEL_DATA``, 0 when the range ends without it).

    None where pydicom must read the data set instead: an element of undefined length (a
    sequence to walk item by item), one cut off by ``end``, or one after Pixel Data's tag.
    Explicit VR bytes that are no VR raise ``InvalidDataset`` (``codec.UnknownVR``): pydicom
    would read that element as implicit VR or fail on its value, so the two readers would
    disagree.
    """
    walked = codec.walk(data, start, end, explicit=explicit, kept=kept, stop=PIXEL_DATA)
    if walked is None:
        return None
    if walked.stop < 0:
        return walked.elements, _NO_PIXEL_DATA, 0
    if walked.stop_tag != PIXEL_DATA:
        return None
    found = codec.element_at(data, walked.stop, end, explicit=explicit)
    if found is None:
        return None
    _, _, value_tell, length = found
    return walked.elements, value_tell, length


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
            if vr not in codec.VRS:
                raise UnknownVR(int(elem.tag), vr)


def needed_bytes(source: Any) -> int:
    """Bytes of native Pixel Data that a data set's image attributes call for."""
    frames = int(source.get("NumberOfFrames") or 1)
    bits = int(source.get("BitsAllocated") or 16)
    samples = int(source.get("SamplesPerPixel") or 1)
    pixels = int(source.get("Rows") or 0) * int(source.get("Columns") or 0)
    if bits == 1:  # a binary SEG's frames are packed 8 pixels a byte, one after the other
        return (pixels * frames * samples + 7) // 8
    return pixels * frames * samples * ((bits + 7) // 8)


_UNREADABLE = object()
# Text decoded here as pydicom gives it (a str); DS (pydicom's DSfloat) is left to pydicom.
_TEXT_VRS = codec.TEXT_VRS - {"DS", "IS"}


def _decode(data: bytes, vr: str, encoding: str) -> Any:
    """One element's value as pydicom gives it (str, int), None when empty, else _UNREADABLE."""
    if vr == "US":
        if len(data) == 0:
            return None
        value = codec.number(data, "US")
        return _UNREADABLE if value is None else value
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
