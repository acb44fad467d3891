"""A small Volume with plain geometry for the evaluate tests."""

from __future__ import annotations

import numpy as np

from imaging_ai.volume import Volume


def make_volume(
    shape: tuple[int, int, int] = (5, 64, 64),
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0),
    origin: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> Volume:
    """An all-air volume (slices, rows, cols) with identity direction; slice k's SOP Instance
    UID is ``1.2.3.<k + 1>``."""
    return Volume(
        hu=np.full(shape, -1000.0, np.float32),
        origin_mm=origin,
        spacing_mm=spacing,
        direction=np.eye(3),
        sop_instance_uids=tuple(f"1.2.3.{k + 1}" for k in range(shape[0])),
        series_instance_uid="1.2.3",
        study_instance_uid="1.2",
        frame_of_reference_uid="1.2.4",
    )
