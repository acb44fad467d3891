"""Takes a PACS destination's ``sr`` setting; gives the SR IOD to build and its instance UID.

The Measurement Report (TID 1500) the daemon writes holds no 3-D coordinates: each finding is
a TID 1411 volumetric group that references its SEG segment and the segment's source images,
with its measurements as numbers. So the same tree is valid in a Comprehensive SR
(1.2.840.10008.5.1.4.1.1.88.33, PS3.3 A.35.3), which differs from Comprehensive 3D SR
(1.2.840.10008.5.1.4.1.1.88.34, A.35.13) only in not allowing SCOORD3D; highdicom refuses to
build a Comprehensive SR whose content has one, so a future 3-D coordinate cannot slip in.
Each class is its own object with its own SOP Instance UID (one UID never names two objects),
in the one SR series of the job.
"""

from __future__ import annotations

import highdicom as hd

from imaging_ai.outputs.uids import OutputUids

COMPREHENSIVE_3D = "comprehensive3d"
COMPREHENSIVE = "comprehensive"
SR_IODS: dict[str, type[hd.sr.Comprehensive3DSR] | type[hd.sr.ComprehensiveSR]] = {
    COMPREHENSIVE_3D: hd.sr.Comprehensive3DSR,
    COMPREHENSIVE: hd.sr.ComprehensiveSR,
}


def sr_instance_uid(uids: OutputUids, sr_class: str) -> str:
    """The SOP Instance UID of the job's SR in ``sr_class``; Comprehensive 3D SR keeps the
    UID it always had."""
    if sr_class == COMPREHENSIVE_3D:
        return uids.sr_instance
    if sr_class not in SR_IODS:
        raise ValueError(f"unknown SR class {sr_class!r}")
    return uids.uid(f"sr-instance:{sr_class}")
