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

``--fake-per-slice S`` runs the models as the daemon does, through its batchers and one "GPU"
worker process (two batches at once, the shared-memory arenas), with the test-only
fixed-latency engine standing in for the GPU: each batch sleeps ``--fake-batch S`` plus S per
slice (0.0001 is about an H200's: CHANGELOG.md, 2026-12-01, "Load with the fast CT reader").
Its outputs are not a model's, so postprocessing times mean nothing there and SEG/SR are not
written; load, preprocess and the inference stages (copies, batching, round trips) are what it
measures.

    .venv/bin/python scripts/cpu_stage_times.py /tmp/d/ph --repeats 5 --fake-per-slice 0.0001
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

from imaging_ai.analyse import Models, analyse_study, load_models
from imaging_ai.batch import BatchingEngine
from imaging_ai.config import Config, load_config
from imaging_ai.engine_set import EngineSet
from imaging_ai.infer.base import LoadedModel
from imaging_ai.outputs.files import write_results
from imaging_ai.process import EngineClock, split_steps


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


def batching_models(
    config: Config, fake: tuple[float, float] | None, data_dir: Path
) -> tuple[Models, EngineSet]:
    """The models behind the daemon's batchers and worker pool, as the processor gets them.

    With ``fake`` (s per batch, s per slice) the workers run the fixed-latency engine, and
    ``gpus = 1`` gives that worker a GPU worker's shape (two batches at once, a deeper queue);
    the fake engine runs on the CPU whatever the worker is told.
    """
    engines = config.engines
    if fake is not None:
        size = engines.max_batch_size
        backend = f"fake:latency={fake[0]},per_slice={fake[1]},max_batch={size}"
        engines = replace(engines, backend=backend, gpus=1)
    engine_set = EngineSet(engines, data_dir)
    engine_set.start()
    deadline = time.time() + 3600

    def loaded(card: Any) -> LoadedModel:
        return LoadedModel(card, BatchingEngine(engine_set.batchers[card.name], 1, deadline))

    extra = engine_set.cards.candidates
    models = Models(
        loaded(engine_set.lungs),
        loaded(engine_set.nodules),
        engines.backend,
        loaded(extra) if extra else None,
    )
    return models, engine_set


def trace_summary(engine_set: EngineSet) -> str:
    """Per model, the batches of the run just done: sizes, round trips, the worker's own time."""
    lines = []
    traces = engine_set.pool.take_traces()
    for model in sorted({t.model for t in traces}):
        mine = [t for t in traces if t.model == model]
        span = (max(t.returned for t in mine) - min(t.sent for t in mine)) / 1e6
        trip = statistics.median((t.returned - t.sent) / 1e6 for t in mine)
        run = statistics.median((t.ended - t.started) / 1e6 for t in mine)
        stages = [t.stages for t in mine if t.stages]
        engine = sum(s[1] for s in stages) / 1e6 if stages else float("nan")
        sizes = sorted(t.size for t in mine)
        lines.append(
            f"  {model}: {len(mine)} batches {sizes}, first sent to last back {span:.1f} ms, "
            f"round trip {trip:.2f} ms, in worker {run:.2f} ms (medians), engine run "
            f"{engine:.1f} ms in all"
        )
    return "\n".join(lines)


def once(files: list[Path], models: Any, data_dir: Path, outputs: bool) -> dict[str, float]:
    for model in (models.lungs, models.nodules):
        if isinstance(model.engine, Tape):
            model.engine.calls = 0
    lungs, nodules = EngineClock(models.lungs.engine), EngineClock(models.nodules.engine)
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
    if outputs:
        t = time.perf_counter()
        write_results(analysis, files, 1, datetime.now(UTC), "impression", config)
        steps["outputs"] = time.perf_counter() - t
    steps["total"] = time.perf_counter() - started
    steps["cpu (process)"] = time.process_time() - cpu
    return steps


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a phantom study folder (dicom/*.dcm)")
    parser.add_argument("--repeats", type=int, default=3)
    tape = parser.add_mutually_exclusive_group()
    tape.add_argument("--record", type=Path, help="save the models' outputs here")
    tape.add_argument("--replay", type=Path, help="replay the models' outputs saved here")
    tape.add_argument(
        "--fake-per-slice", type=float, help="through the batchers, fake engine: s per slice"
    )
    tape.add_argument(
        "--daemon", action="store_true", help="through the batchers and workers, real engines"
    )
    parser.add_argument("--fake-batch", type=float, default=0.0, help="fake engine: s per batch")
    parser.add_argument("--no-outputs", action="store_true", help="leave SEG/SR writing out")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    files = sorted((args.study / "dicom").glob("*.dcm"))
    fake = None if args.fake_per_slice is None else (args.fake_batch, args.fake_per_slice)
    outputs = not (args.no_outputs or fake)
    with tempfile.TemporaryDirectory() as tmp:
        engine_set = None
        if fake or args.daemon:
            models, engine_set = batching_models(load_config(None), fake, Path(tmp))
        else:
            models = load_models(load_config(None).engines, Path(tmp))
        if args.record or args.replay:
            models = taped(models, args.record or args.replay, replay=bool(args.replay))
        try:
            runs = []
            for _ in range(args.repeats + 1):
                runs.append(once(files, models, Path(tmp), outputs))
                traces = trace_summary(engine_set) if engine_set else ""
        finally:
            if engine_set is not None:
                engine_set.stop()
    print(f"{len(files)} slices, backend {models.backend}, median of {len(runs) - 1} runs")
    for key in runs[1]:
        values = [run[key] for run in runs[1:]]
        print(
            f"{key:>16} {statistics.median(values):7.3f} s  ({min(values):.3f}-{max(values):.3f})"
        )
    if traces:
        print(f"batches of the last run:\n{traces}")


if __name__ == "__main__":
    main()
