"""Takes the `imaging-ai` subcommand parsers and adds the kit's commands: phantom and bench.

Registered for the daemon's ``imaging_ai.commands`` extension point (`imaging_ai.plugins`), so
`imaging-ai phantom` and `imaging-ai bench ...` exist wherever the kit is installed, and only there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

from imaging_ai.logs import setup_logging

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_phantom(sub: Subparsers) -> None:
    """Add `imaging-ai phantom` to ``sub``."""
    from imaging_ai_devkit.phantom.cli import add_arguments

    phantom = sub.add_parser("phantom", help="write a synthetic chest CT study (development kit)")
    add_arguments(phantom)
    phantom.set_defaults(func=cmd_phantom)


def cmd_phantom(args: argparse.Namespace) -> int:
    """Write a synthetic chest CT study."""
    from imaging_ai_devkit.phantom.cli import run

    return run(args)


def add_bench(sub: Subparsers) -> None:
    """Add `imaging-ai bench` and its benchmarks to ``sub``."""
    from imaging_ai_devkit.bench import engines, ingest, schedule, sustained, turnaround

    bench = sub.add_parser("bench", help="benchmarks (development kit)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    benchmarks = (
        ("ingest", "images/s into the daemon vs DCMTK storescp", ingest.add_arguments, ingest.run),
        ("schedule", "urgent turnaround under load vs idle", schedule.add_arguments, schedule.run),
        (
            "turnaround",
            "last instance in to results in PACS, by stage (Orthanc pushing)",
            turnaround.add_arguments,
            turnaround.run,
        ),
        (
            "sustained",
            "capacity, then deadline misses per class at 80%% of it",
            sustained.add_arguments,
            sustained.run,
        ),
        (
            "engines",
            "slices/s per backend and batch size vs PyTorch eager FP32",
            engines.add_arguments,
            engines.run,
        ),
    )
    for name, text, add_arguments, run in benchmarks:
        parser = bench_sub.add_parser(name, help=text)
        add_arguments(parser)
        parser.set_defaults(func=_quiet(run))


def _quiet(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with the daemon's logging at WARNING, as every benchmark wants it."""

    def command(args: argparse.Namespace) -> int:
        setup_logging("WARNING")
        return run(args)

    return command
