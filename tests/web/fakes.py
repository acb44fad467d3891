"""An AdminActions fake: records each call and, like the daemon, changes the rows and audits."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai.db.models import AuditEvent, ClassControl, Delivery, Job, Study
from imaging_ai.db.session import utcnow


class FakeActions:
    """What the daemon does for each action, reduced to the row changes the page shows."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.calls: list[tuple[str, ...]] = []

    def force_complete(self, study_uid: str, actor: str) -> bool:
        self.calls.append(("force_complete", study_uid, actor))
        with self.sessions() as s, s.begin():
            study = self._study(s, study_uid, "receiving")
            if study is None:
                return self._audit(s, actor, "force_complete", study_uid, False)
            now = utcnow()
            study.state, study.priority, study.completed_at = "queued", "outpatient", now
            study.deadline = now + timedelta(seconds=1800)
            s.add(
                Job(
                    study_id=study.id,
                    state="queued",
                    priority="outpatient",
                    rank=1,
                    deadline=study.deadline,
                    created_at=now,
                )
            )
            return self._audit(s, actor, "force_complete", study_uid, True)

    def retry_study(self, study_uid: str, actor: str) -> bool:
        self.calls.append(("retry_study", study_uid, actor))
        with self.sessions() as s, s.begin():
            study = self._study(s, study_uid, "failed")
            if study is None:
                return self._audit(s, actor, "retry_study", study_uid, False)
            study.state, study.error = "queued", ""
            job = s.scalars(select(Job).where(Job.study_id == study.id)).first()
            if job is not None:
                job.state, job.error, job.finished_at = "queued", "", None
            return self._audit(s, actor, "retry_study", study_uid, True)

    def raise_priority(self, study_uid: str, priority: str, actor: str) -> bool:
        self.calls.append(("raise_priority", study_uid, priority, actor))
        with self.sessions() as s, s.begin():
            study = self._study(s, study_uid, "queued")
            if study is not None:
                study.priority = priority
            return self._audit(s, actor, "raise_priority", study_uid, study is not None)

    def set_paused(self, priority: str, paused: bool, actor: str) -> None:
        self.calls.append(("set_paused", priority, str(paused), actor))
        with self.sessions() as s, s.begin():
            control = s.get(ClassControl, priority) or ClassControl(priority=priority)
            control.paused, control.changed_at, control.changed_by = paused, utcnow(), actor
            s.add(control)
            self._audit(s, actor, "pause_class" if paused else "resume_class", priority, True)

    def retry_delivery(self, delivery_id: int, actor: str) -> bool:
        self.calls.append(("retry_delivery", str(delivery_id), actor))
        return self._delivery(delivery_id, actor, "retry_delivery", "pending")

    def cancel_delivery(self, delivery_id: int, actor: str) -> bool:
        self.calls.append(("cancel_delivery", str(delivery_id), actor))
        return self._delivery(delivery_id, actor, "cancel_delivery", "cancelled")

    def reload_models(self, actor: str) -> None:
        self.calls.append(("reload_models", "engines", actor))
        with self.sessions() as s, s.begin():
            self._audit(s, actor, "models_reload", "engines", True)

    def _delivery(self, delivery_id: int, actor: str, action: str, state: str) -> bool:
        with self.sessions() as s, s.begin():
            row = s.get(Delivery, delivery_id)
            ok = row is not None and row.state == "pending"
            if ok and row is not None:
                row.state = state
            return self._audit(s, actor, action, str(delivery_id), ok)

    @staticmethod
    def _study(s: Session, uid: str, state: str) -> Study | None:
        study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).first()
        return study if study is not None and study.state == state else None

    @staticmethod
    def _audit(s: Session, actor: str, action: str, target: str, ok: bool) -> bool:
        detail = "ok" if ok else "nothing to do"
        s.add(AuditEvent(at=utcnow(), actor=actor, action=action, target=target, detail=detail))
        return ok
