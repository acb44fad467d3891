"""Takes queued jobs in the database and gives them to nodes in policy order, under leases.

Policy: urgent work always first; among the rest, earliest deadline first, so an outpatient
study that has waited long enough overtakes new inpatient work and nothing starves. A claim
holds a lease; a node renews it while it works, and a job whose lease expired (its node died)
is queued again for any node. On PostgreSQL, ``FOR UPDATE SKIP LOCKED`` lets several nodes
claim from one queue without blocking each other.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai import faults
from imaging_ai.assemble import RANKS
from imaging_ai.config import PRIORITY_CLASSES, PriorityConfig
from imaging_ai.db.models import AuditEvent, ClassControl, Job, Study
from imaging_ai.db.session import utcnow
from imaging_ai.states import JobState, StudyState

log = logging.getLogger(__name__)

_CLAIM_TRIES = 5
_LOST = object()


@dataclass(frozen=True)
class Claim:
    """A job this node now works on."""

    job_id: int
    study_id: int
    study_uid: str
    priority: str
    deadline: datetime
    attempt: int


class Scheduler:
    """Claims, renews and finishes jobs for one node."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        node: str,
        priority: PriorityConfig | None = None,
        lease_s: float = 120.0,
    ) -> None:
        self.sessions = sessions
        self.node = node
        self.priority = priority or PriorityConfig()
        self.lease = timedelta(seconds=lease_s)
        # Wake-ups of this node's claimers when work was queued here (the assembler, a
        # requeue, an admin's retry): they claim at once instead of at their next poll,
        # which stays for work queued by other nodes.
        self._work = threading.Condition()
        self._wakes = 0

    @property
    def wakes(self) -> int:
        """How many wake-ups so far; pass it to `wait_for_work` after a claim found nothing."""
        with self._work:
            return self._wakes

    def wake(self) -> None:
        """Work may be runnable: wake every claimer waiting in `wait_for_work`."""
        with self._work:
            self._wakes += 1
            self._work.notify_all()

    def wait_for_work(self, seen: int, timeout_s: float) -> None:
        """Wait until a wake-up after ``seen`` (`wakes` before the claim), or ``timeout_s``."""
        with self._work:
            self._work.wait_for(lambda: self._wakes != seen, timeout_s)

    def claim(self, now: datetime | None = None, urgent_only: bool = False) -> Claim | None:
        """Claim the next job by policy, or None when nothing is runnable."""
        now = now or utcnow()
        self.requeue_expired(now)
        for _ in range(_CLAIM_TRIES):
            result = self._try_claim(now, urgent_only)
            if result is not _LOST:
                assert result is None or isinstance(result, Claim)
                return result
        return None

    def _try_claim(self, now: datetime, urgent_only: bool) -> Claim | object | None:
        with self.sessions() as s, s.begin():
            paused = set(s.scalars(select(ClassControl.priority).where(ClassControl.paused)))
            max_rank = RANKS["urgent"] if urgent_only else max(RANKS.values())
            query = (
                select(Job)
                .where(
                    Job.state == JobState.QUEUED,
                    Job.priority.not_in(paused or {""}),
                    Job.rank <= max_rank,
                )
                .order_by(Job.rank, Job.deadline, Job.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            )
            job = s.scalars(query).first()
            if job is None:
                return None
            faults.reach("before:claim")
            # Compare-and-set: on SQLite, SKIP LOCKED does not exist and the select takes no
            # lock, so two threads can pick the same row; only one of them changes its state.
            won = s.execute(
                update(Job)
                .where(Job.id == job.id, Job.state == JobState.QUEUED)
                .values(
                    state=JobState.PROCESSING,
                    node=self.node,
                    started_at=now,
                    lease_until=now + self.lease,
                    attempts=Job.attempts + 1,
                )
                .execution_options(synchronize_session=False)
            )
            if won.rowcount != 1:  # type: ignore[attr-defined]
                return _LOST  # another claimer took it: try the next one
            s.refresh(job)
            study = s.get(Study, job.study_id)
            assert study is not None
            study.state = StudyState.PROCESSING
            return Claim(
                job.id, study.id, study.study_instance_uid, job.priority, job.deadline, job.attempts
            )

    def renew(self, claim: Claim, now: datetime | None = None) -> bool:
        """Extend the lease; False if the job is no longer ours (it was requeued)."""
        now = now or utcnow()
        with self.sessions() as s, s.begin():
            job = s.get(Job, claim.job_id, with_for_update=True)
            if job is None or job.node != self.node or job.state != JobState.PROCESSING:
                return False
            job.lease_until = now + self.lease
        return True

    def requeue_expired(self, now: datetime | None = None) -> int:
        """Queue again every job whose node stopped renewing its lease."""
        now = now or utcnow()
        with self.sessions() as s, s.begin():
            jobs = s.scalars(
                select(Job)
                .where(Job.state == JobState.PROCESSING, Job.lease_until < now)
                .with_for_update(skip_locked=True)
            ).all()
            for job in jobs:
                log.warning("job %d: lease of node %s expired; queued again", job.id, job.node)
                job.state, job.node, job.lease_until = JobState.QUEUED, "", None
                study = s.get(Study, job.study_id)
                if study is not None:
                    study.state = StudyState.QUEUED
            return len(jobs)

    def requeue_orphans(self) -> int:
        """Queue again, without waiting for their leases, the jobs of an earlier process of
        this node that is gone (a crash or a kill): called once at start.

        Nodes are ``name:pid``; node names are unique per host, so a job held under this
        node's name by a process that no longer exists here has no one working on it.
        """
        name = self.node.rpartition(":")[0]
        with self.sessions() as s, s.begin():
            jobs = s.scalars(
                select(Job)
                .where(Job.state == JobState.PROCESSING)
                .with_for_update(skip_locked=True)
            ).all()
            orphans = [j for j in jobs if j.node != self.node and _dead_here(j.node, name)]
            for job in orphans:
                log.warning("job %d: its process %s is gone; queued again", job.id, job.node)
                job.state, job.node, job.lease_until = JobState.QUEUED, "", None
                job.notes = [*job.notes, "queued again after the daemon restarted"]
                study = s.get(Study, job.study_id)
                if study is not None:
                    study.state = StudyState.QUEUED
            return len(orphans)

    def requeue(self, claim: Claim, reason: str) -> None:
        """Give a claimed job back to the queue (shutdown, or a transient failure)."""
        with self.sessions() as s, s.begin():
            job = s.get(Job, claim.job_id)
            if job is None or job.node != self.node:
                return
            job.state, job.node, job.lease_until = JobState.QUEUED, "", None
            job.notes = [*job.notes, reason]
            study = s.get(Study, claim.study_id)
            if study is not None:
                study.state = StudyState.QUEUED
        self.wake()

    def retry_failed(self, study_uid: str, now: datetime | None = None) -> bool:
        """Queue a failed study again with a fresh deadline from its class's SLA."""
        now = now or utcnow()
        with self.sessions() as s, s.begin():
            study = s.scalars(select(Study).where(Study.study_instance_uid == study_uid)).first()
            if study is None or study.state != StudyState.FAILED:
                return False
            job = s.scalars(
                select(Job).where(Job.study_id == study.id).order_by(Job.id.desc())
            ).first()
            if job is None:
                return False
            deadline = now + timedelta(seconds=self.priority.sla_s(job.priority))
            job.state, job.error, job.deadline, job.attempts = JobState.QUEUED, "", deadline, 0
            job.node, job.lease_until, job.finished_at = "", None, None
            job.notes = [*job.notes, "retried by an administrator"]
            study.state, study.error, study.deadline = StudyState.QUEUED, "", deadline
        self.wake()
        return True

    def set_paused(self, priority: str, paused: bool, actor: str) -> None:
        """Pause or resume a priority class on every node; recorded in the audit log."""
        if priority not in PRIORITY_CLASSES:
            raise ValueError(f"unknown priority class {priority!r}")
        now = utcnow()
        with self.sessions() as s, s.begin():
            control = s.get(ClassControl, priority) or ClassControl(priority=priority)
            control.paused, control.changed_at, control.changed_by = paused, now, actor
            s.add(control)
            action = "pause_class" if paused else "resume_class"
            s.add(AuditEvent(at=now, actor=actor, action=action, target=priority))
        if not paused:
            self.wake()

    def raise_priority(self, study_uid: str, priority: str, actor: str) -> bool:
        """Move a queued study to a more urgent class; recorded in the audit log."""
        now = utcnow()
        with self.sessions() as s, s.begin():
            study = s.scalars(select(Study).where(Study.study_instance_uid == study_uid)).first()
            if study is None or priority not in PRIORITY_CLASSES:
                return False
            job = s.scalars(
                select(Job).where(Job.study_id == study.id, Job.state == JobState.QUEUED)
            ).first()
            if job is None:
                return False
            was = job.priority
            job.priority, job.rank = priority, RANKS[priority]
            # The new class's SLA counts from now, unless the old deadline is sooner.
            deadline = min(job.deadline, now + timedelta(seconds=self.priority.sla_s(priority)))
            job.deadline = study.deadline = deadline
            study.priority = priority
            study.priority_reason = f"raised from {was} by {actor}"
            s.add(
                AuditEvent(
                    at=now,
                    actor=actor,
                    action="raise_priority",
                    target=study_uid,
                    detail=f"{was} -> {priority}",
                )
            )
            return True


def _dead_here(node: str, name: str) -> bool:
    """Whether ``node`` (``name:pid``) is a process of this host's node that no longer runs."""
    node_name, _, pid = node.rpartition(":")
    if node_name != name or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return False
