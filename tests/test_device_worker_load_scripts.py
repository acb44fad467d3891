"""benchmarks/device/worker_load.py: imports on the GPU machine, and its batch-trace summaries."""

from __future__ import annotations

import runpy
import time
from pathlib import Path
from typing import Any

from imaging_ai.workers import BatchTrace
from tests.infer.test_infer_imports import help_without_dicom_or_database

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "device" / "worker_load.py"


def test_the_script_imports_without_dicom_or_database_packages() -> None:
    assert "--budget-s" in help_without_dicom_or_database(SCRIPT)


def script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT))


def trace(start: int, stages: tuple[int, int, int] | None) -> BatchTrace:
    ms = 1_000_000
    times = [start + k * ms for k in (0, 1, 2, 10, 11, 13)]  # sent ... returned
    return BatchTrace("lung-seg", 64, 0, *times, stages)


def test_a_trace_row_splits_the_round_trip_into_medians_in_ms() -> None:
    row = script()["trace_row"]([trace(0, (2_000_000, 5_000_000, 1_000_000)), trace(50, None)])
    assert row["batches"] == 2 and row["to_worker"] == 1.0 and row["wait_engines"] == 1.0
    assert (row["copy_in"], row["run"], row["copy_out"]) == (2.0, 5.0, 1.0)
    assert row["rest_in_worker"] == 0.0 and row["in_worker"] == 8.0
    assert (row["reply"], row["back"], row["round_trip"]) == (1.0, 2.0, 13.0)


def test_the_headline_compares_the_median_runs_of_two_gpus_and_one() -> None:
    def load(gpus: int, rate: float) -> dict[str, Any]:
        workers = [{"busy": 0.9}] * gpus
        gpu = [{"util": 0.7}] * gpus
        return {
            "gpus": gpus,
            "gpu_threads": 1,
            "slices_per_s": rate,
            "workers": workers,
            "gpu": gpu,
        }

    line = script()["headline"]([load(1, 100.0), load(2, 190.0), load(1, 110.0), load(2, 180.0)])
    assert line.startswith("headline: two GPUs at 1.76x one")
    assert "busy 90%-90%, GPU util 70%-70%" in line
    assert "no one-vs-two" in script()["headline"]([load(1, 100.0)])


def test_the_gpu_sampler_reads_nvidia_smi_and_tolerates_unreported_fields(
    tmp_path: Path, monkeypatch: Any
) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\nprintf '0, 55, 1980, 300.5\\n1, 20, [N/A], [N/A]\\n'\nexec sleep 5\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    run = script()
    samples: dict[int, list[list[float]]] = {}
    with run["gpu_sampler"](samples):
        time.sleep(0.5)
    zero, one = run["gpu_figures"](samples, 2)
    assert (zero["util"], zero["sm_mhz"], zero["power_w"]) == (0.55, 1980, 300)
    assert (one["util"], one["sm_mhz"], one["power_w"]) == (0.2, None, None)


def test_the_feed_and_run_tail_scripts_import_without_dicom_or_database_packages() -> None:
    scripts = SCRIPT.parent
    assert "--only" in help_without_dicom_or_database(scripts / "worker_feed.py")
    assert "--cpu" in help_without_dicom_or_database(scripts / "run_tail.py")


def test_raw_traces_keep_every_batch_in_microseconds_from_the_first_send() -> None:
    raw = script()["raw_traces"](
        [trace(5_000_000, (2_000, 5_000, 1_000)), trace(0, None)], ["lung-seg"]
    )
    fields = raw["fields"].split()
    first, second = (dict(zip(fields, row, strict=True)) for row in raw["rows"])
    assert (first["sent"], first["returned"], first["run"]) == (5_000, 18_000, 5)
    assert (second["sent"], second["ended"], second["copy_in"]) == (0, 10_000, 0)
    assert first["size"] == 64 and first["runner"] == 0


def test_feed_figures_say_when_a_worker_idled_with_slices_queued() -> None:
    feed = runpy.run_path(str(SCRIPT.parent / "worker_feed.py"))["feed_figures"]
    # one worker's batches in flight, then two batchers' queued slices
    figures = feed([[0, 10, 0], [2, 0, 0], [3, 5, 5], [0, 0, 0]], 1)
    assert figures["inflight_mean"] == [1.25] and figures["idle_with_queue"] == [0.25]
    assert figures["queue_empty"] == 0.5 and figures["queued_mean"] == 5
