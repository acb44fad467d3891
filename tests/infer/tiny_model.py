"""A tiny 1x1-conv + softmax model with its card, and numpy maths for its expected output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imaging_ai.infer.base import FloatArray
from imaging_ai.modelcard import ModelCard, load_model_card
from tests.fakes.onnx_models import write_conv_softmax_onnx

TINY_CARD = """\
name = "tiny"
version = "0.0.1"
task = "segmentation"
description = "1x1 convolution + softmax with random weights, for tests."

[input]
name = "image"
channels = 1
size = [16, 16]

[preprocess]
window_center = 40.0
window_width = 400.0
normalise = "zscore"

[output]
name = "probabilities"
kind = "softmax"
channels = 3

[[labels]]
value = 1
channel = 1
name = "Class one"
threshold = 0.5
category = { code = "91723000", scheme = "SCT", meaning = "Anatomical Structure" }
type = { code = "3341006", scheme = "SCT", meaning = "Right lung" }

[[labels]]
value = 2
channel = 2
name = "Class two"
threshold = 0.5
category = { code = "91723000", scheme = "SCT", meaning = "Anatomical Structure" }
type = { code = "44029006", scheme = "SCT", meaning = "Left lung" }

[quality]

[provenance]
training_data = "None: random weights, for tests only."
"""


@dataclass(frozen=True)
class TinyModel:
    """The card plus the weights needed to compute the expected output with numpy."""

    card: ModelCard
    weight: FloatArray
    bias: FloatArray

    def expected(self, batch: FloatArray) -> FloatArray:
        logits = np.einsum("kc,nchw->nkhw", self.weight, batch) + self.bias[None, :, None, None]
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    def batch(self, n: int, seed: int = 1) -> FloatArray:
        return np.random.default_rng(seed).standard_normal((n, 1, 16, 16), dtype=np.float32)


def make_tiny(root: Path) -> TinyModel:
    """Write the tiny model's folder under `root/engines/tiny` and load its card."""
    folder = root / "engines" / "tiny"
    weight, bias = write_conv_softmax_onnx(folder / "model.onnx")
    (folder / "model.toml").write_text(TINY_CARD)
    return TinyModel(load_model_card(folder), weight, bias)
