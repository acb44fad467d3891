"""One model's outputs from two engines in; how far apart they are, judged by the stated tolerance,
out.

The daemon runs FP16 on GPUs and checks it against ONNX Runtime FP32 on the CPU. The stated
tolerance (docs/models.md, "FP16 and the GPU"): the GPU's outputs may differ from the CPU's no
more than the CPU's own outputs move when the input moves by `SENSITIVITY_HU` (Gaussian, 1 HU:
the step CT values are stored in, and a tenth or less of a scanner's noise). That holds for each
of three measures: the largest |difference| of a probability, the share of pixels whose label
(the daemon's own rule) differs, and the worst label's Dice against the CPU's mask. A difference
below what 1 HU does is numerically immaterial to the study.

A fixed bound on the probabilities alone cannot serve: where a pixel's classes are nearly tied,
1 HU moves its probability by more than any useful bound (lung-seg run at 512x512, a size it was
never trained at: 0.10-0.13), so any rounding there shows, whichever operator rounds. Only numpy
is imported, so this runs on the GPU machine too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from imaging_ai.modelcard import ModelCard

SENSITIVITY_HU = 1.0
SENSITIVITY_DRAWS = 3  # the limit is the median of this many draws of the noise

FloatArray = NDArray[np.float32]


@dataclass(frozen=True)
class Agreement:
    """How far one engine's outputs are from the reference's on the same slices."""

    max_abs_diff: float
    p9999_abs_diff: float
    label_disagreement: float  # share of pixels whose label differs
    dice_min: float  # the worst label's Dice against the reference's mask

    def within(self, limit: Agreement) -> bool:
        """Whether every measure is as close as `limit`'s (the model's `hu_sensitivity`)."""
        return (
            self.max_abs_diff <= limit.max_abs_diff
            and self.label_disagreement <= limit.label_disagreement
            and self.dice_min >= limit.dice_min
        )


def label_map(probabilities: NDArray[Any], card: ModelCard) -> NDArray[np.uint8]:
    """The daemon's label map, as `postprocess.segment_labels` makes it (which needs SimpleITK).

    Softmax outputs: the most probable class where it passes its label's threshold; sigmoid
    outputs: each label's channel against its threshold.
    """
    out = np.zeros((len(probabilities), *probabilities.shape[2:]), np.uint8)
    best = probabilities.argmax(axis=1) if card.output.kind == "softmax" else None
    for label in card.labels:
        channel = probabilities[:, label.channel]
        if card.output.kind == "logits":
            channel = 1.0 / (1.0 + np.exp(-channel))
        hit = channel >= label.threshold
        out[hit if best is None else hit & (best == label.channel)] = label.value
    return out


def compare(out: NDArray[Any], ref: NDArray[Any], card: ModelCard) -> Agreement:
    """`out` against `ref`, both (N, C, H, W) outputs of `card`'s model on the same slices."""
    if out.shape != ref.shape or not np.isfinite(out).all():
        raise ValueError(f"outputs {out.shape} against {ref.shape}, or not all finite")
    diff = np.abs(out.astype(np.float32) - ref.astype(np.float32))
    mine, theirs = label_map(out, card), label_map(ref, card)
    dice = [1.0]
    for label in card.labels:
        a, b = mine == label.value, theirs == label.value
        both = int(a.sum()) + int(b.sum())
        dice.append(2.0 * int((a & b).sum()) / both if both else 1.0)
    return Agreement(
        float(diff.max()),
        float(np.quantile(diff, 0.9999)),
        float(np.mean(mine != theirs)),
        min(dice),
    )


def hu_sensitivity(
    run: Callable[[FloatArray], NDArray[Any]],
    x: FloatArray,
    ref: NDArray[Any],
    card: ModelCard,
    hu: float = SENSITIVITY_HU,
    draws: int = SENSITIVITY_DRAWS,
) -> Agreement:
    """How far `run`'s outputs move when every input pixel moves by `hu` (Gaussian): the limit.

    Parameters
    ----------
    run : callable
        The reference engine (ONNX Runtime FP32 on the CPU): (N, C, H, W) in, outputs out.
    x, ref : ndarray
        Preprocessed slices and the reference's outputs on them.
    card : ModelCard
        The model; its window converts HU into input units (min-max cards only).
    hu, draws : float, int
        Standard deviation of the perturbation in HU, and how many draws (seeds 0, 1, ...).

    Returns
    -------
    Agreement
        Each measure's median over the draws.
    """
    if card.preprocess.normalise != "minmax":
        raise ValueError(f"{card.name}: HU sensitivity needs a min-max normalised input")
    sigma = hu / card.preprocess.window_width
    found = []
    for seed in range(draws):
        noise = np.random.default_rng(seed).normal(0.0, sigma, x.shape)
        found.append(compare(run((x + noise).astype(np.float32)), ref, card))
    return Agreement(
        *(float(np.median(column)) for column in zip(*map(astuple, found), strict=True))
    )
