"""Takes HTTP requests and gives JSON views of studies, health and readiness (Starlette)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from imaging_ai.db.models import AuditEvent, Instance, Job, Report, Series, Study
from imaging_ai.db.session import utcnow
from imaging_ai.web.auth import Principal, TokenStore

log = logging.getLogger(__name__)

MAX_PAGE = 500


class AdminActions(Protocol):
    """What an administrator can do from the status page; each is audited by the daemon."""

    def force_complete(self, study_uid: str, actor: str) -> bool:
        """Complete a study that is still receiving."""

    def retry_study(self, study_uid: str, actor: str) -> bool:
        """Queue a failed study again."""

    def raise_priority(self, study_uid: str, priority: str, actor: str) -> bool:
        """Move a queued study to a more urgent class."""

    def set_paused(self, priority: str, paused: bool, actor: str) -> None:
        """Pause or resume a priority class."""

    def retry_delivery(self, delivery_id: int, actor: str) -> bool:
        """Try a pending delivery now."""

    def cancel_delivery(self, delivery_id: int, actor: str) -> bool:
        """Stop trying a delivery."""


def _no_live_status() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class WebContext:
    """What the web app needs from the daemon, passed in explicitly.

    ``live`` returns in-memory state for the status page (receivers, workers, the study in
    hand); ``actions`` is None where the app runs without a daemon (tests of read views).
    """

    sessions: sessionmaker[Session]
    tokens: TokenStore
    readiness: Callable[[], dict[str, str]]
    live: Callable[[], dict[str, Any]] = _no_live_status
    actions: AdminActions | None = None


def create_app(ctx: WebContext) -> Starlette:
    """Build the ASGI application."""

    def require(request: Request, *roles: str) -> Principal:
        principal = ctx.tokens.from_request(request)
        if principal is None:
            raise HTTPException(401, "a valid Authorization: Bearer token is required")
        if principal.role not in roles:
            raise HTTPException(403, f"role {principal.role!r} may not do this")
        return principal

    async def list_studies(request: Request) -> Response:
        require(request, "ris", "admin")
        limit = _int_param(request, "limit", 100, 1, MAX_PAGE)
        with ctx.sessions() as s:
            query = select(Study).order_by(Study.received_at.desc()).limit(limit)
            if accession := request.query_params.get("accession"):
                query = query.where(Study.accession_number == accession)
            if state := request.query_params.get("state"):
                query = query.where(Study.state == state)
            studies = s.scalars(query).all()
            rows = [study_json(s, study) for study in studies]
        return JSONResponse({"studies": rows})

    async def get_study(request: Request) -> Response:
        require(request, "ris", "admin")
        uid = request.path_params["study_uid"]
        with ctx.sessions() as s:
            study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).first()
            if study is None:
                raise HTTPException(404, f"no study with Study Instance UID {uid}")
            return JSONResponse(study_json(s, study))

    async def get_report(request: Request) -> Response:
        who = require(request, "ris", "admin")
        uid = request.path_params["study_uid"]
        with ctx.sessions() as s, s.begin():
            row = s.execute(
                select(Study, Report)
                .join(Report, Report.study_id == Study.id)
                .where(Study.study_instance_uid == uid)
            ).first()
            if row is None:
                raise HTTPException(404, f"no report for Study Instance UID {uid}")
            audit(s, who, "read_report", uid, request)
            return JSONResponse(report_json(s, row[0], row[1]))

    async def list_reports(request: Request) -> Response:
        who = require(request, "ris", "admin")
        accession = request.query_params.get("accession")
        if not accession:
            raise HTTPException(400, "query parameter accession is required")
        with ctx.sessions() as s, s.begin():
            rows = s.execute(
                select(Study, Report)
                .join(Report, Report.study_id == Study.id)
                .where(Study.accession_number == accession)
                .order_by(Report.created_at)
            ).all()
            audit(s, who, "read_report", f"accession {accession}", request)
            return JSONResponse({"reports": [report_json(s, st, rp) for st, rp in rows]})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        checks = ctx.readiness()
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    routes = [
        Route("/api/v1/studies", list_studies),
        Route("/api/v1/studies/{study_uid}", get_study),
        Route("/api/v1/reports", list_reports),
        Route("/api/v1/reports/{study_uid}", get_report),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=headers)


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPException(400, f"query parameter {name} must be an integer") from None
    if not low <= value <= high:
        raise HTTPException(400, f"query parameter {name} must be between {low} and {high}")
    return value


def iso(value: datetime | None) -> str | None:
    """ISO 8601 UTC with a Z, or None."""
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def study_json(s: Session, study: Study) -> dict[str, Any]:
    """The public JSON view of a study (no patient identifiers)."""
    counts = s.execute(
        select(func.count(Instance.id), func.count(func.distinct(Series.id)))
        .select_from(Series)
        .join(Instance, Instance.series_id == Series.id, isouter=True)
        .where(Series.study_id == study.id)
    ).one()
    return {
        "study_uid": study.study_instance_uid,
        "accession": study.accession_number,
        "state": study.state,
        "priority": study.priority or None,
        "priority_reason": study.priority_reason or None,
        "deadline": iso(study.deadline),
        "instance_count": counts[0],
        "series_count": counts[1],
        "late_instances": study.late_instances,
        "received_at": iso(study.received_at),
        "last_instance_at": iso(study.last_instance_at),
        "completed_at": iso(study.completed_at),
        "completion_reason": study.completion_reason or None,
        "error": study.error or None,
    }


def report_json(s: Session, study: Study, report: Report) -> dict[str, Any]:
    """The RIS view of a report: findings, measurements, impression, models, timings."""
    job = s.get(Job, report.job_id)
    findings = dict(report.findings)
    return {
        "study_uid": study.study_instance_uid,
        "accession": study.accession_number,
        "status": report.status,
        "ai_generated": True,
        "created_at": iso(report.created_at),
        "impression": report.impression,
        "lesions": findings.get("lesions", []),
        "organ_volumes_ml": findings.get("organ_volumes_ml", {}),
        "models": findings.get("models", {}),
        "timings_s": job.timings if job is not None else {},
        "coordinates": findings.get("coordinates", ""),
    }


def audit(s: Session, who: Principal, action: str, target: str, request: Request) -> None:
    """Record who read or did what, from where (no patient identifiers)."""
    source = request.client.host if request.client else ""
    s.add(AuditEvent(at=utcnow(), actor=who.name, action=action, target=target, source=source))


def database_ready(sessions: sessionmaker[Session]) -> str:
    """'ok' when the database answers, else the reason."""
    try:
        with sessions() as s:
            s.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"database unreachable: {exc.__class__.__name__}"
