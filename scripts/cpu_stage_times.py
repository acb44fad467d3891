"""The CPU stages around inference for one study, as the daemon's processor splits them (issue 7).

Runs ``imaging_ai.analyse.analyse_study`` on the configured backend (ONNX Runtime CPU here) with
each engine clocked, splits the steps as ``imaging_ai.process.split_steps`` does (load,
preprocess, each model's inference, postprocess), then ``write_results`` (SEG, SR, ORU, FHIR:
"outputs"), and prints the median of each stage over the repeats, wall and this process's CPU
time. The first repeat also warms up the engines and highdicom's tables; it is left out.

    .venv/bin/imaging-ai phantom /tmp/d/ph --slices 300 --seed 7 --nodules 5
    .venv/bin/python scripts/cpu_stage_times.py /tmp/d/ph --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imaging_ai.analyse import LoadedModel, analyse_study, load_models
from imaging_ai.config import load_config
from imaging_ai.outputs.files import write_results
from imaging_ai.process import split_steps


class Clock:
    """An engine that notes when its first batch went in and how long it spent inferring."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.busy_s = engine, 0.0
        self.first_call: float | None = None
        self.max_batch_size, self.info = engine.max_batch_size, engine.info

    def infer(self, batch: Any) -> Any:
        start = time.perf_counter()
        self.first_call = self.first_call or start
        try:
            return self.engine.infer(batch)
        finally:
            self.busy_s += time.perf_counter() - start

    def close(self) -> None:
        self.engine.close()


def once(files: list[Path], models: Any, data_dir: Path) -> dict[str, float]:
    lungs, nodules = Clock(models.lungs.engine), Clock(models.nodules.engine)
    clocked = replace(
        models,
        lungs=LoadedModel(models.lungs.card, lungs),
        nodules=LoadedModel(models.nodules.card, nodules),
    )
    config = load_config(None, {"IMAGING_AI_STORAGE__DATA_DIR": str(data_dir)})
    cpu, started = time.process_time(), time.perf_counter()
    analysis = analyse_study(files, clocked)
    clocks = {models.lungs.card.name: lungs, models.nodules.card.name: nodules}
    steps = split_steps(analysis.timings_s, started, clocks)  # type: ignore[arg-type]
    t = time.perf_counter()
    write_results(analysis, files, 1, datetime.now(UTC), "impression", config)
    steps["outputs"] = time.perf_counter() - t
    steps["total"] = time.perf_counter() - started
    steps["cpu (process)"] = time.process_time() - cpu
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a phantom study folder (dicom/*.dcm)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    files = sorted((args.study / "dicom").glob("*.dcm"))
    with tempfile.TemporaryDirectory() as tmp:
        models = load_models(load_config(None).engines, Path(tmp))
        runs = [once(files, models, Path(tmp)) for _ in range(args.repeats + 1)][1:]
    print(f"{len(files)} slices, backend {models.backend}, median of {len(runs)} runs")
    for key in runs[0]:
        values = [run[key] for run in runs]
        print(
            f"{key:>16} {statistics.median(values):7.3f} s  ({min(values):.3f}-{max(values):.3f})"
        )


if __name__ == "__main__":
    main()
