"""`imaging-ai build-engines` arguments in; TensorRT plans built (or found cached), a table out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from imaging_ai import progress
from imaging_ai.errors import EngineError, ModelError
from imaging_ai.infer.tensorrt import TensorRTOptions, build_engines
from imaging_ai.modelcard import discover_models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the build-engines options to a (sub)parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The `build-engines` subcommand's parser; the caller may set `data_dir` from the
        configuration with `parser.set_defaults(data_dir=...)`.
    """
    defaults = TensorRTOptions()
    parser.add_argument(
        "--engines-dir",
        type=Path,
        default=Path("engines"),
        help="folder of model folders (default: engines)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the daemon's data folder; plans go to DATA_DIR/engines",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="build only this model (repeatable; default: all)",
    )
    parser.add_argument("--precision", choices=("fp32", "fp16"), default=defaults.precision)
    parser.add_argument("--max-batch", type=int, default=defaults.max_batch_size)
    parser.add_argument("--opt-batch", type=int, default=defaults.opt_batch_size)
    parser.add_argument("--workspace-gib", type=float, default=defaults.workspace_bytes / 2**30)
    parser.add_argument("--optimization-level", type=int, default=None, choices=range(6))
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    parser.add_argument("--force", action="store_true", help="rebuild cached plans too")
    progress.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Build the engines the arguments ask for and print one line per model.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed with the options of `add_arguments`.

    Returns
    -------
    int
        0 on success, 1 when a model, TensorRT or the GPU failed (the reason is on stderr),
        2 when the arguments are incomplete.
    """
    if args.data_dir is None:
        print("build-engines: --data-dir is required", file=sys.stderr)
        return 2
    options = TensorRTOptions(
        precision=args.precision,
        max_batch_size=args.max_batch,
        opt_batch_size=args.opt_batch,
        workspace_bytes=int(args.workspace_gib * 2**30),
        device_id=args.device,
        optimization_level=args.optimization_level,
    )
    try:
        cards = discover_models(args.engines_dir)
        unknown = sorted(set(args.model) - {card.name for card in cards})
        if unknown:
            raise ModelError(f"no model named {', '.join(unknown)} in {args.engines_dir}")
        chosen = [card for card in cards if not args.model or card.name in args.model]
        # A bar per model (a build takes minutes); the build's log records print above it.
        bar = progress.progress(chosen, desc="build-engines", unit="model", force=args.progress)
        with progress.logs_above_bars(), bar:
            results = build_engines(bar, args.data_dir, options, force=args.force)
    except (EngineError, ModelError) as exc:
        print(f"build-engines: {exc}", file=sys.stderr)
        return 1
    for result in results:
        status = f"built in {result.seconds:.0f} s" if result.built else "cached"
        print(f"{result.model:<24} {status:<16} {result.plan}")
    return 0
