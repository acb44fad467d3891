"""The Segmentation IOD (PS3.3 A.51): the daemon's DICOM SEG of lungs and lesions.

``sop`` builds the instance with highdicom; ``frames`` encodes its frames and Per-Frame
Functional Groups as highdicom would, slice by slice instead of frame by frame.
"""

from imaging_ai.outputs.seg.sop import (
    SEG_SERIES_NUMBER,
    EncodedSegmentation,
    build_segmentation,
    encode_segmentation,
    reference_segmentation,
    segment_label_map,
)

__all__ = [
    "SEG_SERIES_NUMBER",
    "EncodedSegmentation",
    "build_segmentation",
    "encode_segmentation",
    "reference_segmentation",
    "segment_label_map",
]
