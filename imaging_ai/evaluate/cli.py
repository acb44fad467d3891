"""``imaging-ai evaluate``: takes command-line options, gives the evaluation's files and table."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from imaging_ai import progress

DEFAULT_CONFIG = Path("deploy/imaging-ai.dev.toml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the evaluate command's arguments to ``parser``."""
    parser.add_argument("cases", type=Path, help="folder with one sub-folder per case")
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument(
        "--config",
        type=Path,
        help=f"TOML configuration ([engines] and [storage] are used; default {DEFAULT_CONFIG} "
        "when present, else the built-in defaults)",
    )
    progress.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Evaluate every case; write the outputs and print the table."""
    from imaging_ai.analyse import load_models
    from imaging_ai.config import load_config
    from imaging_ai.evaluate.report import draw_froc, table, write_summary
    from imaging_ai.evaluate.run import case_summary, evaluate_folder, froc_of, overall_summary

    started = time.perf_counter()
    path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    config = load_config(path)
    models = load_models(config.engines, Path(config.storage.data_dir))
    with progress.logs_above_bars():
        results = evaluate_folder(args.cases, models, args.out, progress=args.progress)
    cases = [case_summary(r) for r in results]
    overall = overall_summary(results)
    summary = write_summary(args.out, cases, overall)
    draw_froc(froc_of(results), args.out / "froc.png", f"{args.cases.name}: {len(results)} case(s)")
    print(table(cases, overall))
    print(
        f"{time.perf_counter() - started:.1f} s on {models.backend}; wrote {summary}, "
        f"{args.out / 'froc.png'} and {args.out / 'cases'}/",
        file=sys.stderr,
    )
    return 0
