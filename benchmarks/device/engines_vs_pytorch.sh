#!/usr/bin/env bash
# Issue 3 on one H200 of an nvidia-h200-x2 (docs/benchmarks.md, "Engines on one H200"): the last
# call of a device sequence, after the calls that carried onnxruntime-gpu's parts
# (benchmarks/device/setup_ort.sh). Carry `.whl-parts/phantom` (issue3.npz, 11 MB, made here with
# `.venv/bin/python benchmarks/device/engines_vs_pytorch.py --make-slices .whl-parts/phantom/issue3.npz`).
# About 150 s; the log and device_issue3.json go to $OUT.
source benchmarks/device/setup_ort.sh
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/device/engines_vs_pytorch.py \
    --slices .whl-parts/phantom/issue3.npz 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/issue3-h200.log"
