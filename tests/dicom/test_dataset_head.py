"""The receiver's fast header reader gives exactly what pydicom gives, or steps aside (None)."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydicom import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, generate_uid

from imaging_ai.catalog import CATALOG_KEYWORDS, meta_from_dataset
from imaging_ai.dicom.dataset_head import HeadValues, PixelFacts, Reader
from imaging_ai.errors import InvalidDataset
from imaging_ai.receive_incoming import read_header
from imaging_ai.receive_store import pixel_facts
from tests.dicom_factory import ct_dataset

ROUTING = ("AdmissionID", "CurrentPatientLocation", "RequestedProcedurePriority")
SYNTAXES = (ExplicitVRLittleEndian, ImplicitVRLittleEndian)
READER = Reader(CATALOG_KEYWORDS + ROUTING)


def _encode(ds: Dataset, syntax: str, cut: int | None = None) -> bytes:
    """The data set as a C-STORE carries it, cut after ``cut`` bytes of Pixel Data."""
    fp = DicomBytesIO()
    fp.is_little_endian = True
    fp.is_implicit_VR = syntax == ImplicitVRLittleEndian
    write_dataset(fp, ds)
    data = fp.getvalue()
    return data if cut is None else data[: len(data) - len(ds.PixelData) + cut]


def _both(head: bytes, syntax: str) -> tuple[object, object]:
    """(pydicom's result, the fast reader's result) as comparable tuples; None where absent."""
    reference = read_header(head, syntax)
    fast = READER.read(head, syntax)
    return (
        None if reference is None else _result(reference, pixel_facts(reference), syntax),
        None if fast is None else _result(fast, fast.pixel, syntax),
    )


def _result(source: Dataset | HeadValues, pixel: PixelFacts, syntax: str) -> object:
    try:
        meta = meta_from_dataset(source, syntax, "PACS", ROUTING)
    except InvalidDataset as exc:
        return (str(exc), astuple(pixel))
    return (astuple(meta), meta.routing, astuple(pixel))


def _dataset(**attributes: object) -> Dataset:
    ds = ct_dataset(generate_uid(), generate_uid(), 3, size=32)
    for keyword, value in attributes.items():
        if value is None:
            delattr(ds, keyword)
        else:
            setattr(ds, keyword, value)
    return ds


@pytest.mark.parametrize("syntax", SYNTAXES)
@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"SpecificCharacterSet": "ISO_IR 100", "PatientName": "Müller^Jürgen"},
        {"SpecificCharacterSet": "ISO_IR 192", "PatientName": "Ødegård^Åse=雅子"},
        {"RequestedProcedurePriority": "STAT", "AdmissionID": "ADM 7 "},
        {"CurrentPatientLocation": "WARD 3", "SeriesNumber": None, "AccessionNumber": ""},
        {"Modality": " CT ", "PatientID": "  leading"},
        {"SOPClassUID": None},  # refused by both with the same words
        {"NumberOfFrames": 2},  # Pixel Data shorter than two frames need
    ],
)
def test_equal_to_pydicom(syntax: str, attributes: dict[str, object]) -> None:
    head = _encode(_dataset(**attributes), syntax, cut=100)
    reference, fast = _both(head, syntax)
    assert fast is not None, "the fast reader should cover this case"
    assert fast == reference


@pytest.mark.parametrize("syntax", SYNTAXES)
@pytest.mark.parametrize(
    "attributes",
    [
        {"SpecificCharacterSet": "ISO 2022 IR 87", "PatientName": "Yamada^Tarou"},
        {"PatientName": "ONE^NAME\\TWO^NAME"},  # multi-valued
    ],
)
def test_steps_aside_where_pydicom_must_read(syntax: str, attributes: dict[str, object]) -> None:
    head = _encode(_dataset(**attributes), syntax, cut=100)
    assert READER.read(head, syntax) is None
    assert read_header(head, syntax) is not None


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_routing_values_inside_request_attributes_items(syntax: str) -> None:
    first, second = Dataset(), Dataset()
    first.AccessionNumber = "A1"
    second.RequestedProcedurePriority = "HIGH"
    second.AdmissionID = "ADM-1"
    ds = _dataset(RequestAttributesSequence=[first, second], AdmissionID="TOP")
    head = _encode(ds, syntax, cut=100)
    reference, fast = _both(head, syntax)
    assert fast is not None
    assert fast == reference
    routing = READER.read(head, syntax)
    assert routing is not None
    assert meta_from_dataset(routing, syntax, "PACS", ROUTING).routing == {
        "AdmissionID": "TOP",
        "RequestedProcedurePriority": "HIGH",
    }


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_no_pixel_data_yet_or_other_syntax_is_none(syntax: str) -> None:
    whole = _encode(_dataset(), syntax)
    position = whole.index(b"\xe0\x7f\x10\x00")
    assert READER.read(whole[:position], syntax) is None
    assert READER.read(whole[: position + 4], syntax) is None
    assert READER.read(whole, "1.2.840.10008.1.2.2") is None  # big endian: pydicom's job


text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\\"),
    max_size=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    syntax=st.sampled_from(SYNTAXES),
    name=text,
    accession=text.map(lambda t: t[:16]),
    location=text,
    series=st.one_of(st.none(), st.integers(min_value=-999, max_value=99999)),
    rows=st.integers(min_value=1, max_value=64),
    cut=st.integers(min_value=0, max_value=2048),
)
def test_equal_to_pydicom_on_any_latin1_values(
    syntax: str, name: str, accession: str, location: str, series: int | None, rows: int, cut: int
) -> None:
    ds = _dataset(
        SpecificCharacterSet="ISO_IR 100",
        PatientName=name,
        AccessionNumber=accession,
        CurrentPatientLocation=location,
        SeriesNumber=series,
        Rows=rows,
    )
    head = _encode(ds, syntax, cut=min(cut, len(ds.PixelData)))
    reference, fast = _both(head, syntax)
    assert fast is not None  # Latin-1 single values: the fast reader's own case
    assert fast == reference
