"""Every route: missing, wrong and other-role tokens are refused; traversal and oversized input
get a 4xx answer, never a 500."""

from __future__ import annotations

from starlette.routing import Route
from starlette.testclient import TestClient

from tests.web.conftest import ADMIN, RIS

TRAVERSAL = ("..%2F..%2Fetc%2Fpasswd", "%2e%2e/%2e%2e/secret", "1.2.3/../../x", "\u00e9\u00e9")
HUGE = "9" * 6_000
# What the server can do, no patient data: FHIR clients read /fhir/metadata before they sign in.
OPEN = {"/healthz", "/readyz", "/metrics", "/", "/admin/signin", "/fhir/metadata"}
OPEN |= {"/api/v1/openapi.json"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def get_routes(client: TestClient) -> list[str]:
    app = client.app
    routes = [r for r in app.routes if isinstance(r, Route)]  # type: ignore[attr-defined]
    return [r.path for r in routes if "GET" in (r.methods or {"GET"})]


def fill(path: str, value: str) -> str:
    """The path with every parameter set to ``value``."""
    out, _, rest = path.partition("{")
    if not rest:
        return path
    return out + value + fill(rest.partition("}")[2], value)


def test_every_protected_route_refuses_missing_wrong_and_other_role_tokens(
    client: TestClient,
) -> None:
    for path in get_routes(client):
        if path in OPEN or path.startswith("/static"):
            continue
        url = fill(path, "1.2.3")
        missing = client.get(url, follow_redirects=False)
        assert missing.status_code in (401, 303, 307), (url, missing.status_code)
        wrong = client.get(url, headers=bearer("wrong-token-0000000000"), follow_redirects=False)
        assert wrong.status_code in (401, 303, 307), (url, wrong.status_code)
        if path.startswith("/admin"):
            assert client.get(url, headers=bearer(RIS)).status_code == 403, url


def test_traversal_and_oversized_inputs_get_4xx_never_500(client: TestClient) -> None:
    for path in get_routes(client):
        for value in (*TRAVERSAL, HUGE):
            for token in (RIS, ADMIN):
                url = fill(path, value)
                response = client.get(url, headers=bearer(token), follow_redirects=False)
                assert response.status_code < 500, (url[:80], response.status_code)
                query = client.get(
                    f"{fill(path, '1.2.3')}?accession={value}&identifier={value}&limit={value}"
                    f"&date={value}&state={value}",
                    headers=bearer(token),
                    follow_redirects=False,
                )
                assert query.status_code < 500, (path, value[:20], query.status_code)


def test_posts_with_oversized_bodies_are_refused(client: TestClient) -> None:
    body = {"name": HUGE, "token": HUGE, "action": HUGE, "target": HUGE, "confirm": "yes"}
    signin = client.post("/admin/signin", data=body, follow_redirects=False)
    assert 400 <= signin.status_code < 500, signin.status_code
    action = client.post("/admin/actions", data=body, headers=bearer(ADMIN), follow_redirects=False)
    assert 400 <= action.status_code < 500, (action.status_code, action.headers.get("location"))
