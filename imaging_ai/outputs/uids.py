"""Takes a study UID and a job id; gives the UIDs of that job's results, the same on every retry.

A retry, or a rebuild after a crash, must not send PACS a second copy of a result under new
UIDs: each UID is a hash of (study, job, what it names). A new job (a re-analysis) is a new
result and gets new UIDs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pydicom.uid import PYDICOM_ROOT_UID, generate_uid

_NAMESPACE = "imaging-ai outputs v1"


@dataclass(frozen=True)
class OutputUids:
    """The UIDs of one job's results.

    Attributes
    ----------
    study_uid, job_id
        What they are derived from.
    prefix
        UID root (an organisation's own root where it has one; pydicom's otherwise).
    """

    study_uid: str
    job_id: str
    prefix: str = PYDICOM_ROOT_UID

    def uid(self, kind: str) -> str:
        """The UID named ``kind`` (e.g. "seg-series") of this job."""
        return str(generate_uid(self.prefix, [_NAMESPACE, self.study_uid, self.job_id, kind]))

    @property
    def seg_series(self) -> str:
        """SeriesInstanceUID of the DICOM SEG."""
        return self.uid("seg-series")

    @property
    def seg_instance(self) -> str:
        """SOPInstanceUID of the DICOM SEG."""
        return self.uid("seg-instance")

    @property
    def sr_series(self) -> str:
        """SeriesInstanceUID of the DICOM SR."""
        return self.uid("sr-series")

    @property
    def sr_instance(self) -> str:
        """SOPInstanceUID of the DICOM SR."""
        return self.uid("sr-instance")

    def tracking_uid(self, finding: str) -> str:
        """Tracking UID of a finding ("nodule-1", "right-lung"), shared by SEG, SR and FHIR."""
        return self.uid(f"tracking:{finding}")

    def message_control_id(self, destination: str) -> str:
        """HL7 MSH-10 for this job's report to ``destination``: 20 characters, so that a RIS
        that keeps the historical 20-character limit still recognises a resend."""
        digest = hashlib.sha256(
            "\0".join([_NAMESPACE, self.study_uid, self.job_id, destination]).encode()
        ).hexdigest()
        return "IA" + digest[:18].upper()


def output_uids(study_uid: str, job_id: int | str, prefix: str = PYDICOM_ROOT_UID) -> OutputUids:
    """The UIDs of job ``job_id``'s results for study ``study_uid``."""
    if not study_uid:
        raise ValueError("a Study Instance UID is needed to derive result UIDs")
    return OutputUids(study_uid, str(job_id), prefix)
