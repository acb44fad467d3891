"""The study page's findings and their key images: listed with size, place, probability and
whether reported; images served to administrators only, from the study's result folder only."""

from __future__ import annotations

import re
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine, select
from starlette.testclient import TestClient

from imaging_ai.db.models import Report, Study
from imaging_ai.db.session import session_factory
from tests.web.conftest import ADMIN, BASE, RIS, make_app, sign_in
from tests.web.fakes import FakeActions
from tests.web.findings_seed import CAVEAT
from tests.web.seed import Seeded, seed


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def with_findings(engine: Engine, data_dir: Path) -> Seeded:
    """The seeded database whose done study has four findings and their key images."""
    return seed(engine, data_dir)


@pytest.fixture
def anonymous(engine: Engine, with_findings: Seeded, data_dir: Path) -> TestClient:
    app = make_app(engine, FakeActions(session_factory(engine)), data_dir=data_dir)
    return TestClient(app, base_url=BASE)


@pytest.fixture
def viewer(anonymous: TestClient) -> TestClient:
    assert sign_in(anonymous).status_code == 303
    return anonymous


def _study_page(client: TestClient, uid: str) -> str:
    response = client.get(f"/admin/studies/{uid}")
    assert response.status_code == 200
    return response.text


def _figures(html: str) -> list[str]:
    return re.findall(r'<figure class="finding[^"]*" id="finding-\d+">.*?</figure>', html, re.S)


def test_the_study_page_lists_every_finding_with_its_key_image(
    viewer: TestClient, with_findings: Seeded
) -> None:
    uid = with_findings.uids["done"]
    html = _study_page(viewer, uid)
    figures = _figures(html)
    # Reported first, then by probability: 1 (0.94), 2 (0.81), then 4 (0.31), 3 (0.12).
    assert [re.search(r'id="finding-(\d+)"', f).group(1) for f in figures] == ["1", "2", "4", "3"]
    first, last = figures[0], figures[-1]
    assert 'class="finding reported"' in first and "0.94" in first and "right lung" in first
    assert "15.3 &times; 15.3 mm" in first
    assert 'class="finding not-reported"' in last and "0.12" in last and "not reported" in last
    assert f'src="/admin/studies/{uid}/images/key-1.png"' in first
    assert f'src="/admin/studies/{uid}/images/key-3.png"' in last
    assert "2 reported, 2 not reported" in html
    assert CAVEAT.split(":")[0] in html and 'class="caveats"' in html


def test_the_key_image_is_a_png_from_the_result_folder(
    viewer: TestClient, with_findings: Seeded, data_dir: Path
) -> None:
    uid = with_findings.uids["done"]
    response = viewer.get(f"/admin/studies/{uid}/images/key-2.png")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert response.headers["cache-control"] == "no-store"
    assert "img-src 'self'" in response.headers["content-security-policy"]
    (written,) = data_dir.glob(f"results/{uid}/*/key-2.png")
    assert response.content == written.read_bytes()
    image = Image.open(BytesIO(response.content))
    assert image.format == "PNG" and image.height == 256


def test_key_images_need_an_administrator(anonymous: TestClient, with_findings: Seeded) -> None:
    path = f"/admin/studies/{with_findings.uids['done']}/images/key-1.png"
    browser = anonymous.get(path, follow_redirects=False)
    assert browser.status_code == 303 and "/admin/signin" in browser.headers["location"]
    assert anonymous.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert anonymous.get(path, headers={"Authorization": f"Bearer {RIS}"}).status_code == 403
    script = anonymous.get(path, headers={"Authorization": f"Bearer {ADMIN}"})
    assert script.status_code == 200 and script.content.startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "tail",
    [
        "key-9.png",  # no such finding
        "key--1.png",
        "key-1.png.tmp",
        "key-01x.png",
        "seg.dcm",
        "fhir.json",
        "key-1.PNG",
        "..%2F..%2F..%2Fetc%2Fpasswd",
        "key-1.png%2F..%2F..%2Fseg.dcm",
        "key-99999999999999999999.png",
        "key-\u0661.png",  # an Arabic-Indic digit one: int() would take it, the name rule not
        "%2e%2e",
        "key-1.png%00",
    ],
)
def test_only_key_images_of_the_study_are_served(
    viewer: TestClient, with_findings: Seeded, data_dir: Path, tail: str
) -> None:
    (folder,) = data_dir.glob("results/*/*")
    (folder / "seg.dcm").write_bytes(b"DICM")
    (folder / "fhir.json").write_text("{}")
    (folder / "key-1.png.tmp").write_bytes(b"half")
    response = viewer.get(f"/admin/studies/{with_findings.uids['done']}/images/{tail}")
    assert response.status_code == 404
    assert b"DICM" not in response.content and b"root:" not in response.content


def test_another_studys_uid_gives_no_image(viewer: TestClient, with_findings: Seeded) -> None:
    for uid in (with_findings.uids["failed"], "1.2.3.4.5", "..", "%2E%2E"):
        assert viewer.get(f"/admin/studies/{uid}/images/key-1.png").status_code == 404


def test_a_report_naming_a_folder_outside_the_results_serves_nothing(
    viewer: TestClient, with_findings: Seeded, engine: Engine, data_dir: Path
) -> None:
    secret = data_dir / "elsewhere"
    secret.mkdir(parents=True)
    (secret / "key-1.png").write_bytes(b"\x89PNG not a key image")
    uid = with_findings.uids["done"]
    with session_factory(engine)() as s, s.begin():
        report = s.scalars(
            select(Report)
            .join(Study, Study.id == Report.study_id)
            .where(Study.study_instance_uid == uid)
        ).one()
        report.findings = {**report.findings, "files": {"folder": "results/../elsewhere"}}
    assert viewer.get(f"/admin/studies/{uid}/images/key-1.png").status_code == 404
    html = _study_page(viewer, uid)
    assert "key-1.png" not in html and html.count("No key image for this finding.") == 4


def test_lesions_are_listed_where_no_candidate_stage_ran(
    viewer: TestClient, with_findings: Seeded, engine: Engine
) -> None:
    uid = with_findings.uids["done"]
    with session_factory(engine)() as s, s.begin():
        report = s.scalars(
            select(Report)
            .join(Study, Study.id == Report.study_id)
            .where(Study.study_instance_uid == uid)
        ).one()
        lesions = [
            {k: v for k, v in x.items() if k not in ("probability", "reported")}
            for x in report.findings["lesions"]
        ]  # as reports were written before candidates existed
        report.findings = {**report.findings, "candidates": [], "lesions": lesions}
        report.findings.pop("caveats")
    html = _study_page(viewer, uid)
    figures = _figures(html)
    assert len(figures) == 2 and all('class="finding reported"' in f for f in figures)
    assert "no classifier ran" in figures[0]
    assert f'src="/admin/studies/{uid}/images/key-1.png"' in figures[0]
    assert 'class="caveats"' not in html


def test_a_study_without_a_report_says_so(viewer: TestClient, with_findings: Seeded) -> None:
    html = _study_page(viewer, with_findings.uids["failed"])
    assert "No report yet." in html and not _figures(html)


def test_many_candidates_not_reported_are_folded_away(
    viewer: TestClient, with_findings: Seeded, engine: Engine
) -> None:
    uid = with_findings.uids["done"]
    html = _study_page(viewer, uid)
    assert '<details class="not-reported-list" open>' in html  # two: shown at once
    with session_factory(engine)() as s, s.begin():
        report = s.scalars(
            select(Report)
            .join(Study, Study.id == Report.study_id)
            .where(Study.study_instance_uid == uid)
        ).one()
        candidates = report.findings["candidates"]
        extra = [{**candidates[3], "number": n, "probability": 0.05} for n in range(5, 11)]
        report.findings = {**report.findings, "candidates": [*candidates, *extra]}
    html = _study_page(viewer, uid)
    assert '<details class="not-reported-list">' in html
    assert "Candidates not reported (8)" in html and len(_figures(html)) == 10
    assert html.count("No key image for this finding.") == 6  # none drawn for 5-10
