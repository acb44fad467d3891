"""The Comprehensive 3D SR IOD (PS3.3 A.35.13) holding TID 1500, the daemon's Measurement Report.

``sop`` builds the document with highdicom; ``references`` puts each segment's source images
into it, encoded once instead of item by item; ``classes`` gives the IOD a PACS takes
(Comprehensive SR, A.35.3, for one without Comprehensive 3D SR) and its UID.
"""

from imaging_ai.outputs.sr.sop import (
    SR_SERIES_NUMBER,
    build_measurement_report,
    device_uid,
)

__all__ = ["SR_SERIES_NUMBER", "build_measurement_report", "device_uid"]
