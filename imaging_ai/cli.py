"""Takes the command line and gives the `imaging-ai` subcommands (serve, phantom, db, bench)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from imaging_ai import __version__
from imaging_ai.config import Config, load_config
from imaging_ai.errors import ImagingAIError

log = logging.getLogger("imaging_ai")


def setup_logging(level: str) -> None:
    """Log to stderr; pynetdicom stays at WARNING because its debug output dumps datasets."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("pynetdicom").setLevel(logging.WARNING)


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


def cmd_bench_ingest(args: argparse.Namespace) -> int:
    """Benchmark ingest against DCMTK storescp."""
    from imaging_ai.bench.ingest import run

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

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from imaging_ai.bench.ingest import add_arguments as ingest_arguments

    ingest = bench_sub.add_parser("ingest", help="images/s into the daemon vs DCMTK storescp")
    ingest_arguments(ingest)
    ingest.set_defaults(func=cmd_bench_ingest)
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
