"""Takes HTTP requests; gives the RIS API (JSON), admin pages, metrics and health (Starlette)."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from imaging_ai.errors import StartupError
from imaging_ai.metrics import DaemonCollector
from imaging_ai.web.actions import Actions
from imaging_ai.web.admin import AdminPages
from imaging_ai.web.api import RisApi
from imaging_ai.web.context import AdminActions, WebContext
from imaging_ai.web.fhir import FhirApi, operation_outcome
from imaging_ai.web.findings import KeyImages
from imaging_ai.web.headers import SecurityHeaders
from imaging_ai.web.openapi import openapi_routes
from imaging_ai.web.pages import Pages
from imaging_ai.web.session import SignInThrottle
from imaging_ai.web.signin import SignIn

__all__ = ["AdminActions", "WebContext", "create_app", "database_ready", "tls_options"]

log = logging.getLogger(__name__)


def create_app(ctx: WebContext, throttle: SignInThrottle | None = None) -> Starlette:
    """Build the ASGI application.

    Parameters
    ----------
    ctx
        What the app needs from the daemon.
    throttle
        Failed sign-in slowing (tests pass one without delays).
    """

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        checks = ctx.readiness()
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    pages = Pages(ctx)
    routes = [
        *RisApi(ctx).routes(),
        *FhirApi(ctx).routes(),
        *openapi_routes(),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint(ctx)),
        Route("/", _home),
        *SignIn(pages, throttle).routes(),
        *AdminPages(pages).routes(),
        *KeyImages(pages).routes(),
        *Actions(pages).routes(),
        Mount("/static", StaticFiles(packages=[("imaging_ai.web", "static")]), name="static"),
    ]
    handler = error_handler(pages)
    return Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={HTTPException: handler, Exception: handler},
    )


METRICS_ROLES = ("metrics", "admin")
"""Who may read ``/metrics`` when ``[http] metrics_require_token`` is set."""


def metrics_endpoint(ctx: WebContext) -> Callable[[Request], Response]:
    """``/metrics``: Prometheus text format from a registry of this app's own."""
    registry = CollectorRegistry(auto_describe=False)
    storage = ctx.config.storage
    collector = DaemonCollector(
        ctx.sessions, ctx.config.priority, ctx.live, storage.spool_dir, storage.min_free_mb * 2**20
    )
    registry.register(collector)
    ProcessCollector(registry=registry)

    def metrics(request: Request) -> Response:
        # A plain function: Starlette runs it in a thread, off the event loop, as it queries.
        if ctx.config.http.metrics_require_token:
            principal = ctx.tokens.from_request(request)
            if principal is None:
                raise HTTPException(401, "a valid Authorization: Bearer token is required")
            if principal.role not in METRICS_ROLES:
                raise HTTPException(403, f"role {principal.role!r} may not read the metrics")
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def error_handler(pages: Pages) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The one error handler: JSON for the API and scripts, pages for people in browsers.

    A browser without a session that asks for an admin page is sent to the sign-in form.
    Unexpected exceptions answer 500 without details (the server logs them).
    """

    async def handle(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            code, message = exc.status_code, str(exc.detail)
        else:
            code, message = 500, "internal error: the daemon's log has the details"
        headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
        if request.url.path.startswith("/fhir/") or request.url.path == "/fhir":
            return operation_outcome(code, message, headers)
        browser = request.url.path.startswith("/admin") and "authorization" not in request.headers
        if browser and code == 401:
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/admin/signin?next={quote(here)}", 303)
        if browser:
            return pages.render(request, "error.html", None, code, code=code, message=message)
        return JSONResponse({"error": message}, status_code=code, headers=headers)

    return handle


def tls_options(http: object) -> dict[str, str]:
    """uvicorn's ``ssl_certfile``/``ssl_keyfile`` from ``[http] tls_cert``/``tls_key``.

    Empty when either is unset (plain HTTP; loopback by default). Read with ``getattr`` so
    that this works before the keys exist in ``HttpConfig``.

    Raises
    ------
    StartupError
        When only one of the two is given, or a file cannot be read.
    """
    cert, key = (str(getattr(http, name, "") or "") for name in ("tls_cert", "tls_key"))
    if not cert and not key:
        return {}
    if not (cert and key):
        raise StartupError("http.tls_cert and http.tls_key must be given together")
    for name, path in (("http.tls_cert", cert), ("http.tls_key", key)):
        if not os.access(path, os.R_OK):
            raise StartupError(f"{name} {path} cannot be read; check the path and permissions")
    return {"ssl_certfile": cert, "ssl_keyfile": key}


def _home(request: Request) -> Response:
    return RedirectResponse("/admin", 303)


def database_ready(sessions: sessionmaker[Session]) -> str:
    """'ok' when the database answers, else the reason."""
    try:
        with sessions() as s:
            s.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"database unreachable: {exc.__class__.__name__}"
