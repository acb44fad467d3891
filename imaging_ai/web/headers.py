"""Takes every HTTP response and gives it the security headers an intranet admin page needs."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Only our own files: no CDN, no inline script, no framing (clickjacking on action buttons).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
COMMON = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": CSP,
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# Pages and API answers may show patient data or reports: never kept in a browser's or
# proxy's cache. Static files and health checks may be.
PRIVATE_PREFIXES = ("/admin", "/api", "/fhir")


class SecurityHeaders:
    """Pure ASGI middleware (no response buffering) that adds the headers above."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        private = str(scope["path"]).startswith(PRIVATE_PREFIXES)
        https = scope.get("scheme") == "https"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in COMMON.items():
                    headers[name] = value
                if private:
                    headers["Cache-Control"] = "no-store"
                    headers["Pragma"] = "no-cache"
                if https:
                    headers["Strict-Transport-Security"] = "max-age=31536000"
            await send(message)

        await self.app(scope, receive, send_with_headers)
