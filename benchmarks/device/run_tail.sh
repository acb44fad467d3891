#!/usr/bin/env bash
# Issue 4: the last call of an onnxruntime-gpu sequence (benchmarks/device/setup_ort.sh), then
# benchmarks/device/run_tail.py (about 60 s); log and JSON to $OUT.
source benchmarks/device/setup_ort.sh
timeout 200 python3 benchmarks/device/run_tail.py 2>&1 \
    | grep --line-buffered -v "No registered plugin EP device" | tee "$OUT/run_tail.log"
