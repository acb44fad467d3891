#!/usr/bin/env python3
"""Write held-out phantom studies as an ``imaging-ai evaluate`` CASES folder.

Each case is ``OUT/phantom-<seed>/`` with ``image.nii.gz`` (the phantom's HU in its patient
geometry), ``lungs.nii.gz`` (1 right, 2 left) and ``lesions.nii.gz`` (the nodule mask: each
connected component one lesion). Seeds come from the test range (300000 on) unless
``--first-seed`` says otherwise, with the protocols ``training.data.draw_spec`` draws (1-5 mm
slices, any kernel, contrast or not, 3-12 nodules of 3.5-30 mm), so the phantom rows of
docs/models.md come from the same tool as the real-CT rows::

    python scripts/phantom_cases.py /tmp/phantoms --count 10
    imaging-ai evaluate /tmp/phantoms --out /tmp/phantoms-eval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import SimpleITK as sitk

sys.path.insert(0, str(Path(__file__).resolve().parent))

from training.data import TEST_SEEDS, generate_study


def write_case(seed: int, out: Path) -> Path:
    """Generate phantom ``seed`` and write its case folder under ``out``."""
    vol = generate_study(seed)
    grid, z = vol.geometry.grid, vol.geometry.z[vol.indices]
    folder = out / f"phantom-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in (
        ("image", vol.hu),
        ("lungs", vol.lung_labels),
        ("lesions", vol.nodule_mask),
    ):
        image = sitk.GetImageFromArray(array)
        image.SetOrigin((grid.x0, grid.y0, float(z[0])))
        image.SetSpacing((grid.spacing, grid.spacing, vol.geometry.thickness))
        image.SetDirection((1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, -1.0))  # slices head to feet
        sitk.WriteImage(image, str(folder / f"{name}.nii.gz"), useCompression=True)
    diameters = ", ".join(f"{d:.1f}" for d in np.sort(vol.nodule_diameters_mm)[::-1])
    print(f"{folder.name}: {len(z)} slices of {vol.geometry.thickness} mm; nodules {diameters} mm")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=TEST_SEEDS.start)
    args = parser.parse_args()
    for seed in range(args.first_seed, args.first_seed + args.count):
        write_case(seed, args.out)


if __name__ == "__main__":
    main()
