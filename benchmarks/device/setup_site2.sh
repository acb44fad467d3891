#!/usr/bin/env bash
# Sourced on the device after benchmarks/device/setup_ort.sh (benchmarks/device/turnaround.sh does both).
# The daemon's packages that the GPU machine lacks, for cp312 manylinux x86_64, unpacked from
# their wheels into one folder and packed as a .tar.xz (38.9 MB; one part of <= 50,000,000
# bytes, `.whl-parts/site2/site2.part0`, ignored by git): pydicom 3.0.2, pynetdicom 3.0.4,
# SimpleITK 2.5.7, highdicom 0.28.2, pyjpegls 1.5.1, SQLAlchemy 2.1.9, greenlet 3.5.6,
# alembic 1.20.1, Mako 1.4.3, starlette 1.10.0, anyio 4.16.0, uvicorn 0.54.0, h11 0.16.0,
# click 8.5.1, python-multipart 0.0.34, itsdangerous 2.2.0, hl7 0.4.5, hl7apy 1.3.5,
# typing_extensions 4.16.0, Jinja2 3.1.6, MarkupSafe 3.0.4, prometheus_client 0.26.0, idna 3.20
# (the versions of the project's .venv). Not carried: numpy, pillow, packaging, onnx (the
# machine's own; a carried numpy would shadow the one its CuPy and PyTorch were built with),
# onnxruntime (benchmarks/device/setup_ort.sh), psycopg (SQLite there), the test tools.
#
# The part is read from the carried `.whl-parts/site2/` (the working tree, ~11.6 MB, and it fit
# in one call's 64 MiB) or else from /tmp/parts, where an earlier call may have copied it.
# Built here by benchmarks/device/pack.sh (deterministic: the hash below is what it makes).
# This checks the archive, unpacks it to /tmp/site2 and puts it on PYTHONPATH after /tmp/site.
set -uo pipefail
want=e957c00c7fc16c56475b55899655417eb27e94c80a3c474abd54c6fcea4e67fb
parts=$(ls .whl-parts/site2/site2.part* 2>/dev/null || ls /tmp/parts/site2.part* 2>/dev/null)
if [ -z "$parts" ]; then
    echo "site2: no .whl-parts/site2/site2.part* (carry .whl-parts/site2) nor /tmp/parts/site2.part*"
    return 1 2>/dev/null || exit 1
fi
got=$(cat $parts | tee /tmp/site2.tar.xz | sha256sum | cut -c1-64)
if [ "$got" != "$want" ]; then
    echo "site2 archive sha256 $got, expected $want (parts: $parts)"
    return 1 2>/dev/null || exit 1
fi
mkdir -p /tmp/site2
python3 -c "import tarfile; tarfile.open('/tmp/site2.tar.xz').extractall('/tmp/site2', filter='data')" \
    || { echo "site2: cannot unpack /tmp/site2.tar.xz"; return 1 2>/dev/null || exit 1; }
# $PWD/devkit: the development kit (phantoms, benchmarks, the fixed-latency engine), importable
# without installing; the daemon reads its extension points from devkit/pyproject.toml.
export PYTHONPATH=/tmp/site:/tmp/site2:$PWD:$PWD/devkit PYTHONUNBUFFERED=1
python3 -c "import pydicom, pynetdicom, SimpleITK, highdicom, sqlalchemy, uvicorn, numpy
print('site2: pydicom', pydicom.__version__, 'pynetdicom', pynetdicom.__version__,
      'SimpleITK', SimpleITK.Version.VersionString(), 'SQLAlchemy', sqlalchemy.__version__,
      'numpy', numpy.__version__, numpy.__file__)"
