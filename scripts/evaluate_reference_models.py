#!/usr/bin/env python3
"""Measure the shipped models on held-out phantoms through the daemon's path; optionally write
the figures into their cards.

For each test seed (300000 + i, never used in training or calibration) a full chest phantom is
generated with the training distribution of protocols (1–5 mm slices, fields of view, noise,
kernels, contrast, patient sizes, 3–12 nodules of 3.5–30 mm, solid, sub-solid and juxtapleural),
and :func:`imaging_ai.analyse.analyse` runs both models on it with ONNX Runtime on the CPU (two
intra-op threads), as the daemon does. Printed: Dice per lung, nodule sensitivity per size and
false positives per study; then the time for a 300-slice 512x512 study, preprocessing and
postprocessing included, best and median of ``--timing-repeats`` runs.

    .venv/bin/python scripts/evaluate_reference_models.py                  # 30 studies, print
    .venv/bin/python scripts/evaluate_reference_models.py --write-cards    # and update [quality]
    .venv/bin/python scripts/evaluate_reference_models.py --studies 5 --timing-repeats 0
    .venv/bin/python scripts/evaluate_reference_models.py --timing-only --write-cards  # retime
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/, for the training package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # imaging_ai without installing
sys.path.insert(2, str(Path(__file__).resolve().parents[1] / "devkit"))  # the development kit

from training.data import TEST_SEEDS
from training.evaluation import (
    MIN_VOLUMES_MM3,
    THRESHOLDS,
    StudyResult,
    cached_candidates,
    evaluate,
    format_table,
    load_models,
    operating_table,
    rewrite_quality,
    summarise,
    time_study,
)
from training.recipes import ENGINES, quality_table

from imaging_ai.infer.base import LoadedModel


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=Path, default=ENGINES)
    p.add_argument("--studies", type=int, default=30, help="held-out test phantoms")
    p.add_argument("--first-seed", type=int, default=TEST_SEEDS[0])
    p.add_argument("--timing-repeats", type=int, default=5, help="0 skips the timing")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--write-cards", action="store_true", help="rewrite both cards' [quality]")
    p.add_argument(
        "--timing-only",
        action="store_true",
        help="instead: only the 300-slice timing; with --write-cards only the cards' cpu_*\n"
        "figures change (quality does not depend on the machine's load; timing does)",
    )
    p.add_argument("--json", type=Path, help="also write every figure and study here")
    p.add_argument(
        "--candidates-cache",
        type=Path,
        help="with --operating-points: keep each study's detections here (see\n"
        "train_reference_models.py --candidates-cache)",
    )
    p.add_argument(
        "--operating-points",
        action="store_true",
        help="instead: sensitivity and FP/study at every threshold and minimum volume that\n"
        "calibration chooses among, on these seeds (for information; changes no card)",
    )
    return p.parse_args(argv)


def _show(r: StudyResult) -> None:
    found = sum(r.found)
    print(
        f"  seed {r.seed}: {r.slices:3d} x {r.thickness_mm:g} mm  dice R {r.dice_right:.4f} "
        f"L {r.dice_left:.4f}  nodules {found}/{len(r.found)}  FP {r.false_positives}  "
        f"{r.seconds:.1f} s",
        flush=True,
    )


def print_summary(s: dict[str, Any], timing: dict[str, Any]) -> None:
    """The short table."""
    print("\nheld-out phantoms:", s["studies"], "studies,", s["slices"], "slices")
    print(f"  Dice right lung  {s['dice_right_lung']:.4f} (mean {s['dice_right_lung_mean']:.4f}, "
          f"worst study {s['dice_right_lung_min']:.4f})")  # fmt: skip
    print(f"  Dice left lung   {s['dice_left_lung']:.4f} (mean {s['dice_left_lung_mean']:.4f}, "
          f"worst study {s['dice_left_lung_min']:.4f})")  # fmt: skip
    print(f"  sensitivity >= 6 mm  {s['sensitivity_6mm_plus']:.3f} of {s['nodules_6mm_plus']}")
    for key, value in s.items():
        if key.startswith("sensitivity_") and key != "sensitivity_6mm_plus":
            count = s[key.replace("sensitivity", "nodules")]
            print(f"  {key:24s} {value:.3f} of {count}")
    print(f"  false positives per study  {s['false_positives_per_study']:.2f} "
          f"(most in one study: {s['false_positives_max_study']})")  # fmt: skip
    if timing:
        print(f"  300x512x512 study on {timing['threads']} CPU threads: best "
              f"{timing['best_s']:.1f} s, median {timing['median_s']:.1f} s of {timing['runs']} "
              f"runs; stages of the best {timing['stages']}")  # fmt: skip


def card_tables(
    s: dict[str, Any], timing: dict[str, Any], seeds: str, engines: Path
) -> dict[str, dict[str, Any]]:
    """The two ``[quality]`` tables (the nodule card keeps its ``validation_*`` entries)."""
    test_set = f"{s['studies']} held-out synthetic phantom studies ({s['slices']} slices), {seeds}"
    how = "scripts/evaluate_reference_models.py (imaging_ai.analyse, ONNX Runtime CPU)"
    speed = speed_table(timing)
    lung = {k: round(s[k], 4) for k in s if k.startswith("dice_")}
    nodule: dict[str, Any] = {
        k: round(v, 3) if isinstance(v, float) else v
        for k, v in s.items()
        if k.startswith(("sensitivity_", "nodules_", "false_positives_"))
    }
    nodule["hit_rule"] = "detection centre within max(5 mm, radius) of the nodule centre"
    old = tomllib.loads((engines / "nodule-det" / "model.toml").read_text(encoding="utf-8"))
    kept = {k: v for k, v in old.get("quality", {}).items() if k.startswith("validation_")}
    common = {"test_set": test_set, "measured_with": how, **speed}
    return {"lung-seg": {**lung, **common}, "nodule-det": {**nodule, **common, **kept}}


def speed_table(timing: dict[str, Any]) -> dict[str, Any]:
    """The cards' ``cpu_*`` entries from :func:`measure_time`'s figures (none without them)."""
    if not timing:
        return {}
    return {
        "cpu_seconds_300x512x512_study_best": round(timing["best_s"], 1),
        "cpu_seconds_300x512x512_study_median": round(timing["median_s"], 1),
        "cpu_timing": f"both models, pre- and postprocessing, {timing['threads']} ORT threads, "
        f"{timing['runs']} runs on the development machine",
    }


def print_operating_points(seeds: range, nodule: LoadedModel, cache: Path | None) -> int:
    """Print the operating-point table of the detector over ``seeds``."""
    print(f"operating points on {len(seeds)} phantoms (seeds {seeds[0]}-{seeds[-1]})")
    candidates = [cached_candidates(seed, nodule, THRESHOLDS, cache) for seed in seeds]
    label = nodule.card.labels[0]
    table = operating_table(candidates, THRESHOLDS, MIN_VOLUMES_MM3)
    print(format_table(table, (label.threshold, label.min_volume_mm3)))
    return 0


def measure_time(
    lung: LoadedModel, nodule: LoadedModel, repeats: int, threads: int
) -> dict[str, Any]:
    """Seconds for the 300-slice study, ``repeats`` times (an empty dict for none)."""
    if repeats <= 0:
        return {}
    runs, stages = time_study(lung, nodule, repeats)
    timing: dict[str, Any] = {"runs": len(runs), "threads": threads, "seconds": runs}
    timing |= {"best_s": min(runs), "median_s": statistics.median(runs)}
    timing["stages"] = {k: round(v, 2) for k, v in stages.items()}
    return timing


def retime(args: argparse.Namespace, lung: LoadedModel, nodule: LoadedModel) -> int:
    """``--timing-only``: time the study; with ``--write-cards`` replace the cards' cpu_* keys."""
    timing = measure_time(lung, nodule, max(1, args.timing_repeats), args.threads)
    print(f"300x512x512 study on {timing['threads']} CPU threads: best {timing['best_s']:.1f} s, "
          f"median {timing['median_s']:.1f} s of {timing['runs']} runs {timing['seconds']}; "
          f"stages of the best {timing['stages']}")  # fmt: skip
    if args.write_cards:
        for name in ("lung-seg", "nodule-det"):
            path = args.engines / name / "model.toml"
            old = tomllib.loads(path.read_text(encoding="utf-8")).get("quality", {})
            rewrite_quality(path, quality_table({**old, **speed_table(timing)}))
        print("wrote the timing into [quality] of lung-seg, nodule-det")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Evaluate, print, and with ``--write-cards`` update the cards."""
    args = parse_args(argv)
    lung, nodule = load_models(args.engines, args.threads)
    seeds = range(args.first_seed, args.first_seed + args.studies)
    if args.operating_points:
        return print_operating_points(seeds, nodule, args.candidates_cache)
    if args.timing_only:
        return retime(args, lung, nodule)
    print(f"evaluating {args.studies} held-out phantoms (seeds {seeds[0]}-{seeds[-1]})")
    results = evaluate(seeds, lung, nodule, progress=_show)
    summary = summarise(results)
    timing = measure_time(lung, nodule, args.timing_repeats, args.threads)
    print_summary(summary, timing)
    tables = card_tables(summary, timing, f"seeds {seeds[0]}-{seeds[-1]}", args.engines)
    if args.write_cards:
        for name, table in tables.items():
            rewrite_quality(args.engines / name / "model.toml", quality_table(table))
        print("wrote [quality] of", ", ".join(tables))
    if args.json:
        detail = {"summary": summary, "timing": timing, "studies": [r.__dict__ for r in results]}
        args.json.write_text(json.dumps(detail, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
