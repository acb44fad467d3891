#!/usr/bin/env bash
# The last call of the second device sequence on nvidia-h200-x2 (CHANGELOG.md, 2026-11-30, "GPU
# workers run two batches at once", run 2): the first sequence found the GPU workers busy 99% with
# the GPU 25-63% utilised. This one measures where a worker's batch time goes
# (benchmarks/device/host_memory.py: copies from each kind of host memory, the engine fed from each,
# and the engines on preprocessed phantom slices, carried in .whl-parts/phantom/slices.npz), then
# the one-vs-two-GPU load with the batches copied through the workers' own page-locked buffers
# (staged) against straight from the shared slots.
source benchmarks/device/setup_ort.sh
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/device/host_memory.py \
    --slices .whl-parts/phantom/slices.npz 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/copy-check-h200.log"
timeout 230 python3 benchmarks/device/multi_gpu.py --configs graphs=0,conc=2,depth=3,staged=1 \
    graphs=0,conc=1,depth=2,staged=1 graphs=0,conc=2,depth=3 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/multi-gpu-h200x2-run2.log"
