"""Imaging chain: takes an ideal HU plane, gives what a scanner reconstructs (blur, noise, FOV)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from imaging_ai_devkit.phantom.canvas import Grid
from imaging_ai_devkit.phantom.sdf import Arr
from imaging_ai_devkit.phantom.spec import Kernel

PADDING_HU = -3024.0
"""Value outside the reconstruction circle, as many scanners store it (PixelPaddingValue)."""
MIN_HU = -1024.0
"""Reconstructed values are clipped here, as stored values cannot go lower."""
SUBSLICE_MM = 1.0
"""Spacing of the planes averaged into one slice (the slice sensitivity profile)."""

# Kernel: MTF cut-off (cycles/mm), edge enhancement, and noise relative to "standard".
KERNEL_MTF = {"soft": (0.42, 0.0, 0.7), "standard": (0.6, 0.0, 1.0), "sharp": (0.95, 2.0, 2.4)}
KERNEL_NAMES = {"soft": "SOFT", "standard": "STANDARD", "sharp": "LUNG"}


def subslice_offsets(thickness: float) -> Arr:
    """Offsets from the slice centre of the planes averaged into a slice of ``thickness`` mm."""
    n = max(1, round(thickness / SUBSLICE_MM))
    return ((np.arange(n) + 0.5) / n - 0.5) * thickness


def tuned(kernel: Kernel, rng: np.random.Generator) -> tuple[float, float, float]:
    """A scanner's own version of ``kernel``: sharpness, edge boost and noise grain.

    Soft kernels never overshoot; standard ones a little on some scanners; sharp (lung) kernels
    always do: their MTF rises 10 to 40 % above 1 before it falls, which rings at edges.
    """
    boost = {"soft": 0.0, "standard": rng.uniform(0.0, 0.6), "sharp": rng.uniform(1.5, 3.0)}
    return float(rng.uniform(0.87, 1.15)), float(boost[kernel]), float(rng.uniform(0.4, 0.65))


def default_noise(kernel: Kernel, thickness: float, diameter: float) -> float:
    """Noise SD (HU) a dose-modulated scanner gives: more for big patients and thin slices.

    Parameters
    ----------
    kernel : str
        Reconstruction kernel.
    thickness : float
        Slice thickness, mm.
    diameter : float
        Water-equivalent patient diameter, mm.
    """
    sigma = 15.0 * np.exp(0.0065 * (diameter - 290.0)) * np.sqrt(1.25 / thickness)
    return float(np.clip(sigma * KERNEL_MTF[kernel][2], 6.0, 80.0))


@dataclass(frozen=True)
class Scanner:
    """Resolution, noise and geometry of the reconstruction.

    Attributes
    ----------
    grid : Grid
        In-plane sampling.
    kernel : str
        Reconstruction kernel.
    noise_hu : float
        Noise SD in the body centre.
    cupping_hu : float
        Residual beam hardening: the body centre reads this much lower.
    sharpness : float
        Scales the kernel's MTF cut-off: vendors' kernels of one name differ by about 15 %.
    boost : float or None
        Edge enhancement (overshoot at edges); None takes the kernel's own.
    grain : float
        Exponent of the ramp in the noise power spectrum: higher gives finer-grained noise.
    """

    grid: Grid
    kernel: Kernel
    noise_hu: float
    cupping_hu: float
    sharpness: float = 1.0
    boost: float | None = None
    grain: float = 0.5

    @cached_property
    def _filters(self) -> tuple[Arr, Arr]:
        """Image MTF and noise amplitude spectrum on the ``rfft2`` frequency grid."""
        n, d = self.grid.n, self.grid.spacing
        fy = np.fft.fftfreq(n, d)[:, None]
        fx = np.fft.rfftfreq(n, d)[None, :]
        f = np.sqrt(fx * fx + fy * fy)
        cutoff, boost, _ = KERNEL_MTF[self.kernel]
        cutoff *= self.sharpness
        boost = boost if self.boost is None else self.boost
        mtf = np.exp(-((f / cutoff) ** 2)) * (1.0 + boost * (f / cutoff) ** 2)
        # Filtered back-projection: noise power grows with frequency (ramp) under the MTF.
        amplitude = f**self.grain * mtf
        amplitude[0, 0] = 0.0
        return mtf.astype(np.complex64), amplitude.astype(np.float32)

    @cached_property
    def outside(self) -> Arr:
        """Pixels outside the reconstruction circle."""
        c = (self.grid.n - 1) / 2
        i = np.arange(self.grid.n) - c
        return np.asarray(i[:, None] ** 2 + i[None, :] ** 2 > (self.grid.n / 2) ** 2)

    def reconstruct(self, hu: Arr, body_q: Arr, rng: np.random.Generator) -> Arr:
        """Apply cupping, blur, noise and the reconstruction circle to ``hu`` in place.

        Parameters
        ----------
        hu : ndarray
            Ideal slice (average of its sub-slices), float32 ``(n, n)``.
        body_q : ndarray
            Normalised body radius (1 at the skin), for cupping and noise non-uniformity.
        rng : numpy.random.Generator
            Noise source of this slice.

        Returns
        -------
        ndarray
            ``hu``, now as reconstructed, in whole HU.
        """
        inside = np.clip(1.0 - body_q * body_q, 0.0, 1.0)
        hu -= self.cupping_hu * inside
        mtf, amplitude = self._filters
        spectrum = _rfft2(hu - hu[0, 0]) * mtf
        hu[...] = np.fft.irfft2(spectrum, s=hu.shape) + hu[0, 0]
        noise = self._noise(amplitude, rng)
        # Photon starvation is worst through the body centre: noise rises there.
        hu += noise * (self.noise_hu * (0.75 + 0.35 * inside))
        np.maximum(hu, MIN_HU, out=hu)
        np.rint(hu, out=hu)  # scanners store whole HU
        hu[self.outside] = PADDING_HU
        return hu

    def _noise(self, amplitude: Arr, rng: np.random.Generator) -> Arr:
        """Unit-SD noise with the kernel's power spectrum (random phases, Gaussian by CLT)."""
        shape = amplitude.shape
        coeffs = rng.random(shape, dtype=np.float32) - 0.5
        coeffs = coeffs + 1j * (rng.random(shape, dtype=np.float32) - 0.5)
        field = np.fft.irfft2(coeffs * amplitude, s=(self.grid.n, self.grid.n))
        return (field * (1.0 / max(float(field.std()), 1e-12))).astype(np.float32)


def _rfft2(a: Arr) -> Arr:
    """``numpy.fft.rfft2`` through the inverse transform along rows, which numpy does faster."""
    rows = np.fft.rfft(a, axis=1)
    n = a.shape[0]
    return np.asarray(np.conj(np.fft.ifft(np.conj(rows), axis=0)) * n)
