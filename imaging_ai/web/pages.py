"""Takes a request to an admin page; gives who is asking, CSRF-checked forms and rendered HTML.

An administrator is either a signed-in browser (session cookie; every POST must carry the
session's CSRF token) or a script with an ``Authorization: Bearer`` admin token (no cookie is
involved, so no CSRF check is needed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from imaging_ai import __version__
from imaging_ai.db.models import AuditEvent
from imaging_ai.db.session import utcnow
from imaging_ai.dicom.times import local
from imaging_ai.states import DeliveryState, StudyState
from imaging_ai.web.auth import Principal
from imaging_ai.web.charts import duration
from imaging_ai.web.context import WebContext
from imaging_ai.web.session import AdminSession, Sessions, csrf_ok

MAX_FORM_BYTES = 64 * 1024


@dataclass(frozen=True)
class Admin:
    """An authenticated administrator; ``session`` is None for bearer-token scripts."""

    principal: Principal
    session: AdminSession | None

    @property
    def csrf(self) -> str:
        """The token forms must carry (empty for scripts)."""
        return self.session.csrf if self.session else ""


class Pages:
    """Shared by every admin page: authentication, audit, templates."""

    def __init__(self, ctx: WebContext) -> None:
        self.ctx = ctx
        self.sessions = Sessions(ctx.tokens, ctx.web_security, ctx.sessions)
        self.env = Environment(
            loader=PackageLoader("imaging_ai.web", "templates"),
            autoescape=select_autoescape(["html"]),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        # Times as the site's clock shows them ([site] time_zone), not a UTC container's.
        zone = ctx.config.site.time_zone
        self.env.filters.update(
            when=lambda value: when(value, zone), dur=duration, dicom_date=dicom_date, size=size
        )
        self.env.globals.update(version=__version__, tz=zone or time.strftime("%Z"))
        # Templates compare states against the members, as the code does.
        self.env.globals.update(StudyState=StudyState, DeliveryState=DeliveryState)

    def admin(self, request: Request) -> Admin:
        """The administrator making the request.

        Raises
        ------
        HTTPException
            401 without valid credentials (browsers are sent to the sign-in form), 403 for
            a token of another role.
        """
        if "authorization" in request.headers:
            principal = self.ctx.tokens.from_request(request)
            if principal is None:
                raise HTTPException(401, "a valid Authorization: Bearer token is required")
            if principal.role != "admin":
                raise HTTPException(403, f"role {principal.role!r} may not use the admin pages")
            return Admin(principal, None)
        session = self.sessions.read(request)
        if session is None:
            raise HTTPException(401, "sign in to use the admin pages")
        return Admin(session.principal, session)

    async def form(self, request: Request, admin: Admin) -> FormData:
        """The POSTed form, after checking its CSRF token (browser sessions only).

        Raises
        ------
        HTTPException
            403 when the token is missing or not this session's (audited).
        """
        if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
            raise HTTPException(413, "form too large")
        form = await request.form(max_files=0, max_fields=20)
        if admin.session is not None and not csrf_ok(admin.session, str(form.get("csrf", ""))):
            await run_in_threadpool(
                self.audit, admin.principal.name, "csrf_rejected", request.url.path, request
            )
            raise HTTPException(
                403, "this form has expired or did not come from this page: reload and try again"
            )
        return form

    def audit(
        self, actor: str, action: str, target: str, request: Request, detail: str = ""
    ) -> None:
        """Write an audit event with the request's source address (no patient identifiers)."""
        with self.ctx.sessions() as s, s.begin():
            s.add(
                AuditEvent(
                    at=utcnow(),
                    actor=actor[:100],
                    action=action,
                    target=target[:200],
                    detail=detail,
                    source=source(request),
                )
            )

    def render(
        self,
        request: Request,
        template: str,
        admin: Admin | None,
        status: int = 200,
        /,
        **values: Any,
    ) -> HTMLResponse:
        """Render a template with the page frame's values (who, CSRF token, refresh)."""
        html = self.env.get_template(template).render(
            admin=admin, path=request.url.path, refresh_s=self.ctx.refresh_s, **values
        )
        return HTMLResponse(html, status_code=status)


def source(request: Request) -> str:
    """Where a request came from: the client address as the server saw it."""
    return request.client.host if request.client else ""


def when(value: datetime | None, zone_name: str = "") -> str:
    """A time in the site's zone (the server's for ""), to the second; a dash for none."""
    if value is None:
        return "–"
    return local(value, zone_name).strftime("%Y-%m-%d %H:%M:%S")


def size(value: float | None) -> str:
    """A number of bytes in binary units (KiB to TiB), one decimal; a dash for none."""
    if value is None:
        return "–"
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def dicom_date(value: str) -> str:
    """A DICOM DA value (YYYYMMDD) as YYYY-MM-DD; anything else as it is."""
    if len(value) == 8 and value.isdigit():
        return f"{value[:4]}-{value[4:6]}-{value[6:]}"
    return value or "–"
