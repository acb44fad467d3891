"""Takes an iterable or a total, gives a tqdm progress bar on stderr for the interactive commands.

The rule every command follows (evaluate, build-engines, the training scripts, and the
development kit's phantom and bench): a bar only when stderr is a terminal, unless the command
line forces it (``--progress``) or turns it off (``--no-progress``); a pipe, a file or the
journal gets the command's own lines only, the same with a bar or without. ``imaging-ai serve``
never draws one: the daemon's progress is its log, its status page and its metrics.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]
from tqdm.contrib.logging import logging_redirect_tqdm  # type: ignore[import-untyped]

from imaging_ai import redact


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--progress`` / ``--no-progress`` (dest ``progress``, default None: the TTY rule)."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: only when stderr is a terminal)",
    )


def shown(force: bool | None = None) -> bool:
    """Whether a bar is drawn: ``force`` when given, else whether stderr is a terminal."""
    if force is not None:
        return force
    return sys.stderr.isatty()


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str,
    unit: str = "it",
    force: bool | None = None,
) -> Any:
    """A tqdm bar on stderr over ``iterable`` (or counting to ``total`` with ``update``).

    Parameters
    ----------
    iterable : Iterable, optional
        What to iterate over; its length is the total unless ``total`` is given.
    total : int, optional
        The count to reach, for a bar advanced with ``bar.update(n)``.
    desc, unit : str
        The bar's label and what it counts ("case", "model", "step").
    force : bool, optional
        True or False from ``--progress`` / ``--no-progress``; None for the TTY rule.

    Returns
    -------
    tqdm
        Disabled (iterating, counting and ``write`` still work, nothing is drawn) where
        :func:`shown` says no. Lines printed while it is drawn go through :func:`echo`.
    """
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not shown(force),
        dynamic_ncols=True,
    )


def echo(line: str) -> None:
    """Print ``line`` to stdout above any bars being drawn, flushed (a log file being followed
    sees it at once)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


@contextmanager
def logs_above_bars() -> Iterator[None]:
    """Route the root logger's console output through tqdm, so records print above the bars."""
    with logging_redirect_tqdm(tqdm_class=tqdm):
        # tqdm's handler copies the formatter; the redacting filter is put on it here too,
        # whatever tqdm copies (older versions copied no filters).
        redact.install()
        yield
