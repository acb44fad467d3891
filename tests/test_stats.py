"""One quantile for every reported p50/p95: nearest rank, the same on the status page and in the
benchmarks."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from imaging_ai_devkit.bench import engines
from imaging_ai_devkit.bench.harness import ENGINES_DIR

from imaging_ai.modelcard import discover_models
from imaging_ai.stats import quantile
from imaging_ai.web.charts import buckets, quantile_or_none


def test_nearest_rank_gives_a_measured_sample() -> None:
    samples = [24.0, 20.0, 22.0]
    assert quantile(samples, 0.5) == 22.0
    assert quantile(samples, 0.95) == 24.0  # linear interpolation would say 23.8
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0  # the lower middle, not 2.5
    assert quantile(range(1, 101), 0.95) == 95.0
    assert quantile(range(1, 21), 0.95) == 19.0
    assert quantile([7.0], 0.0) == quantile([7.0], 1.0) == 7.0
    # 0.95 * 60 is not exactly 57 in floating point: the rank is still 57.
    assert quantile(range(1, 61), 0.95) == 57.0


def test_no_samples_or_a_share_outside_0_to_1_is_an_error() -> None:
    with pytest.raises(ValueError, match="no samples"):
        quantile([], 0.5)
    with pytest.raises(ValueError, match="outside"):
        quantile([1.0], 95)
    assert quantile_or_none([], 0.95) is None


def test_the_status_page_and_the_benchmarks_give_the_same_p50_and_p95() -> None:
    seconds = [31.0, 12.5, 18.0, 45.0, 20.0, 22.0, 19.5]
    now = datetime(2026, 12, 1, 12)
    samples = [(now - timedelta(minutes=1), s) for s in seconds]
    (bucket,) = buckets(samples, now, timedelta(hours=1), 1)
    assert (bucket.p50, bucket.p95) == (quantile(seconds, 0.5), quantile(seconds, 0.95))
    assert (bucket.p50, bucket.p95) == (20.0, 45.0)


def test_the_engines_benchmark_reports_nearest_rank_latencies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    latencies_s = [0.010, 0.030, 0.020, 0.050, 0.040]
    # perf_counter: the start, each run's start and end, the end.
    ticks = [0.0, *(x for i, s in enumerate(latencies_s) for x in (float(i), i + s)), 9.0]
    clock = iter(ticks)
    monkeypatch.setattr(engines.time, "perf_counter", lambda: next(clock))
    card = discover_models(ENGINES_DIR)[0]
    cell = engines.measure(card, "fake", lambda batch: batch, 1, len(latencies_s))
    assert cell.latency_ms_p50 == pytest.approx(30.0)
    assert cell.latency_ms_p95 == pytest.approx(50.0)  # interpolated it was 48 ms
