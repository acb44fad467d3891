"""Takes an HTTP request and gives the authenticated principal (token name and role)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from starlette.requests import HTTPConnection

from imaging_ai.config import Token


@dataclass(frozen=True)
class Principal:
    """Who is calling: a configured token's name and role."""

    name: str
    role: str


class TokenStore:
    """Bearer tokens kept only as SHA-256 digests, compared in constant time."""

    def __init__(self, tokens: tuple[Token, ...]) -> None:
        self._digests = [(_digest(t.token), Principal(t.name, t.role)) for t in tokens]

    def lookup(self, token: str) -> Principal | None:
        """The principal a token belongs to, if any."""
        digest = _digest(token)
        found = None
        for known, principal in self._digests:
            # No early exit: every comparison is made, so timing tells nothing.
            if hmac.compare_digest(known, digest):
                found = principal
        return found

    def verify(self, name: str, token: str) -> Principal | None:
        """A principal if ``token`` is the token configured under ``name``."""
        principal = self.lookup(token)
        return principal if principal is not None and principal.name == name else None

    def from_request(self, conn: HTTPConnection) -> Principal | None:
        """The principal of an ``Authorization: Bearer`` header, if valid."""
        header = conn.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        return self.lookup(token.strip())

    def known(self, name: str) -> bool:
        """Whether ``name`` is a configured token name."""
        return any(principal.name == name for _, principal in self._digests)

    def binding(self, name: str, key: bytes) -> tuple[Principal, str] | None:
        """The principal named ``name`` and a keyed fingerprint of its current token.

        A session keeps the fingerprint, so replacing or removing a token in the
        configuration ends the sessions that were signed in with it. The fingerprint is
        an HMAC under the session key, so a cookie reveals nothing that could be used
        to guess the token offline.

        Parameters
        ----------
        name
            A token name from ``[http] tokens``.
        key
            The session signing key.
        """
        for digest, principal in self._digests:
            if principal.name == name:
                return principal, hmac.new(key, digest, hashlib.sha256).hexdigest()[:32]
        return None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()
