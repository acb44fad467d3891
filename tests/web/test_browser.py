"""The admin pages in headless Chromium against a real uvicorn server: sign in, watch a study
move through the queue, act with confirmation, with and without JavaScript; screenshots."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import Engine, select, update

from imaging_ai.config import Config, StorageConfig
from imaging_ai.db.models import AuditEvent, Job, Study
from imaging_ai.db.session import make_engine, session_factory, upgrade, utcnow
from imaging_ai.web.app import WebContext, create_app
from imaging_ai.web.session import SignInThrottle, WebSecurity
from tests.conftest import free_port
from tests.web.conftest import ADMIN, LIVE, tokens
from tests.web.fakes import FakeActions
from tests.web.seed import Seeded, seed

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing (apt-get install chromium); browser tests not run",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REFRESH_S = 0.5


@dataclass
class Server:
    """A running daemon web server over a seeded SQLite database."""

    url: str
    engine: Engine
    seeded: Seeded
    actions: FakeActions


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """uvicorn on a free loopback port, in a thread, with the fake daemon."""
    engine = make_engine(f"sqlite:///{tmp_path / 'web.sqlite3'}")
    upgrade(engine)
    seeded = seed(engine, tmp_path / "data")
    actions = FakeActions(session_factory(engine))
    settings = WebSecurity(signin_delay_s=0.0)
    ctx = WebContext(
        session_factory(engine),
        tokens(),
        lambda: {"database": "ok"},
        live=lambda: LIVE,
        actions=actions,
        config=Config(storage=StorageConfig(data_dir=str(tmp_path / "data"))),
        security=settings,
        refresh_s=REFRESH_S,
    )
    port = free_port()
    app = create_app(ctx, SignInThrottle(settings))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not http.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert http.started, "uvicorn did not start"
    yield Server(f"http://127.0.0.1:{port}", engine, seeded, actions)
    http.should_exit = True
    thread.join(timeout=10)
    engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (Debian's, not a downloaded one)."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def new_page(browser: Any, javascript: bool = True) -> Any:
    """A page in a fresh context (its own cookies), big enough for the status page."""
    context = browser.new_context(
        viewport={"width": 1440, "height": 1000}, java_script_enabled=javascript
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    return page


def sign_in(page: Any, server: Server) -> None:
    """Open /admin, get sent to the form, sign in, land on the status page."""
    page.goto(f"{server.url}/admin")
    assert "/admin/signin" in page.url
    page.fill("#name", "it")
    page.fill("#token", ADMIN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/admin")
    assert page.get_by_role("heading", name="Now").is_visible()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """Save a full-page screenshot; also into $IMAGING_AI_SCREENSHOT_DIR when set."""
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if extra := os.environ.get("IMAGING_AI_SCREENSHOT_DIR"):
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / name)
    return path


def state_cell(page: Any, uid: str) -> Any:
    return page.locator(f"#now tr[data-uid='{uid}'] .state")


def test_watch_a_study_move_through_the_queue(browser: Any, server: Server, tmp_path: Path) -> None:
    page = new_page(browser)
    sign_in(page, server)
    uid = server.seeded.uids["queued"]
    sync_api.expect(state_cell(page, uid)).to_have_text("queued")
    assert "DOE" not in page.content()  # no patient names on the status page
    with session_factory(server.engine)() as s, s.begin():
        study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).one()
        study.state = "processing"
        s.execute(
            update(Job)
            .where(Job.study_id == study.id)
            .values(state="processing", started_at=utcnow(), node="node-b:7")
        )
    sync_api.expect(state_cell(page, uid)).to_have_text("processing")  # refreshed by itself
    sync_api.expect(page.locator(f"#now tr[data-uid='{uid}']")).to_contain_text("node-b:7")
    with session_factory(server.engine)() as s, s.begin():
        study = s.scalars(select(Study).where(Study.study_instance_uid == uid)).one()
        study.state = "done"
        done_at = utcnow()
        s.execute(
            update(Job)
            .where(Job.study_id == study.id)
            .values(state="done", finished_at=done_at, timings={"lung-seg": 3.0})
        )
    sync_api.expect(state_cell(page, uid)).to_have_count(0)
    sync_api.expect(page.locator("#recent")).to_contain_text("ACC-QUEUED")
    shot = screenshot(page, tmp_path, "status.png")
    assert shot.stat().st_size > 20_000


def confirm(page: Any, row: str, button: str, yes: str) -> None:
    """Click an action in a row, check the confirmation page, confirm."""
    page.locator(row).get_by_role("link", name=button).click()
    page.wait_for_url("**/admin/confirm?**")
    assert page.locator("h1").inner_text().endswith("?")
    page.get_by_role("button", name=yes).click()
    page.wait_for_url("**/admin?**")


def test_force_complete_and_retry_with_confirmation(
    browser: Any, server: Server, tmp_path: Path
) -> None:
    page = new_page(browser)
    sign_in(page, server)
    receiving, failed = server.seeded.uids["receiving"], server.seeded.uids["failed"]
    page.locator(f"#now tr[data-uid='{receiving}']").get_by_role(
        "link", name="Force complete"
    ).click()
    assert "Complete study ACC-RECEIVING" in page.locator("h1").inner_text()
    screenshot(page, tmp_path, "confirm.png")
    page.get_by_role("button", name="Yes, force complete").click()
    page.wait_for_url("**/admin?**")
    sync_api.expect(page.locator(".notice")).to_contain_text("completed and queued")
    sync_api.expect(state_cell(page, receiving)).to_have_text("queued")
    confirm(page, f"#problems tr[data-uid='{failed}']", "Retry", "Yes, retry")
    sync_api.expect(page.locator(".notice")).to_contain_text(f"Study {failed} queued again")
    sync_api.expect(state_cell(page, failed)).to_have_text("queued")
    assert [c[0] for c in server.actions.calls] == ["force_complete", "retry_study"]
    with session_factory(server.engine)() as s:
        actions = s.scalars(select(AuditEvent.action).where(AuditEvent.actor == "it")).all()
    assert actions.count("admin_request") == 2 and "sign_in" in actions


def test_works_without_javascript(browser: Any, server: Server, tmp_path: Path) -> None:
    page = new_page(browser, javascript=False)
    sign_in(page, server)
    assert page.locator("noscript").count() == 1
    confirm(page, "#now table:first-of-type tr:has-text('outpatient')", "Pause", "Yes, pause")
    assert "Class outpatient paused." in page.locator(".notice").inner_text()
    assert ("set_paused", "outpatient", "True", "it") in server.actions.calls
    page.goto(f"{server.url}/admin/search?accession=ACC-DONE")
    assert "DOE JANE" in page.locator("td.patient").inner_text()  # admins see names here
    screenshot(page, tmp_path, "search.png")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/admin/signin")
    page.goto(f"{server.url}/admin")
    assert "/admin/signin" in page.url  # the session is over


def test_session_cookie_flags_in_the_browser(browser: Any, server: Server) -> None:
    page = new_page(browser)
    sign_in(page, server)
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert cookie["expires"] - time.time() == pytest.approx(
        timedelta(hours=8).total_seconds(), abs=60
    )
    assert page.evaluate("document.cookie") == ""  # not readable by scripts


def test_study_page_shows_the_findings_key_images_under_the_csp(
    browser: Any, server: Server, tmp_path: Path
) -> None:
    page = new_page(browser)
    problems: list[str] = []
    images_seen: list[tuple[int, str]] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on(
        "response",
        lambda r: (
            images_seen.append((r.status, r.headers.get("content-type", "")))
            if "/images/key-" in r.url
            else None
        ),
    )
    sign_in(page, server)
    problems.clear()  # the status page's polling, cut short by leaving it
    uid = server.seeded.uids["done"]
    page.goto(f"{server.url}/admin/studies/{uid}")
    images = page.locator("img.key-image")
    sync_api.expect(images).to_have_count(4)
    for i in range(4):
        images.nth(i).scroll_into_view_if_needed()  # they load lazily
    page.wait_for_function("[...document.querySelectorAll('img.key-image')].every(i => i.complete)")
    widths = page.eval_on_selector_all("img.key-image", "els => els.map(e => e.naturalWidth)")
    assert widths == [516] * 4, widths  # 256 px slice, 4 px gap, 256 px close-up
    assert images_seen == [(200, "image/png")] * 4
    assert not [p for p in problems if "Content Security Policy" in p or "/images/" in p], problems
    sync_api.expect(page.locator("#finding-3")).to_contain_text("not reported")
    sync_api.expect(page.locator(".caveats")).to_contain_text("5.0 mm thick")
    page.evaluate("window.scrollTo(0, 0)")
    shot = screenshot(page, tmp_path, "study.png")
    assert shot.stat().st_size > 50_000
