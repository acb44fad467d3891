#!/usr/bin/env bash
# The last call of the first device sequence on nvidia-h200-x2 for issues 3 and 4
# (CHANGELOG.md, 2026-11-30, "GPU workers run two batches at once", run 1 and its engine table;
# the current figures: docs/benchmarks.md, "Engines on one H200"): onnxruntime-gpu from the parts
# the calls before it carried (benchmarks/device/setup_ort.sh), then the engine benchmark on GPU 0
# and the one-vs-two-GPU load; logs and JSON go to $OUT.
source benchmarks/device/setup_ort.sh
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/device/engine_variants.py 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/lungseg-h200.log"
timeout 230 python3 benchmarks/device/multi_gpu.py --configs graphs=0,conc=1,depth=2 \
    graphs=0,conc=2,depth=3 graphs=1,conc=2,depth=3 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/multi-gpu-h200x2.log"
