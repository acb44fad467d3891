"""Takes RIS requests with a bearer token; gives studies and reports as JSON (reads audited)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from imaging_ai.db.models import AuditEvent, Delivery, Instance, Job, Report, Series, Study
from imaging_ai.db.session import utcnow
from imaging_ai.states import DeliveryState
from imaging_ai.web.auth import Principal
from imaging_ai.web.context import WebContext
from imaging_ai.web.status import study_series

MAX_PAGE = 500


class RisApi:
    """``/api/v1``: studies and reports for ``ris`` and ``admin`` tokens.

    Handlers are plain functions: Starlette runs them in a thread, off the event loop, since
    they query the database.
    """

    def __init__(self, ctx: WebContext) -> None:
        self.ctx = ctx

    def routes(self) -> list[Route]:
        """The API's routes."""
        return [
            Route("/api/v1/studies", self.list_studies),
            Route("/api/v1/studies/{study_uid}", self.get_study),
            Route("/api/v1/reports", self.list_reports),
            Route("/api/v1/reports/{study_uid}", self.get_report),
        ]

    def require(self, request: Request, *roles: str) -> Principal:
        """The caller, if its bearer token has one of ``roles``; else 401 or 403."""
        principal = self.ctx.tokens.from_request(request)
        if principal is None:
            raise HTTPException(401, "a valid Authorization: Bearer token is required")
        if principal.role not in roles:
            raise HTTPException(403, f"role {principal.role!r} may not do this")
        return principal

    def list_studies(self, request: Request) -> Response:
        """Studies, newest first, by accession number or state."""
        self.require(request, "ris", "admin")
        limit = _int_param(request, "limit", 100, 1, MAX_PAGE)
        with self.ctx.sessions() as s:
            query = select(Study).order_by(Study.received_at.desc()).limit(limit)
            if accession := request.query_params.get("accession"):
                query = query.where(Study.accession_number == accession)
            if state := request.query_params.get("state"):
                query = query.where(Study.state == state)
            rows = [study_json(s, study) for study in s.scalars(query).all()]
        return JSONResponse({"studies": rows})

    def get_study(self, request: Request) -> Response:
        """One study by Study Instance UID, with its deliveries."""
        self.require(request, "ris", "admin")
        uid = request.path_params["study_uid"]
        with self.ctx.sessions() as s:
            study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).first()
            if study is None:
                raise HTTPException(404, f"no study with Study Instance UID {uid}")
            deliveries = [delivery_json(d) for d in study_deliveries(s, study.id)]
            series = [series_json(row, n) for row, n in study_series(s, study.study_instance_uid)]
            return JSONResponse(
                {**study_json(s, study), "series": series, "deliveries": deliveries}
            )

    def get_report(self, request: Request) -> Response:
        """The report of a study (audited)."""
        who = self.require(request, "ris", "admin")
        uid = request.path_params["study_uid"]
        with self.ctx.sessions() as s, s.begin():
            row = s.execute(
                select(Study, Report)
                .join(Report, Report.study_id == Study.id)
                .where(Study.study_instance_uid == uid)
            ).first()
            if row is None:
                raise HTTPException(404, f"no report for Study Instance UID {uid}")
            audit(s, who, "read_report", uid, request)
            return JSONResponse(report_json(s, row[0], row[1]))

    def list_reports(self, request: Request) -> Response:
        """The reports of an accession number (audited)."""
        who = self.require(request, "ris", "admin")
        accession = request.query_params.get("accession")
        if not accession or len(accession) > 64:
            raise HTTPException(
                400, "query parameter accession (at most 64 characters) is required"
            )
        with self.ctx.sessions() as s, s.begin():
            rows = s.execute(
                select(Study, Report)
                .join(Report, Report.study_id == Study.id)
                .where(Study.accession_number == accession)
                .order_by(Report.created_at)
            ).all()
            audit(s, who, "read_report", f"accession {accession}", request)
            return JSONResponse({"reports": [report_json(s, st, rp) for st, rp in rows]})


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
    job = s.scalars(select(Job).where(Job.study_id == study.id).order_by(Job.id.desc())).first()
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
        "notes": list(job.notes) if job is not None else [],
    }


def series_json(series: Series, instances: int) -> dict[str, Any]:
    """One series as radiology IT sees it: what it is, and why it is not analysed (if not)."""
    return {
        "series_uid": series.series_instance_uid,
        "series_number": series.series_number,
        "modality": series.modality,
        "instance_count": instances,
        "not_analysed": series.not_analysed or None,
    }


def study_deliveries(s: Session, study_id: int) -> list[Delivery]:
    """A study's deliveries, oldest first."""
    return list(
        s.scalars(select(Delivery).where(Delivery.study_id == study_id).order_by(Delivery.id))
    )


def delivery_json(d: Delivery) -> dict[str, Any]:
    """One delivery as RIS and radiology IT see it: what went where, its state and why."""
    return {
        "result": d.kind,
        "destination": d.destination,
        "state": d.state,
        "attempts": d.attempts,
        "last_error": d.last_error or None,
        "created_at": iso(d.created_at),
        "last_attempt_at": iso(d.last_attempt_at),
        "next_try_at": iso(d.next_try_at) if d.state == DeliveryState.PENDING else None,
        "delivered_at": iso(d.delivered_at),
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
    s.add(
        AuditEvent(
            at=utcnow(), actor=who.name, action=action, target=target[:200], source=source[:100]
        )
    )
