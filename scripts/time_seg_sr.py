#!/usr/bin/env python3
"""Times building and writing the SEG and SR of a 300-slice 512×512 study (three runs).

Run from the repository root: ``.venv/bin/python scripts/time_seg_sr.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imaging_ai.outputs import (
    Algorithm,
    build_measurement_report,
    build_segmentation,
    output_uids,
)
from tests.outputs.scale import large_study


def main() -> int:
    analysis, headers = large_study()
    uids = output_uids(analysis.volume.study_instance_uid, 1)
    algorithm = Algorithm.from_analysis(analysis)
    when = datetime.now(UTC)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(3):
            t0 = time.perf_counter()
            seg = build_segmentation(analysis, headers, algorithm, uids, created=when)
            t1 = time.perf_counter()
            sr = build_measurement_report(
                analysis, headers, seg, algorithm, uids, impression="timing", created=when
            )
            t2 = time.perf_counter()
            seg.save_as(Path(tmp, "seg.dcm"))
            sr.save_as(Path(tmp, "sr.dcm"))
            t3 = time.perf_counter()
            print(
                f"SEG {t1 - t0:.2f} s, SR {t2 - t1:.2f} s, write {t3 - t2:.2f} s, "
                f"total {t3 - t0:.2f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
