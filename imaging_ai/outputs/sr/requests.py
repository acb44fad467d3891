"""Takes a source header; gives the SR's Referenced Request Sequence (0040,A370) items.

SR Document General (PS3.3 C.17.2) has one item per imaging service request the document
answers: Study Instance UID (Type 1), and Accession Number, Placer and Filler Order Number,
Requested Procedure ID and Description, Referenced Study and Requested Procedure Code
Sequences (Type 2: present, empty where unknown). The values are the source's own, as
:func:`~imaging_ai.outputs.common.requests` reads them; unlike HL7's ORC/OBR, an order number
the images do not carry stays empty rather than repeating the accession number.
"""

from __future__ import annotations

from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from imaging_ai.outputs.common import requests


def referenced_requests(source: Dataset) -> list[Dataset] | None:
    """The Referenced Request Sequence items for an SR on ``source``; None where the source
    names no request (no accession, order number or requested procedure): the sequence is
    Type 1C, required only for a document made in response to a request."""
    study_uid = str(source.StudyInstanceUID)
    items = []
    for request in requests(source):
        item = Dataset()
        item.StudyInstanceUID = request.study_uid or study_uid
        item.ReferencedStudySequence = Sequence()
        item.AccessionNumber = request.accession
        item.PlacerOrderNumberImagingServiceRequest = request.placer_order_number
        item.FillerOrderNumberImagingServiceRequest = request.filler_order_number
        item.RequestedProcedureID = request.requested_procedure_id
        item.RequestedProcedureDescription = request.requested_procedure_description
        item.RequestedProcedureCodeSequence = Sequence()
        items.append(item)
    return items or None
