#!/usr/bin/env bash
# The last call of the device sequence for issue 4 on nvidia-h200-x2 (docs/benchmarks.md, "One GPU
# vs two"; why it was written: CHANGELOG.md, 2026-11-30, "Where a worker's batch time goes"):
# onnxruntime-gpu from the parts the calls before it carried (benchmarks/device/setup_ort.sh), then
# benchmarks/device/worker_load.py, which stops starting steps after 200 s; its JSON and this log go
# to $OUT (two files).
source benchmarks/device/setup_ort.sh
timeout 235 python3 benchmarks/device/worker_load.py 2>&1 \
    | grep --line-buffered -v "No registered plugin EP device" | tee "$OUT/issue4.log"
