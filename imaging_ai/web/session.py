"""Takes sign-ins and session cookies and gives signed, expiring admin sessions with CSRF tokens.

A session is a signed cookie (itsdangerous, HMAC-SHA256 with a timestamp): the token name, a
keyed fingerprint of that token, a CSRF token and a session id. Nothing is stored server-side
except the ids of sessions signed out early, so several HTTP workers or nodes that share
``[http] session_secret`` accept each other's sessions. Those ids are kept in the database
(``session_revocations``), so a sign-out holds on every node and across restarts.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import HTTPConnection
from starlette.responses import Response

from imaging_ai.db.models import SessionRevocation
from imaging_ai.web.auth import Principal, TokenStore

COOKIE = "imaging_ai_session"
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_TRACKED_SOURCES = 10_000


@dataclass(frozen=True)
class WebSecurity:
    """Session and sign-in settings; the first three are ``[http]`` keys of the same names.

    ``session_secret`` empty means a random key per start: sessions then end when the
    daemon restarts and are not shared between nodes.
    """

    session_secret: str = ""
    session_max_age_s: float = 8 * 3600.0
    cookie_secure: bool = True
    signin_delay_s: float = 1.0
    signin_max_failures: int = 10
    signin_window_s: float = 900.0

    @classmethod
    def from_http_config(cls, http: object) -> WebSecurity:
        """Read the keys from an ``HttpConfig``, using defaults for those it lacks."""
        return cls(
            session_secret=str(getattr(http, "session_secret", "") or ""),
            session_max_age_s=float(getattr(http, "session_max_age_s", cls.session_max_age_s)),
            cookie_secure=bool(getattr(http, "cookie_secure", cls.cookie_secure)),
        )


@dataclass(frozen=True)
class AdminSession:
    """A signed-in administrator: who, the form token that proves a POST came from our page."""

    principal: Principal
    csrf: str
    sid: str


class Sessions:
    """Issues, reads and revokes admin session cookies.

    With ``db``, sign-outs are rows of ``session_revocations``, read on every request, so
    they hold on every node and after a restart; if the database cannot be read, a session
    is refused rather than perhaps one signed out accepted. Without ``db`` (tests of the
    pages alone) they are kept in this process.
    """

    def __init__(
        self,
        tokens: TokenStore,
        settings: WebSecurity,
        db: sessionmaker[Session] | None = None,
    ) -> None:
        self._tokens = tokens
        self._settings = settings
        self._db = db
        self._key = settings.session_secret.encode("utf-8") or secrets.token_bytes(32)
        self._signer = URLSafeTimedSerializer(self._key, salt="imaging-ai admin session")
        self._revoked: dict[str, float] = {}
        self._lock = threading.Lock()

    def issue(self, principal: Principal) -> tuple[str, AdminSession]:
        """A new cookie value for ``principal`` (always a new id, so no session fixation)."""
        bound = self._tokens.binding(principal.name, self._key)
        assert bound is not None, "sessions are issued only for configured tokens"
        session = AdminSession(principal, secrets.token_urlsafe(32), secrets.token_urlsafe(16))
        payload = {"n": principal.name, "b": bound[1], "c": session.csrf, "s": session.sid}
        return self._signer.dumps(payload), session

    def read(self, conn: HTTPConnection) -> AdminSession | None:
        """The session of the request's cookie, if signed by us, unexpired and still valid."""
        raw = conn.cookies.get(COOKIE)
        if not raw:
            return None
        try:
            payload: Any = self._signer.loads(raw, max_age=int(self._settings.session_max_age_s))
            name, binding, csrf, sid = (str(payload[k]) for k in ("n", "b", "c", "s"))
        except (BadSignature, KeyError, TypeError):
            return None
        bound = self._tokens.binding(name, self._key)
        if bound is None or not hmac.compare_digest(bound[1], binding) or self._is_revoked(sid):
            return None
        return AdminSession(bound[0], csrf, sid)

    def revoke(self, session: AdminSession) -> None:
        """End a session before it expires (sign-out), on every node sharing the database.

        Raises SQLAlchemyError if the database cannot record it: the sign-out has then not
        happened, and the caller must say so.
        """
        now = time.time()
        with self._lock:
            self._revoked = {s: t for s, t in self._revoked.items() if t > now}
            self._revoked[session.sid] = now + self._settings.session_max_age_s
        if self._db is None:
            return
        at = datetime.now(UTC)
        with self._db.begin() as s:
            s.execute(delete(SessionRevocation).where(SessionRevocation.expires_at < at))
            if s.get(SessionRevocation, session.sid) is None:
                expires = at + timedelta(seconds=self._settings.session_max_age_s)
                s.add(SessionRevocation(sid=session.sid, expires_at=expires))

    def _is_revoked(self, sid: str) -> bool:
        with self._lock:
            if sid in self._revoked:
                return True
        if self._db is None:
            return False
        try:
            with self._db() as s:
                found = s.scalar(select(SessionRevocation.sid).where(SessionRevocation.sid == sid))
        except SQLAlchemyError:
            return True  # cannot tell: refuse, never accept a session perhaps signed out
        return found is not None

    def set_cookie(self, response: Response, value: str) -> None:
        """Attach the session cookie: HTTP-only, SameSite=Strict, Secure unless disabled."""
        response.set_cookie(
            COOKIE,
            value,
            max_age=int(self._settings.session_max_age_s),
            path="/",
            secure=self._settings.cookie_secure,
            httponly=True,
            samesite="strict",
        )

    def clear_cookie(self, response: Response) -> None:
        """Remove the session cookie from the browser."""
        response.delete_cookie(
            COOKIE, path="/", secure=self._settings.cookie_secure, httponly=True, samesite="strict"
        )

    def cookie_usable(self, conn: HTTPConnection) -> bool:
        """Whether a browser will send our cookie back over this connection.

        Browsers drop Secure cookies on plain HTTP except on loopback, so a sign-in over
        plain HTTP from another host would seem to work and then forget itself.
        """
        if not self._settings.cookie_secure or conn.url.scheme == "https":
            return True
        return (conn.url.hostname or "") in LOOPBACK_HOSTS


def csrf_ok(session: AdminSession, submitted: str) -> bool:
    """Whether a form's CSRF token is this session's (constant-time comparison)."""
    return hmac.compare_digest(session.csrf.encode(), submitted.encode())


class SignInThrottle:
    """Slows and then stops repeated failed sign-ins from one address.

    Each failure costs ``delay_s`` times the failures so far (at most five times);
    after ``max_failures`` within ``window_s`` the address must wait for the window.
    An attempt is counted as a failure by ``admit``, before its token is checked, in the same
    critical section as the decision: simultaneous guesses cannot all pass the limit before
    any of them is counted. ``succeeded`` forgets the count.
    """

    def __init__(self, settings: WebSecurity, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._failures: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def wait_s(self, source: str) -> float:
        """Seconds before ``source`` may try again; 0 when it may try now (counts nothing)."""
        with self._lock:
            return self._wait_locked(source, self._clock())

    def admit(self, source: str) -> float:
        """Count an attempt from ``source`` that is about to be checked, if it may be.

        Returns 0 when the attempt was counted and may be checked, else the seconds
        ``source`` must wait (and nothing is counted).
        """
        with self._lock:
            now = self._clock()
            wait = self._wait_locked(source, now)
            if wait <= 0:
                self._record_locked(source, now)
            return wait

    def delay_s(self, source: str) -> float:
        """The delay to impose before answering a failed attempt already counted by ``admit``."""
        with self._lock:
            recent = self._recent_locked(source, self._clock())
        return self._settings.signin_delay_s * min(len(recent), 5)

    def failed(self, source: str) -> float:
        """Record a failure; the delay to impose before answering."""
        with self._lock:
            self._record_locked(source, self._clock())
        return self.delay_s(source)

    def succeeded(self, source: str) -> None:
        """Forget the failures of ``source``."""
        with self._lock:
            self._failures.pop(source, None)

    def _wait_locked(self, source: str, now: float) -> float:
        recent = self._recent_locked(source, now)
        if len(recent) < self._settings.signin_max_failures:
            return 0.0
        return max(0.0, recent[0] + self._settings.signin_window_s - now)

    def _record_locked(self, source: str, now: float) -> None:
        if source not in self._failures and len(self._failures) >= MAX_TRACKED_SOURCES:
            self._failures.clear()  # bounded memory; an attacker gains one fresh window
        self._failures.setdefault(source, []).append(now)

    def _recent_locked(self, source: str, now: float) -> list[float]:
        horizon = now - self._settings.signin_window_s
        recent = [t for t in self._failures.get(source, []) if t > horizon]
        if recent:
            self._failures[source] = recent
        else:
            self._failures.pop(source, None)
        return recent
