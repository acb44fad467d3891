"""The synthetic patient: takes a spec, gives habitus, sizes and positions drawn from its seed."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import numpy as np

from imaging_ai_devkit.phantom.spec import KERNELS, PhantomSpec


def rng_for(seed: int, purpose: str) -> np.random.Generator:
    """An independent random stream per purpose, so changing one part keeps the others."""
    return np.random.default_rng([seed, zlib.crc32(purpose.encode())])


@dataclass(frozen=True)
class Patient:
    """Sizes in mm, positions in LPS mm; ``f`` is depth below the lung apex in lung lengths.

    Attributes
    ----------
    sex : {"M", "F"}
    age : int
    scale : float
        Habitus (fat, belly); 1 is an average adult.
    frame : float
        Skeleton size; scales the rib cage, organs and lungs.
    lung_length : float
        Apex to the top of the right hemidiaphragm.
    z_apex : float
        Patient z of the lung apex.
    centre : tuple of float
        x, y of the thoracic cavity centre.
    cavity : tuple of float
        Semi-axes (lateral, antero-posterior) of the thoracic cavity at its widest.
    fat : float
        Lateral subcutaneous fat thickness.
    muscle : float
        Lateral chest-wall muscle thickness.
    contrast, dense_contrast, atelectasis : bool
        As drawn for the study (:func:`drawn_spec`).
    """

    seed: int
    sex: str
    age: int
    scale: float
    frame: float
    lung_length: float
    z_apex: float
    centre: tuple[float, float]
    cavity: tuple[float, float]
    fat: float
    muscle: float
    heart_scale: float
    left_dome_drop: float
    lung_hu: float
    dependent_hu: float
    breasts: bool
    contrast: bool
    dense_contrast: bool = False
    atelectasis: bool = False

    def z(self, f: float) -> float:
        """Patient z at depth ``f`` lung lengths below the apex."""
        return self.z_apex - f * self.lung_length

    def at(self, x: float, y: float, f: float) -> tuple[float, float, float]:
        """LPS point from offsets (scaled by the frame) from the cavity centre and a depth."""
        return (self.centre[0] + x * self.frame, self.centre[1] + y * self.frame, self.z(f))

    @property
    def weight_kg(self) -> float:
        """Plausible body weight for the habitus, for PatientWeight."""
        base = 78.0 if self.sex == "M" else 66.0
        return round(float(base * self.scale**1.6 * self.frame**2), 1)

    @property
    def height_m(self) -> float:
        """Plausible height for the frame, for PatientSize."""
        return round((1.76 if self.sex == "M" else 1.63) * self.frame, 2)


def draw_patient(spec: PhantomSpec) -> Patient:
    """Draw the patient of ``spec.seed`` (and ``spec.patient_scale`` when set).

    Parameters
    ----------
    spec : PhantomSpec
        Seed, optional habitus and contrast.

    Returns
    -------
    Patient
        Deterministic for a given seed and habitus.
    """
    rng = rng_for(spec.seed, "patient")
    sex = "M" if rng.random() < 0.5 else "F"
    frame = float(np.clip(rng.normal(1.0, 0.04), 0.9, 1.1)) * (1.0 if sex == "M" else 0.93)
    drawn_scale = float(np.clip(np.exp(rng.normal(0.02, 0.14)), 0.78, 1.42))
    scale = spec.patient_scale if spec.patient_scale is not None else drawn_scale
    fat_noise = float(np.clip(rng.normal(1.0, 0.2), 0.6, 1.5))
    fat = float(np.clip((5.0 + 40.0 * (scale - 0.8)) * fat_noise, 2.0, 55.0))
    return Patient(
        seed=spec.seed,
        sex=sex,
        age=int(rng.integers(32, 86)),
        scale=scale,
        frame=frame,
        lung_length=float(205.0 * frame * np.clip(rng.normal(1.0, 0.06), 0.85, 1.15)),
        z_apex=float(rng.uniform(-80.0, 60.0)),
        centre=(float(rng.normal(0.0, 8.0)), float(rng.normal(-12.0, 10.0))),
        cavity=(
            float(128.0 * frame * np.clip(rng.normal(1.0, 0.04), 0.9, 1.1)),
            float(86.0 * frame * np.clip(rng.normal(1.0, 0.07), 0.82, 1.18)),
        ),
        fat=fat * (1.2 if sex == "F" else 1.0),
        muscle=float((9.0 if sex == "M" else 7.0) * np.clip(rng.normal(1.0, 0.2), 0.6, 1.5)),
        heart_scale=float(np.clip(rng.normal(1.0, 0.08), 0.82, 1.25)),
        left_dome_drop=float(rng.uniform(4.0, 25.0)),
        lung_hu=float(rng.normal(-875.0, 18.0)),
        dependent_hu=float(rng.uniform(20.0, 90.0)),
        breasts=sex == "F" and rng.random() < 0.85,
        contrast=bool(spec.contrast),
        dense_contrast=bool(spec.dense_contrast),
        atelectasis=bool(spec.atelectasis),
    )


def drawn_spec(spec: PhantomSpec) -> PhantomSpec:
    """``spec`` with every option left to chance (None) drawn from its seed.

    Each option has its own random stream, so drawing one never changes another, and a spec
    that sets them all is returned unchanged.
    """
    contrast = spec.contrast
    if contrast is None:
        contrast = bool(rng_for(spec.seed, "spec contrast").random() < 0.5)
    dense = spec.dense_contrast
    if dense is None:
        dense = contrast and bool(rng_for(spec.seed, "spec dense contrast").random() < 0.6)
    atelectasis = spec.atelectasis
    if atelectasis is None:
        atelectasis = bool(rng_for(spec.seed, "spec atelectasis").random() < 0.65)
    kernel = spec.kernel
    if kernel is None:
        pick = int(rng_for(spec.seed, "spec kernel").choice(3, p=[0.25, 0.45, 0.3]))
        kernel = KERNELS[pick]
    return replace(
        spec, contrast=contrast, dense_contrast=dense, atelectasis=atelectasis, kernel=kernel
    )
