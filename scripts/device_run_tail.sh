#!/usr/bin/env bash
# Issue 4: the last call of an onnxruntime-gpu sequence (scripts/device_setup_ort.sh), then
# scripts/device_run_tail.py (about 60 s); log and JSON to $OUT.
source scripts/device_setup_ort.sh
timeout 200 python3 scripts/device_run_tail.py 2>&1 \
    | grep --line-buffered -v "No registered plugin EP device" | tee "$OUT/run_tail.log"
