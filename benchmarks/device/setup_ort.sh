#!/usr/bin/env bash
# Sourced on the device by the last call of a sequence (the benchmarks/device/*.sh scripts:
# docs/benchmarks.md, "Running the device scripts"). The calls before it each carried one part of
# onnxruntime-gpu 1.31.1 to /tmp/parts (built here by benchmarks/device/pack.sh): the cp312 manylinux_2_28 wheel (sha256 05d548956197b9d0...,
# DEVICE.md) unzipped and packed as a .tar.xz (204 MB instead of 256 MB: four calls, not six),
# split with `split -b 51100000 -d -a 1`. This checks the archive, unpacks it to /tmp/site, sets
# PYTHONPATH and prints what the machine has.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
want=23686bcde749b196ed45508822007703ee80732a7f18139b128afd27ef139b74
# A later script of the same sequence finds it unpacked already.
if [ ! -f /tmp/site/.unpacked ]; then
    got=$(cat /tmp/parts/ortsite.part* | tee /tmp/ort-site.tar.xz | sha256sum | cut -c1-64)
    [ "$got" = "$want" ] || { echo "onnxruntime archive sha256 $got, expected $want"; exit 1; }
    mkdir -p /tmp/site
    python3 -c "import tarfile; tarfile.open('/tmp/ort-site.tar.xz').extractall('/tmp/site', filter='data')" || exit 1
    touch /tmp/site/.unpacked
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv
nproc; free -g | head -2; df -h /dev/shm
# The arenas need about 1.3 GB of /dev/shm; a small one would refuse to start (and is not the GPU).
avail=$(df --output=avail -B1M /dev/shm | tail -1)
if [ "${avail:-0}" -lt 8192 ]; then mount -o remount,size=16G /dev/shm && df -h /dev/shm; fi
