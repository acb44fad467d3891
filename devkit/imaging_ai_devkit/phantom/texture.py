"""Smooth random 3-D fields: take a seed and a grid, give unit-variance texture planes at any z."""

from __future__ import annotations

import math

import numpy as np

from imaging_ai_devkit.phantom.canvas import Grid
from imaging_ai_devkit.phantom.sdf import Arr


def bspline_weights(t: Arr) -> Arr:
    """Cubic B-spline weights of the four nodes around fractional grid positions ``t``.

    Parameters
    ----------
    t : ndarray
        Positions in grid units.

    Returns
    -------
    ndarray
        Shape ``t.shape + (4,)``; the weights of nodes ``floor(t) - 1`` to ``floor(t) + 2``.
    """
    f = t - np.floor(t)
    f2, f3 = f * f, f * f * f
    return np.stack(
        [(1 - f) ** 3 / 6, (3 * f3 - 6 * f2 + 4) / 6, (-3 * f3 + 3 * f2 + 3 * f + 1) / 6, f3 / 6],
        axis=-1,
    )


class TextureField:
    """Gaussian random field with correlation length about ``step`` mm, sampled on a plane grid.

    In the plane the field is band-limited noise made by an inverse FFT of random Fourier
    coefficients; along z the coefficients of lattice layers ``step`` mm apart are blended with
    cubic B-spline weights, so neighbouring slices share texture. The layers sit at multiples of
    ``step`` in patient z, so a plane's texture does not depend on which slices are rendered
    (a thick slice is the mean of the thin slices it covers). Planes have unit variance on
    average; callers multiply by the HU amplitude they want. (FFTs, unlike matrix products,
    start no BLAS threads, which would fight the worker processes for cores.)
    """

    def __init__(self, seed: int, step: float, grid: Grid) -> None:
        self.seed, self.step, self.n = seed, step, grid.n
        sigma = step / 2
        fy = np.fft.fftfreq(grid.n, grid.spacing)
        fx = np.fft.rfftfreq(grid.n, grid.spacing)
        # Only frequencies where the Gaussian spectrum is not negligible get coefficients.
        f_max = math.sqrt(math.log(100.0) / 2) / (math.pi * sigma)
        self._rows = np.nonzero(np.abs(fy) <= f_max)[0]
        self._cols = np.nonzero(fx <= f_max)[0]
        f2 = fy[self._rows, None] ** 2 + fx[None, self._cols] ** 2
        self._amp = np.exp(-2 * (math.pi * sigma) ** 2 * f2).astype(np.float32)
        self._amp[0, 0] = 0.0
        self._layers: dict[int, Arr] = {}
        self._gain = 1.0
        self._gain = float(self._field(self._layer(0)).std()) or 1.0

    def _layer(self, k: int) -> Arr:
        """Random coefficients of lattice layer ``k`` (cached: neighbouring planes share them)."""
        if k not in self._layers:
            if len(self._layers) > 8:
                self._layers.clear()
            rng = np.random.default_rng([self.seed, 0x7E47, round(self.step * 1000), k + 100000])
            # Uniform coefficients: the inverse FFT sums thousands, so the field is Gaussian.
            re, im = rng.random((2, *self._amp.shape), dtype=np.float32) - 0.5
            self._layers[k] = (re + 1j * im) * self._amp
        return self._layers[k]

    def _field(self, coeffs: Arr) -> Arr:
        """Plane from a block of Fourier coefficients, scaled by the layer gain."""
        full = np.zeros((self.n, self.n // 2 + 1), dtype=np.complex64)
        full[np.ix_(self._rows, self._cols)] = coeffs
        return np.fft.irfft2(full, s=(self.n, self.n)) * (1.0 / self._gain)

    def plane(self, z: float) -> Arr:
        """Field on the plane grid at ``z``, unit variance on average, float32 ``(n, n)``."""
        t = z / self.step
        wz = bspline_weights(np.asarray([t]))[0]
        base = math.floor(t) - 1
        coeffs = sum(float(wz[k]) * self._layer(base + k) for k in range(4))
        gain = math.sqrt(float((wz**2).sum()))
        return np.asarray(self._field(np.asarray(coeffs)) * (1.0 / gain), dtype=np.float32)
