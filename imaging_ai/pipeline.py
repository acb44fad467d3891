"""Takes a Config and gives the running daemon: wires receive, spool, assemble and web together."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from imaging_ai import __version__, faults, site
from imaging_ai.assemble import Assembler, routing_tags
from imaging_ai.catalog import Catalog
from imaging_ai.config import Config, RisDestination, deprecations
from imaging_ai.db.models import AuditEvent
from imaging_ai.db.session import make_engine, session_factory, upgrade, utcnow
from imaging_ai.engine_set import EngineSet
from imaging_ai.errors import OutOfResources, StartupError
from imaging_ai.models_watch import ModelWatcher
from imaging_ai.outbox import Outbox
from imaging_ai.outputs.messages import MessageBuilder
from imaging_ai.outputs.mllp import send_oru
from imaging_ai.outputs.warm import warm_up_outputs
from imaging_ai.process import Processor
from imaging_ai.receive_pool import ReceiverPool
from imaging_ai.retention import Retention
from imaging_ai.schedule import Scheduler
from imaging_ai.spool import Spool
from imaging_ai.states import WorkerState
from imaging_ai.systemd import NotifySettings, Watchdog
from imaging_ai.web.app import WebContext, create_app, database_ready, tls_options
from imaging_ai.web.auth import TokenStore
from imaging_ai.web.server import HttpServer, server_config

log = logging.getLogger(__name__)

# The whole graceful shutdown, from the first SIGTERM: under systemd's TimeoutStopSec (60 s in
# deploy/imaging-ai.service), past which the unit is killed without the steps below.
SHUTDOWN_S = 45.0
# Kept back from the study in hand for the steps after it (workers, outbox, database).
_AFTER_PROCESSING_S = 10.0


class Daemon:
    """The imaging-ai daemon on one node.

    Shutdown order: stop accepting associations, stop assembly, finish the study in
    hand (or give it back to the queue), stop HTTP, close the database. Everything
    answered Success is already durable, so a hard stop loses nothing; a second SIGTERM
    forces an immediate exit.
    """

    def __init__(self, config: Config, systemd: NotifySettings | None = None) -> None:
        self.config = config
        self.engine = make_engine(config.storage.resolved_database_url)
        self.sessions = session_factory(self.engine)
        self.spool = Spool(
            config.storage.spool_dir, config.storage.min_free_mb, config.storage.node
        )
        self.catalog = Catalog(self.engine, self.spool)
        self.routing_tags = routing_tags(config.priority.rules)
        self.receivers = ReceiverPool(config)
        self.node = f"{config.storage.node}:{os.getpid()}"
        self.scheduler = Scheduler(
            self.sessions, self.node, config.priority, lease_s=config.storage.job_lease_s
        )
        # A release in a receiver wakes the assembler; a study it queues wakes the processor.
        self.assembler = Assembler(
            self.sessions,
            config.assemble,
            config.priority,
            wake=self.receivers.released,
            on_queued=self.scheduler.wake,
        )
        self.processor: Processor | None = None
        # Makes HL7 and FHIR messages beside the SEG and SR encoding (outputs/messages.py).
        self.messages = MessageBuilder()
        self.models = ModelWatcher(config.engines, Path(config.storage.data_dir), self._swap_models)
        self.outbox = Outbox(
            self.sessions, config, Path(config.storage.data_dir), hl7_sender=_send_hl7
        )
        # Deletes the spool files of studies ended storage.retention_days ago (hourly).
        self.retention = Retention(self.sessions, self.spool, config.storage.retention_days)
        self.http: HttpServer | None = None
        # Under systemd (Type=notify): READY=1 once serving, watchdog pings while healthy.
        self.watchdog = Watchdog(systemd, self.health) if systemd is not None else None
        self._stopping = threading.Event()
        self._shutdown_by = 0.0  # time.monotonic() by which the shutdown should be over

    def start(self) -> None:
        """Check everything that can fail, then open the ports.

        Raises
        ------
        StartupError
            With a hint of what to fix, before any port is opened.
        """
        for note in deprecations(self.config):
            log.warning("config: %s", note)
        data_dir = Path(self.config.storage.data_dir)
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self.spool.prepare()
            # The installation's DeviceSerialNumber, made once (imaging_ai.site says why).
            self.config = site.with_device_serial_number(self.config)
        except OSError as exc:
            raise StartupError(
                f"cannot create storage.data_dir {data_dir}: {exc.strerror}"
            ) from exc
        upgrade(self.engine)
        # Checked before the models load, so a port in use stops the start at once.
        _check_port_free("dicom", self.config.dicom.bind, self.config.dicom.port)
        _check_port_free("http", self.config.http.bind, self.config.http.port)
        engines = EngineSet(self.config.engines, data_dir)
        engines.start()
        log.info(
            "models %s on %s",
            ", ".join(f"{c.name} {c.version}" for c in engines.cards.all()),
            engines.backend,
        )
        # While the inference workers load and warm up their engines.
        try:
            self.messages.start()
        except OSError:
            log.exception("cannot start the message process; messages are made in the daemon")
        try:
            seconds = warm_up_outputs(self.config, self.messages)
            log.info("result encoders warmed up in %.2f s", seconds)
        except Exception:
            log.exception("warming up the result encoders failed; the first study pays for it")
        self.processor = Processor(
            self.sessions, self.scheduler, engines, self.config, self.outbox, messages=self.messages
        )
        orphans = self.scheduler.requeue_orphans()
        if orphans:
            log.warning("%d job(s) of an earlier process of this node queued again", orphans)
        registered, missing = self.catalog.reconcile(self.routing_tags)
        if registered or missing:
            log.warning(
                "spool reconciled: %d file(s) registered, %d row(s) missing", registered, missing
            )
        self.receivers.start()
        # The idle clocks run from when senders can reach this process, not from its
        # construction: a sender cut off by a restart gets its full idle window to resend,
        # not what is left of it after the models loaded and the encoders warmed up.
        self.assembler.started_at = utcnow()
        self.assembler.start()
        self.processor.start()
        self.outbox.start()
        self.models.start()
        self.retention.start()

    def readiness(self) -> dict[str, str]:
        """Checks behind /readyz."""
        try:
            self.spool.ensure_space()
            disk = "ok"
        except OutOfResources as exc:
            disk = str(exc)
        return {
            "database": database_ready(self.sessions),
            "disk": disk,
            "receivers": self.receivers.readiness(),
            "engines": self._engines_ready(),
        }

    def health(self) -> str:
        """Why the daemon cannot take and queue studies, or "ok" (feeds systemd's watchdog)."""
        ingest = self.receivers.can_accept()
        if ingest != "ok":
            return ingest
        if not self.assembler.alive():
            return "assembler thread stopped"
        if self.processor is None or not self.processor.alive():
            return "processing threads stopped"
        return "ok"

    def _engines_ready(self) -> str:
        if self.processor is None:
            return "models not loaded"
        workers = self.processor.engines.pool.status()
        down = [w.device for w in workers if not w.alive]
        if not workers or down:
            return f"inference workers down: {', '.join(down)}"
        # A worker is ready once its engines are loaded and warmed up; until then it starts.
        starting = [w.device for w in workers if w.state != WorkerState.READY]
        return f"inference workers starting: {', '.join(starting)}" if starting else "ok"

    def _swap_models(self, engines: EngineSet) -> None:
        assert self.processor is not None
        # The next study takes the new set; studies in hand finish on the one they started with.
        old, self.processor.engines = self.processor.engines, engines
        old.retire()
        self._audit("daemon", "models_reload", self.config.engines.dir, "ok")

    def reload_models(self, actor: str) -> None:
        """Admin action / SIGHUP: validate and load the models again, in the background."""
        self._audit(actor, "models_reload", self.config.engines.dir, "requested")
        self.models.request_reload()

    def live_status(self) -> dict[str, Any]:
        """In-memory state for the status page."""
        claims = self.processor.current if self.processor else []
        engines = self.processor.engines.status() if self.processor else {}
        return {
            "node": self.node,
            "receivers": {
                "processes": self.receivers.alive(),
                "restarts": self.receivers.restarts(),
                "accepting": self.receivers.can_accept(),
                **self.receivers.stats.snapshot(),
            },
            "receiver_processes": self.receivers.processes(),
            "processing": [c.study_uid for c in claims],
            **engines,
            "models_error": self.models.last_error,
        }

    # Admin actions (web.app.AdminActions): each is recorded in the audit log.

    def force_complete(self, study_uid: str, actor: str) -> bool:
        """Complete a study that is still receiving."""
        done = self.assembler.force_complete(study_uid)
        self._audit(actor, "force_complete", study_uid, "ok" if done else "not receiving")
        return done

    def retry_study(self, study_uid: str, actor: str) -> bool:
        """Queue a failed study again, as a new attempt; not one whose images were purged."""
        gone = self.retention.refuse_retry(study_uid)
        if gone:
            self._audit(actor, "retry_study", study_uid, f"not retried: {gone}")
            return False
        done = self.scheduler.retry_failed(study_uid)
        self._audit(actor, "retry_study", study_uid, "ok" if done else "not failed")
        return done

    def raise_priority(self, study_uid: str, priority: str, actor: str) -> bool:
        """Move a queued study to a more urgent class (audited by the scheduler)."""
        return self.scheduler.raise_priority(study_uid, priority, actor)

    def set_paused(self, priority: str, paused: bool, actor: str) -> None:
        """Pause or resume a class on every node (audited by the scheduler)."""
        self.scheduler.set_paused(priority, paused, actor)

    def retry_delivery(self, delivery_id: int, actor: str) -> bool:
        """Try a pending delivery now (audited by the outbox)."""
        return self.outbox.retry(delivery_id, actor)

    def cancel_delivery(self, delivery_id: int, actor: str) -> bool:
        """Stop trying a delivery (audited by the outbox)."""
        return self.outbox.cancel(delivery_id, actor)

    def _audit(self, actor: str, action: str, target: str, detail: str) -> None:
        with self.sessions() as s, s.begin():
            s.add(AuditEvent(at=utcnow(), actor=actor, action=action, target=target, detail=detail))

    def serve_forever(self) -> None:
        """Serve HTTP in this thread until a shutdown is requested."""
        ctx = WebContext(
            self.sessions,
            TokenStore(self.config.http.tokens),
            self.readiness,
            live=self.live_status,
            actions=self,
            config=self.config,
        )
        tls = tls_options(self.config.http)
        uv_config = server_config(
            create_app(ctx),
            self.config.http,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ssl_certfile=tls.get("ssl_certfile"),
            ssl_keyfile=tls.get("ssl_keyfile"),
        )
        self.http = HttpServer(uv_config, on_started=self._serving)
        log.info(
            "imaging-ai %s ready: HTTP on %s:%d",
            __version__,
            self.config.http.bind,
            self.config.http.port,
        )
        self.http.run()
        if not self.http.started and not self._stopping.is_set():
            raise StartupError(
                f"cannot serve HTTP on {self.config.http.bind}:{self.config.http.port}"
            )

    def _serving(self) -> None:
        if self.watchdog is not None:
            self.watchdog.ready()

    def request_shutdown(self) -> None:
        """Begin the documented shutdown; returns at once."""
        if self._stopping.is_set():
            return
        self._shutdown_by = time.monotonic() + SHUTDOWN_S
        self._stopping.set()
        log.info("shutting down: no new associations")
        if self.watchdog is not None:
            self.watchdog.stopping()
        self.receivers.stop()
        if self.http is not None:
            self.http.should_exit = True

    def close(self) -> None:
        """Finish the shutdown after serving has stopped, within SHUTDOWN_S of its start.

        The study in hand gets what is left less _AFTER_PROCESSING_S; if it has not finished
        by then it goes back to the queue, and its batches still on a worker are not waited
        for (the next start runs the study again, with the same result UIDs).
        """
        self.receivers.stop()
        self.assembler.stop()
        if self.processor is not None:
            self.processor.stop(timeout_s=max(1.0, self._time_left() - _AFTER_PROCESSING_S))
            self.processor.engines.pool.stop(timeout_s=self._time_left() / 2)
            self.processor.engines.stop()
        self.outbox.stop(timeout_s=self._time_left())
        self.retention.stop(timeout_s=self._time_left())
        self.messages.stop()
        self.models.stop()
        self.engine.dispose()
        log.info("imaging-ai stopped")

    def _time_left(self) -> float:
        """Seconds left of the shutdown's budget; at least one for each step."""
        return max(1.0, self._shutdown_by - time.monotonic())

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: graceful shutdown; a second one exits at once."""

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._stopping.is_set():
                log.warning("second signal %d: exiting now", signum)
                os._exit(1)
            threading.Thread(target=self.request_shutdown, name="shutdown").start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, lambda signum, frame: self.models.request_reload())


def _send_hl7(dest: RisDestination, message: str) -> None:
    send_oru(dest.host, dest.port, message, timeout=30.0)


def _check_port_free(what: str, host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise StartupError(
                f"cannot listen for {what} on {host}:{port}: {exc.strerror}; "
                f"change {what}.port or stop the other program"
            ) from exc


def run_daemon(config: Config) -> None:
    """Start the daemon, serve until signalled, shut down in order."""
    faults.arm(os.environ)  # test-only fault injection; off unless IMAGING_AI_FAULT is set
    fixed_mmap_threshold()
    daemon = Daemon(config, NotifySettings.from_environ(os.environ))
    daemon.start()
    daemon.install_signal_handlers()
    try:
        daemon.serve_forever()
    finally:
        daemon.request_shutdown()
        daemon.close()


# glibc's M_MMAP_THRESHOLD (malloc.h); 128 KiB is its starting value.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 128 * 1024


def fixed_mmap_threshold() -> None:
    """Keep glibc returning large freed buffers (volumes, batches) to the system.

    glibc raises its mmap threshold each time a large block is freed, after which blocks of
    that size come from the heap and stay resident: a process's memory then follows its
    busiest moment and not its work (tests/test_memory_flat.py caught the inference worker
    growing by 300 MB). Fixing the threshold turns that off, here through mallopt and in the
    processes this one starts through the environment variable glibc reads at their start.
    """
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(_MMAP_THRESHOLD_BYTES))
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to fix
