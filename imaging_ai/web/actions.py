"""Takes an administrator's action request; gives a confirmation page, then does it and says so.

Every action is two steps that work without JavaScript: a GET confirmation page that says
what will happen, then a POST with the session's CSRF token and ``confirm=yes``. The daemon
audits what it did; this module audits the request with where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from imaging_ai.config import PRIORITY_CLASSES
from imaging_ai.db.models import Delivery, Study
from imaging_ai.web.context import AdminActions
from imaging_ai.web.pages import Admin, Pages


@dataclass(frozen=True)
class Action:
    """One admin action and the words around it; ``{what}`` names the target."""

    name: str
    kind: str  # what the target is: study, delivery, class or models
    button: str
    question: str
    consequence: str
    done: str
    unchanged: str = ""


ACTIONS = {
    a.name: a
    for a in (
        Action("force_complete", "study", "Force complete", "Complete study {what} now?",
               "It is queued with the instances received so far. Instances that arrive later "
               "are kept and counted as late.",
               "Study {what} completed and queued.",
               "Study {what} was no longer receiving: nothing changed."),
        Action("retry_study", "study", "Retry", "Process study {what} again?",
               "It is queued again, with a new deadline from its class's SLA.",
               "Study {what} queued again.",
               "Study {what} was not queued: it had not failed, or its images were deleted by "
               "retention (its page says which)."),
        Action("raise_priority", "study", "Raise priority", "Raise the priority of study {what}?",
               "It moves to the class chosen below; its deadline becomes that class's SLA from "
               "now, unless the old deadline is sooner.",
               "Study {what} moved to a more urgent class.",
               "Study {what} was not queued: nothing changed."),
        Action("pause_class", "class", "Pause", "Pause the {what} class?",
               "Queued {what} studies wait, on every node, until the class is resumed. Studies "
               "in progress finish; new studies still arrive and queue.",
               "Class {what} paused."),
        Action("resume_class", "class", "Resume", "Resume the {what} class?",
               "Queued {what} studies are processed again, earliest deadline first.",
               "Class {what} resumed."),
        Action("retry_delivery", "delivery", "Retry now", "Try delivery {what} now?",
               "It is sent at once instead of at its next scheduled try (a refused one: once "
               "the PACS or its destination's configuration was changed).",
               "Delivery {what} will be tried now.",
               "Delivery {what} was neither pending nor refused: nothing changed."),
        Action("cancel_delivery", "delivery", "Cancel", "Stop trying delivery {what}?",
               "This result is not sent to this destination unless the study is processed "
               "again.",
               "Delivery {what} cancelled.", "Delivery {what} was not pending: nothing changed."),
        Action("reload_models", "models", "Reload models", "Reload {what}?",
               "The model folders are validated and their engines loaded in the background. "
               "Studies already running finish on the current models, later ones use the new "
               "ones. A model that fails validation leaves the current ones running, and the "
               "error shows on this page.",
               "Model reload started: this page shows the models' error if it fails."),
    )
}  # fmt: skip
URGENCY = {p: i for i, p in enumerate(PRIORITY_CLASSES)}
MODELS = "engines"  # the one target of reload_models: the engines folder


@dataclass(frozen=True)
class Target:
    """What an action applies to, in words, and the classes a study may be raised to."""

    key: str
    what: str
    raise_to: tuple[str, ...] = ()


class Actions:
    """The confirmation page and the action endpoint."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages

    def routes(self) -> list[Route]:
        """``/admin/confirm`` (GET) and ``/admin/actions`` (POST)."""
        return [
            Route("/admin/confirm", self.confirm, methods=["GET"]),
            Route("/admin/actions", self.act, methods=["POST"]),
        ]

    def confirm(self, request: Request) -> Response:
        """Say what the action will do and ask for confirmation."""
        admin = self.pages.admin(request)
        action = _action(request.query_params.get("action", ""))
        target = self._target(action, request.query_params.get("target", ""))
        return self.pages.render(
            request, "confirm.html", admin, action=action, target=target, actions=self._daemon()
        )

    async def act(self, request: Request) -> Response:
        """Do a confirmed action; browsers go back to the status page with a notice."""
        admin = await run_in_threadpool(self.pages.admin, request)  # reads sign-outs
        form = await self.pages.form(request, admin)
        action = _action(str(form.get("action", "")))
        if form.get("confirm") != "yes":
            raise HTTPException(400, "the action was not confirmed (confirm=yes)")
        target = await run_in_threadpool(self._target, action, str(form.get("target", "")))
        priority = str(form.get("priority", ""))
        if action.name == "raise_priority" and priority not in target.raise_to:
            raise HTTPException(400, f"study {target.what} cannot be raised to {priority!r}")
        changed = await run_in_threadpool(self._do, admin, action, target, priority, request)
        if admin.session is None:
            return JSONResponse({"action": action.name, "target": target.key, "changed": changed})
        notice = {"done": action.name, "target": target.key, "changed": int(changed)}
        return RedirectResponse(f"/admin?{urlencode(notice)}", 303)

    def _do(
        self, admin: Admin, action: Action, target: Target, priority: str, request: Request
    ) -> bool:
        changed = run(self._daemon(), action.name, target.key, priority, admin.principal.name)
        outcome = "changed" if changed else "nothing changed"
        detail = f"{action.name}{' to ' + priority if priority else ''}: {outcome}"
        self.pages.audit(admin.principal.name, "admin_request", target.key, request, detail)
        return changed

    def _daemon(self) -> AdminActions:
        if self.pages.ctx.actions is None:
            raise HTTPException(503, "actions are unavailable: this server runs without the daemon")
        return self.pages.ctx.actions

    def _target(self, action: Action, key: str) -> Target:
        if action.kind == "models":
            if key != MODELS:
                raise HTTPException(404, f"no {key!r}: the models' target is {MODELS!r}")
            return Target(key, "the models")
        with self.pages.ctx.sessions() as s:
            if action.kind == "class":
                if key not in PRIORITY_CLASSES:
                    raise HTTPException(404, f"no priority class {key!r}")
                return Target(key, key)
            if action.kind == "delivery":
                row = s.get(Delivery, int(key)) if key.isdigit() else None
                if row is None:
                    raise HTTPException(404, f"no delivery {key!r}")
                return Target(key, f"#{row.id} ({row.kind.upper()} to {row.destination})")
            study = s.scalars(select(Study).where(Study.study_instance_uid == key)).first()
            if study is None:
                raise HTTPException(404, f"no study with Study Instance UID {key}")
            more_urgent = [
                p for p in PRIORITY_CLASSES if URGENCY[p] < URGENCY.get(study.priority, 9)
            ]
            what = f"{study.accession_number or 'without accession'} ({key})"
            return Target(key, what, tuple(more_urgent))


def run(actions: AdminActions, name: str, key: str, priority: str, actor: str) -> bool:
    """Call the daemon's action; True when it changed something."""
    if name == "force_complete":
        return actions.force_complete(key, actor)
    if name == "retry_study":
        return actions.retry_study(key, actor)
    if name == "raise_priority":
        return actions.raise_priority(key, priority, actor)
    if name in ("pause_class", "resume_class"):
        actions.set_paused(key, name == "pause_class", actor)
        return True
    if name == "retry_delivery":
        return actions.retry_delivery(int(key), actor)
    if name == "reload_models":
        actions.reload_models(actor)
        return True
    return actions.cancel_delivery(int(key), actor)


def _action(name: str) -> Action:
    if name not in ACTIONS:
        raise HTTPException(400, f"unknown action {name!r}")
    return ACTIONS[name]
