"""Takes turnaround samples and gives percentiles (`imaging_ai.stats`, nearest rank) and small
inline SVG charts (no chart library).

The SVG uses presentation attributes only, no ``style``, so the page's Content-Security-Policy
(no inline styles) holds; every number is formatted here, so nothing from the database reaches
the markup unescaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup, escape

from imaging_ai.stats import quantile

WIDTH, HEIGHT = 300, 110
LEFT, RIGHT, TOP, BOTTOM = 34, 6, 8, 18


@dataclass(frozen=True)
class Bucket:
    """Percentiles of one time bucket; None where no study finished in it."""

    p50: float | None
    p95: float | None
    count: int


def quantile_or_none(values: Sequence[float], q: float) -> float | None:
    """`imaging_ai.stats.quantile` of ``values``, or None where there are none."""
    return quantile(values, q) if values else None


def buckets(
    samples: Sequence[tuple[datetime, float]], now: datetime, span: timedelta, count: int
) -> list[Bucket]:
    """Split ``samples`` (finished at, seconds) in the ``span`` before ``now`` into buckets."""
    width = span / count
    grouped: list[list[float]] = [[] for _ in range(count)]
    for at, seconds in samples:
        index = int((at - (now - span)) / width)
        if 0 <= index < count:
            grouped[index].append(seconds)
    return [Bucket(quantile_or_none(g, 0.5), quantile_or_none(g, 0.95), len(g)) for g in grouped]


def turnaround_chart(title: str, series: Sequence[Bucket], sla_s: float, span: str) -> Markup:
    """A bar chart: p95 (light) and p50 (dark) per bucket, the SLA as a dashed line.

    Parameters
    ----------
    title
        What the chart shows, read by screen readers and shown as a tooltip.
    series
        The buckets, oldest first.
    sla_s
        The class's SLA in seconds (the dashed line).
    span
        Words for the left end of the time axis, e.g. "24 h ago".
    """
    scale = _Scale(max([sla_s, *(b.p95 or 0.0 for b in series)]) * 1.15)
    sla_y = scale.y(sla_s)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
        _line(scale.bottom, "#888"),
        *_bars(series, scale),
        _line(sla_y, "#c0392b", ' stroke-dasharray="4 3"'),
        _text(WIDTH - RIGHT - 62, sla_y - 3, f"SLA {duration(sla_s)}", "#c0392b"),
        _text(2, TOP + 8, duration(scale.top), "#555"),
        _text(2, scale.bottom, "0", "#555"),
        _text(LEFT, HEIGHT - 4, span, "#555"),
        _text(WIDTH - RIGHT - 22, HEIGHT - 4, "now", "#555"),
        "</svg>",
    ]
    return Markup("".join(parts))


@dataclass(frozen=True)
class _Scale:
    """Seconds to SVG y coordinates, from 0 at the bottom to ``top`` at the top."""

    top: float
    bottom: float = HEIGHT - BOTTOM

    def y(self, seconds: float) -> float:
        return TOP + (self.bottom - TOP) * (1 - seconds / self.top)


def _bars(series: Sequence[Bucket], scale: _Scale) -> list[str]:
    """A light p95 bar with a dark p50 bar over it, per bucket; a tooltip with the figures."""
    step = (WIDTH - LEFT - RIGHT) / max(1, len(series))
    bars = []
    for i, bucket in enumerate(series):
        x = LEFT + i * step + step * 0.15
        tip = f"{bucket.count} studies: p50 {duration(bucket.p50)}, p95 {duration(bucket.p95)}"
        for value, colour in ((bucket.p95, "#9ecae1"), (bucket.p50, "#2c6fa8")):
            if value is not None:
                y = scale.y(value)
                bars.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" '
                    f'height="{scale.bottom - y:.1f}" fill="{colour}"><title>{tip}</title></rect>'
                )
    return bars


def _line(y: float, colour: str, extra: str = "") -> str:
    return (
        f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
        f'stroke="{colour}"{extra}/>'
    )


def _text(x: float, y: float, words: str, colour: str) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="9" fill="{colour}">{escape(words)}</text>'


def duration(seconds: float | None) -> str:
    """Seconds in the unit a person reads fastest: 42 s, 3.5 min, 1.2 h."""
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
