"""``imaging-ai phantom``: takes command-line options, gives a synthetic CT study on disk."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from imaging_ai import progress as bars
from imaging_ai_devkit.phantom.dicom import PRIORITIES, default_accession, write_study
from imaging_ai_devkit.phantom.generate import generate
from imaging_ai_devkit.phantom.spec import KERNELS, PATIENT_SIZES, PhantomSpec


def _patient_size(text: str) -> float:
    """A named habitus (small, medium, large, obese) or a scale such as 1.1."""
    if text in PATIENT_SIZES:
        return PATIENT_SIZES[text]
    try:
        return float(text)
    except ValueError:
        names = ", ".join(PATIENT_SIZES)
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {names} or a number") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the phantom command's arguments to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The ``phantom`` sub-command parser.
    """
    parser.add_argument(
        "outdir", metavar="OUTDIR", type=Path, help="folder for dicom/ and truth.npz (created)"
    )
    parser.add_argument(
        "--slices", type=int, default=300, metavar="N", help="number of axial images (default 300)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="chooses patient, nodules and noise (default 0)",
    )
    parser.add_argument(
        "--nodules", type=int, default=3, metavar="K", help="lung nodules to place (default 3)"
    )
    parser.add_argument(
        "--priority",
        choices=PRIORITIES,
        default="outpatient",
        help="request tags: urgent = STAT, inpatient = admission and ward",
    )
    parser.add_argument(
        "--accession",
        metavar="A",
        help="AccessionNumber, at most 16 characters (default from the seed)",
    )
    _add_realism_arguments(parser.add_argument_group("realism"))
    bars.add_argument(parser)


def _add_realism_arguments(realism: argparse._ArgumentGroup) -> None:
    """Options that make the phantom look like one scanner, patient or protocol or another."""
    realism.add_argument(
        "--slice-thickness",
        type=float,
        metavar="MM",
        help="slice thickness and spacing; each slice averages 1 mm planes over its thickness, "
        "so 5 mm slices blur small nodules and vessels (default: cover the chest)",
    )
    realism.add_argument(
        "--pixel-spacing",
        type=float,
        metavar="MM",
        help="in-plane pixel size (default: field of view fitted to the body)",
    )
    realism.add_argument(
        "--patient-size",
        type=_patient_size,
        metavar="SIZE",
        help=f"{', '.join(PATIENT_SIZES)} or a scale (default from the seed)",
    )
    realism.add_argument(
        "--noise",
        type=float,
        metavar="HU",
        help="noise SD in soft tissue (default from size, kernel, thickness)",
    )
    realism.add_argument(
        "--kernel",
        choices=KERNELS,
        help="reconstruction kernel (sharp = lung kernel; default drawn from the seed)",
    )
    realism.add_argument(
        "--contrast",
        action=argparse.BooleanOptionalAction,
        help="intravenous contrast (default drawn from the seed)",
    )
    realism.add_argument(
        "--dense-contrast",
        action=argparse.BooleanOptionalAction,
        help="undiluted contrast in the subclavian vein, with streaks (default drawn)",
    )
    realism.add_argument(
        "--atelectasis",
        action=argparse.BooleanOptionalAction,
        help="dependent atelectasis at the posterior bases (default drawn from the seed)",
    )
    realism.add_argument(
        "--nodule-size",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=(4.0, 30.0),
        help="nodule diameter range in mm (default 4 30)",
    )
    realism.add_argument("--nodule-hu", type=float, default=30.0, metavar="HU",
                         help="mean attenuation of solid nodules (default 30)")  # fmt: skip


def spec_from_args(args: argparse.Namespace) -> PhantomSpec:
    """The :class:`PhantomSpec` that parsed arguments describe (raises ValueError if invalid)."""
    return PhantomSpec(
        slices=args.slices,
        seed=args.seed,
        nodules=args.nodules,
        slice_thickness_mm=args.slice_thickness,
        pixel_spacing_mm=args.pixel_spacing,
        noise_hu=args.noise,
        patient_scale=args.patient_size,
        kernel=args.kernel,
        contrast=args.contrast,
        dense_contrast=args.dense_contrast,
        atelectasis=args.atelectasis,
        nodule_diameter_range_mm=(args.nodule_size[0], args.nodule_size[1]),
        nodule_hu=args.nodule_hu,
    )


def run(args: argparse.Namespace) -> int:
    """Generate and write the study; print one summary line without patient identity (stdout),
    with bars of the slices rendered and written on stderr where it is a terminal or
    ``--progress`` asks.

    Parameters
    ----------
    args : argparse.Namespace
        Arguments added by :func:`add_arguments`.

    Returns
    -------
    int
        0 on success, 2 when the options cannot make a phantom.
    """
    start = time.perf_counter()
    try:
        spec = spec_from_args(args)
        # Bars of the slices rendered, then written, on stderr (see imaging_ai.progress).
        render = bars.progress(
            total=spec.slices, desc="phantom render", unit="slice", force=args.progress
        )
        with render:
            vol = generate(spec, done=render.update)
        accession = args.accession or default_accession(spec.seed)
        written = bars.progress(
            total=len(vol.indices), desc="phantom write", unit="slice", force=args.progress
        )
        with written:
            write_study(vol, args.outdir, args.priority, accession, done=written.update)
    except ValueError as err:
        print(f"imaging-ai phantom: error: {err}", file=sys.stderr)
        return 2
    sizes = ", ".join(f"{d:.1f}" for d in sorted(vol.nodule_diameters_mm))
    print(
        f"phantom seed {spec.seed}: {spec.slices} slices of {vol.geometry.thickness:g} mm, "
        f"{vol.geometry.grid.spacing:.3f} mm pixels, {len(vol.nodules)} nodules [{sizes}] mm, "
        f"{args.priority}, accession {accession} -> {args.outdir} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m imaging_ai_devkit.phantom.cli OUTDIR ...``."""
    parser = argparse.ArgumentParser(prog="imaging-ai phantom", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
