"""Takes an Analysis and its source headers; gives the results: DICOM SEG and SR, HL7 ORU, FHIR.

Typical use after an analysis (job ``job_id``)::

    headers = read_headers(files)
    uids = output_uids(analysis.volume.study_instance_uid, job_id)
    algorithm = Algorithm.from_analysis(analysis, device_serial_number="node-1")
    seg = build_segmentation(analysis, headers, algorithm, uids, created=when)
    sr = build_measurement_report(analysis, headers, seg, algorithm, uids, impression=text,
                                  created=when)
    report = build_report(analysis, headers, algorithm, uids, text, when)
    oru = build_oru(report, receiving_application="RIS", receiving_facility="HOSPITAL")
    bundle = diagnostic_report_bundle(report)
    send_oru(host, port, oru, timeout=30)   # raises DeliveryError
"""

from imaging_ai.outputs.common import (
    Algorithm,
    Finding,
    ModelId,
    Quantity,
    Report,
    StudyInfo,
    build_report,
    findings,
    read_headers,
)
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.hl7 import build_oru
from imaging_ai.outputs.mllp import Ack, parse_ack, send_oru, send_oru_async
from imaging_ai.outputs.seg import build_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.outputs.uids import OutputUids, output_uids

__all__ = [
    "Ack",
    "Algorithm",
    "Finding",
    "ModelId",
    "OutputUids",
    "Quantity",
    "Report",
    "StudyInfo",
    "build_measurement_report",
    "build_oru",
    "build_report",
    "build_segmentation",
    "diagnostic_report_bundle",
    "findings",
    "output_uids",
    "parse_ack",
    "read_headers",
    "send_oru",
    "send_oru_async",
]
