"""Takes an extension point's name and gives what installed packages registered there.

The daemon has three extension points, each an entry-point group. A hospital's install fills
none of them; the development kit (``devkit/``, package ``imaging_ai_devkit``) fills all three
for the tests and the benchmarks:

``imaging_ai.commands``
    Callables ``(subparsers) -> None`` that add `imaging-ai` subcommands (`phantom`, `bench`).
``imaging_ai.backends``
    Callables ``(setting) -> Backend`` for a worker's backend setting ``NAME:OPTIONS``, by
    ``NAME`` (the kit's ``fake:latency=...``). `[engines] backend` in a config file never
    reaches them: it accepts only the shipped backends.
``imaging_ai.faults``
    At most one callable ``(value) -> FaultPlan`` (`imaging_ai.faults`) for
    ``IMAGING_AI_FAULT``.

Where the kit is importable but not installed (its folder on ``sys.path``, as the device
scripts put it), its entry points are read from its ``pyproject.toml``, so the two ways agree.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tomllib
from pathlib import Path

COMMANDS = "imaging_ai.commands"
BACKENDS = "imaging_ai.backends"
FAULTS = "imaging_ai.faults"
DEVKIT = "imaging_ai_devkit"
DEVKIT_DISTRIBUTION = "imaging-ai-devkit"
DEVKIT_HINT = "the development kit has it (pip install -e ./devkit; never on a hospital's server)"
# The kit's commands, named so that a missing kit gets a plain hint, not "invalid choice".
DEVKIT_COMMANDS = ("phantom", "bench")


def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The entry points registered in ``group``, sorted by name."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}
    for ep in _source_devkit(group):
        found.setdefault(ep.name, ep)
    return [found[name] for name in sorted(found)]


def find(group: str, name: str) -> importlib.metadata.EntryPoint | None:
    """The entry point ``name`` of ``group``, or None when nothing registered it."""
    return next((ep for ep in entry_points(group) if ep.name == name), None)


def _source_devkit(group: str) -> list[importlib.metadata.EntryPoint]:
    """The group's entries in the kit's pyproject.toml where it is importable, not installed."""
    try:
        importlib.metadata.distribution(DEVKIT_DISTRIBUTION)
        return []  # installed: its entry points are in its metadata
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(DEVKIT)
    if spec is None or spec.origin is None:
        return []
    pyproject = Path(spec.origin).parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        return []
    table = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    entries: dict[str, str] = table.get("project", {}).get("entry-points", {}).get(group, {})
    return [importlib.metadata.EntryPoint(n, v, group) for n, v in entries.items()]
