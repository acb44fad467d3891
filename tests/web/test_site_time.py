"""The admin pages show times as the site's clock does ([site] time_zone), not a UTC host's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine

from imaging_ai.config import Config, SiteConfig
from imaging_ai.db.session import session_factory
from imaging_ai.web.context import WebContext
from imaging_ai.web.pages import Pages, when
from tests.web.conftest import tokens


@pytest.fixture
def utc_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("utc_host")
def test_page_times_are_in_the_site_zone() -> None:
    config = Config(site=SiteConfig(time_zone="Europe/Berlin"))
    ctx = WebContext(
        session_factory(create_engine("sqlite://")), tokens(), lambda: {}, config=config
    )
    page = Pages(ctx).env.from_string("{{ t | when }} {{ tz }}")
    received = datetime(2026, 12, 7, 8, 51, tzinfo=UTC)
    assert page.render(t=received) == "2026-12-07 09:51:00 Europe/Berlin"
    assert when(received) == "2026-12-07 08:51:00"  # no site zone: the host's, here UTC
