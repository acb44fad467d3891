#!/usr/bin/env bash
# Issue 7 on the device, the last call of the lead's sequence on nvidia-h200-x2: the turnaround
# of 300-slice studies on one H200 with ONNX Runtime CUDA (goal <= 3 s), by stage.
#
# Calls before this one each copied one onnxruntime-gpu part to /tmp/parts
# (`mkdir -p /tmp/parts && cp .whl-parts/xz/ortsite.partN /tmp/parts/`, see
# benchmarks/device/setup_ort.sh); this call carries `.whl-parts/site2` (one 38.9-MB part) and runs
#     bash benchmarks/device/turnaround.sh
# Writes $OUT/turnaround.log and $OUT/turnaround.json; prints the stage table and `headline:` last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# shellcheck source=/dev/null
source benchmarks/device/setup_ort.sh || { echo "headline: turnaround not measured (onnxruntime-gpu setup failed)"; exit 1; }
# shellcheck source=/dev/null
source benchmarks/device/setup_site2.sh || { echo "headline: turnaround not measured (site2 setup failed)"; exit 1; }
# One H200: the daemon's one GPU worker and the in-process peer both see GPU 0 only.
export CUDA_VISIBLE_DEVICES=0 IMAGING_AI_ENGINES__BACKEND=onnxruntime-cuda IMAGING_AI_ENGINES__GPUS=1
# 300 s for this script: the setup above takes ~30 s; the studies stop being sent at 200 s.
timeout -k 10 260 python3 benchmarks/device/turnaround.py --studies 5 --slices 300 --goal 3 \
    --timeout 60 --budget 200 --json "$OUT/turnaround.json" > "$OUT/turnaround.log" 2>&1
rc=$?
[ $rc -eq 124 ] && echo "turnaround.py stopped by timeout after 260 s" >> "$OUT/turnaround.log"
# The progress lines and the table: from the first study on (the log keeps everything).
grep -v "^WARNING\|^\s*warn" "$OUT/turnaround.log" | tail -n 32
exit $rc
