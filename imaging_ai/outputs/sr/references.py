"""Takes an SR whose segment references name a placeholder; gives it the source images, encoded.

A TID 1411 group lists, after its Referenced Segment, every source image the segment lies on:
for a 300-slice CT with lungs, about 1,600 IMAGE items. highdicom builds each as a Dataset,
deep-copies them all with the document, searches them for evidence, and pydicom writes them
one element at a time: about a second on a 2-core machine. So the SR is built by highdicom
with one "Source series for segmentation" item per group in their place (the document, the
evidence and everything else are highdicom's), and then each placeholder becomes the
segment's "Source image for segmentation" items: highdicom's own item, encoded once, with each
image's UIDs. The content tree is then held encoded (:mod:`~imaging_ai.outputs.encoding`).
``tests/outputs/test_encoded.py`` checks the bytes against the SR highdicom builds whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import highdicom as hd
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset

from imaging_ai.outputs import encoding

_CONTENT_SEQUENCE = 0x0040A730
_REFERENCED_SOP_SEQUENCE = 0x00081199
_SOURCE_SERIES = "121232"  # DCM "Source series for segmentation": the placeholder
_REFERENCED_SEGMENT = "121191"  # DCM "Referenced Segment"


def placeholder(sr_series_of_sources: str) -> hd.sr.SourceSeriesForSegmentation:
    """What a group names in place of its source images until :func:`put_source_images`."""
    return hd.sr.SourceSeriesForSegmentation(sr_series_of_sources)


def put_source_images(sr: Dataset, sources_of_segment: Mapping[int, Sequence[Dataset]]) -> None:
    """Replace each group's placeholder by its segment's source images, and hold the SR's
    content encoded.

    Parameters
    ----------
    sr
        The SR, its groups built with :func:`placeholder` after each Referenced Segment.
    sources_of_segment
        The source images of each segment number, in the order the SR lists them.
    """
    charset = sr.get("SpecificCharacterSet")
    source_item = _source_item_encoder(charset)

    def encode(items: Sequence[Dataset]) -> list[bytes]:
        out: list[bytes] = []
        segment = 0
        for ds in items:
            if _concept(ds) == _REFERENCED_SEGMENT:
                segment = int(ds.ReferencedSOPSequence[0].ReferencedSegmentNumber)
            if _concept(ds) == _SOURCE_SERIES:
                out.extend(source_item(image) for image in sources_of_segment[segment])
                continue
            out.append(encoding.item(*(_element(e, charset, encode) for e in ds)))
        return out

    sr[_CONTENT_SEQUENCE] = encoding.raw_sequence(_CONTENT_SEQUENCE, encode(sr.ContentSequence))
    encoding.mark_encoded(sr)


def _element(
    elem: DataElement,
    charset: str | list[str] | None,
    encode: Callable[[Sequence[Dataset]], list[bytes]],
) -> bytes:
    """An element of a content item; its Content Sequence encoded item by item."""
    if elem.tag == _CONTENT_SEQUENCE:
        return encoding.sequence(_CONTENT_SEQUENCE, encode(elem.value))
    return encoding.element(elem, charset)


def _source_item_encoder(charset: str | list[str] | None) -> Callable[[Dataset], bytes]:
    """Encodes highdicom's Source Image for Segmentation item for an image, once per image:
    the item's other elements (relationship, value type, concept name) are the same for all."""
    cache: dict[str, bytes] = {}
    template = hd.sr.SourceImageForSegmentation("1.2.3", "1.2.3")
    after = [encoding.element(e, charset) for e in template if e.tag != _REFERENCED_SOP_SEQUENCE]
    if any(e.tag < _REFERENCED_SOP_SEQUENCE for e in template):
        raise ValueError("highdicom's source image item has an element before its reference")

    def encode(image: Dataset) -> bytes:
        uid = str(image.SOPInstanceUID)
        if uid not in cache:
            reference = encoding.item(
                encoding.uid(0x00081150, image.SOPClassUID),  # ReferencedSOPClassUID
                encoding.uid(0x00081155, uid),  # ReferencedSOPInstanceUID
            )
            cache[uid] = encoding.item(
                encoding.sequence(_REFERENCED_SOP_SEQUENCE, [reference]), *after
            )
        return cache[uid]

    return encode


def _concept(item: Dataset) -> str:
    names = item.get("ConceptNameCodeSequence")
    return str(names[0].CodeValue) if names else ""
