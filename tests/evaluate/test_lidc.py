"""evaluate.lidc on a small hand-written reader XML in the LIDC schema."""

from __future__ import annotations

import numpy as np
import pytest

from imaging_ai.errors import InvalidDataset
from imaging_ai.evaluate.lidc import lidc_lesions
from tests.evaluate.helpers import make_volume

VOLUME = make_volume((5, 64, 64))


def square(x0: int, y0: int, x1: int, y1: int) -> str:
    corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    return "".join(
        f"<edgeMap><xCoord>{x}</xCoord><yCoord>{y}</yCoord></edgeMap>" for x, y in corners
    )


def roi(k: int, edges: str, inclusion: str = "TRUE", uid: str | None = None) -> str:
    return (
        f"<roi><imageZposition>{float(k)}</imageZposition>"
        f"<imageSOP_UID>{uid or f'1.2.3.{k + 1}'}</imageSOP_UID>"
        f"<inclusion>{inclusion}</inclusion>{edges}</roi>"
    )


def nodule(name: str, *rois: str) -> str:
    return f"<unblindedReadNodule><noduleID>{name}</noduleID>{''.join(rois)}</unblindedReadNodule>"


def session(*marks: str) -> str:
    reader = "<servicingRadiologistID>r</servicingRadiologistID>"
    return f"<readingSession>{reader}{''.join(marks)}</readingSession>"


XML = f"""<?xml version="1.0" encoding="UTF-8"?>
<LidcReadMessage xmlns="http://www.nih.gov">
<ResponseHeader><SeriesInstanceUid>1.2.3</SeriesInstanceUid></ResponseHeader>
{
    session(
        nodule(
            "N1",
            roi(2, square(10, 10, 20, 20)),
            roi(3, square(10, 10, 20, 20)),
            roi(3, square(14, 14, 16, 16), inclusion="FALSE"),
        ),
    )
}
{
    session(
        nodule("A", roi(2, square(12, 12, 22, 22))),
        nodule(
            "small",
            roi(1, "<edgeMap><xCoord>40</xCoord><yCoord>40</yCoord></edgeMap>", uid="9.9.9"),
        ),
        "<nonNodule><nonNoduleID>x</nonNoduleID><imageZposition>4.0</imageZposition>"
        "<imageSOP_UID>1.2.3.5</imageSOP_UID><locus><xCoord>50</xCoord><yCoord>10</yCoord>"
        "</locus></nonNodule>",
    )
}
{session(nodule("B", roi(0, square(40, 50, 46, 56))))}
</LidcReadMessage>
""".encode()


def test_readers_marks_become_lesions_and_irrelevant_findings() -> None:
    found = lidc_lesions(XML, VOLUME)
    relevant = [f for f in found if f.relevant]
    other = [f for f in found if not f.relevant]
    # Two readers' overlapping contours are one lesion; the third reader's nodule is another.
    assert [f.readers for f in relevant] == [2, 1]
    assert len(other) == 2
    assert sorted(tuple(np.rint(f.centre_mm)) for f in other) == [(40, 40, 1), (50, 10, 4)]


def test_contours_are_filled_by_slice_with_exclusions_as_holes() -> None:
    both = lidc_lesions(XML, VOLUME)[0]
    voxels = {tuple(v) for v in both.voxels.tolist()}
    # Reader 1's slice 3: an 11 × 11 square (outline included) less a 3 × 3 hole.
    on_3 = {v for v in voxels if v[0] == 3}
    assert len(on_3) == 121 - 9
    assert (3, 15, 15) not in voxels and (3, 10, 10) in voxels
    # Slice 2: both readers' squares joined (rows, then columns, are (slice, row, col) = y, x).
    assert (2, 22, 22) in voxels and (2, 10, 10) in voxels and (2, 21, 10) not in voxels
    # Mean of the readers' long axes: 10√2 mm on the 11-pixel squares of 1 mm pixels.
    assert both.diameter_mm == pytest.approx(10 * np.sqrt(2), abs=1.5)


def test_small_nodule_placed_by_z_when_its_uid_is_unknown() -> None:
    small = next(f for f in lidc_lesions(XML, VOLUME) if not f.relevant and f.centre_mm[0] == 40)
    assert small.voxels.tolist() == [[1, 40, 40]]


def test_not_xml_is_refused() -> None:
    with pytest.raises(InvalidDataset, match="LIDC XML"):
        lidc_lesions(b"<LidcReadMessage", VOLUME)
