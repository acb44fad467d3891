"""Takes DICOM bytes in little endian, implicit or explicit VR, and gives their elements; gives
the bytes of an element back. The daemon's one DICOM byte codec: one table of VRs, one set of
length limits, one element walker.

Four readers use it instead of pydicom where pydicom's element-by-element reading was the
measured cost: the DIMSE command set (``dul.decode_command``, ~80 µs through pydicom), the
receiver's header reader (``dicom_head``, ~0.45 ms), the volume loader's plain-slice reader
(``slice_read``) and the result writer's header reader (``outputs.headers``). The walk covers
the common case only and steps aside (None) for the rest (an element of undefined length, one
cut off by the end of the bytes), after which the caller reads with pydicom. VR bytes that are
no VR raise :class:`UnknownVR`: pydicom would read such an element as implicit VR or fail on
it. ``tests/dicom/test_codec.py`` checks with hypothesis, on valid and on damaged bytes, that
every element the walk gives is the one pydicom reads (tag, VR, value, where the value starts).
"""

from __future__ import annotations

import struct
from collections.abc import Container
from typing import NamedTuple

from pydicom.valuerep import VR

from imaging_ai.errors import InvalidDataset

PIXEL_DATA = 0x7FE00010
# dcmread(stop_before_pixels=True) stops at any of these: Float, Double Float and Pixel Data.
PIXEL_TAGS = frozenset({0x7FE00008, 0x7FE00009, 0x7FE00010})
SPECIFIC_CHARACTER_SET = 0x00080005
TRANSFER_SYNTAX_UID = 0x00020010
ITEM = 0xFFFEE000
# Ends an item's data set; pydicom ends any data set there, whatever its length, and reads no
# further (`filereader.data_element_generator`).
ITEM_DELIMITATION = 0xFFFEE00D
UNDEFINED_LENGTH = 0xFFFFFFFF
FILE_META_END = 0x00030000  # the File Meta Information is group 0002 (PS3.10 7.1)

# The VRs of PS3.5, from pydicom's table so that both readers know the same ones.
VRS = frozenset(vr.value.encode() for vr in VR if len(vr.value) == 2)
# Explicit VR little endian: these have two reserved bytes and a 4-byte length (PS3.5 7.1.2).
LONG_VRS = frozenset(
    {b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"}
)
# Bytes of an explicit VR element's tag, VR and length, by its VR bytes.
HEADER_LENGTH = {vr: 12 if vr in LONG_VRS else 8 for vr in VRS}
# The VRs whose values are character strings (PS3.5 6.2).
TEXT_VRS = frozenset(
    {"AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM", "UC", "UI"}
    | {"UR", "UT"}
)
NUMBER_FORMATS = {"US": struct.Struct("<H"), "UL": struct.Struct("<L")}
# Python codecs of the character sets the fast readers decode; others go to pydicom.
_CHARSETS = {"": "iso8859", "ISO_IR 6": "iso8859", "ISO_IR 100": "latin_1", "ISO_IR 192": "UTF8"}

# Limits. A Part-10 file starts with a 128-byte preamble and "DICM".
PREAMBLE_BYTES = 132
# A file's header is read from this many first bytes (a CT header is 1-4 KB); a longer one
# goes to pydicom.
FILE_HEAD_BYTES = 16384
# The receiver decodes a C-STORE data set's attributes from this many first bytes.
DATASET_HEAD_BYTES = 65536
# A DIMSE command set is a few hundred bytes; a longer one is refused (issue 18, item 1).
MAX_COMMAND_LENGTH = 65536

_EXPLICIT = struct.Struct("<HH2sH")  # tag, VR, 2-byte length
_IMPLICIT = struct.Struct("<HHL")  # tag, 4-byte length
_LONG_LENGTH = struct.Struct("<L")

# (VR bytes or None for implicit VR, where the value starts, the value's bytes)
Element = tuple[bytes | None, int, bytes]


class UnknownVR(InvalidDataset):
    """Explicit VR bytes that are no VR of PS3.5."""

    def __init__(self, tag: int, vr: bytes | None) -> None:
        shown = "that are not letters" if vr is None else repr(vr)
        super().__init__(
            f"element ({tag >> 16:04X},{tag & 0xFFFF:04X}) has VR bytes {shown}, not a VR"
        )
        self.tag = tag


class Walk(NamedTuple):
    """What :func:`walk` found: the kept elements, and where it stopped.

    A NamedTuple: a frozen dataclass's construction cost a microsecond a header.
    """

    elements: dict[int, Element]  # by tag
    stop: int  # where the header of the first element at or past ``stop`` starts; -1 if none
    stop_tag: int = -1  # that element's tag


def walk(
    data: bytes,
    start: int,
    end: int,
    *,
    explicit: bool,
    kept: Container[int] | None,
    stop: int,
) -> Walk | None:
    """The elements from ``start`` to ``end`` before the first whose tag is ``stop`` or more.

    Parameters
    ----------
    data
        The bytes; elements are little endian.
    start, end
        The range to walk: a data set, an item's or the file meta group's bytes.
    explicit
        Explicit VR (else implicit VR).
    kept
        The tags whose elements to give (None for all).
    stop
        The walk ends at the first element whose tag is this or greater (not given), e.g.
        ``PIXEL_DATA`` or ``FILE_META_END``.

    Returns
    -------
    Walk or None
        None where pydicom must read the bytes: an element of undefined length before ``stop``
        (a sequence to walk item by item), one cut off by ``end``, or an item delimitation
        where the stop would be (pydicom ends the data set there: no element at or past
        ``stop`` follows, though the walk would say one does).

    Raises
    ------
    UnknownVR
        Explicit VR bytes that are no VR (checked once the tag is known to be before ``stop``,
        so that an implicit VR data set after the explicit file meta group stops the walk).
    """
    # One loop, no generator: a CT header has ~90 elements before Pixel Data, and a generator's
    # step per element was half of the header's reading time.
    elements: dict[int, Element] = {}
    header_length = HEADER_LENGTH
    unpack_explicit, unpack_implicit = _EXPLICIT.unpack_from, _IMPLICIT.unpack_from
    unpack_long = _LONG_LENGTH.unpack_from
    offset = start
    while offset < end:
        if offset + 8 > end:
            return None
        if explicit:
            group, number, vr, length = unpack_explicit(data, offset)
            tag = group << 16 | number
            if tag >= stop:
                return None if tag == ITEM_DELIMITATION else Walk(elements, offset, tag)
            try:
                header = header_length[vr]  # subscript, not .get(): ~0.1 µs an element
            except KeyError:
                raise UnknownVR(tag, vr) from None
            if header == 12:
                if offset + 12 > end:
                    return None
                (length,) = unpack_long(data, offset + 8)
            value = offset + header
        else:
            group, number, length = unpack_implicit(data, offset)
            tag = group << 16 | number
            if tag >= stop:
                return None if tag == ITEM_DELIMITATION else Walk(elements, offset, tag)
            vr, value = None, offset + 8
        if length == UNDEFINED_LENGTH or value + length > end:
            return None
        if kept is None or tag in kept:
            elements[tag] = (vr, value, data[value : value + length])
        offset = value + length
    return Walk(elements, -1)


def element_at(
    data: bytes | bytearray | memoryview, offset: int, end: int, *, explicit: bool
) -> tuple[int, bytes | None, int, int] | None:
    """The tag, VR, value start and value length of the element whose header starts at
    ``offset``; None if the header is cut off by ``end``. The length may be
    ``UNDEFINED_LENGTH``; the value is not read (it may be Pixel Data, still arriving).

    Raises
    ------
    UnknownVR
        Explicit VR bytes that are no VR.
    """
    if offset + 8 > end:
        return None
    if not explicit:
        group, number, length = _IMPLICIT.unpack_from(data, offset)
        return group << 16 | number, None, offset + 8, length
    group, number, vr, length = _EXPLICIT.unpack_from(data, offset)
    header = HEADER_LENGTH.get(vr)
    if header is None:
        raise UnknownVR(group << 16 | number, vr)
    if header == 12:
        if offset + 12 > end:
            return None
        (length,) = _LONG_LENGTH.unpack_from(data, offset + 8)
    return group << 16 | number, vr, offset + header, length


def ascii_text(value: bytes | bytearray | memoryview) -> str | None:
    """ASCII text with its padding (spaces, NUL) stripped at both ends; None if not ASCII."""
    try:
        return bytes(value).decode("ascii").strip(" \0")
    except UnicodeDecodeError:
        return None


def number(value: bytes | bytearray | memoryview, vr: str) -> int | None:
    """A single US or UL value; None if the value is not exactly one number's bytes."""
    form = NUMBER_FORMATS[vr]
    if len(value) != form.size:
        return None
    return int(form.unpack(value)[0])


def charset_encoding(value: bytes | None) -> str | None:
    """The Python codec of a Specific Character Set value (None: absent, the default); None
    where the fast readers do not decode it (several, or code extensions)."""
    name = b"" if value is None else value
    return _CHARSETS.get(name.decode("ascii", "replace").strip(" \0"))


def explicit_element(tag: int, vr: str, value: bytes) -> bytes:
    """One explicit VR little endian element (value already padded to even length)."""
    code = vr.encode("ascii")
    if code in LONG_VRS:
        head = _EXPLICIT.pack(tag >> 16, tag & 0xFFFF, code, 0) + _LONG_LENGTH.pack(len(value))
        return head + value
    return _EXPLICIT.pack(tag >> 16, tag & 0xFFFF, code, len(value)) + value


def implicit_element(tag: int, value: bytes) -> bytes:
    """One implicit VR little endian element (value already padded to even length)."""
    return _IMPLICIT.pack(tag >> 16, tag & 0xFFFF, len(value)) + value


def padded(text: str, vr: str) -> bytes:
    """A text value as ASCII, padded to even length as PS3.5 6.2 says (UI with NUL, else space)."""
    raw = text.encode("ascii", "replace")
    if len(raw) % 2:
        raw += b"\x00" if vr == "UI" else b" "
    return raw
