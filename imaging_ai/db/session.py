"""Gives one SQLAlchemy engine per process for a URL, with SQLite tuned for WAL, and migrations."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from imaging_ai.errors import StartupError


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)


def make_engine(url: str) -> Engine:
    """Create the process's engine; SQLite gets WAL, a busy timeout and foreign keys.

    ``synchronous=NORMAL`` in WAL mode survives a process crash; after a power loss
    the last commits may be lost, which the spool reconciliation on start repairs
    because every instance file is fsynced before its row is written.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    try:
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)
    except ImportError as exc:  # the dialect imports its driver here
        raise StartupError(
            f"storage.database_url is a PostgreSQL URL but its driver is not installed ({exc}); "
            "install it with: pip install 'imaging-ai[postgres]'"
        ) from exc


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Return the sessionmaker used as ``with Session() as s, s.begin():``."""
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> AlembicConfig:
    """Alembic configuration pointing at the packaged migrations and this engine."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(resources.files("imaging_ai") / "migrations"))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine) -> None:
    """Apply every migration up to head.

    Raises
    ------
    StartupError
        When the database cannot be reached or a migration fails.
    """
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        command.upgrade(alembic_config(engine), "head")
    except SQLAlchemyError as exc:
        raise StartupError(
            f"database {engine.url.render_as_string(hide_password=True)} is not usable: "
            f"{exc.__class__.__name__}: {str(exc).splitlines()[0]}; "
            "check storage.database_url and that the server is running"
        ) from exc
