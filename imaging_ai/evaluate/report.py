"""Takes the scored cases; gives summary.json, the stdout table, froc.png and per-case PNGs.

Drawn with Pillow (the daemon ships no plotting library); the slices with
:func:`imaging_ai.render.key_image`, as the status page draws them. Per case, the worst slices: the
reported false positives with the highest scores and every missed lesion (or, when there are
none, the lesions found), each on the slice through its centre in a lung window, with the
findings outlined: reference lesions green, hits cyan, false positives red, missed lesions
yellow, the analysis's lungs blue.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw

from imaging_ai.evaluate.cases import Case
from imaging_ai.evaluate.metrics import FROC_RATES, FrocCurve, Outcome
from imaging_ai.evaluate.run import CaseResult
from imaging_ai.render import key_image

MOST_FALSE_POSITIVES = 3
MOST_PICTURES = 6
PICTURE_PIXELS = 512
_GREEN, _CYAN, _RED, _YELLOW, _BLUE = (
    (40, 220, 40),
    (0, 220, 255),
    (255, 40, 40),
    (255, 230, 0),
    (70, 110, 255),
)


def write_summary(out: Path, cases: list[dict[str, Any]], overall: dict[str, Any]) -> Path:
    """Write ``out/summary.json``; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    body = {"cases": cases, "overall": overall, "froc_rates_fp_per_scan": list(FROC_RATES)}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def table(cases: Sequence[dict[str, Any]], overall: dict[str, Any]) -> str:
    """A plain-text table: one row per case and one for all of them."""
    head = (
        f"{'case':<22} {'slices':>6} {'z mm':>5} {'Dice R':>6} {'Dice L':>6} "
        f"{'found':>7} {'reported':>8} {'FP':>4} {'CPM':>5} {'s':>6}"
    )
    rows = [head, "-" * len(head)]
    for c in cases:
        rows.append(_row(c["name"], c, f"{c['slices']:>6} {c['spacing_mm'][2]:>5.2f}"))
    rows.append("-" * len(head))
    rows.append(_row(f"all ({overall['cases']})", overall, f"{'':>6} {'':>5}"))
    return "\n".join(rows)


def _row(name: str, c: dict[str, Any], middle: str) -> str:
    found = f"{c['lesions_found']}/{c['lesions_total']}"
    return (
        f"{name[:22]:<22} {middle} {_num(c['dice_right']):>6} {_num(c['dice_left']):>6} "
        f"{found:>7} {c['reported']:>8} {c['false_positives']:>4} {c['cpm']:>5.2f} "
        f"{c['seconds']:>6.1f}"
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def draw_froc(curve: FrocCurve, path: Path, title: str) -> None:
    """The FROC curve on a log2 false-positive axis from 1/8 to 8 per scan."""
    width, height, left, top, right, bottom = 640, 440, 60, 40, 20, 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    span_x, span_y = width - left - right, height - top - bottom

    def at(rate: float, sens: float) -> tuple[float, float]:
        x = left + span_x * (math.log2(rate) + 3) / 6
        return x, top + span_y * (1 - sens)

    for tick in FROC_RATES:
        x, _ = at(tick, 0)
        draw.line([(x, top), (x, top + span_y)], fill=(225, 225, 225))
        draw.text((x - 10, top + span_y + 6), _rate_label(tick), fill="black")
    for sens in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = at(1, sens)
        draw.line([(left, y), (left + span_x, y)], fill=(225, 225, 225))
        draw.text((left - 34, y - 6), f"{sens:.2f}", fill="black")
    rates = np.geomspace(FROC_RATES[0], FROC_RATES[-1], 200)
    draw.line([at(float(r), curve.at(float(r))) for r in rates], fill=_BLUE, width=3)
    for rate in FROC_RATES:
        x, y = at(rate, curve.at(rate))
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], outline="black", fill=_BLUE)
    draw.rectangle([left, top, left + span_x, top + span_y], outline="black")
    draw.text((left, 12), f"{title}   CPM {curve.cpm():.3f}", fill="black")
    draw.text((left + span_x // 2 - 70, height - 22), "false positives per scan", fill="black")
    draw.text((6, top - 20), "sensitivity", fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def _rate_label(rate: float) -> str:
    return {0.125: "1/8", 0.25: "1/4", 0.5: "1/2"}.get(rate, f"{rate:g}")


def worst_findings(result: CaseResult) -> list[tuple[str, tuple[float, float, float]]]:
    """What to picture: top false positives, missed lesions, else the lesions found."""
    op = result.at_operating_point
    false = sorted(
        (d for i, d in enumerate(result.detections) if op.outcomes[i] is Outcome.FALSE_POSITIVE),
        key=lambda d: -d.score,
    )[:MOST_FALSE_POSITIVES]
    picks = [
        (f"false positive, score {d.score:.2f}, {d.long_axis_mm:.1f} mm", d.centre_mm)
        for d in false
    ]
    found = list(zip(result.relevant, op.found_by, strict=True))
    missed = [
        (f"missed {x.name}, {x.diameter_mm:.1f} mm", x.centre_mm) for x, d in found if d is None
    ]
    picks += missed
    if not picks:
        picks = [(f"found {x.name}, {x.diameter_mm:.1f} mm", x.centre_mm) for x, _ in found]
    return picks[:MOST_PICTURES]


def draw_case(case: Case, lungs: NDArray[np.uint8], result: CaseResult, folder: Path) -> list[Path]:
    """Write the case's worst slices as PNGs into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, (caption, centre) in enumerate(worst_findings(result), start=1):
        i, j, k = case.volume.lps_to_index(centre)
        k = min(max(round(float(k)), 0), case.volume.hu.shape[0] - 1)
        image = slice_picture(case, lungs, result, k, (float(j), float(i)))
        ImageDraw.Draw(image).text((6, 6), f"{case.name} slice {k}: {caption}", fill=_YELLOW)
        path = folder / f"{n:02d}-{caption.split(',')[0].replace(' ', '-')}.png"
        image.save(path)
        paths.append(path)
    return paths


def slice_picture(
    case: Case,
    lungs: NDArray[np.uint8],
    result: CaseResult,
    k: int,
    at: tuple[float, float],
) -> Image.Image:
    """Slice ``k`` in a lung window with the lungs, references and detections outlined and a
    circle round ``at`` (row, column), the finding pictured."""
    overlays = [(lungs[k] == value, _BLUE) for value in (1, 2)]
    op = result.at_operating_point
    for lesion, by in zip(result.relevant, op.found_by, strict=True):
        colour = _GREEN if by is not None else _YELLOW
        overlays.append((_on_slice(lesion.voxels, k, lungs.shape[1:]), colour))
    for n, d in enumerate(result.detections):
        if d.reported:
            colour = _RED if op.outcomes[n] is Outcome.FALSE_POSITIVE else _CYAN
            overlays.append((_on_slice(d.voxels, k, lungs.shape[1:]), colour))
    # Cropped scans (a few centimetres across) are enlarged to about 512 pixels to be seen.
    scale = max(1.0, PICTURE_PIXELS / max(lungs.shape[1:]))
    picture = key_image(
        case.volume.hu[k], overlays, markers=[(*at, _YELLOW)], marker_radius=16, scale=scale
    )
    return picture.convert("RGB")


def _on_slice(voxels: NDArray[np.intp], k: int, shape: tuple[int, ...]) -> NDArray[np.bool_]:
    mask = np.zeros(shape, bool)
    here = voxels[voxels[:, 0] == k]
    mask[here[:, 1], here[:, 2]] = True
    return mask
