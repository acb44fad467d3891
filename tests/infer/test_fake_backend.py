"""The test-only fixed-latency backend that scheduler tests will use."""

from __future__ import annotations

import numpy as np
import pytest
from imaging_ai_devkit.fake_engines import FixedLatencyBackend

from tests.infer.tiny_model import TinyModel


def test_latency_shape_and_deterministic_values(tiny: TinyModel) -> None:
    slept: list[float] = []
    backend = FixedLatencyBackend(0.05, 0.01, max_batch_size=4, sleep=slept.append)
    engine = backend.load(tiny.card)
    batch = np.stack([np.full((1, 16, 16), v, np.float32) for v in (0.0, 2.0, 5.0)])
    out = engine.infer(batch)
    assert slept == [pytest.approx(0.08)]
    assert out.shape == (3, 3, 16, 16) and out.dtype == np.float32
    assert out[2, 1, 0, 0] == pytest.approx(1 + 5.0)  # channel + mean of the slice
    engine.infer(batch[:1])
    assert engine.batches == [3, 1]
    assert engine.info.backend == "fixed-latency" and engine.max_batch_size == 4
    with pytest.raises(ValueError):
        engine.infer(np.zeros((5, 1, 16, 16), np.float32))
