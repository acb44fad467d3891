"""Takes the command line and gives the `imaging-ai` subcommands (serve, phantom, db, bench)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from imaging_ai import __version__
from imaging_ai.config import BACKENDS, Config, load_config
from imaging_ai.errors import ImagingAIError
from imaging_ai.logs import setup_logging

log = logging.getLogger("imaging_ai")


def _config(args: argparse.Namespace) -> Config:
    path = Path(args.config) if getattr(args, "config", None) else None
    return load_config(path)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon."""
    from imaging_ai.pipeline import run_daemon

    config = _config(args)
    setup_logging(config.logging.level)
    run_daemon(config)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Apply database migrations."""
    from imaging_ai.db.session import make_engine, upgrade

    config = _config(args)
    setup_logging(config.logging.level)
    Path(config.storage.data_dir).mkdir(parents=True, exist_ok=True)
    engine = make_engine(config.storage.resolved_database_url)
    upgrade(engine)
    print(f"database at {engine.url.render_as_string(hide_password=True)} is up to date")
    return 0


def cmd_phantom(args: argparse.Namespace) -> int:
    """Write a synthetic chest CT study."""
    from imaging_ai.phantom.cli import run

    return run(args)


def cmd_infer(args: argparse.Namespace) -> int:
    """Analyse one study folder and write labels.nii.gz and findings.json."""
    from imaging_ai.analyse import analyse_study, load_models, write_outputs

    config = _config(args)
    setup_logging(config.logging.level)
    engines = config.engines
    if args.engines_dir:
        engines = replace(engines, dir=str(args.engines_dir))
    if args.backend:
        engines = replace(engines, backend=args.backend)
    models = load_models(engines, Path(config.storage.data_dir))
    files = sorted(p for p in Path(args.study_dir).rglob("*") if p.is_file())
    analysis = analyse_study(files, models)
    write_outputs(analysis, Path(args.out))
    sizes = ", ".join(f"{lesion.long_axis_mm:.1f} mm" for lesion in analysis.lesions)
    seconds = sum(analysis.timings_s.values())
    print(
        f"{len(analysis.lesions)} lesion(s) [{sizes}] in {analysis.volume.hu.shape[0]} slices, "
        f"{seconds:.1f} s on {models.backend}; wrote {args.out}/labels.nii.gz and findings.json"
    )
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Score the analysis on local cases with references."""
    from imaging_ai.evaluate.cli import run

    setup_logging("WARNING")
    return run(args)


def cmd_build_engines(args: argparse.Namespace) -> int:
    """Build TensorRT engines ahead of time."""
    from imaging_ai.infer.cli import run

    setup_logging("INFO")
    return run(args)


def cmd_bench_ingest(args: argparse.Namespace) -> int:
    """Benchmark ingest against DCMTK storescp."""
    from imaging_ai.bench.ingest import run

    setup_logging("WARNING")
    return run(args)


def cmd_bench_schedule(args: argparse.Namespace) -> int:
    """Benchmark the urgent study's turnaround under load."""
    from imaging_ai.bench.schedule import run

    setup_logging("WARNING")
    return run(args)


def cmd_bench_turnaround(args: argparse.Namespace) -> int:
    """Benchmark one study's turnaround through Orthanc, by stage."""
    from imaging_ai.bench.turnaround import run

    setup_logging("WARNING")
    return run(args)


def cmd_bench_sustained(args: argparse.Namespace) -> int:
    """Benchmark capacity and deadline misses under a mixed-priority stream."""
    from imaging_ai.bench.sustained import run

    setup_logging("WARNING")
    return run(args)


def cmd_bench_engines(args: argparse.Namespace) -> int:
    """Benchmark the inference backends against PyTorch eager."""
    from imaging_ai.bench.engines import run

    setup_logging("WARNING")
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="imaging-ai", description=__doc__)
    parser.add_argument("--version", action="version", version=f"imaging-ai {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", help="TOML configuration file")
    serve.set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_upgrade = db_sub.add_parser("upgrade", help="apply migrations up to the newest")
    db_upgrade.add_argument("--config", help="TOML configuration file")
    db_upgrade.set_defaults(func=cmd_db_upgrade)

    from imaging_ai.phantom.cli import add_arguments as phantom_arguments

    phantom = sub.add_parser("phantom", help="write a synthetic chest CT study")
    phantom_arguments(phantom)
    phantom.set_defaults(func=cmd_phantom)

    infer = sub.add_parser("infer", help="analyse one study folder (labels.nii.gz, findings.json)")
    infer.add_argument("study_dir", type=Path, help="folder of the study's DICOM files")
    infer.add_argument("--out", type=Path, required=True, help="output folder")
    infer.add_argument("--config", help="TOML configuration file ([engines] is used)")
    infer.add_argument("--engines-dir", type=Path, help="folder of model folders")
    infer.add_argument("--backend", choices=BACKENDS, help="force an inference backend")
    infer.set_defaults(func=cmd_infer)

    from imaging_ai.evaluate.cli import add_arguments as evaluate_arguments

    evaluate = sub.add_parser(
        "evaluate", help="score the analysis on local cases (summary.json, froc.png, table)"
    )
    evaluate_arguments(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)

    from imaging_ai.infer.cli import add_arguments as build_arguments

    build = sub.add_parser("build-engines", help="build TensorRT engines ahead of time")
    build_arguments(build)
    build.set_defaults(func=cmd_build_engines)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from imaging_ai.bench.ingest import add_arguments as ingest_arguments

    ingest = bench_sub.add_parser("ingest", help="images/s into the daemon vs DCMTK storescp")
    ingest_arguments(ingest)
    ingest.set_defaults(func=cmd_bench_ingest)
    from imaging_ai.bench.schedule import add_arguments as schedule_arguments

    schedule = bench_sub.add_parser("schedule", help="urgent turnaround under load vs idle")
    schedule_arguments(schedule)
    schedule.set_defaults(func=cmd_bench_schedule)
    from imaging_ai.bench.turnaround import add_arguments as turnaround_arguments

    turnaround = bench_sub.add_parser(
        "turnaround", help="last instance in to results in PACS, by stage (Orthanc pushing)"
    )
    turnaround_arguments(turnaround)
    turnaround.set_defaults(func=cmd_bench_turnaround)
    from imaging_ai.bench.sustained import add_arguments as sustained_arguments

    sustained = bench_sub.add_parser(
        "sustained", help="capacity, then deadline misses per class at 80%% of it"
    )
    sustained_arguments(sustained)
    sustained.set_defaults(func=cmd_bench_sustained)
    from imaging_ai.bench.engines import add_arguments as engines_arguments

    engines = bench_sub.add_parser(
        "engines", help="slices/s per backend and batch size vs PyTorch eager FP32"
    )
    engines_arguments(engines)
    engines.set_defaults(func=cmd_bench_engines)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `imaging-ai` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ImagingAIError as exc:
        print(f"imaging-ai: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
