"""Takes a folder and writes the daemon's warm-up fixture there: a tiny phantom CT and its lungs.

The daemon's result encoders warm up at start on this fixture (`imaging_ai.outputs.warm`),
shipped as package data so the daemon never builds a phantom. Written once and committed::

    python -m imaging_ai_devkit.warm_fixture    # rewrites imaging_ai/outputs/warm_fixture/

A four-slice, lung-level phantom drawn on a 128 matrix without noise (so the files stay small),
then every second row and column kept: 64 x 64 pixels of 3 mm, 5 mm slices, about 40 kB.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pydicom

import imaging_ai.outputs
from imaging_ai_devkit.phantom import PhantomSpec, generate, write_study

DEFAULT_DIR = Path(imaging_ai.outputs.__file__).parent / "warm_fixture"
SPEC = PhantomSpec(
    slices=4,
    seed=7,
    nodules=0,
    matrix=128,
    pixel_spacing_mm=1.5,
    slice_thickness_mm=5.0,
    noise_hu=0.0,
)
STEP = 2  # keep every second row and column


def write_fixture(folder: Path) -> list[Path]:
    """Write ``CT*.dcm`` and ``lungs.npz`` (``labels``, one per slice) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    phantom = generate(SPEC, workers=1)
    written = []
    with tempfile.TemporaryDirectory(prefix="imaging-ai-fixture-") as tmp:
        root = write_study(phantom, Path(tmp), workers=1)
        for path in sorted((root / "dicom").glob("*.dcm")):
            written.append(_shrink(path, folder / path.name))
    labels = phantom.lung_labels[:, ::STEP, ::STEP].astype(np.uint8)
    np.savez_compressed(folder / "lungs.npz", labels=labels)
    return [*written, folder / "lungs.npz"]


def _shrink(source: Path, target: Path) -> Path:
    """``source`` with every STEP-th row and column from the first: same origin, wider pixels."""
    ds = pydicom.dcmread(source)
    pixels = ds.pixel_array[::STEP, ::STEP].copy()
    ds.Rows, ds.Columns = pixels.shape
    ds.PixelSpacing = [float(v) * STEP for v in ds.PixelSpacing]
    ds.PixelData = pixels.tobytes()
    ds.save_as(target, enforce_file_format=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """Write the fixture (into the daemon's package unless a folder is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    paths = write_fixture(args.folder)
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {size / 1000:.0f} kB, to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
