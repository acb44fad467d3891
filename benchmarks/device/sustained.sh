#!/usr/bin/env bash
# Issue 7 on the device, the last call of the lead's sequence: `imaging-ai bench sustained` on one
# H200 with ONNX Runtime CUDA - capacity from a backlog of 8 300-slice studies, then a Poisson
# mixed-priority stream of up to 40 at 80% of it, deadline misses per class.
#
# Calls before this one each copied one onnxruntime-gpu part to /tmp/parts
# (`mkdir -p /tmp/parts && cp .whl-parts/xz/ortsite.partN /tmp/parts/`, see
# benchmarks/device/setup_ort.sh); this call carries `.whl-parts/site2` (one 38.9-MB part) and runs
#     bash benchmarks/device/sustained.sh
# Writes $OUT/sustained.log and $OUT/sustained.json; prints the table and `headline:` last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# shellcheck source=/dev/null
source benchmarks/device/setup_ort.sh || { echo "headline: sustained not measured (onnxruntime-gpu setup failed)"; exit 1; }
# shellcheck source=/dev/null
source benchmarks/device/setup_site2.sh || { echo "headline: sustained not measured (site2 setup failed)"; exit 1; }
# One H200: the daemon's one GPU worker sees GPU 0 only.
export CUDA_VISIBLE_DEVICES=0 IMAGING_AI_ENGINES__BACKEND=onnxruntime-cuda IMAGING_AI_ENGINES__GPUS=1
# ~280 s for this call: the setup above ~30 s; phantoms, copies and the daemon's start ~40-60 s;
# the stream stops being sent 190 s after the script starts, and the results of what was sent
# have 40 s more; 240 s is the hard stop.
timeout -k 10 240 python3 benchmarks/device/sustained.py --capacity-studies 8 --studies 40 \
    --slices 300 --senders 8 --budget 190 --timeout 40 --json "$OUT/sustained.json" \
    > "$OUT/sustained.log" 2>&1
rc=$?
[ $rc -eq 124 ] && echo "sustained.py stopped by timeout after 240 s" >> "$OUT/sustained.log"
# The progress lines and the table (the log keeps everything).
grep -v "^WARNING\|^\s*warn" "$OUT/sustained.log" | tail -n 40
exit $rc
