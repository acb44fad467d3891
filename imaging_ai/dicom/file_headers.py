"""Takes the paths of source images; gives their headers as pydicom datasets (no pixel data).

The SEG and SR reference every source image, so the result writer reads every header again after
the volume was loaded: 300 with ``pydicom.dcmread`` take about 0.12 s on a quiet machine, most
of it in pydicom's element-by-element reader. For the plain case (a file with a preamble,
Explicit VR Little Endian, every element before Pixel Data of defined length and of a VR pydicom
keeps as read) this reads the file's first bytes and cuts them into the same raw elements
pydicom's reader makes, with the byte codec (``imaging_ai.dicom.codec``); pydicom decodes each
value when it is first used, as it does after ``dcmread``. Anything else is read by ``dcmread``.
``tests/outputs/test_file_headers.py`` compares both readers' datasets.

Patient and study attributes that every result copies are checked here too
(:func:`clean_demographics`): one malformed birth date must not keep a result from an urgent
study (issue 18, item 10).
"""

from __future__ import annotations

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

from imaging_ai.dicom import codec
from imaging_ai.errors import InvalidDataset

HEAD_BYTES = codec.FILE_HEAD_BYTES
# UN (pydicom may replace it by the dictionary's VR when it decodes) goes to pydicom.
_VR_NAMES = {vr: vr.decode() for vr in codec.VRS - {b"UN"}}
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
    meta = _elements(data, codec.PREAMBLE_BYTES, stop=codec.FILE_META_END)
    if meta is None:
        return None
    elements, end = meta
    if any(tag.group != 0x0002 for tag in elements):
        return None  # pydicom ends the file meta group at the first element of another group
    syntax = elements.get(BaseTag(codec.TRANSFER_SYNTAX_UID))
    if syntax is None or (syntax.value or b"").rstrip(b"\0 ") != ExplicitVRLittleEndian.encode():
        return None
    body = _elements(data, end, stop=min(codec.PIXEL_TAGS))
    if body is None:
        return None
    return _dataset(path, data[:128], FileMetaDataset(dict(elements)), body[0])


def _elements(
    data: bytes, offset: int, *, stop: int
) -> tuple[dict[BaseTag, RawDataElement], int] | None:
    """Raw explicit VR elements from ``offset`` up to ``stop`` (the end of the file meta
    group, or Pixel Data), and where they end. None where an element is not plain, where the
    walk ends at another tag, or where the header runs past the bytes read."""
    try:
        walked = codec.walk(data, offset, len(data), explicit=True, kept=None, stop=stop)
        if walked is None or walked.stop < 0:
            return None  # no Pixel Data within the bytes read, or not plain
        found = codec.element_at(data, walked.stop, len(data), explicit=True)
    except codec.UnknownVR:
        return None
    if found is None or (stop != codec.FILE_META_END and walked.stop_tag not in codec.PIXEL_TAGS):
        return None
    raw: dict[BaseTag, RawDataElement] = {}
    for tag, (vr, start, value) in walked.elements.items():
        name = _VR_NAMES.get(vr or b"")
        if name is None:
            return None
        key = BaseTag(tag)  # what pydicom's Tag() gives for an int, without its checks
        raw[key] = RawDataElement(key, name, len(value), value, start, False, True)
    return raw, walked.stop


def _dataset(
    path: Path, preamble: bytes, meta: FileMetaDataset, elements: dict[BaseTag, RawDataElement]
) -> FileDataset:
    """The data set as ``dcmread`` leaves it: character set decoded, the rest raw."""
    charset = elements.get(BaseTag(codec.SPECIFIC_CHARACTER_SET))
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
