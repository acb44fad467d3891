"""Takes a Volume; gives plain-words caveats on what its slices allow the analysis to find.

Lung volumes hold on any regular series, but a nodule of a few millimetres is averaged away on
thick slices and can fall between sparse ones. Such a series is still analysed; every report
says so instead of giving a silent result (issue 17, item 6).
"""

from __future__ import annotations

from imaging_ai.volume import Volume

# Thicker (or sparser) than this, nodule detection is limited: the thin-slice limit of
# screening protocols (LUNA16 kept series of 2.5 mm and thinner).
MAX_THICKNESS_MM = 2.5
# Slices further apart than this share of their thickness leave tissue unimaged between them.
MAX_GAP_RATIO = 1.5
# Decimal strings round: 2.5 written as 2.50001 is still 2.5.
_TOLERANCE_MM = 0.01


def input_caveats(volume: Volume, slice_thickness_mm: float | None = None) -> tuple[str, ...]:
    """Caveats for a series too thick or too sparse for nodule detection; empty if neither.

    Parameters
    ----------
    volume
        The analysed series; its spacing along the slice normal is the spacing between slices.
    slice_thickness_mm
        The series' SliceThickness; default ``volume.slice_thickness_mm``, and where neither
        is known the spacing between slices stands for it.

    Returns
    -------
    tuple of str
        One sentence per limit, for people: thick slices, then gaps between slices.
    """
    spacing = float(volume.spacing_mm[2])
    known = slice_thickness_mm if slice_thickness_mm is not None else volume.slice_thickness_mm
    thickness = known if known is not None and known > 0 else spacing
    caveats = []
    thick = thickness > MAX_THICKNESS_MM + _TOLERANCE_MM
    if thick:
        caveats.append(
            f"Slices are {thickness:.1f} mm thick: lung volumes are measured, but nodule "
            f"detection is limited on slices thicker than {MAX_THICKNESS_MM:.1f} mm; review "
            "the thin-slice series if one exists."
        )
    sparse = spacing > MAX_THICKNESS_MM + _TOLERANCE_MM and not thick
    if spacing > MAX_GAP_RATIO * thickness + _TOLERANCE_MM or sparse:
        caveats.append(
            f"Slices are {spacing:.1f} mm apart and {thickness:.1f} mm thick: lung volumes are "
            "measured, but nodules between slices can be missed; review a contiguous "
            "thin-slice series if one exists."
        )
    return tuple(caveats)
