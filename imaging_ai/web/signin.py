"""Takes the sign-in form (token name and token) and gives an admin session cookie, or a refusal.

Failures are audited, slowed, and after several from one address refused for a while; each
attempt is counted before its token is checked. The answer never says whether the name or the
token was wrong.
"""

from __future__ import annotations

import asyncio
import logging
import math

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from imaging_ai.web.pages import MAX_FORM_BYTES, Pages, source
from imaging_ai.web.session import SignInThrottle

log = logging.getLogger(__name__)

PLAIN_HTTP = (
    "This page was reached over plain HTTP from another computer, so the browser would not "
    "keep the sign-in. Use HTTPS ([http] tls_cert and tls_key), or on a trusted network set "
    "[http] cookie_secure = false."
)


class SignIn:
    """The sign-in and sign-out routes."""

    def __init__(self, pages: Pages, throttle: SignInThrottle | None = None) -> None:
        self.pages = pages
        self.throttle = throttle or SignInThrottle(pages.ctx.web_security)

    def routes(self) -> list[Route]:
        """``/admin/signin`` (GET form, POST sign-in) and ``/admin/signout`` (POST)."""
        return [
            Route("/admin/signin", self.form, methods=["GET"]),
            Route("/admin/signin", self.sign_in, methods=["POST"]),
            Route("/admin/signout", self.sign_out, methods=["POST"]),
        ]

    async def form(self, request: Request) -> Response:
        """The sign-in form; a signed-in administrator goes straight on."""
        if self.pages.sessions.read(request) is not None:
            return RedirectResponse(_next(request.query_params.get("next", "")), 303)
        return self._page(request, next_=request.query_params.get("next", ""))

    async def sign_in(self, request: Request) -> Response:
        """Check the token; on success set the session cookie and go on."""
        if refused := self._refused(request, self.throttle.wait_s(source(request))):
            return refused
        if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
            raise HTTPException(413, "form too large")
        form = await request.form(max_files=0, max_fields=10)
        name, token = str(form.get("name", "")).strip(), str(form.get("token", "")).strip()
        next_ = str(form.get("next", ""))
        if not self.pages.sessions.cookie_usable(request):
            return self._page(request, 400, error=PLAIN_HTTP, next_=next_)
        # Counted as a failure before the check, in one step with the limit's decision, so
        # simultaneous guesses cannot all pass the limit (a success forgets the count).
        if refused := self._refused(request, self.throttle.admit(source(request))):
            return refused
        principal = self.pages.ctx.tokens.verify(name, token)
        if principal is None or principal.role != "admin":
            await self._failed(request, name, "no" if principal is None else principal.role)
            error = "Not signed in: check the token name and token."
            return self._page(request, 401, error=error, name=name, next_=next_)
        self.throttle.succeeded(source(request))
        cookie, _ = self.pages.sessions.issue(principal)
        await run_in_threadpool(self.pages.audit, principal.name, "sign_in", "", request)
        response = RedirectResponse(_next(next_), 303)
        self.pages.sessions.set_cookie(response, cookie)
        return response

    def _refused(self, request: Request, wait: float) -> Response | None:
        """A 429 page while the address must ``wait`` after too many failures."""
        if wait <= 0:
            return None
        log.warning("sign-in from %s refused: too many failures", source(request))
        minutes = math.ceil(wait / 60)
        error = f"Too many failed sign-ins from this address. Try again in {minutes} min."
        return self._page(request, 429, error=error)

    async def sign_out(self, request: Request) -> Response:
        """End the session (CSRF-checked, so another site cannot sign you out)."""
        admin = await run_in_threadpool(self.pages.admin, request)  # reads sign-outs
        await self.pages.form(request, admin)
        if admin.session is not None:
            try:
                await run_in_threadpool(self.pages.sessions.revoke, admin.session)
            except SQLAlchemyError:
                raise HTTPException(
                    503, "the database is unavailable: you are not signed out; try again"
                ) from None
        await run_in_threadpool(self.pages.audit, admin.principal.name, "sign_out", "", request)
        response = RedirectResponse("/admin/signin", 303)
        self.pages.sessions.clear_cookie(response)
        return response

    async def _failed(self, request: Request, name: str, role: str) -> None:
        # A name that is not configured may be a token typed into the wrong field: it is
        # not written to the audit log.
        actor = name if self.pages.ctx.tokens.known(name) else "(unknown name)"
        detail = "wrong token or unknown name" if role == "no" else f"{role} token: not an admin"
        await run_in_threadpool(self.pages.audit, actor, "sign_in_failed", "", request, detail)
        await asyncio.sleep(self.throttle.delay_s(source(request)))  # counted by admit

    def _page(self, request: Request, status: int = 200, **values: str) -> Response:
        values.setdefault("error", "" if self.pages.sessions.cookie_usable(request) else PLAIN_HTTP)
        values.setdefault("name", "")
        values.setdefault("next_", "")
        return self.pages.render(request, "signin.html", None, status, **values)


def _next(target: str) -> str:
    """Where to go after signing in: only an admin page of this site (no open redirect)."""
    if target.startswith("/admin") and "//" not in target and "\\" not in target:
        return target
    return "/admin"
