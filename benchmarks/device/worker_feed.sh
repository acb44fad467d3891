#!/usr/bin/env bash
# Issue 4 on nvidia-h200-x2, fourth session: the last call of an onnxruntime-gpu sequence
# (benchmarks/device/setup_ort.sh), then benchmarks/device/worker_feed.py (at most ~200 s), which
# writes $OUT/issue4_feed.json; this log goes to $OUT/issue4_feed.log.
source benchmarks/device/setup_ort.sh
timeout 235 python3 benchmarks/device/worker_feed.py "$@" 2>&1 \
    | grep --line-buffered -v "No registered plugin EP device" | tee "$OUT/issue4_feed.log"
