"""The development kit's commands draw imaging_ai.progress bars: `imaging-ai phantom` and
`imaging-ai bench ...` put a bar on stderr when forced (``--progress``) and print exactly the
same stdout with the bar or without it (the benchmarks' figures are read from stdout)."""

from __future__ import annotations

import argparse
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from imaging_ai_devkit.bench import engines, ingest, turnaround
from imaging_ai_devkit.bench.engines import Cell
from imaging_ai_devkit.bench.stages import StudyStages
from imaging_ai_devkit.phantom.cli import main as phantom_main
from imaging_ai_devkit.phantom.parallel import for_spans, shared_array

from tests.test_bench_ingest import DRIFTING, fake_servers


def test_spans_report_each_item_done_in_this_process_and_in_workers() -> None:
    for workers in (1, 2):
        out = shared_array((40,), np.int64)
        counted: list[int] = []

        def task(start: int, stop: int, out: Any = out) -> None:
            out[start:stop] = np.arange(start, stop) * 2

        for_spans(task, 40, workers, counted.append)
        assert sum(counted) == 40 and max(counted) <= 4  # span by span, in both
        assert list(out) == [2 * i for i in range(40)]


def run_phantom(folder: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, str]:
    args = [str(folder), "--slices", "6", "--seed", "11", "--nodules", "1",
            "--slice-thickness", "5", *flags]  # fmt: skip
    assert phantom_main(args) == 0
    captured = capsys.readouterr()
    # The summary line ends with the seconds it took, which differ from run to run.
    return re.sub(r"\(\d+\.\d s\)$", "(s)", captured.out.strip()), captured.err


def test_phantom_draws_bars_of_slices_rendered_and_written_when_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_on, err_on = run_phantom(tmp_path, capsys, "--progress")
    assert "phantom render" in err_on and "phantom write" in err_on
    assert "6/6" in err_on and "slice" in err_on
    out_off, err_off = run_phantom(tmp_path, capsys, "--no-progress")
    assert err_off == ""
    assert out_on == out_off and out_on.startswith("phantom seed 11: 6 slices of 5 mm")
    # Not a terminal and not forced: no bar (the rule of imaging_ai.progress).
    assert run_phantom(tmp_path, capsys)[1] == ""


def bench_args(add_arguments: Callable[[argparse.ArgumentParser], None], *argv: str) -> Any:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def fake_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines per model, each cell's figures fixed."""

    def two(card: Any, *args: Any) -> Iterator[tuple[str, Any]]:
        yield "ONNX Runtime CPU FP32", None
        yield "PyTorch eager FP32 (cpu)", None

    def measure(card: Any, engine: str, runner: Any, batch: int, slices: int) -> Cell:
        rate = 100.0 * batch if engine.startswith("ONNX") else 40.0 * batch
        return Cell(card.name, engine, batch, rate, 10.0 / batch, 12.0 / batch)

    monkeypatch.setattr(engines, "_engines", two)
    monkeypatch.setattr(engines, "measure", measure)


def test_bench_engines_draws_a_bar_of_cells_and_prints_the_same_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_engines(monkeypatch)
    runs = {}
    for flag in ("--progress", "--no-progress"):
        args = bench_args(engines.add_arguments, "--batches", "1,8", "--models", "lung-seg", flag)
        assert engines.run(args) == 0
        runs[flag] = capsys.readouterr()
    assert runs["--progress"].out == runs["--no-progress"].out
    assert "  lung-seg ONNX Runtime CPU FP32 batch 8: 800 slices/s" in runs["--progress"].out
    assert runs["--progress"].out.splitlines()[-1].startswith("headline: lung-seg 800 slices/s")
    assert "engines" in runs["--progress"].err and "4/4" in runs["--progress"].err
    assert runs["--no-progress"].err == ""


def test_bench_ingest_draws_a_bar_of_runs_and_prints_the_same_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The servers are fakes; run() only looks for DCMTK's tools before it starts.
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    study = tmp_path / "study"
    study.mkdir()
    (study / "a.dcm").write_bytes(b"\0" * 100)
    runs = {}
    for flag in ("--progress", "--no-progress"):
        fake_servers(monkeypatch, DRIFTING)
        args = bench_args(ingest.add_arguments, "--study", str(study), "--associations", "4", flag)
        assert ingest.run(args) == 0
        runs[flag] = capsys.readouterr()
    assert runs["--progress"].out == runs["--no-progress"].out
    assert "  4 association(s): storescp 800, tuned storescp 1000, imaging-ai 600 img/s" in (
        runs["--progress"].out
    )
    assert "headline: imaging-ai ingest (img/s) at 0.75x storescp with 4" in runs["--progress"].out
    assert "ingest" in runs["--progress"].err and "9/9" in runs["--progress"].err
    assert runs["--no-progress"].err == ""


def test_bench_turnaround_draws_a_bar_of_studies_and_prints_the_same_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def one(hospital: Any, files: list[Path], n: int, args: Any) -> StudyStages:
        turnaround.bars.echo(f"  study {n}/{args.studies}: {20.0 + n:.1f} s")
        return StudyStages("u", "urgent", 300, 20.0 + n, 19.0 + n, {"assemble": 1.0})

    monkeypatch.setattr(turnaround, "_one", one)
    runs = {}
    for flag in ("--progress", "--no-progress"):
        args = bench_args(turnaround.add_arguments, "--studies", "3", flag)
        results = turnaround._all(None, [[], [], []], args, 0.0)  # type: ignore[arg-type]
        assert turnaround.report(results, 19.5, "onnxruntime-cpu, PACS fake", args) == 0
        runs[flag] = capsys.readouterr()
    assert runs["--progress"].out == runs["--no-progress"].out
    lines = runs["--progress"].out.splitlines()
    assert lines[:3] == [f"  study {n}/3: {20.0 + n:.1f} s" for n in (1, 2, 3)]
    assert lines[-1].startswith("headline: turnaround p50 22.0 s, p95 23.0 s")
    assert "turnaround" in runs["--progress"].err and "3/3" in runs["--progress"].err
    assert runs["--no-progress"].err == ""
