"""Takes FHIR R4 requests under ``/fhir``; gives the reports' resources (read by id, a search of
DiagnosticReport), the CapabilityStatement, and errors as OperationOutcome (application/fhir+json).

Reads and searches need a ``ris`` or ``admin`` token and are audited, as the RIS API's are;
``/fhir/metadata`` (what the server can do, no patient data) is open, as FHIR clients expect.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import imaging_ai
from imaging_ai.db.models import Instance, Report, Series, Study
from imaging_ai.web.api import RisApi, audit
from imaging_ai.web.context import WebContext
from imaging_ai.web.fhir_resources import (
    RESOURCE_TYPES,
    CatalogSeries,
    Publication,
    StoredReport,
    job_of,
    published_entries,
    searchset,
)
from imaging_ai.web.fhir_search import SEARCH_PARAMS, parse_search

FHIR_JSON = "application/fhir+json"
# OperationOutcome.issue.code (R4 IssueType) for each HTTP status the API answers.
_ISSUE_CODES = {400: "invalid", 401: "login", 403: "forbidden", 404: "not-found"} | {
    405: "not-supported",
    500: "exception",
}


class FhirResponse(JSONResponse):
    """JSON with FHIR's media type."""

    media_type = FHIR_JSON


class FhirApi:
    """``/fhir``: the resources of every stored report bundle, published."""

    def __init__(self, ctx: WebContext) -> None:
        self.ctx = ctx
        self.api = RisApi(ctx)
        self.started = datetime.now(UTC).isoformat(timespec="seconds")

    def routes(self) -> list[Route]:
        """``/fhir/metadata``, the DiagnosticReport search and a read route per resource type."""
        reads = [Route(f"/fhir/{kind}/{{id}}", self._reader(kind)) for kind in RESOURCE_TYPES]
        return [
            Route("/fhir/metadata", self.metadata),
            Route("/fhir/DiagnosticReport", self.search),
            *reads,
        ]

    def publication(self, request: Request) -> Publication:
        """``[fhir]``, its base URL taken from the request where none is configured."""
        fhir = self.ctx.config.fhir
        base = fhir.base_url or str(request.base_url).rstrip("/") + "/fhir"
        return Publication(base, fhir.patient_identifier_system, fhir.accession_identifier_system)

    def metadata(self, request: Request) -> Response:
        """``GET /fhir/metadata``: the CapabilityStatement."""
        base = self.publication(request).base_url
        return FhirResponse(capability_statement(base, self.started))

    def search(self, request: Request) -> Response:
        """``GET /fhir/DiagnosticReport?...``: a searchset Bundle (see :mod:`fhir_search`)."""
        who = self.api.require(request, "ris", "admin")
        publication = self.publication(request)
        items = request.query_params.multi_items()
        query = parse_search(items, publication.patient_system, publication.accession_system)
        with self.ctx.sessions() as s, s.begin():
            rows = s.execute(
                select(Study, Report)
                .join(Report, Report.study_id == Study.id)
                .where(*query.conditions)
                .order_by(Report.created_at, Report.id)
            ).all()
            names = ",".join(sorted({name for name, _ in items}))
            accessions = f" accession {','.join(query.accessions)}" if query.accessions else ""
            audit(s, who, "read_report", f"fhir DiagnosticReport?{names}{accessions}", request)
            stored = self._stored(s, rows)
        for wanted in query.patient_ids:
            stored = [r for r in stored if _patient_of(r, publication) in wanted]
        url = f"{publication.base_url}/DiagnosticReport"
        url += f"?{request.url.query}" if request.url.query else ""
        return FhirResponse(searchset(stored, publication, url))

    def _reader(self, kind: str) -> Callable[[Request], Response]:
        def read(request: Request) -> Response:
            """``GET /fhir/<type>/{id}``: one resource of a stored report."""
            return self.read(request, kind)

        return read

    def read(self, request: Request, kind: str) -> Response:
        """One resource by its published id; 404 (OperationOutcome) if there is none."""
        who = self.api.require(request, "ris", "admin")
        ident = request.path_params["id"]
        job = job_of(ident)
        with self.ctx.sessions() as s, s.begin():
            rows = s.execute(
                select(Study, Report)
                .join(Report, Report.study_id == Study.id)
                .where(Report.job_id == (job if job is not None else -1))
            ).all()
            audit(s, who, "read_report", f"fhir {kind}/{ident}", request)
            stored = self._stored(s, rows)
        for report in stored:
            for entry in published_entries(report, self.publication(request)):
                resource = entry["resource"]
                if resource["resourceType"] == kind and resource["id"] == ident:
                    return FhirResponse(resource)
        raise HTTPException(404, f"no {kind} with id {ident!r}")

    def _stored(self, s: Session, rows: Sequence[Any]) -> list[StoredReport]:
        """The rows' reports with their stored bundles (a report without one is left out)."""
        data_dir = Path(self.ctx.config.storage.data_dir)
        series = _catalog_series(s, [study.id for study, _ in rows])
        stored = []
        for study, report in rows:
            path = data_dir / report.findings.get("files", {}).get("fhir", "")
            if path.is_file():
                bundle = json.loads(path.read_bytes())
                status, created = str(report.status), report.created_at
                series_of = tuple(series.get(study.id, ()))
                stored.append(StoredReport(report.job_id, status, created, bundle, series_of))
        return stored


def _catalog_series(s: Session, study_ids: list[int]) -> dict[int, list[CatalogSeries]]:
    """The catalogue's series of these studies, by study, in series number order."""
    if not study_ids:
        return {}
    rows = s.execute(
        select(Series, func.count(Instance.id))
        .join(Instance, (Instance.series_id == Series.id) & ~Instance.missing, isouter=True)
        .where(Series.study_id.in_(study_ids))
        .group_by(Series.id)
        .order_by(Series.series_number, Series.id)
    ).all()
    found: dict[int, list[CatalogSeries]] = {}
    for series, count in rows:
        entry = CatalogSeries(
            series.series_instance_uid, series.series_number, series.modality, count
        )
        found.setdefault(series.study_id, []).append(entry)
    return found


def _patient_of(report: StoredReport, publication: Publication) -> str:
    for entry in published_entries(report, publication):
        if entry["resource"]["resourceType"] == "Patient":
            return str(entry["resource"]["id"])
    return ""


def capability_statement(base_url: str, date: str) -> dict[str, Any]:
    """What this server implements, in R4's CapabilityStatement (kind instance)."""
    search = [
        {"name": p.name, "type": p.type, "documentation": p.documentation} for p in SEARCH_PARAMS
    ]
    resources = []
    for kind in RESOURCE_TYPES:
        resource: dict[str, Any] = {"type": kind, "interaction": [{"code": "read"}]}
        if kind == "DiagnosticReport":
            resource["interaction"].append({"code": "search-type"})
            resource["searchParam"] = search
        resources.append(resource)
    security = "Authorization: Bearer <token> of role ris or admin ([http] tokens)."
    return {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "date": date,
        "publisher": "imaging-ai",
        "kind": "instance",
        "software": {"name": "imaging-ai", "version": imaging_ai.__version__},
        "implementation": {"description": "imaging-ai: AI results of CT studies", "url": base_url},
        "fhirVersion": "4.0.1",
        "format": [FHIR_JSON, "json"],
        "rest": [{"mode": "server", "security": {"description": security}, "resource": resources}],
    }


def operation_outcome(status: int, message: str, headers: dict[str, str] | None) -> Response:
    """The error answer of every ``/fhir`` request: an OperationOutcome with one issue."""
    issue = {"severity": "error", "code": _ISSUE_CODES.get(status, "processing")}
    outcome = {"resourceType": "OperationOutcome", "issue": [issue | {"diagnostics": message}]}
    return FhirResponse(outcome, status_code=status, headers=headers)
