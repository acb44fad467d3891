"""The CPU stages around inference for one study, as the daemon's processor splits them (issue 7).

Runs ``imaging_ai.analyse.analyse_study`` on the configured backend (ONNX Runtime CPU here) with
each engine clocked, splits the steps as ``imaging_ai.process.split_steps`` does (load,
preprocess, each model's inference, postprocess), then ``write_results`` (SEG, SR, ORU, FHIR:
"outputs"), and prints the median of each stage over the repeats, wall and this process's CPU
time. The first repeat also warms up the engines and highdicom's tables; it is left out.

``--record DIR`` saves every batch's outputs; ``--replay DIR`` then returns them instead of
running the models, so the stages around inference can be timed alone (inference then reads
files: a few milliseconds).

    .venv/bin/imaging-ai phantom /tmp/d/ph --slices 300 --seed 7 --nodules 5
    .venv/bin/python scripts/cpu_stage_times.py /tmp/d/ph --repeats 3 --record /tmp/d/outputs
    .venv/bin/python scripts/cpu_stage_times.py /tmp/d/ph --repeats 5 --replay /tmp/d/outputs
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

import numpy as np

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


class Tape:
    """An engine that records its batches' outputs to a folder, or replays them from it."""

    def __init__(self, engine: Any, folder: Path, name: str, replay: bool) -> None:
        self.engine, self.folder, self.name, self.replay = engine, folder, name, replay
        self.max_batch_size, self.info, self.calls = engine.max_batch_size, engine.info, 0

    def infer(self, batch: Any) -> Any:
        path = self.folder / f"{self.name}-{self.calls}.npy"
        self.calls += 1
        if self.replay:
            return np.load(path)
        out = self.engine.infer(batch)
        np.save(path, out)
        return out

    def close(self) -> None:
        self.engine.close()


def taped(models: Any, folder: Path, replay: bool) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    return replace(
        models,
        **{
            key: LoadedModel(m.card, Tape(m.engine, folder, key, replay))
            for key, m in (("lungs", models.lungs), ("nodules", models.nodules))
        },
    )


def once(files: list[Path], models: Any, data_dir: Path) -> dict[str, float]:
    for model in (models.lungs, models.nodules):
        if isinstance(model.engine, Tape):
            model.engine.calls = 0
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
    tape = parser.add_mutually_exclusive_group()
    tape.add_argument("--record", type=Path, help="save the models' outputs here")
    tape.add_argument("--replay", type=Path, help="replay the models' outputs saved here")
    args = parser.parse_args()
    files = sorted((args.study / "dicom").glob("*.dcm"))
    with tempfile.TemporaryDirectory() as tmp:
        models = load_models(load_config(None).engines, Path(tmp))
        if args.record or args.replay:
            models = taped(models, args.record or args.replay, replay=bool(args.replay))
        runs = [once(files, models, Path(tmp)) for _ in range(args.repeats + 1)][1:]
    print(f"{len(files)} slices, backend {models.backend}, median of {len(runs)} runs")
    for key in runs[0]:
        values = [run[key] for run in runs]
        print(
            f"{key:>16} {statistics.median(values):7.3f} s  ({min(values):.3f}-{max(values):.3f})"
        )


if __name__ == "__main__":
    main()
