"""DICOM files of one CT series in, a Volume (HU voxels with their patient geometry) out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from numpy.typing import ArrayLike, NDArray
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)

from imaging_ai.dicom.slice_read import PlainSlice, read_plain, series_uid
from imaging_ai.errors import GeometryError, ImagingAIError, InvalidDataset, UnsupportedInput

CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
ENHANCED_CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2.1"
LEGACY_ENHANCED_CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2.2"
_MULTI_FRAME = frozenset({ENHANCED_CT_IMAGE_STORAGE, LEGACY_ENHANCED_CT_IMAGE_STORAGE})
_CT_CLASSES = _MULTI_FRAME | {CT_IMAGE_STORAGE}
_NATIVE_LITTLE_ENDIAN = frozenset(
    {ImplicitVRLittleEndian, ExplicitVRLittleEndian, DeflatedExplicitVRLittleEndian}
)
_SUMMARY_TAGS = [
    *("SeriesInstanceUID", "Modality", "SOPClassUID", "ImageType", "ImageOrientationPatient"),
    *("SharedFunctionalGroupsSequence", "NumberOfFrames", "SliceThickness", "SeriesNumber"),
]
# Where Enhanced CT keeps the attributes that single-frame CT has at top level.
_FUNCTIONAL_GROUP = {
    "ImagePositionPatient": "PlanePosition",
    "ImageOrientationPatient": "PlaneOrientation",
    "PixelSpacing": "PixelMeasures",
    "RescaleSlope": "PixelValueTransformation",
    "RescaleIntercept": "PixelValueTransformation",
    "GantryDetectorTilt": "CTAcquisitionDetails",
    "SliceThickness": "PixelMeasures",
}
# A series covering less than this share of the longest one's extent is a targeted slab.
_COVERAGE = 0.6
# ImageType values (PS3.3 C.8.16.1.1, and vendors' usage) of images derived by reformatting.
_REFORMATS = frozenset({"REFORMATTED", "MPR", "MIP", "MINIP", "PROJECTION IMAGE"})
# Direction cosines are decimal strings; scanners round them to about 6 digits.
_COSINE_TOL = 1e-3
# A step this short is the same position written twice, not a thin slice.
_DUPLICATE_MM = 0.01
# Spacing may jitter by rounding; beyond this a single z spacing would misplace slices.
_IRREGULAR_FRACTION = 0.1


@dataclass(frozen=True, eq=False)
class Volume:
    """One CT series as a 3-D array of Hounsfield units with its patient geometry.

    ``hu`` is indexed ``hu[k, j, i]`` (slice, row, column). Indices handed to
    :meth:`index_to_lps` are ``(i, j, k)``, in the order of ``spacing_mm`` (x, y, z), as ITK does.
    ``direction`` holds the row direction, the column direction and the slice normal as its
    columns, so ``lps = origin + direction @ (spacing * ijk)``. For multi-frame instances
    ``sop_instance_uids`` repeats the instance's UID and ``frame_numbers`` tells the frames apart
    (1 for every single-frame instance). ``slice_thickness_mm`` is the series' SliceThickness
    (the reconstructed slice's width, which may differ from the spacing between slices), or
    None where the files do not say.
    """

    hu: NDArray[np.float32]
    origin_mm: tuple[float, float, float]
    spacing_mm: tuple[float, float, float]
    direction: NDArray[np.float64]
    sop_instance_uids: tuple[str, ...]
    series_instance_uid: str
    study_instance_uid: str
    frame_of_reference_uid: str
    frame_numbers: tuple[int, ...] = ()
    slice_thickness_mm: float | None = None

    def __post_init__(self) -> None:
        if self.hu.ndim != 3 or self.direction.shape != (3, 3):
            raise ValueError("Volume needs a 3-D hu array and a 3×3 direction")

    @property
    def voxel_volume_ml(self) -> float:
        """Volume of one voxel in millilitres (cm³)."""
        return float(np.prod(self.spacing_mm)) / 1000.0

    def index_to_lps(self, ijk: ArrayLike) -> NDArray[np.float64]:
        """Map continuous voxel indices ``(..., 3)`` as (i, j, k) to LPS millimetres."""
        scaled = np.asarray(ijk, dtype=np.float64) * np.asarray(self.spacing_mm)
        lps: NDArray[np.float64] = np.asarray(self.origin_mm) + scaled @ self.direction.T
        return lps

    def lps_to_index(self, xyz: ArrayLike) -> NDArray[np.float64]:
        """Map LPS millimetres ``(..., 3)`` to continuous voxel indices (i, j, k)."""
        offset = np.asarray(xyz, dtype=np.float64) - np.asarray(self.origin_mm)
        ijk: NDArray[np.float64] = offset @ np.linalg.inv(self.direction).T
        ijk /= np.asarray(self.spacing_mm)
        return ijk


Attributes = Dataset | PlainSlice
"""Where a frame's attributes are read from: pydicom's data set, or the fast reader's values."""


@dataclass(frozen=True, slots=True)
class _Frame:
    """One 2-D image: a single-frame instance or one frame of a multi-frame instance."""

    sop_uid: str
    frame_number: int
    series_uid: str
    study_uid: str
    for_uid: str
    orientation: tuple[float, ...]
    position: tuple[float, ...]
    pixel_spacing: tuple[float, ...]  # DICOM order: between rows (y), between columns (x)
    slope: float
    intercept: float
    tilt_deg: float
    thickness_mm: float | None
    pixels: NDArray[Any]


def load_series(paths: Sequence[Path], *, min_slices: int = 3, workers: int = 4) -> Volume:
    """Read the DICOM files of one CT series and build its volume.

    Parameters
    ----------
    paths
        Files of one series, in any order. Localizer (scout) images among them are skipped.
    min_slices
        Fewest slices accepted as a volume (never fewer than 2: the slice spacing is measured
        between positions).
    workers
        Threads reading files; reading is mostly I/O and pixel copies.

    Returns
    -------
    Volume
        Slices sorted along the slice normal (not by InstanceNumber), HU from the rescale.

    Raises
    ------
    InvalidDataset
        A file is not DICOM, lacks pixel data or a required attribute.
    UnsupportedInput
        Not CT, an undecodable transfer syntax, or files of more than one series.
    GeometryError
        The slices do not form one regular grid (the message says why).
    """
    if not paths:
        raise UnsupportedInput("no DICOM files were given; cannot build a volume")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        per_file = list(pool.map(_read_frames, paths))
    unique = {(f.sop_uid, f.frame_number): f for frames in per_file for f in frames}
    return _assemble(list(unique.values()), min_slices, workers)


def group_series(paths: Iterable[Path]) -> dict[str, list[Path]]:
    """Group files by SeriesInstanceUID, reading headers only.

    Parameters
    ----------
    paths
        DICOM files of one or more series.

    Returns
    -------
    dict
        Series Instance UID → its files, in the order given.
    """
    groups: dict[str, list[Path]] = {}
    for path in paths:
        # The fast reader's None means an unusual file: pydicom reads it (and says what is wrong).
        uid = series_uid(path) or _text(
            _dcmread(path, ["SeriesInstanceUID"]), "SeriesInstanceUID", path.name
        )
        groups.setdefault(uid, []).append(path)
    return groups


def pick_series(series: Mapping[str, Sequence[Path]]) -> str:
    """Choose the series of a study to analyse: the thinnest axial series that covers the chest.

    The candidates are CT image series (CT or Enhanced CT storage, not localizers) whose slice
    normal lies closest to the patient's head–foot axis (axial). A candidate is suitable when
    it is not a reformat (ImageType REFORMATTED, MPR, MIP, MINIP or PROJECTION IMAGE) and spans
    at least 60 % of the longest candidate's extent along the slice normal, so a thin targeted
    slab does not win over the whole chest. Among suitable series the thinnest wins (its
    SliceThickness, else its spacing between slices: nodules are found on thin slices), then
    the one with more slices, the lower SeriesNumber, the UID. Where none is suitable the
    candidate with the most slices wins. Each series' kind is judged by the header of its
    first file; extents are read from every file's position only where a study has several
    candidates.

    Parameters
    ----------
    series
        Output of :func:`group_series`.

    Returns
    -------
    str
        The chosen Series Instance UID.

    Raises
    ------
    UnsupportedInput
        No series qualifies; the message lists what the study holds.
    """
    return choose_series(series).uid


@dataclass(frozen=True)
class SeriesChoice:
    """The series analysed, and why each other series of the study is not (in words)."""

    uid: str
    not_analysed: dict[str, str]


def choose_series(series: Mapping[str, Sequence[Path]]) -> SeriesChoice:
    """:func:`pick_series`' choice, with the reason each other series is left out.

    Raises
    ------
    UnsupportedInput
        No series qualifies; the message lists what the study holds.
    """
    facts = [_facts(uid, paths) for uid, paths in series.items()]
    axial = [f for f in facts if f.kind == "axial CT"]
    if not axial:
        seen = "; ".join(f"{f.uid} ({f.kind}, {len(series[f.uid])} files)" for f in facts)
        raise UnsupportedInput(f"the study has no axial CT series; it holds: {seen}")
    extents = {f.uid: _extent(series[f.uid]) for f in axial} if len(axial) > 1 else {}
    longest = max((extent for extent, _ in extents.values()), default=0.0)

    def suitable(f: _SeriesFacts) -> bool:
        return not f.reformat and extents[f.uid][0] >= _COVERAGE * longest

    def rank(f: _SeriesFacts) -> tuple[bool, float, int, int, str]:
        thickness = f.thickness_mm or extents[f.uid][1]
        fits = suitable(f)
        return (not fits, thickness if fits else 0.0, -f.slices, f.number, f.uid)

    chosen = axial[0] if len(axial) == 1 else min(axial, key=rank)

    def reason(f: _SeriesFacts) -> str:
        if f.kind != "axial CT":
            return _KIND_REASONS.get(f.kind, f"not CT: {f.kind}")
        if f.slices < 3:
            return "too few images for a volume"
        if f.reformat:
            return "reformatted images (another series analysed)"
        if not suitable(f):
            return "covers too little of the scan (another series analysed)"
        return "another axial series analysed (thinner slices)"

    others = {f.uid: reason(f) for f in facts if f.uid != chosen.uid}
    return SeriesChoice(chosen.uid, others)


_KIND_REASONS = {"CT localizer": "localizer", "non-axial CT": "not axial (no volume built)"}


@dataclass(frozen=True)
class _SeriesFacts:
    """What the first file of a series says about it."""

    uid: str
    kind: str
    slices: int
    thickness_mm: float | None
    number: int
    reformat: bool


def _facts(uid: str, paths: Sequence[Path]) -> _SeriesFacts:
    ds = _dcmread(paths[0], _SUMMARY_TAGS)
    thickness = ds.get("SliceThickness")
    if thickness is None and "SharedFunctionalGroupsSequence" in ds:
        shared = ds.SharedFunctionalGroupsSequence[0]
        thickness = _groups(Dataset(), shared)("SliceThickness").get("SliceThickness")
    return _SeriesFacts(
        uid=uid,
        kind=_series_kind(ds),
        slices=len(paths) * int(ds.get("NumberOfFrames", 1) or 1),
        thickness_mm=_thickness(thickness),
        number=int(ds.get("SeriesNumber", 0) or 0),
        reformat=bool(_image_type(ds) & _REFORMATS),
    )


def _extent(paths: Sequence[Path]) -> tuple[float, float]:
    """(extent, median spacing) of a series' images along their slice normal, in mm; (0, 0)
    where the positions cannot be read (that series is then not judged suitable)."""
    try:
        positions = [p for path in paths for p in _positions(path)]
        normal = _normal(_dcmread(paths[0], _SUMMARY_TAGS), paths[0].name)
        along = np.unique(np.round(np.asarray(positions) @ normal, 3))
    except (ImagingAIError, *_UNREADABLE_VALUE, IndexError, KeyError):
        return 0.0, 0.0
    if len(along) < 2:
        return 0.0, 0.0
    return float(along[-1] - along[0]), float(np.median(np.diff(along)))


def _positions(path: Path) -> list[tuple[float, ...]]:
    """ImagePositionPatient of each frame of one file (one for a single-frame image)."""
    ds = _dcmread(path, ["ImagePositionPatient", "PerFrameFunctionalGroupsSequence"])
    if "PerFrameFunctionalGroupsSequence" not in ds:
        return [_floats(ds, "ImagePositionPatient", 3, path.name)]
    return [
        _floats(item.PlanePositionSequence[0], "ImagePositionPatient", 3, path.name)
        for item in ds.PerFrameFunctionalGroupsSequence
    ]


def _series_kind(ds: Dataset) -> str:
    modality = str(ds.get("Modality", "?"))
    if modality != "CT" or str(ds.get("SOPClassUID", "")) not in _CT_CLASSES:
        return f"{modality} {ds.get('SOPClassUID', 'no SOP class')}"
    if "LOCALIZER" in _image_type(ds):
        return "CT localizer"
    normal = np.abs(_normal(ds, "first file"))
    return "axial CT" if int(np.argmax(normal)) == 2 else "non-axial CT"


def _image_type(ds: Dataset) -> set[str]:
    """ImageType's values in capitals; one value (VM 1, as some writers give it) is one."""
    value = ds.get("ImageType", [])
    values = [value] if isinstance(value, str) else value
    return {str(v).upper() for v in values}


def _normal(ds: Dataset, where: str) -> NDArray[np.float64]:
    """The slice normal from ImageOrientationPatient (Enhanced CT: its shared group)."""
    source = ds
    if "SharedFunctionalGroupsSequence" in ds:
        source = _groups(Dataset(), ds.SharedFunctionalGroupsSequence[0])("ImageOrientationPatient")
    cosines = np.asarray(_floats(source, "ImageOrientationPatient", 6, where))
    normal: NDArray[np.float64] = np.cross(cosines[:3], cosines[3:])
    return normal


def _dcmread(path: Path, header_tags: list[str] | None = None) -> Dataset:
    try:
        if header_tags is not None:
            return pydicom.dcmread(path, stop_before_pixels=True, specific_tags=header_tags)
        return pydicom.dcmread(path)
    except (InvalidDicomError, EOFError, OSError) as exc:
        raise InvalidDataset(f"file {path.name} is not a readable DICOM file ({exc})") from exc


# What pydicom and the conversions raise on a value of the wrong form (text in a DS, a
# sequence where a number belongs, an empty IS).
_UNREADABLE_VALUE = (ValueError, TypeError, OverflowError, NotImplementedError, AttributeError)


def _read_frames(path: Path) -> list[_Frame]:
    plain = read_plain(path)
    if plain is not None:
        where = f"instance {plain.get('SOPInstanceUID')} ({path.name})"
        try:
            return [_frame(plain, plain.pixels, where, lambda _: plain)]
        except (ImagingAIError, *_UNREADABLE_VALUE):
            pass  # pydicom's reading below refuses it with the usual message
    ds = _dcmread(path)
    where = f"instance {ds.get('SOPInstanceUID', '?')} ({path.name})"
    try:
        return _frames_of(ds, where)
    except ImagingAIError:
        raise
    except _UNREADABLE_VALUE as exc:
        # Bad data, not a passing fault: refused at once with a reason, never retried.
        raise InvalidDataset(f"{where} has an attribute that cannot be read: {exc}") from exc


def _frames_of(ds: Dataset, where: str) -> list[_Frame]:
    _check_instance(ds, where)
    if "LOCALIZER" in [str(v).upper() for v in ds.get("ImageType", [])]:
        return []
    pixels = _decode(ds, where)
    if str(ds.SOPClassUID) not in _MULTI_FRAME:
        return [_frame(ds, pixels[0], where, lambda _: ds)]
    shared_seq = ds.get("SharedFunctionalGroupsSequence")
    shared = shared_seq[0] if shared_seq else Dataset()
    per_frame = ds.get("PerFrameFunctionalGroupsSequence") or []
    if len(per_frame) != len(pixels):
        raise InvalidDataset(
            f"{where} has {len(pixels)} frames but {len(per_frame)} per-frame functional groups"
        )
    return [
        _frame(ds, pixels[i], f"{where} frame {i + 1}", _groups(item, shared), i + 1)
        for i, item in enumerate(per_frame)
    ]


def _groups(item: Dataset, shared: Dataset) -> Callable[[str], Dataset]:
    """Find an attribute's functional group, per-frame before shared (PS3.3 C.7.6.16)."""

    def lookup(keyword: str) -> Dataset:
        name = f"{_FUNCTIONAL_GROUP[keyword]}Sequence"
        for source in (item, shared):
            if source.get(name):
                found: Dataset = source[name][0]
                return found
        return Dataset()  # the caller then reports the attribute as missing

    return lookup


def _frame(
    ds: Attributes,
    pixels: NDArray[Any],
    where: str,
    source: Callable[[str], Attributes],
    number: int = 1,
) -> _Frame:
    """Collect one image's geometry; `source` says which dataset holds an attribute."""
    tilt = source("GantryDetectorTilt").get("GantryDetectorTilt")
    return _Frame(
        sop_uid=_text(ds, "SOPInstanceUID", where),
        frame_number=number,
        series_uid=_text(ds, "SeriesInstanceUID", where),
        study_uid=_text(ds, "StudyInstanceUID", where),
        for_uid=_text(ds, "FrameOfReferenceUID", where),
        orientation=_floats(source("ImageOrientationPatient"), "ImageOrientationPatient", 6, where),
        position=_floats(source("ImagePositionPatient"), "ImagePositionPatient", 3, where),
        pixel_spacing=_floats(source("PixelSpacing"), "PixelSpacing", 2, where),
        slope=_floats(source("RescaleSlope"), "RescaleSlope", 1, where)[0],
        intercept=_floats(source("RescaleIntercept"), "RescaleIntercept", 1, where)[0],
        tilt_deg=float(tilt or 0.0),
        thickness_mm=_thickness(source("SliceThickness").get("SliceThickness")),
        pixels=pixels,
    )


def _thickness(value: Any) -> float | None:
    """SliceThickness in mm, or None where absent or unreadable: it is Type 2 and only ever
    qualifies the result (a caveat), so a bad value must not refuse the series."""
    try:
        thickness = float(value)
    except (*_UNREADABLE_VALUE, IndexError):
        return None
    return thickness if np.isfinite(thickness) and thickness > 0 else None


def _check_instance(ds: Dataset, where: str) -> None:
    modality = ds.get("Modality", "unknown")
    if modality != "CT":
        raise UnsupportedInput(f"{where} is modality {modality}; only CT is supported")
    sop_class = str(ds.get("SOPClassUID", ""))
    if sop_class not in _CT_CLASSES:
        name = getattr(ds.get("SOPClassUID"), "name", sop_class)
        raise UnsupportedInput(f"{where} is a {name}, not a CT image; cannot build a volume")
    if "PixelData" not in ds:
        raise InvalidDataset(f"{where} has no pixel data")
    photometric = ds.get("PhotometricInterpretation", "MONOCHROME2")
    if int(ds.get("SamplesPerPixel", 1)) != 1 or photometric != "MONOCHROME2":
        raise UnsupportedInput(f"{where} is {photometric}, not a MONOCHROME2 greyscale image")


def _decode(ds: Dataset, where: str) -> NDArray[Any]:
    """Stored pixel values as (frames, rows, cols); a buffer view where no decoding is needed."""
    rows, cols = int(_value(ds, "Rows", where)), int(_value(ds, "Columns", where))
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    bits = int(_value(ds, "BitsAllocated", where))
    syntax = ds.file_meta.get("TransferSyntaxUID") if hasattr(ds, "file_meta") else None
    if syntax in _NATIVE_LITTLE_ENDIAN and bits in (8, 16, 32):
        signed = int(_value(ds, "PixelRepresentation", where)) == 1
        dtype = np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
        try:
            raw = np.frombuffer(ds.PixelData, dtype=dtype, count=frames * rows * cols)
        except ValueError as exc:
            raise InvalidDataset(f"{where} has truncated pixel data") from exc
        stored = int(_value(ds, "BitsStored", where))
        return _mask_unused_bits(raw, stored, bits, signed).reshape(frames, rows, cols)
    try:
        return np.asarray(ds.pixel_array).reshape(frames, rows, cols)
    except (RuntimeError, NotImplementedError, ValueError, AttributeError) as exc:
        name = getattr(syntax, "name", syntax)
        raise UnsupportedInput(f"{where}: pixel data in {name} cannot be decoded ({exc})") from exc


def _mask_unused_bits(raw: NDArray[Any], stored: int, bits: int, signed: bool) -> NDArray[Any]:
    # The bits above BitsStored may hold overlays or garbage; the standard says to ignore them.
    if stored >= bits:
        return raw
    if not signed:
        return raw & ((1 << stored) - 1)
    shift = bits - stored
    return (raw << shift) >> shift  # arithmetic shift right sign-extends from bit `stored`


def _value(ds: Attributes, keyword: str, where: str) -> Any:
    value = ds.get(keyword)
    if value is None or value == "":
        raise InvalidDataset(f"{where} lacks the required attribute {keyword}")
    return value


def _text(ds: Attributes, keyword: str, where: str) -> str:
    return str(_value(ds, keyword, where))


def _floats(ds: Attributes, keyword: str, count: int, where: str) -> tuple[float, ...]:
    value = _value(ds, keyword, where)
    values = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    try:
        numbers = tuple(float(v) for v in values)
    except _UNREADABLE_VALUE as exc:
        raise InvalidDataset(f"{where} has a value in {keyword} that is not a number") from exc
    if len(numbers) != count:
        raise InvalidDataset(f"{where} has {len(numbers)} values in {keyword}, not {count}")
    return numbers


def _assemble(frames: list[_Frame], min_slices: int, workers: int = 1) -> Volume:
    series = _one_value(frames, "series_uid", "files of {n} different series")
    if len(frames) < max(2, min_slices):  # the slice spacing comes from two positions at least
        raise GeometryError(
            f"series {series} has {len(frames)} image(s); at least {max(2, min_slices)} "
            "are needed to build a volume"
        )
    study = _one_value(frames, "study_uid", "images from {n} different studies")
    frame_of_reference = _one_value(frames, "for_uid", "{n} different frames of reference")
    direction = _direction(frames, series)
    _check_matrix(frames, series)
    ordered, spacing_z = _sort_along_normal(frames, direction[:, 2], series)
    hu = _hounsfield(ordered, workers)
    row_mm, col_mm = ordered[0].pixel_spacing
    return Volume(
        hu=hu,
        origin_mm=(ordered[0].position[0], ordered[0].position[1], ordered[0].position[2]),
        spacing_mm=(col_mm, row_mm, spacing_z),
        direction=direction,
        sop_instance_uids=tuple(f.sop_uid for f in ordered),
        series_instance_uid=series,
        study_instance_uid=study,
        frame_of_reference_uid=frame_of_reference,
        frame_numbers=tuple(f.frame_number for f in ordered),
        slice_thickness_mm=_series_thickness(ordered),
    )


def _series_thickness(frames: list[_Frame]) -> float | None:
    # Scanners write one thickness per series; the median ignores a stray odd slice.
    known = [f.thickness_mm for f in frames if f.thickness_mm is not None]
    return float(np.median(known)) if known else None


def _hounsfield(ordered: list[_Frame], workers: int) -> NDArray[np.float32]:
    """The frames' stored values rescaled to HU as one read-only array, slices in threads.

    One slice at a time (cast, scale and offset while it is in cache) and several at once:
    numpy lets go of the GIL for each, and over a 300-slice series the cast alone was the
    larger part of building the volume.
    """
    hu = np.empty((len(ordered), *ordered[0].pixels.shape), dtype=np.float32)

    def fill(k: int) -> None:
        frame, out = ordered[k], hu[k]
        # One pass where the slope is 1: the same float32 sums as casting first, then adding.
        if frame.slope != 1.0:
            np.multiply(frame.pixels, np.float32(frame.slope), out=out)
            out += np.float32(frame.intercept)
        else:
            np.add(frame.pixels, np.float32(frame.intercept), out=out)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(fill, range(len(ordered))))
    hu.flags.writeable = False
    return hu


def _one_value(frames: list[_Frame], field: str, problem: str) -> str:
    values = sorted({str(getattr(f, field)) for f in frames})
    if len(values) > 1:
        message = f"series {frames[0].series_uid} has {problem.format(n=len(values))}"
        error = GeometryError if field == "for_uid" else UnsupportedInput
        raise error(f"{message} ({', '.join(values[:3])}); cannot build one volume")
    return values[0]


def _direction(frames: list[_Frame], series: str) -> NDArray[np.float64]:
    first = np.asarray(frames[0].orientation)
    distinct = [first]
    for frame in frames:
        cosines = np.asarray(frame.orientation)
        if all(np.max(np.abs(cosines - seen)) > _COSINE_TOL for seen in distinct):
            distinct.append(cosines)
    if len(distinct) > 1:
        raise GeometryError(
            f"series {series} has {len(distinct)} different image orientations; "
            "cannot build a volume"
        )
    row, col = first[:3], first[3:]
    if abs(np.linalg.norm(row) - 1) > _COSINE_TOL or abs(np.linalg.norm(col) - 1) > _COSINE_TOL:
        raise GeometryError(f"series {series} has an image orientation that is not unit vectors")
    if abs(float(row @ col)) > _COSINE_TOL:
        raise GeometryError(
            f"series {series} has image rows and columns that are not at a right angle"
        )
    row, col = row / np.linalg.norm(row), col / np.linalg.norm(col)
    return np.column_stack([row, col, np.cross(row, col)])


def _check_matrix(frames: list[_Frame], series: str) -> None:
    sizes = sorted({f.pixels.shape for f in frames})
    if len(sizes) > 1:
        listed = ", ".join(f"{r}×{c}" for r, c in sizes)
        raise GeometryError(f"series {series} mixes image sizes ({listed}); cannot build a volume")
    spacings = np.array([f.pixel_spacing for f in frames])
    if np.ptp(spacings, axis=0).max() > 1e-3 * spacings.max():
        raise GeometryError(
            f"series {series} mixes pixel spacings (from {spacings.min():g} to "
            f"{spacings.max():g} mm); cannot build a volume"
        )
    tilts = [abs(f.tilt_deg) for f in frames]
    if max(tilts) > 0.01:
        raise GeometryError(
            f"series {series} was acquired with a gantry tilt of {max(tilts):g}°; "
            "tilted series are not supported (ask for a reconstruction without "
            "tilt)"
        )


def _sort_along_normal(
    frames: list[_Frame], normal: NDArray[np.float64], series: str
) -> tuple[list[_Frame], float]:
    """Order frames by position along the normal and return them with the slice spacing."""
    positions = np.array([f.position for f in frames])
    along = positions @ normal
    order = np.argsort(along, kind="stable")
    positions, along = positions[order], along[order]
    steps = np.diff(along)
    repeated = steps < _DUPLICATE_MM
    if np.any(repeated):
        count = np.count_nonzero(np.r_[repeated, False] | np.r_[False, repeated])
        raise GeometryError(
            f"series {series} has {count} images at repeated positions (e.g. "
            f"{along[int(np.argmax(repeated))]:.2f} mm along the slice normal); cannot build a "
            "volume"
        )
    _check_shear(positions, along, normal, frames[0].pixel_spacing, series)
    _check_steps(steps, along, series)
    return [frames[i] for i in order], float((along[-1] - along[0]) / (len(along) - 1))


def _check_shear(
    positions: NDArray[np.float64],
    along: NDArray[np.float64],
    normal: NDArray[np.float64],
    pixel_spacing: tuple[float, ...],
    series: str,
) -> None:
    # Slices stacked off the normal are a sheared grid (gantry tilt); a fifth of a pixel is
    # below what resampling would change, and above decimal rounding of the positions.
    expected = positions[0] + np.outer(along - along[0], normal)
    drift = float(np.max(np.linalg.norm(positions - expected, axis=1)))
    if drift > 0.2 * min(pixel_spacing):
        raise GeometryError(
            f"series {series} has slices that are not stacked along the slice normal (shifted "
            f"sideways by up to {drift:.2f} mm, as with gantry tilt); tilted series are not "
            "supported (ask for a reconstruction without tilt)"
        )


def _check_steps(steps: NDArray[np.float64], along: NDArray[np.float64], series: str) -> None:
    median = float(np.median(steps))
    k = int(np.argmax(steps))
    if steps[k] > 1.5 * median:
        raise GeometryError(
            f"series {series} is missing slices: a gap of {steps[k]:.2f} mm between "
            f"{along[k]:.2f} and {along[k + 1]:.2f} mm along the slice normal where the "
            f"spacing is {median:.2f} mm"
        )
    k = int(np.argmax(np.abs(steps - median)))
    if abs(steps[k] - median) > _IRREGULAR_FRACTION * median:
        raise GeometryError(
            f"series {series} has irregular slice spacing ({steps[k]:.2f} mm between "
            f"{along[k]:.2f} and {along[k + 1]:.2f} mm, elsewhere {median:.2f} mm); "
            "cannot build a volume with one spacing"
        )
