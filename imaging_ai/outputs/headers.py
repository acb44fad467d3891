"""Takes the paths of source images; gives their headers as pydicom datasets (no pixel data).

The SEG and SR reference every source image, so the result writer reads every header again
after the volume was loaded: 300 with ``pydicom.dcmread`` take about 0.12 s on a quiet
machine, most of it in pydicom's element-by-element reader. For the plain case (a file with
a preamble, Explicit VR Little Endian, every element before Pixel Data of defined length and
of a VR pydicom keeps as read) this reads the file's first bytes and cuts them into the same
raw elements pydicom's reader makes, with ``struct``; pydicom decodes each value when it is
first used, as it does after ``dcmread``. Anything else is read by ``dcmread``.
``tests/outputs/test_headers.py`` compares both readers' datasets.

Patient and study attributes that every result copies are checked here too
(:func:`clean_demographics`): one malformed birth date must not keep a result from an urgent
study (issue 18, item 10).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pydicom
from pydicom import config
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset, FileDataset, FileMetaDataset
from pydicom.tag import BaseTag
from pydicom.uid import ExplicitVRLittleEndian
from pydicom.valuerep import DA, TM, validate_value

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
# What SEG, SR, ORU and FHIR copy from the source that a malformed value breaks (highdicom and
# hl7apy parse dates and times; FHIR's birthDate must be a real date). All Type 2 or 3 in the
# Patient and General Study modules: present and empty is valid.
_DEMOGRAPHICS = {
    "PatientName": "PN",
    "PatientBirthDate": "DA",
    "PatientBirthTime": "TM",
    "StudyDate": "DA",
    "StudyTime": "TM",
    "ReferringPhysicianName": "PN",
}
_PARSE: dict[str, Callable[[str], Any]] = {"DA": DA, "TM": TM}
_VR_WORDS = {"DA": "date (DA)", "TM": "time (TM)", "PN": "person name (PN)"}


def read_headers(paths: list[Path]) -> list[Dataset]:
    """Headers of the source files, each as ``dcmread(path, stop_before_pixels=True)`` gives.

    Raises
    ------
    InvalidDataset
        A file is not a readable DICOM file.
    """
    return [read_plain(path) or _dcmread(path) for path in paths]


def clean_demographics(datasets: Iterable[Dataset]) -> tuple[str, ...]:
    """Empty the patient and study attributes whose values are not valid DICOM, in place.

    A date, time or person name that breaks the standard's form (PatientBirthDate
    ``19AB0304``, StudyTime ``25xx``, a name component over 64 characters) would fail the
    SEG, SR and ORU encoders on every attempt; emptied, those Type 2 attributes are valid and
    the results go out. The values are never read into a message: they may identify the
    patient.

    Parameters
    ----------
    datasets
        Source headers, as :func:`read_headers` gives them.

    Returns
    -------
    tuple of str
        One note per attribute emptied (in any of the headers), naming it and its VR only.
    """
    emptied: dict[str, None] = {}
    for ds in datasets:
        for keyword, vr in _DEMOGRAPHICS.items():
            if keyword in ds and not _valid(ds, keyword, vr):
                setattr(ds, keyword, "")
                emptied[keyword] = None
    return tuple(
        f"{keyword} in the source images is not a valid DICOM {_VR_WORDS[_DEMOGRAPHICS[keyword]]};"
        " the results carry it empty"
        for keyword in emptied
    )


def _valid(ds: Dataset, keyword: str, vr: str) -> bool:
    """Whether the value has the VR's form and (dates, times) is a real date or time."""
    try:
        value = ds[keyword].value  # converted without pydicom's validation warning
    except (ValueError, TypeError, UnicodeError, KeyError):
        return False
    if value is None or value == "" or isinstance(value, (DA, TM)):
        return True  # empty, or parsed already (pydicom's datetime_conversion)
    text = str(value) if vr == "PN" else value
    if not isinstance(text, str):
        return False  # several values where the standard allows one
    try:
        validate_value(vr, text, config.RAISE)  # the VR's form (pydicom's rules)
        _PARSE.get(vr, str)(text)  # a date or time that exists
    except (ValueError, TypeError, OverflowError):
        return False
    return True


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
