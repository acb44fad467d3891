#!/usr/bin/env bash
# Issue 7 on one H200: where one 300-slice study's load and inference stages go. The last call of
# an onnxruntime-gpu sequence (calls 1-4 copy .whl-parts/xz/ortsite.part0..3 to /tmp/parts, as
# benchmarks/device/setup_ort.sh says); this call carries .whl-parts/site2. Runs
# scripts/cpu_stage_times.py on a phantom: the engines in this process (as `imaging-ai infer`),
# through the daemon's batchers and one GPU worker, and the CPU proxy (fixed-latency engine, 0.1 ms
# a slice) on this host; then the volume load with the fast reader and with pydicom alone.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# shellcheck source=/dev/null
source benchmarks/device/setup_ort.sh || exit 1
# shellcheck source=/dev/null
source benchmarks/device/setup_site2.sh || exit 1
export CUDA_VISIBLE_DEVICES=0 IMAGING_AI_ENGINES__GPUS=1
python3 -m imaging_ai phantom /tmp/ph --slices 300 --seed 7 --nodules 5 2>&1 | tail -1
run() {
    echo "== $*"
    timeout -k 5 150 python3 scripts/cpu_stage_times.py /tmp/ph --repeats 3 --no-outputs "$@" 2>&1 \
        | grep -v "^WARNING\|warn\|^\s*$" | tail -14
}
IMAGING_AI_ENGINES__BACKEND=onnxruntime-cuda run
IMAGING_AI_ENGINES__BACKEND=onnxruntime-cuda run --daemon
run --fake-per-slice 0.0001
python3 - <<'PY'
import statistics, time
from pathlib import Path
from imaging_ai import volume
files = sorted(Path("/tmp/ph/dicom").glob("*.dcm"))
def load():
    t = time.perf_counter()
    series = volume.group_series(files)
    volume.load_series(series[volume.pick_series(series)])
    return time.perf_counter() - t
fast = statistics.median(load() for _ in range(5))
volume.read_plain = lambda path: None
volume.series_uid = lambda path: None
slow = statistics.median(load() for _ in range(5))
print(f"load 300 files: fast reader {fast:.3f} s, pydicom alone {slow:.3f} s (medians of 5)")
PY
