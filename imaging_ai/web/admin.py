"""Takes requests for the admin pages; gives the status page and its live part, search, a study
and the audit log. Patient names appear only here, behind the admin role, and never in logs."""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from imaging_ai.config import PRIORITY_CLASSES, Config
from imaging_ai.db.session import utcnow
from imaging_ai.web import status
from imaging_ai.web.actions import ACTIONS
from imaging_ai.web.charts import buckets, quantile_or_none, turnaround_chart
from imaging_ai.web.findings import study_findings
from imaging_ai.web.live import live_panels
from imaging_ai.web.pages import Pages

log = logging.getLogger(__name__)

AUDIT_PAGE = 100
AUDIT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "sign-ins": ("sign_in", "sign_in_failed", "sign_out", "csrf_rejected"),
    "report reads": ("read_report",),
    "searches and views": ("search", "view_study"),
    "admin actions": ("admin_request", *ACTIONS),
    "configuration": ("config_reload", "models_reload"),
    "retention": ("purge",),
}
DATE = re.compile(r"^(\d{4})-?(\d{2})-?(\d{2})$")


@dataclass(frozen=True)
class Window:
    """Turnaround of one class over a window: how many, p50, p95, deadline misses."""

    count: int
    p50: float | None
    p95: float | None
    misses: int


@dataclass(frozen=True)
class ClassSummary:
    """A class's recent turnaround: figures and charts for the last hour and day."""

    priority: str
    sla_s: float
    hour: Window
    day: Window
    hour_chart: Markup
    day_chart: Markup


class AdminPages:
    """The read-only admin pages."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages

    def routes(self) -> list[Route]:
        """The status page and its live part, search, a study, the audit log."""
        return [
            Route("/admin", self.status_page),
            Route("/admin/live", self.live_part),
            Route("/admin/search", self.search),
            Route("/admin/studies/{study_uid}", self.study),
            Route("/admin/audit", self.audit),
        ]

    def status_page(self, request: Request) -> Response:
        """Now, Recent and Problems; refreshes its live part by itself."""
        admin = self.pages.admin(request)
        notice = _notice(request.query_params)
        return self.pages.render(request, "status.html", admin, notice=notice, **self._sections())

    def live_part(self, request: Request) -> Response:
        """The sections alone, for the page's polling script."""
        admin = self.pages.admin(request)
        return self.pages.render(request, "sections.html", admin, **self._sections())

    def search(self, request: Request) -> Response:
        """Studies by accession number or study date, with patient names; audited."""
        admin = self.pages.admin(request)
        accession = request.query_params.get("accession", "").strip()[:64]
        raw_date = request.query_params.get("date", "").strip()
        match = DATE.match(raw_date)
        if raw_date and not match:
            raise HTTPException(400, f"study date {raw_date!r} is not YYYY-MM-DD")
        date = "".join(match.groups()) if match else ""
        hits: list[status.SearchHit] = []
        if accession or date:
            with self.pages.ctx.sessions() as s:
                hits = status.search(s, accession, date)
            what = " and ".join(
                f"{k} {v}" for k, v in (("accession", accession), ("date", date)) if v
            )
            self.pages.audit(admin.principal.name, "search", what, request, f"{len(hits)} found")
        return self.pages.render(
            request,
            "search.html",
            admin,
            hits=hits,
            accession=accession,
            date=raw_date,
            searched=bool(accession or date),
        )

    def study(self, request: Request) -> Response:
        """One study: state, stage times, findings with their key images, deliveries, its
        audit trail; audited."""
        admin = self.pages.admin(request)
        uid = request.path_params["study_uid"]
        data_dir = Path(self.pages.ctx.config.storage.data_dir)
        with self.pages.ctx.sessions() as s:
            hit = status.study(s, uid, utcnow())
            if hit is None:
                raise HTTPException(404, f"no study with Study Instance UID {uid}")
            findings = study_findings(s, uid, data_dir)
            deliveries = status.study_deliveries(s, uid)
            series = status.study_series(s, uid)
            purges = status.study_purges(s, uid)
            events = status.audit_events(s, AUDIT_PAGE, target=uid)
        self.pages.audit(admin.principal.name, "view_study", uid, request)
        return self.pages.render(
            request,
            "study.html",
            admin,
            hit=hit,
            findings=findings,
            deliveries=deliveries,
            series=series,
            purges=purges,
            events=events,
            can_act=self.pages.ctx.actions is not None,
        )

    def audit(self, request: Request) -> Response:
        """The audit log, newest first, by category and actor, a page at a time."""
        admin = self.pages.admin(request)
        category = request.query_params.get("category", "")
        actor = request.query_params.get("actor", "").strip()[:100]
        before = request.query_params.get("before", "")
        with self.pages.ctx.sessions() as s:
            events = status.audit_events(
                s,
                AUDIT_PAGE,
                int(before) if before.isdigit() else None,
                AUDIT_CATEGORIES.get(category, ()),
                actor,
            )
        return self.pages.render(
            request,
            "audit.html",
            admin,
            events=events,
            category=category,
            actor=actor,
            categories=AUDIT_CATEGORIES,
            more=len(events) == AUDIT_PAGE,
        )

    def _sections(self) -> dict[str, Any]:
        now = utcnow()
        with self.pages.ctx.sessions() as s:
            values: dict[str, Any] = {
                "queues": status.queues(s, now),
                "in_flight": status.in_flight(s, now),
                "recent": status.recent(s, now),
                "failed": status.failed(s),
                "deliveries": status.deliveries(s),
                "late": status.late(s),
            }
            samples = status.finished_since(s, now - timedelta(days=1))
            values["spool"] = self._spool(s, now)
        values["summaries"] = self._summaries(samples, now)
        values["panels"], values["live_error"] = live_panels(self.pages.ctx.live)
        values["now"] = now
        values["can_act"] = self.pages.ctx.actions is not None
        return values

    def _spool(self, s: Session, now: datetime) -> status.SpoolUse:
        storage = self.pages.ctx.config.storage
        try:
            free: int | None = shutil.disk_usage(storage.spool_dir).free
        except OSError as exc:
            log.warning("status: cannot read free space of the spool: %s", exc.strerror)
            free = None
        low_water = storage.min_free_mb * 2**20
        return status.spool_use(s, now, free, low_water, storage.retention_days)

    def _summaries(
        self, samples: Sequence[tuple[str, datetime, float, bool]], now: datetime
    ) -> list[ClassSummary]:
        return [
            _summary(p, [x[1:] for x in samples if x[0] == p], now, self.pages.ctx.config)
            for p in PRIORITY_CLASSES
        ]


def _summary(
    priority: str, day: Sequence[tuple[datetime, float, bool]], now: datetime, config: Config
) -> ClassSummary:
    """Figures and charts of one class from its results of the last day."""
    sla = config.priority.sla_s(priority)
    hour = [x for x in day if x[0] >= now - timedelta(hours=1)]
    points = [(at, secs) for at, secs, _ in day]
    hourly = buckets(points, now, timedelta(days=1), 24)
    five_minutes = buckets(points, now, timedelta(hours=1), 12)
    return ClassSummary(
        priority,
        sla,
        _window(hour),
        _window(day),
        turnaround_chart(f"{priority}: last hour, 5-minute bins", five_minutes, sla, "1 h ago"),
        turnaround_chart(f"{priority}: last day, hourly bins", hourly, sla, "24 h ago"),
    )


def _window(rows: Sequence[tuple[datetime, float, bool]]) -> Window:
    seconds = [secs for _, secs, _ in rows]
    misses = sum(1 for *_, missed in rows if missed)
    p50, p95 = quantile_or_none(seconds, 0.5), quantile_or_none(seconds, 0.95)
    return Window(len(rows), p50, p95, misses)


def _notice(params: QueryParams) -> str:
    """The outcome of the action just done, from a fixed set of sentences."""
    action = ACTIONS.get(params.get("done", ""))
    if action is None:
        return ""
    sentence = action.done if params.get("changed") == "1" else action.unchanged
    return (sentence or action.done).format(what=params.get("target", "")[:120])
