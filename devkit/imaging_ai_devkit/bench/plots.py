"""Takes benchmark results and gives PNG plots: turnaround by stage, throughput vs batch size.

matplotlib (the ``dev`` extra) is imported only here, with the Agg backend, so the daemon and
the benchmarks' tables never need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from imaging_ai_devkit.bench.stages import StudyStages


class Cell(Protocol):
    """One measurement as plotted (`bench.engines.Cell`, which imports this module)."""

    @property
    def model(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def batch(self) -> int: ...
    @property
    def slices_per_s(self) -> float: ...


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[dev]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def turnaround_stages(studies: Sequence[StudyStages], path: Path, title: str) -> None:
    """One horizontal bar per study, its stages stacked left to right in pipeline order."""
    from imaging_ai_devkit.bench.stages import label

    plt = _pyplot()
    stages = list(dict.fromkeys(k for s in studies for k in s.stages))
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.45 * len(studies)))
    colours = plt.get_cmap("tab20").colors
    for row, study in enumerate(studies):
        left = 0.0
        for i, stage in enumerate(stages):
            width = max(0.0, study.stages.get(stage, 0.0))
            ax.barh(row, width, left=left, color=colours[i % len(colours)],
                    label=label(stage) if row == 0 else None)  # fmt: skip
            left += width
    ax.set_yticks(range(len(studies)), [f"study {i + 1}" for i in range(len(studies))])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the last instance received to SEG+SR stored in PACS")
    ax.set_title(title)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    _save(fig, path)


def throughput_vs_batch(cells: Sequence[Cell], path: Path, note: str) -> None:
    """Slices/s against batch size, one line per model and engine (log-scaled batch axis)."""
    plt = _pyplot()
    models = list(dict.fromkeys(c.model for c in cells))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for engine in dict.fromkeys(c.engine for c in cells if c.model == model):
            line = [c for c in cells if c.model == model and c.engine == engine]
            ax.plot([c.batch for c in line], [c.slices_per_s for c in line], "o-", label=engine)
        ax.set_xscale("log", base=2)
        batches = sorted({c.batch for c in cells if c.model == model})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (slices)")
        ax.set_ylabel("slices/s")
        ax.set_title(f"{model} ({note})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    fig.clear()
