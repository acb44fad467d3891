"""Gives the states of the daemon's state machines, one `StrEnum` each.

A member equals its value (``StudyState.QUEUED == "queued"``), and the value is what the
database stores, the JSON API and the metrics show and the templates compare: changing one
changes stored data, so a value is never renamed without a migration.
"""

from __future__ import annotations

from enum import StrEnum


class StudyState(StrEnum):
    """Where a study (``studies.state``) is on its way from PACS to RIS."""

    # Instances arriving. The assembler completes it (idle timers, the release rule,
    # ``force_complete_s``, an administrator's force-complete) and queues its job.
    RECEIVING = "receiving"
    # Complete; its job waits in the queue. A claim moves it on; a requeue brings it back.
    QUEUED = "queued"
    # A node's processor holds its job under a lease.
    PROCESSING = "processing"
    # Results written and the report committed; deliveries pending. Done once none is.
    DELIVERING = "delivering"
    # Nothing left to do: every delivery done, cancelled or refused, or no destination
    # configured. A refused delivery does not keep it "delivering": the refusal waits for a
    # person (the PACS's or our destination's configuration), not for the daemon; the status
    # page and the API show such a study as done with its refused deliveries beside it.
    DONE = "done"
    # Could not be analysed; the reason is in ``studies.error``. An administrator's retry
    # queues it again.
    FAILED = "failed"


class JobState(StrEnum):
    """A job (``jobs.state``): the queue row nodes claim."""

    # Waiting for a claim, in policy order (urgent first, then earliest deadline).
    QUEUED = "queued"
    # Claimed by ``jobs.node`` until ``jobs.lease_until``; an expired lease, a dead process,
    # shutdown or a transient failure queues it again.
    PROCESSING = "processing"
    # Report, results and deliveries committed.
    DONE = "done"
    # Given up, with the reason in ``jobs.error``; an administrator's retry queues it again.
    FAILED = "failed"


class DeliveryState(StrEnum):
    """One result to one destination (``deliveries.state``): the outbox."""

    # To be sent at ``next_try_at`` (a claim pushes it on by the send lease; a failure backs
    # it off). Done once the destination confirmed it.
    PENDING = "pending"
    # PACS answered a storage success or warning, or RIS answered AA.
    DONE = "done"
    # Stopped by an administrator; never sent again.
    CANCELLED = "cancelled"
    # The destination refused it in a way a retry cannot change (PACS accepted the
    # association but no presentation context for the object's SOP class, or a refusal
    # status such as 0x0122 or 0xA9xx); the reason is in ``last_error``. Not tried again
    # unless an administrator retries it (after the PACS or our destination was changed).
    REFUSED = "refused"


class ReportStatus(StrEnum):
    """A report's status (``reports.status``), in the words of FHIR's DiagnosticReport."""

    # Written by the models, not verified by a radiologist: every report the daemon writes.
    PRELIMINARY = "preliminary"


class ChildState(StrEnum):
    """Where a child supervised by `imaging_ai.supervise` (a DICOM receiver) is in its life."""

    # Started, and not seen to exit since.
    RUNNING = "running"
    # Exited; waiting out its backoff before the supervisor starts it again.
    RESTARTING = "restarting"
    # Left down after `Backoff.give_up_after` crashes in a row.
    FAILED = "failed"
    # Stopped by the supervisor (shutdown).
    STOPPED = "stopped"


class WorkerState(StrEnum):
    """An inference worker slot of `imaging_ai.worker_pool.WorkerPool`, across restarts."""

    # Its process was started and loads and warms up its engines (``start_timeout_s``).
    STARTING = "starting"
    # Engines loaded: it takes batches. A crash or hang starts it again.
    READY = "ready"
    # Left down: it could not start a process, died while the pool was not running, or a
    # CPU worker crashed ``max_restarts`` times in a row (a GPU one comes back on the CPU).
    FAILED = "failed"
    # The pool stopped it.
    STOPPED = "stopped"


class PoolPhase(StrEnum):
    """The life of a `imaging_ai.worker_pool.WorkerPool`."""

    # Made, not started.
    NEW = "new"
    # Its workers start; `start` waits until each is ready or one failed.
    STARTING = "starting"
    # Every worker was ready: batches are taken, and a worker that dies is restarted.
    RUNNING = "running"
    # `stop` lets the batches in flight finish and refuses new ones.
    STOPPING = "stopping"
    # Workers ended; the watchdog thread exits.
    STOPPED = "stopped"
