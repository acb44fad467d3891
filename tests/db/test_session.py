"""The process's engine: a PostgreSQL URL without its driver stops the start, naming the extra."""

from __future__ import annotations

import sys

import pytest

from imaging_ai.db.session import make_engine
from imaging_ai.errors import StartupError


def test_a_postgresql_url_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import psycopg` raise ImportError, as where it is not installed.
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StartupError) as err:
        make_engine("postgresql+psycopg://imaging@127.0.0.1:5432/imaging")
    message = str(err.value)
    assert "storage.database_url" in message
    assert "pip install 'imaging-ai[postgres]'" in message


def test_sqlite_needs_no_driver_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    engine = make_engine("sqlite://")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    engine.dispose()
