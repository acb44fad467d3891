#!/usr/bin/env python3
"""Train the two shipped reference models on synthetic phantoms; write their ONNX files and cards.

Stages (``--stage all`` runs them in order; ``--stage train`` also exports):

``train``
    Generate phantom studies (seeds 100000 + ``--first-study`` + i), preprocess them exactly as
    the model cards say, train the ``--models`` with PyTorch (CUDA when present, else the CPU),
    optionally starting from ``--init-from DIR/<model>/weights.pt``, and save ``weights.pt`` and
    ``training_log.json`` under ``--out`` (default ``engines/``).
``export``
    Build ``model.onnx`` (opset 17, input ``image``, dynamic batch, checked against PyTorch with
    ONNX Runtime) and a provisional ``model.toml`` for each model from the weights in ``--out``
    or ``--init-from``. ``nodule-det`` includes the lung U-Net as its lung-field gate.
``calibrate``
    On validation phantoms (seeds 200000 + i), through the daemon's own path, choose the nodule
    threshold and minimum volume (most sensitivity for nodules >= 6 mm at no more than
    ``--max-fp-per-study`` false positives per study) and rewrite the ``nodule-det`` card;
    ``--candidates-cache DIR`` keeps what the model found per study, so a rerun is quick.
``evaluate``
    On held-out test phantoms (seeds 300000 + i) run ``scripts/evaluate_reference_models.py``,
    which writes the measured figures into both cards' ``[quality]`` tables.

Reproducible: every random choice is seeded (phantoms by seed, weights, batches and augmentation
by ``--seed``); a CPU run repeats bit for bit, a CUDA run up to cuDNN's non-deterministic kernels.
``--time-budget-minutes`` (for leased GPUs) shortens training to fit, and then the schedule follows
the clock, so a run it cuts is not repeatable; leave it out for a reproducible run.

One command does everything on a CUDA machine with the daemon's dependencies and torch::

    python3 scripts/train_reference_models.py

The shipped weights came from three leased-GPU runs (the last one fine-tuning nodule-det 1.0.0
into the 2.5-D 2.0.0, its single-slice weights inflated by ``training.nets.inflate_input``) and
CPU steps here; docs/models.md gives the exact commands. ``--stage train`` needs torch (the
``train`` extra); the other stages need the daemon's dependencies (and torch for ``export``);
every stage imports tqdm, a daemon dependency, for its progress bars (``--progress`` /
``--no-progress``; by default only when stderr is a terminal).
Training on a CPU works (``--device cpu``) but is slow: on the 2-core development machine one
nodule-det step of 8 slices takes ~5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/, for the training package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # imaging_ai without installing
sys.path.insert(2, str(Path(__file__).resolve().parents[1] / "devkit"))  # the development kit

from training.recipes import ENGINES, LUNG_SEG, NODULE_DET, RECIPES, Recipe

from imaging_ai import progress

NAMES = [r.name for r in RECIPES]
UNMEASURED = {"status": "trained; not yet evaluated (run scripts/evaluate_reference_models.py)"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; defaults are the settings of the shipped models."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--stage", choices=("all", "train", "export", "calibrate", "evaluate"), default="all"
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", type=Path, default=ENGINES, help="where --stage train writes")
    p.add_argument("--engines", type=Path, default=ENGINES, help="models to calibrate/evaluate")
    p.add_argument("--seed", type=int, default=20260101, help="weights, batches, augmentation")
    p.add_argument("--studies", type=int, default=400, help="training phantom studies")
    p.add_argument("--first-study", type=int, default=0, help="skip this many training seeds")
    p.add_argument("--models", nargs="+", choices=[r.name for r in RECIPES], default=NAMES)
    p.add_argument("--init-from", type=Path, help="start from DIR/<model>/weights.pt")
    p.add_argument("--monitor-studies", type=int, default=16, help="held-out slices for logs")
    p.add_argument("--lung-steps", type=int, default=3000)
    p.add_argument("--nodule-steps", type=int, default=4000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--workers", type=int, default=0, help="phantom processes (0: all CPUs)")
    p.add_argument(
        "--data-minutes",
        type=float,
        default=0.0,
        help="wall-clock cap of training-data generation (0: none); the studies done by then\n"
        "are used, the first of the seeds in order",
    )
    p.add_argument(
        "--time-budget-minutes",
        type=float,
        default=0.0,
        help="wall-clock cap of --stage train (0: none); training shortens to fit (see fit.py)",
    )
    p.add_argument("--calibration-studies", type=int, default=60)
    p.add_argument(
        "--candidates-cache",
        type=Path,
        help="keep each validation study's detections here (keyed by the ONNX digest), so\n"
        "calibrating again does not run the model again",
    )
    p.add_argument("--max-fp-per-study", type=float, default=1.0, help="calibration target")
    p.add_argument("--test-studies", type=int, default=30)
    p.add_argument("--timing-repeats", type=int, default=5)
    progress.add_argument(p)
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Generate data, train the models asked for, save their weights under ``args.out``."""
    import numpy as np
    import torch
    from training.data import TRAIN_SEEDS, VALIDATION_SEEDS, ModelGrid, build_samples
    from training.fit import FitConfig, fit, init_seed, to_device
    from training.nets import UNet, inflate_input, parameter_count

    workers = args.workers or len(os.sched_getaffinity(0))
    # The lung model's slices are only preprocessed when it is trained.
    lung_grid = ModelGrid(LUNG_SEG.preprocess) if LUNG_SEG.name in args.models else None
    grids = lung_grid, ModelGrid(NODULE_DET.preprocess)
    t0 = time.perf_counter()
    seeds = TRAIN_SEEDS[args.first_study : args.first_study + args.studies]
    monitor_seeds = VALIDATION_SEEDS[-args.monitor_studies :]
    monitor = build_samples(monitor_seeds, *grids, workers=workers, progress=args.progress)
    cap = t0 + args.data_minutes * 60 if args.data_minutes else None
    samples = build_samples(seeds, *grids, workers=workers, deadline=cap, progress=args.progress)
    seeds = seeds[: len(np.unique(samples.seeds))]
    # CUDA is touched only now: the phantom workers above were forked from a CUDA-free process.
    device = _device(args.device, torch)
    torch.backends.cudnn.benchmark = True
    log: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    log["data"] = {"seeds": f"{seeds[0]}-{seeds[-1]}", "slices": len(samples)}
    log["data"]["seconds"] = round(time.perf_counter() - t0, 1)
    positive = samples.nodule_y.reshape(len(samples), -1).max(1) > 0
    log["data"]["nodule_slices"] = int(positive.sum())
    print(f"data: {len(samples)} slices of {len(seeds)} studies ({log['data']['seconds']} s)")
    # Seconds left for training once the data exist, minus half a minute for exports; lung-seg, the
    # easier task, gets 40 % of them and nodule-det what lung-seg leaves.
    deadline = t0 + args.time_budget_minutes * 60 - 30 if args.time_budget_minutes else None
    shares = {LUNG_SEG.name: 0.4, NODULE_DET.name: 1.0}
    for recipe, xy, val, steps, positive in (
        (LUNG_SEG, (samples.lung_x, samples.lung_y), (monitor.lung_x, monitor.lung_y),
         args.lung_steps, 0.0),
        (NODULE_DET, (samples.nodule_x, samples.nodule_y), (monitor.nodule_x, monitor.nodule_y),
         args.nodule_steps, 0.5),
    ):  # fmt: skip
        if recipe.name not in args.models:
            continue
        init_seed(args.seed)
        model = UNet(recipe.net)
        if args.init_from:  # fine-tuning: the schedule restarts from these weights
            state = inflate_input(_weights(args.init_from, recipe, torch), recipe.net.in_channels)
            model.load_state_dict(state)
        model.to(device)
        guard = float("inf")
        if deadline is not None:
            guard = max(30.0, (deadline - time.perf_counter()) * shares[recipe.name])
        config = FitConfig(steps, args.batch, args.lr, args.seed, positive, guard)
        print(f"{recipe.name}: {parameter_count(model)} parameters, {steps} steps on {device}")
        x, y = (to_device(a, device) for a in xy)
        monitored = (to_device(val[0], device), to_device(val[1], device))
        fitted = fit(model, x, y, config, val=monitored, progress=args.progress)
        del x, y
        (args.out / recipe.name).mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out / recipe.name / "weights.pt")
        log[recipe.name] = {"parameters": parameter_count(model), **fitted.__dict__}
    (args.out / "training_log.json").write_text(json.dumps(log, indent=1), encoding="utf-8")
    return log


def _weights(folder: Path, recipe: Recipe, torch: Any) -> Any:
    """The state dict ``folder/<model>/weights.pt`` (loaded onto the CPU)."""
    return torch.load(folder / recipe.name / "weights.pt", map_location="cpu")


def export_models(args: argparse.Namespace) -> dict[str, Any]:
    """Build ONNX files and provisional cards under ``args.out`` from the saved weights.

    ``lung-seg`` is its U-Net. ``nodule-det`` is its U-Net gated by the lung U-Net's dilated lung
    field (:class:`training.nets.LungGatedDetector`), so it needs both weights. Weights are read
    from ``args.out`` (just trained) or else ``--init-from``.
    """
    import torch
    from training.export import export
    from training.nets import LungGatedDetector, UNet, inflate_input

    nets = {}
    for recipe in RECIPES:
        folder = args.out if (args.out / recipe.name / "weights.pt").exists() else args.init_from
        if folder is None:
            raise SystemExit(f"no weights for {recipe.name}: train it or give --init-from")
        nets[recipe.name] = UNet(recipe.net)
        state = inflate_input(_weights(folder, recipe, torch), recipe.net.in_channels)
        nets[recipe.name].load_state_dict(state)
        nets[recipe.name].eval()
    gated = LungGatedDetector(nets[NODULE_DET.name], nets[LUNG_SEG.name]).eval()
    out: dict[str, Any] = {}
    for recipe, model in ((LUNG_SEG, nets[LUNG_SEG.name]), (NODULE_DET, gated)):
        if recipe.name not in args.models:
            continue
        folder = args.out / recipe.name
        folder.mkdir(parents=True, exist_ok=True)
        shape = (recipe.net.in_channels, *recipe.preprocess.input_size)
        worst = export(model, shape, folder / "model.onnx")
        (folder / "model.toml").write_text(recipe.card_text(UNMEASURED), encoding="utf-8")
        size = (folder / "model.onnx").stat().st_size
        out[recipe.name] = {"onnx_bytes": size, "onnx_vs_torch_max_abs": worst}
        print(
            f"{recipe.name}: wrote {folder / 'model.onnx'} ({size} bytes, "
            f"|ORT - torch| {worst:.1e})"
        )
    return out


def _device(choice: str, torch: Any) -> Any:
    """The torch device asked for; ``auto`` takes CUDA when it is there."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """Choose the nodule threshold and minimum volume on validation phantoms; rewrite the card."""
    from training.data import VALIDATION_SEEDS
    from training.evaluation import (
        MIN_VOLUMES_MM3,
        THRESHOLDS,
        cached_candidates,
        choose_operating_point,
        format_table,
        load_models,
    )

    _, nodule = load_models(args.engines)
    seeds = VALIDATION_SEEDS[: args.calibration_studies]
    candidates = []
    for seed in progress.progress(seeds, desc="calibrate", unit="study", force=args.progress):
        candidates.append(cached_candidates(seed, nodule, THRESHOLDS, args.candidates_cache))
        progress.echo(f"  validation phantom {seed}: {len(candidates[-1].diameters)} nodules")
    target = args.max_fp_per_study
    t, v, table = choose_operating_point(candidates, THRESHOLDS, MIN_VOLUMES_MM3, target)
    row = next(r for r in table if r[0] == t and r[1] == v)
    chosen: dict[str, float | str] = {
        "validation_set": f"{len(seeds)} phantom studies, seeds {seeds[0]}-{seeds[-1]}",
        "validation_threshold": t,
        "validation_min_volume_mm3": v,
        "validation_sensitivity_6mm_plus": row[2],
        "validation_sensitivity_all": row[3],
        "validation_false_positives_per_study": row[4],
    }
    card = args.engines / NODULE_DET.name / "model.toml"
    text = NODULE_DET.card_text({**UNMEASURED, **chosen}, {"threshold": t, "min_volume_mm3": v})
    card.write_text(text, encoding="utf-8")
    print(format_table(table, (t, v)))
    return chosen


def evaluate(args: argparse.Namespace) -> None:
    """Measure on test phantoms and write the cards' quality (scripts/evaluate_reference_models)."""
    import evaluate_reference_models

    evaluate_reference_models.main(
        [
            "--engines",
            str(args.engines),
            "--studies",
            str(args.test_studies),
            "--timing-repeats",
            str(args.timing_repeats),
            "--write-cards",
        ]
    )


def card_quality(recipe: Recipe, engines: Path) -> dict[str, Any]:
    """The ``[quality]`` table now on ``recipe``'s card."""
    data = tomllib.loads((engines / recipe.name / "model.toml").read_text(encoding="utf-8"))
    return dict(data.get("quality", {}))


def main(argv: list[str] | None = None) -> int:
    """Run the stages asked for and print a short summary."""
    args = parse_args(argv)
    stages = {
        "all": ("train", "export", "calibrate", "evaluate"),
        "train": ("train", "export"),  # weights are only useful exported
    }.get(args.stage, (args.stage,))
    if "train" in stages:
        log = train(args)
        for name, entry in log.items():
            if name in NAMES:
                print(
                    f"{name}: {entry['parameters']} parameters, {entry['steps']} steps in "
                    f"{entry['seconds']:.0f} s, last check {entry['validation'][-1]}"
                )
    if "export" in stages:
        export_models(args)
    if "calibrate" in stages:
        calibrate(args)
    if "evaluate" in stages:
        evaluate(args)
        for recipe in RECIPES:
            print(f"{recipe.name}: {card_quality(recipe, args.engines)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
