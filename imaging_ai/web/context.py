"""Takes what the daemon offers the web app (database, tokens, live state, actions, config)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from imaging_ai.config import Config
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.session import WebSecurity


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

    def reload_models(self, actor: str) -> None:
        """Validate and load the model folders in the background, then swap them in."""


def _no_live_status() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class WebContext:
    """What the web app needs from the daemon, passed in explicitly.

    ``live`` returns in-memory state for the status page (receivers, workers, the study in
    hand); ``actions`` is None where the app runs without a daemon (tests of read views).
    ``config`` gives the classes' SLAs, the spool and its low-water mark (for ``/metrics``)
    and the ``[http]`` session keys; ``security`` overrides those keys (tests).
    ``refresh_s`` is how often the status page refreshes itself.
    """

    sessions: sessionmaker[Session]
    tokens: TokenStore
    readiness: Callable[[], dict[str, str]]
    live: Callable[[], dict[str, Any]] = _no_live_status
    actions: AdminActions | None = None
    config: Config = field(default_factory=Config)
    security: WebSecurity | None = None
    refresh_s: float = 5.0

    @property
    def web_security(self) -> WebSecurity:
        """Session and sign-in settings: ``security`` if given, else from ``[http]``."""
        return self.security or WebSecurity.from_http_config(self.config.http)
