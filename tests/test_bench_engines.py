"""The engines benchmark's pieces: PyTorch eager runs the shipped networks with their ONNX
weights and agrees with ONNX Runtime; cells, headline and plots come out as documented."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from imaging_ai_devkit.bench.engines import Cell, headline, measure
from imaging_ai_devkit.bench.harness import ENGINES_DIR
from imaging_ai_devkit.bench.stages import StudyStages
from imaging_ai_devkit.bench.turnaround import headline as turnaround_headline

from imaging_ai.infer.base import sample_batch
from imaging_ai.infer.ort import OrtBackend, OrtOptions
from imaging_ai.modelcard import discover_models
from imaging_ai.stats import quantile

CARDS = {c.name: c for c in discover_models(ENGINES_DIR)}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch ('train')")
@pytest.mark.parametrize("model", sorted(CARDS))
def test_torch_eager_runs_the_same_network(model: str) -> None:
    from imaging_ai_devkit.bench.torch_onnx import TorchEager

    card = CARDS[model]
    batch = sample_batch(card, 2, seed=3)
    reference = OrtBackend(OrtOptions(max_batch_size=2)).load(card).infer(batch)
    eager = TorchEager(card.onnx_path)(batch)
    assert eager.shape == reference.shape
    assert float(np.max(np.abs(eager - reference))) < 1e-4


def test_measure_counts_slices_and_latency() -> None:
    card = CARDS["lung-seg"]
    calls: list[int] = []

    def runner(batch: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
        calls.append(len(batch))
        return batch

    cell = measure(card, "fake", runner, 4, 10)
    assert calls == [4, 4, 4, 4]  # one warm-up, then 12 >= 10 slices
    assert cell.batch == 4 and cell.slices_per_s > 0 and cell.latency_ms_p95 >= 0


def test_engines_headline_compares_with_the_peer() -> None:
    cells = [
        Cell("lung-seg", "ONNX Runtime CPU FP32", 8, 300.0, 20.0, 25.0),
        Cell("lung-seg", "ONNX Runtime CPU FP32", 32, 200.0, 150.0, 160.0),
        Cell("lung-seg", "PyTorch eager FP32 (cpu)", 8, 100.0, 80.0, 90.0),
        Cell("nodule-det", "ONNX Runtime CPU FP32", 8, 50.0, 160.0, 170.0),
    ]
    line = headline(cells)
    assert line.startswith("headline: ")
    assert "lung-seg 300 slices/s (ONNX Runtime CPU FP32, batch 8) = 3.00x" in line
    assert "nodule-det 50 slices/s" in line and "no PyTorch eager FP32 peer" in line


def test_turnaround_headline_names_the_slowest_stage() -> None:
    def study(total: float, infer: float) -> StudyStages:
        stages = {"assemble": 1.0, "nodule-det": infer, "other": 0.5}
        return StudyStages("u", "urgent", 300, total, total - 1, stages)

    results = [study(20.0, 9.0), study(22.0, 10.0), study(24.0, 11.0)]
    args = argparse.Namespace(slices=300, goal=30.0)
    line = turnaround_headline(results, 19.5, args)
    # Nearest rank (imaging_ai.stats): the p95 of three studies is the slowest, 24 s (numpy's
    # interpolation gave 23.8 s, a turnaround no study had).
    assert line.startswith("headline: turnaround p50 22.0 s, p95 24.0 s")
    assert "goal <= 30 s: met" in line and "inference nodule-det (p50 10.0 s)" in line
    assert quantile([1.0, 2.0, 3.0], 0.5) == 2.0


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from imaging_ai_devkit.bench.plots import throughput_vs_batch, turnaround_stages

    cells = [Cell("m", "e", b, 10.0 * b, 1.0, 1.0) for b in (1, 8, 32)]
    throughput_vs_batch(cells, tmp_path / "tp.png", "2 CPU threads")
    stages = StudyStages("u", "urgent", 10, 3.0, 2.0, {"assemble": 1.0, "queue": 2.0})
    turnaround_stages([stages, stages], tmp_path / "st.png", "title")
    for name in ("tp.png", "st.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
