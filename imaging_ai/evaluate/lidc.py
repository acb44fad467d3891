"""Takes an LIDC reader XML and the image's Volume; gives reference lesions as LUNA16 counts them.

Each reader's marks (``unblindedReadNodule`` with ``roi`` contours or a single point, and
``nonNodule`` loci) are placed on the image by ``imageSOP_UID`` (or ``imageZposition`` when the
UID is not in the series). Marks of different readers that overlap, or whose centres are within
max(5 mm, the larger one's radius), are one finding. A finding that at least one reader
contoured as a nodule >= 3 mm is a lesion (``readers`` says how many did); the rest (nodules
< 3 mm, non-nodules) are irrelevant findings: a detection on them is neither hit nor false
positive.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from imaging_ai.errors import InvalidDataset
from imaging_ai.evaluate.contours import fill_polygons
from imaging_ai.evaluate.metrics import MIN_HIT_RADIUS_MM, ReferenceLesion
from imaging_ai.postprocess import axial_diameters
from imaging_ai.volume import Volume

_NS = "{http://www.nih.gov}"


@dataclass(frozen=True, eq=False)
class Mark:
    """One reader's mark: a contoured nodule (>= 3 mm), a small nodule, or a non-nodule."""

    reader: int
    contoured: bool
    voxels: NDArray[np.intp]  # (n, 3) slice, row, col
    centre_mm: tuple[float, float, float]
    long_axis_mm: float


def lidc_lesions(xml: bytes, volume: Volume) -> list[ReferenceLesion]:
    """The XML's findings on the volume: lesions first (largest first), then irrelevant ones."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise InvalidDataset(f"LIDC XML is not well-formed: {exc}") from exc
    marks = [
        mark
        for reader, session in enumerate(root.iter(f"{_NS}readingSession"))
        for mark in _session_marks(session, reader, volume)
    ]
    findings = [_finding(n, group) for n, group in enumerate(cluster(marks), start=1)]
    findings.sort(key=lambda f: (not f.relevant, -f.diameter_mm))
    return findings


def _session_marks(session: ET.Element, reader: int, volume: Volume) -> list[Mark]:
    marks = []
    for nodule in session.iter(f"{_NS}unblindedReadNodule"):
        rois = nodule.findall(f"{_NS}roi")
        contoured = any(len(r.findall(f"{_NS}edgeMap")) >= 3 for r in rois)
        voxels = _roi_voxels(rois, volume) if contoured else _points(rois, "edgeMap", volume)
        if len(voxels):
            marks.append(_mark(reader, contoured, voxels, volume))
    for other in session.iter(f"{_NS}nonNodule"):
        voxels = _points([other], "locus", volume)
        if len(voxels):
            marks.append(_mark(reader, False, voxels, volume))
    return marks


def _mark(reader: int, contoured: bool, voxels: NDArray[np.intp], volume: Volume) -> Mark:
    centre = volume.index_to_lps(voxels[:, ::-1].mean(axis=0))
    long_axis = axial_diameters(voxels, volume)[0] if contoured else 0.0
    return Mark(
        reader, contoured, voxels, (float(centre[0]), float(centre[1]), float(centre[2])), long_axis
    )


def _slice_of(element: ET.Element, volume: Volume) -> int | None:
    """The slice an ROI or locus is on: by SOP Instance UID, else by z position."""
    uid = (element.findtext(f"{_NS}imageSOP_UID") or "").strip()
    if uid in volume.sop_instance_uids:
        return volume.sop_instance_uids.index(uid)
    z_text = element.findtext(f"{_NS}imageZposition")
    if z_text is None:
        return None
    z = float(z_text)
    zs = volume.index_to_lps(np.array([[0.0, 0.0, k] for k in range(volume.hu.shape[0])]))[:, 2]
    k = int(np.argmin(np.abs(zs - z)))
    return k if abs(zs[k] - z) <= volume.spacing_mm[2] / 2 + 1e-3 else None


def _xy(element: ET.Element, tag: str) -> NDArray[np.float64]:
    """The (x = column, y = row) pixel coordinates of an element's ``tag`` children."""
    return np.array(
        [
            (float(e.findtext(f"{_NS}xCoord", "nan")), float(e.findtext(f"{_NS}yCoord", "nan")))
            for e in element.findall(f"{_NS}{tag}")
        ],
        dtype=np.float64,
    ).reshape(-1, 2)


def _roi_voxels(rois: list[ET.Element], volume: Volume) -> NDArray[np.intp]:
    """Voxels inside a nodule's contours; ``inclusion`` FALSE contours are holes."""
    by_slice: dict[int, tuple[list[NDArray[np.float64]], list[NDArray[np.float64]]]] = {}
    for roi in rois:
        k = _slice_of(roi, volume)
        if k is None:
            continue
        keep, cut = by_slice.setdefault(k, ([], []))
        include = (roi.findtext(f"{_NS}inclusion") or "TRUE").strip().upper() == "TRUE"
        (keep if include else cut).append(_xy(roi, "edgeMap"))
    shape = volume.hu.shape[1:]
    parts = []
    for k, (keep, cut) in sorted(by_slice.items()):
        mask = fill_polygons(keep, shape) & ~fill_polygons(cut, shape)
        rows, cols = np.nonzero(mask)
        parts.append(np.stack([np.full_like(rows, k), rows, cols], axis=1))
    return np.concatenate(parts).astype(np.intp) if parts else np.zeros((0, 3), np.intp)


def _points(elements: list[ET.Element], tag: str, volume: Volume) -> NDArray[np.intp]:
    """The voxels of single-point marks (small nodules, non-nodule loci)."""
    found = []
    for element in elements:
        k = _slice_of(element, volume)
        for x, y in _xy(element, tag):
            if k is not None:
                found.append((k, round(y), round(x)))
    return np.asarray(found, np.intp).reshape(-1, 3)


def cluster(marks: list[Mark]) -> list[list[Mark]]:
    """Group marks that overlap or lie close (union-find over all pairs)."""
    parent = list(range(len(marks)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(marks)):
        for j in range(i + 1, len(marks)):
            if _same_finding(marks[i], marks[j]):
                parent[root(i)] = root(j)
    groups: dict[int, list[Mark]] = {}
    for i, mark in enumerate(marks):
        groups.setdefault(root(i), []).append(mark)
    return list(groups.values())


def _same_finding(a: Mark, b: Mark) -> bool:
    gap = float(np.linalg.norm(np.subtract(a.centre_mm, b.centre_mm)))
    if gap <= max(MIN_HIT_RADIUS_MM, a.long_axis_mm / 2, b.long_axis_mm / 2):
        return True
    if not (a.contoured and b.contoured):
        return False
    seen = {tuple(v) for v in a.voxels.tolist()}
    return any(tuple(v) in seen for v in b.voxels.tolist())


def _finding(number: int, group: list[Mark]) -> ReferenceLesion:
    """One finding from its marks: a lesion when any reader contoured it as a nodule."""
    nodules = [m for m in group if m.contoured]
    chosen = nodules or group
    centre = np.mean([m.centre_mm for m in chosen], axis=0)
    return ReferenceLesion(
        name=f"finding {number}",
        centre_mm=(float(centre[0]), float(centre[1]), float(centre[2])),
        # LUNA16 sizes a nodule by the mean of its readers' measurements.
        diameter_mm=float(np.mean([m.long_axis_mm for m in chosen])),
        voxels=np.unique(np.concatenate([m.voxels for m in chosen]), axis=0),
        relevant=bool(nodules),
        readers=len({m.reader for m in nodules}),
    )
