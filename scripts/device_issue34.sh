#!/usr/bin/env bash
# The last call of one device sequence on nvidia-h200-x2 for issues 3 and 4 (docs/benchmarks.md,
# "Engines on one H200" and "One GPU vs two"). The calls before it each carried one part of
# onnxruntime-gpu 1.31.1 to /tmp/parts: the cp312 manylinux_2_28 wheel (sha256 05d548956197b9d0...,
# DEVICE.md) unzipped and packed as a .tar.xz (204 MB instead of 256 MB: four calls, not six),
# split with `split -b 51100000 -d -a 1`. This call checks the archive, unpacks it to /tmp/site,
# then runs the engine benchmark on GPU 0 and the one-vs-two-GPU load; logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
want=1bea3f7262b1fe0d3f46b83461efbf821a2795e8f515c0994d049176af9ea035
got=$(cat /tmp/parts/ortsite.part* | tee /tmp/ort-site.tar.xz | sha256sum | cut -c1-64)
[ "$got" = "$want" ] || { echo "onnxruntime archive sha256 $got, expected $want"; exit 1; }
mkdir -p /tmp/site
python3 -c "import tarfile; tarfile.open('/tmp/ort-site.tar.xz').extractall('/tmp/site', filter='data')" || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv
nproc; free -g | head -2; df -h /dev/shm
# The arenas need about 1.3 GB of /dev/shm; a small one would refuse to start (and is not the GPU).
avail=$(df --output=avail -B1M /dev/shm | tail -1)
if [ "${avail:-0}" -lt 8192 ]; then mount -o remount,size=16G /dev/shm && df -h /dev/shm; fi
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 scripts/device_lungseg_bench.py 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/lungseg-h200.log"
timeout 230 python3 scripts/device_multi_gpu.py --configs graphs=0,conc=1,depth=2 \
    graphs=0,conc=2,depth=3 graphs=1,conc=2,depth=3 2>&1 \
    | grep -v "No registered plugin EP device" | tee "$OUT/multi-gpu-h200x2.log"
