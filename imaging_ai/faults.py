"""Takes IMAGING_AI_FAULT at start and gives the daemon's fault hooks: no-ops unless it is set.

The reliability tests (``tests/reliability``) kill the daemon at an exact stage boundary
instead of racing a timer, or break a part while it runs on; ``docs/reliability.md`` lists what
is durable at each point. The daemon only calls the hooks: `reach` at each of `POINTS`, and
`engine_factory` when it builds its inference workers. What they do is a fault plan, which the
development kit registers (entry-point group ``imaging_ai.faults``, `imaging_ai.plugins`). The
variable is read once, by :func:`arm` when the daemon starts; with no plan installed, or a value
the plan does not know, a set variable stops the start. A hospital never sets it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from imaging_ai import plugins
from imaging_ai.errors import ConfigError
from imaging_ai.infer.base import EngineFactory

ENV = "IMAGING_AI_FAULT"
POINTS = {
    "before:claim": "a queued job was found, before its claim commits (it stays queued)",
    "before:preprocess": "a job was claimed (its lease held), before its files are read",
    "in:batch": "a batch was sent to an inference worker, before its result came back",
    "after:postprocess": "the analysis (postprocessing included) finished, before any output",
    "after:outputs": "SEG, SR and ORU files written, before the report and deliveries commit",
    "after:deliver": "a destination confirmed a delivery, before the row is marked done",
}


class FaultPlan(Protocol):
    """What an armed fault does to the daemon; the development kit has the only plans."""

    def reach(self, point: str) -> None:
        """Called at each of `POINTS` as the daemon passes it (a plan may SIGKILL there)."""

    def engine_factory(self, cpu_threads: int, max_batch_size: int) -> EngineFactory | None:
        """Engines that replace the workers' own, on at least one GPU worker; None keeps them."""


class _NoFaults:
    """The daemon's plan unless IMAGING_AI_FAULT is set: nothing happens."""

    def reach(self, point: str) -> None:
        """Nothing."""

    def engine_factory(self, cpu_threads: int, max_batch_size: int) -> EngineFactory | None:
        """None: the workers keep their engines."""
        return None


_plan: FaultPlan = _NoFaults()


def arm(environ: Mapping[str, str]) -> None:
    """Read the fault from ``environ`` (once, at start); no variable, or an empty one, disarms.

    Raises
    ------
    ConfigError
        The variable is set and no fault plan is installed, or the plan refuses its value.
    """
    global _plan
    value = environ.get(ENV, "")
    if not value:
        _plan = _NoFaults()
        return
    registered = plugins.entry_points(plugins.FAULTS)
    if not registered:
        raise ConfigError(
            f"{ENV}={value!r} is set, but fault injection is not installed: {plugins.DEVKIT_HINT}"
        )
    if len(registered) > 1:
        names = ", ".join(ep.value for ep in registered)
        raise ConfigError(f"{ENV}: more than one fault plan is installed ({names})")
    make_plan: Callable[[str], FaultPlan] = registered[0].load()
    _plan = make_plan(value)


def reach(point: str) -> None:
    """Tell the armed plan the daemon is at ``point`` (one of `POINTS`)."""
    _plan.reach(point)


def engine_factory(cpu_threads: int, max_batch_size: int) -> EngineFactory | None:
    """The armed plan's engines for the inference workers, or None to keep theirs."""
    return _plan.engine_factory(cpu_threads, max_batch_size)
