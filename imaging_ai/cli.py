"""Takes the command line and gives the `imaging-ai` subcommands (serve, db, infer, evaluate...).

Installed packages add more through the ``imaging_ai.commands`` extension point
(`imaging_ai.plugins`): the development kit adds `phantom` and `bench`. They are looked up only
when the command line names none of the daemon's own, so `imaging-ai serve` never imports them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeAlias

from imaging_ai import __version__, plugins
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
    setup_logging(config.logging.level, config.logging.format)
    run_daemon(config)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Apply database migrations."""
    from imaging_ai.db.session import make_engine, upgrade

    config = _config(args)
    setup_logging(config.logging.level, config.logging.format)
    Path(config.storage.data_dir).mkdir(parents=True, exist_ok=True)
    engine = make_engine(config.storage.resolved_database_url)
    upgrade(engine)
    print(f"database at {engine.url.render_as_string(hide_password=True)} is up to date")
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    """Analyse one study folder and write labels.nii.gz and findings.json."""
    from imaging_ai.analyse import analyse_study, load_models, write_outputs

    config = _config(args)
    setup_logging(config.logging.level, config.logging.format)
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


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser with the daemon's subcommands, and installed ones.

    Installed subcommands are looked up only where ``argv`` names none of the daemon's own.
    """
    parser = argparse.ArgumentParser(
        prog="imaging-ai",
        description="A hospital-intranet daemon: CT studies in, AI results to PACS and RIS.",
    )
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

    if not argv or argv[0] not in sub.choices:
        _add_extension_commands(parser, sub)
    return parser


def _add_extension_commands(parser: argparse.ArgumentParser, sub: Subparsers) -> None:
    """Let each ``imaging_ai.commands`` entry point add its subcommands to ``sub``."""
    entries = plugins.entry_points(plugins.COMMANDS)
    for entry in entries:
        add: Callable[[Subparsers], None] = entry.load()
        add(sub)
    if not entries:
        names = " and ".join(plugins.DEVKIT_COMMANDS)
        parser.epilog = f"{names} are not installed: {plugins.DEVKIT_HINT}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `imaging-ai` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    if argv and argv[0] in plugins.DEVKIT_COMMANDS and not plugins.entry_points(plugins.COMMANDS):
        print(
            f"imaging-ai: error: {argv[0]} is not installed: {plugins.DEVKIT_HINT}", file=sys.stderr
        )
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ImagingAIError as exc:
        print(f"imaging-ai: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
