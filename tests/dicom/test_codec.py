"""The byte codec reads what pydicom reads, or steps aside: a tested fact (issue 18, item 6).

pydicom is the reference: every data set here is encoded by pydicom's writer and read back by
pydicom's own element reader (``data_element_generator``), which ``dcmread`` uses. On valid
bytes the walk must give every element pydicom gives (tag, VR, value, where the value starts);
on damaged bytes (cut, overwritten, spliced) it may only step aside (None) or refuse
(``UnknownVR``) where pydicom's reading is itself unusual at that point, and otherwise must
again give exactly pydicom's elements.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydicom import Dataset, config
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.filebase import DicomBytesIO
from pydicom.filereader import data_element_generator, read_dataset
from pydicom.filewriter import write_dataset
from pydicom.sequence import Sequence

from imaging_ai.dicom import codec, dataset_head, dimse, dul, file_headers, slice_read

# One dictionary tag of each VR (VM 1), so that implicit VR reading knows the VR as well.
TAG_OF_VR = {
    "AE": 0x00080055,
    "AS": 0x00101010,
    "AT": 0x00140202,
    "CS": 0x00041130,
    "DA": 0x00080012,
    "DS": 0x00101020,
    "DT": 0x00080015,
    "FD": 0x00082134,
    "FL": 0x00089459,
    "IS": 0x00082122,
    "LO": 0x00080041,
    "LT": 0x00080108,
    "OB": 0x00080202,
    "OD": 0x003A032E,
    "OF": 0x00181638,
    "OL": 0x00660040,
    "OV": 0x00720081,
    "OW": 0x00281201,
    "PN": 0x00080090,
    "SH": 0x00080010,
    "SL": 0x00186020,
    "SS": 0x00189219,
    "ST": 0x00080081,
    "TM": 0x00080013,
    "UC": 0x00080119,
    "UI": 0x00041432,
    "UL": 0x00041200,
    "UN": 0x0072006D,
    "UR": 0x0008010E,
    "US": 0x00041212,
    "UT": 0x0008030E,
    "UV": 0x0008040C,
}
SEQUENCE_TAG = 0x00041220
_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="\\"), max_size=40
)
_WORDS = {"<H": (0, 0xFFFF), "<h": (-0x8000, 0x7FFF), "<L": (0, 0xFFFFFFFF)}


def _value(vr: str) -> st.SearchStrategy[Any]:
    """Values of a VR that pydicom's writer encodes (validation is off while writing)."""
    if vr in ("US", "SS", "UL", "SL", "UV", "AT"):
        low, high = {
            "US": (0, 0xFFFF),
            "SS": (-0x8000, 0x7FFF),
            "UL": (0, 0xFFFFFFFF),
            "SL": (-(2**31), 2**31 - 1),
            "UV": (0, 2**64 - 1),
            "AT": (0, 0xFFFFFFFF),
        }[vr]
        return st.integers(low, high)
    if vr in ("FL", "FD"):
        return st.floats(allow_nan=False, width=32 if vr == "FL" else 64)
    if vr in ("OB", "UN"):
        return st.binary(max_size=300)
    if vr in ("OW", "OF", "OL", "OD", "OV"):
        size = {"OW": 2, "OF": 4, "OL": 4, "OD": 8, "OV": 8}[vr]
        return st.binary(max_size=40).map(lambda b: b[: len(b) // size * size])
    if vr == "DS":
        return st.from_regex(r"\A-?[0-9]{1,6}(\.[0-9]{1,4})?\Z")
    if vr == "IS":
        return st.integers(-(2**31), 2**31 - 1).map(str)
    if vr == "UI":
        return st.from_regex(r"\A[0-9]{1,8}(\.[0-9]{1,8}){0,6}\Z")
    return _TEXT


_ELEMENT = st.sampled_from(sorted(TAG_OF_VR)).flatmap(
    lambda vr: _value(vr).map(lambda value: (TAG_OF_VR[vr], vr, value))
)


@st.composite
def datasets(draw: st.DrawFn, sequences: bool = False) -> Dataset:
    elements = draw(st.lists(_ELEMENT, max_size=25))
    inner = draw(st.lists(_ELEMENT, max_size=3)) if sequences and draw(st.booleans()) else None
    ds = Dataset()
    with _unvalidated():
        for tag, vr, value in elements:
            ds[tag] = DataElement(tag, vr, value)
        if inner is not None:
            item = Dataset()
            for tag, vr, value in inner:
                item[tag] = DataElement(tag, vr, value)
            ds[SEQUENCE_TAG] = DataElement(SEQUENCE_TAG, "SQ", Sequence([item]))
    return ds


@contextmanager
def _unvalidated() -> Iterator[None]:
    before = config.settings.writing_validation_mode
    config.settings.writing_validation_mode = config.IGNORE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        config.settings.writing_validation_mode = before


def encode(ds: Dataset, explicit: bool) -> bytes:
    with _unvalidated():
        fp = DicomBytesIO()
        fp.is_little_endian, fp.is_implicit_VR = True, not explicit
        write_dataset(fp, ds)
        return fp.getvalue()


class Reading:
    """pydicom's raw reading of bytes up to the first tag at or past ``stop``."""

    def __init__(self, data: bytes, explicit: bool, stop: int) -> None:
        self.elements: dict[int, tuple[bytes | None, int, bytes]] = {}
        self.unusual: set[str] = set()
        self.vrs: dict[int, str | None] = {}
        self.stopped = False
        self.end = 0  # where the last element read ends
        fp = DicomBytesIO(data)
        fp.is_little_endian, fp.is_implicit_VR = True, not explicit

        def stop_when(tag: int, vr: str | None, length: int) -> bool:
            self.stopped = tag >= stop
            return self.stopped

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for elem in data_element_generator(fp, not explicit, True, stop_when=stop_when):
                    self._take(elem, explicit)
        except Exception as exc:  # pydicom failing is itself "unusual"
            self.unusual.add(f"raised {type(exc).__name__}")
        self.position = fp.tell()
        if not self.stopped and not self.unusual and self.end < len(data):
            self.unusual.add("header cut")  # pydicom ends silently on fewer than 8 bytes

    def _take(self, elem: Any, explicit: bool) -> None:
        tag = int(elem.tag)
        self.vrs[tag] = elem.VR
        if not isinstance(elem, RawDataElement) or elem.length == codec.UNDEFINED_LENGTH:
            self.unusual.add("undefined length")  # pydicom parsed it (a sequence) or skipped it
            return
        value = elem.value if isinstance(elem.value, bytes) else b""
        if len(value) < elem.length:
            self.unusual.add("value cut")
        vr = elem.VR.encode() if explicit and elem.VR is not None else None
        if explicit and (vr is None or vr not in codec.VRS):
            self.unusual.add("not a VR")
        self.elements[tag] = (vr, elem.value_tell, value)
        self.end = elem.value_tell + elem.length


def _walked(data: bytes, explicit: bool, stop: int) -> codec.Walk | codec.UnknownVR | None:
    try:
        return codec.walk(data, 0, len(data), explicit=explicit, kept=None, stop=stop)
    except codec.UnknownVR as exc:
        return exc


# Top-level stops: everything, or before Pixel Data (the receiver's), or before group 0020.
_STOPS = st.sampled_from([0xFFFE0000, codec.PIXEL_DATA, 0x00200000])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datasets(sequences=True), st.booleans(), _STOPS)
def test_valid_bytes_give_exactly_pydicoms_elements(ds: Dataset, explicit: bool, stop: int) -> None:
    data = encode(ds, explicit)
    walked = _walked(data, explicit, stop)
    reading = Reading(data, explicit, stop)
    assert isinstance(walked, codec.Walk), walked  # nothing unusual: the walk must not step aside
    assert not reading.unusual
    assert walked.elements == reading.elements
    assert (walked.stop if walked.stop >= 0 else len(data)) == reading.position


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datasets(sequences=True), st.booleans())
def test_a_sequence_of_undefined_length_is_stepped_aside(ds: Dataset, explicit: bool) -> None:
    assume(SEQUENCE_TAG in ds)
    ds[SEQUENCE_TAG].is_undefined_length = True
    data = encode(ds, explicit)
    assert _walked(data, explicit, 0xFFFE0000) is None
    assert "undefined length" in Reading(data, explicit, 0xFFFE0000).unusual


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, bool]:
    """Valid bytes, then cut, overwritten or spliced with random bytes."""
    explicit = draw(st.booleans())
    ds = draw(datasets(sequences=True))
    if SEQUENCE_TAG in ds:
        ds[SEQUENCE_TAG].is_undefined_length = draw(st.booleans())
    data = bytearray(encode(ds, explicit))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["cut", "overwrite", "splice", "vr"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "cut":
            del data[at:]
        elif how == "overwrite":
            data[at : at + 4] = draw(st.binary(min_size=1, max_size=4))
        elif how == "splice":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:  # letters that may or may not be a VR where a VR may be
            data[at : at + 2] = draw(st.sampled_from([b"ZZ", b"OB", b"UN", b"SQ", b"\x00\x01"]))
    return bytes(data), explicit


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged(), _STOPS)
def test_damaged_bytes_are_read_as_pydicom_reads_them_or_stepped_aside(
    case: tuple[bytes, bool], stop: int
) -> None:
    data, explicit = case
    walked = _walked(data, explicit, stop)
    reading = Reading(data, explicit, stop)
    if isinstance(walked, codec.UnknownVR):
        # Refused only where pydicom met VR bytes that are no VR (read as implicit, or failed).
        raised = any(u.startswith("raised") for u in reading.unusual)
        assert "not a VR" in reading.unusual or raised
        assert reading.vrs.get(walked.tag, "") not in {v.decode() for v in codec.VRS}
    elif walked is None:
        # Stepped aside only where pydicom's reading is unusual too.
        assert reading.unusual, "the walk stepped aside from bytes pydicom reads plainly"
    else:
        assert walked.elements == reading.elements
        # pydicom reads the whole header of the element it stops at; the walk reads only its
        # tag (its callers then read that header with element_at, which gives None if cut).
        try:
            stop_header = walked.stop < 0 or codec.element_at(
                data, walked.stop, len(data), explicit=explicit
            )
        except codec.UnknownVR:
            stop_header = True
        assert not reading.unusual or (not stop_header and reading.unusual == {"raised error"})


def _command(**values: Any) -> bytes:
    ds = Dataset()
    with _unvalidated():
        for keyword, value in values.items():
            setattr(ds, keyword, value)
    return encode(ds, explicit=False)


_UIDS = st.from_regex(r"\A[1-9][0-9]{0,6}(\.[0-9]{1,6}){1,8}\Z")


@settings(max_examples=200, deadline=None)
@given(
    _UIDS,
    _UIDS,
    st.integers(0, 0xFFFF),
    st.sampled_from([0x0001, 0x0030, 0x8001]),
    st.integers(0, 2),
    st.text(st.characters(min_codepoint=0x41, max_codepoint=0x5A), min_size=1, max_size=16),
)
def test_a_command_set_is_decoded_as_pydicom_decodes_it(
    sop_class: str, sop_instance: str, message_id: int, field: int, priority: int, ae: str
) -> None:
    raw = _command(
        CommandGroupLength=0,
        AffectedSOPClassUID=sop_class,
        CommandField=field,
        MessageID=message_id,
        MoveDestination=ae,
        Priority=priority,
        CommandDataSetType=0x0101,
        AffectedSOPInstanceUID=sop_instance,
    )
    decoded = dimse.decode_command(raw)
    fp = DicomBytesIO(raw)
    fp.is_little_endian, fp.is_implicit_VR = True, True
    reference = read_dataset(fp, True, True)
    for keyword in (
        "AffectedSOPClassUID",
        "CommandField",
        "MessageID",
        "MoveDestination",
        "Priority",
        "CommandDataSetType",
        "AffectedSOPInstanceUID",
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pydicom's validation of the values it reads
            expected = reference[keyword].value
        assert decoded.get(keyword) == expected, keyword


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack("<HHL", 0, 0x0100, 2),  # value cut off
        struct.pack("<HHL", 0, 0x0100, 0xFFFFFFFF),  # undefined length
        struct.pack("<HHL", 8, 0x0016, 2) + b"CT",  # not group 0000
    ],
)
def test_a_command_the_walk_steps_aside_from_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(dul.ProtocolError):
        dimse.decode_command(raw)


def test_one_table_of_vrs_for_every_reader() -> None:
    """The readers share the codec's table: UN is a long VR (PS3.5 7.1.2) for all of them."""
    assert b"UN" in codec.LONG_VRS and codec.HEADER_LENGTH[b"UN"] == 12
    assert codec.LONG_VRS <= codec.VRS
    for module in (dataset_head, slice_read, file_headers, dul, dimse):
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        assert 'struct.Struct("<HH2sH")' not in source, module.__name__  # no walker of its own


def _check_damaged(data: bytes, explicit: bool, stop: int) -> None:
    """The property test's assertions on one case (kept as regressions below)."""
    test_damaged_bytes_are_read_as_pydicom_reads_them_or_stepped_aside.hypothesis.inner_test(  # type: ignore[attr-defined]
        (data, explicit), stop
    )


@pytest.mark.parametrize("stop", [0xFFFE0000, codec.PIXEL_DATA, 0x00200000])
@pytest.mark.parametrize("explicit", [True, False])
def test_an_item_delimiter_in_a_data_set_ends_pydicoms_reading_and_the_walk_steps_aside(
    explicit: bool, stop: int
) -> None:
    # pydicom ends a data set at (FFFE,E00D) whatever its length, before it looks at the stop:
    # what follows is not read. The walk must not take it for the element it stops at.
    head = encode(_patient_dataset(), explicit)
    delimiter = struct.pack("<HHL", 0xFFFE, 0xE00D, 4) + b"\x00" * 4
    tail = encode(_pixel_dataset(), explicit)
    data = head + delimiter + tail
    assert _walked(data, explicit, stop) is None
    _check_damaged(data, explicit, stop)


def test_vr_bytes_that_are_no_vr_with_an_undefined_length_are_refused_as_pydicom_reads_them() -> (
    None
):
    # b"\xff\xff" where the VR goes: pydicom switches to implicit VR, where those bytes and the
    # length's are 0xFFFFFFFF, an undefined length. The walk refuses the VR.
    data = encode(_patient_dataset(), True) + struct.pack("<HH", 0x0010, 0x1010) + b"\xff" * 4
    data += b"\x00" * 8
    assert isinstance(_walked(data, True, codec.PIXEL_DATA), codec.UnknownVR)
    _check_damaged(data, True, codec.PIXEL_DATA)


def _patient_dataset() -> Dataset:
    ds = Dataset()
    ds.PatientID = "12345"
    ds.Modality = "CT"
    return ds


def _pixel_dataset() -> Dataset:
    ds = Dataset()
    ds.Rows = 2
    ds.BitsAllocated = 16
    ds.PixelData = b"\x00" * 8
    return ds
