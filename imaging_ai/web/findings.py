"""Takes a study's report; gives the study page its findings (size, place, probability, whether
reported) with their key images, and the input's caveats; serves the key images.

The findings are the report's candidates (every one the detector proposed, reported or not),
or its reported lesions where no candidate stage ran. Key images are the PNGs that
:mod:`imaging_ai.outputs.keyimages` wrote into the job's result folder; only names of the form
``key-<number>.png`` inside that folder are ever read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from imaging_ai.db.models import Report, Study
from imaging_ai.outputs.keyimages import KEY_IMAGE_NAME, key_image_name
from imaging_ai.web.pages import Pages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finding:
    """One finding as the study page lists it; ``image`` is its key image's URL or ""."""

    number: int
    long_axis_mm: float
    short_axis_mm: float
    volume_ml: float
    location: str
    probability: float | None
    reported: bool
    mean_hu: float | None
    image: str


@dataclass(frozen=True)
class Findings:
    """A study's report as the study page shows it."""

    impression: str
    entries: tuple[Finding, ...]
    caveats: tuple[str, ...]
    reported: int


def study_findings(s: Session, uid: str, data_dir: Path) -> Findings | None:
    """The findings of a study's report, reported first then by probability; None without one.

    Parameters
    ----------
    s
        A database session.
    uid
        The Study Instance UID.
    data_dir
        ``[storage] data_dir``, where the result folders are.
    """
    report = _report(s, uid)
    if report is None:
        return None
    data = report.findings or {}
    folder = result_folder(data_dir, data)
    listed = data.get("candidates") or data.get("lesions") or []
    items = [_finding(x, uid, folder) for x in listed if isinstance(x, Mapping)]
    items.sort(key=lambda f: (not f.reported, -(f.probability or 0.0), f.number))
    caveats = tuple(str(c) for c in data.get("caveats") or ())
    reported = sum(1 for f in items if f.reported)
    return Findings(report.impression, tuple(items), caveats, reported)


def result_folder(data_dir: Path, findings: Mapping[str, Any]) -> Path | None:
    """The job's result folder named in a report, if it lies under ``data_dir/results``."""
    named = (findings.get("files") or {}).get("folder")
    if not isinstance(named, str) or not named:
        return None
    root = (data_dir / "results").resolve()
    folder = (data_dir / named).resolve()
    if not folder.is_relative_to(root):
        log.warning("a report names a result folder outside %s; its key images are not shown", root)
        return None
    return folder


def key_image_url(uid: str, number: int) -> str:
    """Where the study page asks for a finding's key image."""
    return f"/admin/studies/{quote(uid, safe='')}/images/{key_image_name(number)}"


class KeyImages:
    """``GET /admin/studies/{uid}/images/key-<n>.png``: a finding's key image, for admins."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages

    def routes(self) -> list[Route]:
        """The key image route."""
        return [Route("/admin/studies/{study_uid}/images/{name}", self.image)]

    def image(self, request: Request) -> Response:
        """The PNG from the study's latest result folder; 404 for any name but
        ``key-<number>.png`` (checked before the disk is touched) and where there is none."""
        self.pages.admin(request)
        uid, name = request.path_params["study_uid"], request.path_params["name"]
        match = KEY_IMAGE_NAME.fullmatch(name)
        path = self._path(uid, int(match.group(1))) if match else None
        if path is None or not path.is_file():
            raise HTTPException(404, "no such key image for this study")
        return Response(path.read_bytes(), media_type="image/png")

    def _path(self, uid: str, number: int) -> Path | None:
        data_dir = Path(self.pages.ctx.config.storage.data_dir)
        with self.pages.ctx.sessions() as s:
            report = _report(s, uid)
            folder = result_folder(data_dir, report.findings or {}) if report else None
        return folder / key_image_name(number) if folder else None


def _report(s: Session, uid: str) -> Report | None:
    return s.scalars(
        select(Report)
        .join(Study, Study.id == Report.study_id)
        .where(Study.study_instance_uid == uid)
    ).first()


def _finding(item: Mapping[str, Any], uid: str, folder: Path | None) -> Finding:
    """A finding from its JSON (reports written before a key was added lack it)."""
    number = int(item.get("number", 0))
    probability = item.get("probability")
    has_image = folder is not None and (folder / key_image_name(number)).is_file()
    return Finding(
        number=number,
        long_axis_mm=float(item.get("long_axis_mm", 0.0)),
        short_axis_mm=float(item.get("short_axis_mm", 0.0)),
        volume_ml=float(item.get("volume_ml", 0.0)),
        location=str(item.get("location", "")),
        probability=None if probability is None else float(probability),
        reported=bool(item.get("reported", True)),
        mean_hu=_float_or_none(item.get("mean_hu")),
        image=key_image_url(uid, number) if has_image else "",
    )


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
