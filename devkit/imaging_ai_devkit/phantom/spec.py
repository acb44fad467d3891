"""What to generate: takes user knobs, gives a validated, frozen :class:`PhantomSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kernel = Literal["soft", "standard", "sharp"]
KERNELS: tuple[Kernel, ...] = ("soft", "standard", "sharp")

STANDARD_THICKNESSES_MM = (0.625, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 5.0)
"""Reconstructed slice thicknesses that scanners offer; an unset thickness snaps to one."""

PATIENT_SIZES = {"small": 0.82, "medium": 1.0, "large": 1.2, "obese": 1.38}
"""Named habitus scales for ``patient_scale``."""


@dataclass(frozen=True)
class PhantomSpec:
    """Everything that decides a phantom; the same spec always gives the same voxels.

    Attributes
    ----------
    slices : int
        Number of axial images.
    seed : int
        Chooses the patient (anatomy, habitus, sex, age), the nodules and the noise.
    nodules : int
        Number of lung nodules.
    slice_thickness_mm : float or None
        Thickness and spacing of the slices; None picks a standard thickness so that the slices
        cover the chest (apex to upper abdomen). Short stacks cover a slab of the mid chest.
    pixel_spacing_mm : float or None
        None fits the field of view to the body (about 300 to 450 mm).
    noise_hu : float or None
        Standard deviation of the noise in water-equivalent tissue; None derives it from the
        patient size, the kernel and the slice thickness (about 8 to 30 HU).
    patient_scale : float or None
        Habitus: 1 is an average adult, 0.8 slim, 1.4 obese; None draws one from the seed.
    kernel : {"soft", "standard", "sharp"} or None
        Reconstruction kernel: resolution and noise texture ("sharp" is a lung kernel, with edge
        overshoot). None draws one from the seed (soft 25 %, standard 45 %, sharp 30 %); each
        patient's scanner also varies the kernel's resolution and noise grain a little.
    contrast : bool or None
        Intravenous contrast (vessels and heart chambers at 150 to 400 HU in a pulmonary,
        arterial or venous phase; enhancing organs). None draws it from the seed (half).
    dense_contrast : bool or None
        Undiluted contrast (1000 to 2500 HU) in the subclavian vein of the injected arm, with
        beam-hardening streaks across the upper chest. Only with contrast; None draws it from
        the seed (60 % of contrast studies).
    atelectasis : bool or None
        Dependent atelectasis: bands and wedges of -300 to +40 HU along the posterior lung
        bases. None draws it from the seed (65 %).
    nodule_diameter_range_mm : tuple of float
        Smallest and largest nodule diameter; drawn log-uniformly, as small nodules are common.
    nodule_hu : float
        Mean attenuation of solid nodules.
    subsolid_fraction : float
        Share of nodules that are part-solid or ground-glass.
    juxtapleural_fraction : float
        Share of nodules that touch the pleura.
    matrix : int
        Rows and columns of each image.
    """

    slices: int = 64
    seed: int = 0
    nodules: int = 3
    slice_thickness_mm: float | None = None
    pixel_spacing_mm: float | None = None
    noise_hu: float | None = None
    patient_scale: float | None = None
    kernel: Kernel | None = None
    contrast: bool | None = None
    dense_contrast: bool | None = None
    atelectasis: bool | None = None
    nodule_diameter_range_mm: tuple[float, float] = (4.0, 30.0)
    nodule_hu: float = 30.0
    subsolid_fraction: float = 0.2
    juxtapleural_fraction: float = 0.15
    matrix: int = 512

    def __post_init__(self) -> None:
        for problem in _problems(self):
            raise ValueError(f"PhantomSpec: {problem}")


def _problems(spec: PhantomSpec) -> list[str]:
    """Each invalid field, named with its bad value."""
    out = []
    if not 1 <= spec.slices <= 2000:
        out.append(f"slices={spec.slices} must be 1 to 2000")
    if not 0 <= spec.nodules <= 40:
        out.append(f"nodules={spec.nodules} must be 0 to 40")
    if spec.seed < 0:
        out.append(f"seed={spec.seed} must be >= 0")
    out += _range("slice_thickness_mm", spec.slice_thickness_mm, 0.5, 10.0)
    out += _range("pixel_spacing_mm", spec.pixel_spacing_mm, 0.3, 1.5)
    out += _range("noise_hu", spec.noise_hu, 0.0, 200.0)
    out += _range("patient_scale", spec.patient_scale, 0.7, 1.5)
    if spec.kernel is not None and spec.kernel not in KERNELS:
        out.append(f"kernel={spec.kernel!r} must be one of {', '.join(KERNELS)} or None")
    if spec.dense_contrast and spec.contrast is False:
        out.append("dense_contrast=True needs contrast (True or None)")
    lo, hi = spec.nodule_diameter_range_mm
    if not 3.0 <= lo <= hi <= 80.0:  # above 30 mm a "mass"
        out.append(f"nodule_diameter_range_mm={(lo, hi)} must satisfy 3 <= min <= max <= 80")
    out += _range("subsolid_fraction", spec.subsolid_fraction, 0.0, 1.0)
    out += _range("juxtapleural_fraction", spec.juxtapleural_fraction, 0.0, 1.0)
    if spec.matrix not in (128, 256, 384, 512, 768, 1024):
        out.append(f"matrix={spec.matrix} must be 128, 256, 384, 512, 768 or 1024")
    return out


def _range(name: str, value: float | None, lo: float, hi: float) -> list[str]:
    """A message if an optional number lies outside ``[lo, hi]``."""
    if value is None or lo <= value <= hi:
        return []
    return [f"{name}={value} must be between {lo} and {hi}"]
