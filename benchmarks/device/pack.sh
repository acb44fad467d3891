#!/usr/bin/env bash
# Builds, here, the archives that the device scripts carry to the GPU machine (each session's
# checkout is fresh, and `.whl-parts/` is ignored by git):
#   .whl-parts/xz/ortsite.part0..3   onnxruntime-gpu 1.31.1 (cp312, CUDA 13) unpacked, tar.xz,
#                                    split in parts of 51,100,000 bytes (one per call),
#                                    read by benchmarks/device/setup_ort.sh;
#   .whl-parts/site2/site2.part0     the daemon's packages the machine lacks, at the versions of
#                                    .venv, read by benchmarks/device/setup_site2.sh.
# The archives are deterministic (names sorted, times and owners zeroed, single-threaded xz), so
# their sha256 is the one the setup scripts check; the script prints both hashes at the end.
# Takes ~5 minutes of one core (xz -6 of ~600 MB). Usage: bash benchmarks/device/pack.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qxF "/.whl-parts/" .git/info/exclude 2>/dev/null || echo "/.whl-parts/" >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d "$1" "${@:2}"
}
pack() {  # folder -> deterministic .tar.xz on stdout
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$1" -cf - . | xz -6 -T1
}
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }

# onnxruntime-gpu
mkdir -p "$work/ort" "$work/ortsite" .whl-parts/xz
download "$work/ort" onnxruntime-gpu==1.31.1
(cd "$work/ortsite" && python3 -m zipfile -e "$work"/ort/*.whl .)
rm -f .whl-parts/xz/ortsite.part*
pack "$work/ortsite" > "$work/ortsite.tar.xz"
split -b 51100000 -d -a 1 "$work/ortsite.tar.xz" .whl-parts/xz/ortsite.part
echo "ortsite $(sha256sum < "$work/ortsite.tar.xz" | cut -c1-64) $(ls .whl-parts/xz | wc -l) parts"

# the daemon's packages
names=(pydicom pynetdicom SimpleITK highdicom pyjpegls SQLAlchemy greenlet alembic Mako starlette
       anyio uvicorn h11 click python-multipart itsdangerous hl7 hl7apy typing_extensions Jinja2
       MarkupSafe prometheus_client idna pydantic pydantic_core annotated_types typing_inspection tqdm)
pins=()
for name in "${names[@]}"; do pins+=("$name==$(version "$name")"); done
mkdir -p "$work/site2whl" "$work/site2" .whl-parts/site2
download "$work/site2whl" "${pins[@]}"
for wheel in "$work"/site2whl/*.whl; do (cd "$work/site2" && python3 -m zipfile -e "$wheel" .); done
rm -f .whl-parts/site2/site2.part*
pack "$work/site2" > "$work/site2.tar.xz"
split -b 50000000 -d -a 1 "$work/site2.tar.xz" .whl-parts/site2/site2.part
echo "site2 $(sha256sum < "$work/site2.tar.xz" | cut -c1-64) $(ls .whl-parts/site2 | wc -l) part(s)"
