"""``/api/v1/openapi.json``: every /api/v1 and /fhir route of the app is in it and it names no
other; its structure is that of OpenAPI 3.0 (a structural check, below: no OpenAPI validator
is a dependency)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine
from starlette.routing import Route
from starlette.testclient import TestClient

from imaging_ai.web.openapi import openapi_document
from tests.web.conftest import make_app

PREFIXES = ("/api/v1", "/fhir")
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def app_operations(app: Any) -> set[tuple[str, str]]:
    """(path, method) of every route under PREFIXES (HEAD, which Starlette adds, left out)."""
    found = set()
    for route in app.routes:
        assert isinstance(route, Route) or not route.path.startswith(PREFIXES), route
        if isinstance(route, Route) and route.path.startswith(PREFIXES):
            found |= {(route.path, m.lower()) for m in route.methods or () if m != "HEAD"}
    return found


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(p, m) for p, item in document["paths"].items() for m in item if m in METHODS}


def test_the_document_lists_every_route_and_no_other(engine: Engine) -> None:
    app = make_app(engine, None)
    document = TestClient(app).get("/api/v1/openapi.json").json()
    assert document == openapi_document()
    routes = app_operations(app)
    assert ("/fhir/DiagnosticReport/{id}", "get") in routes
    assert ("/api/v1/openapi.json", "get") in routes
    assert routes - documented(document) == set(), "routes missing from the OpenAPI document"
    assert documented(document) - routes == set(), "documented paths the app does not have"


def test_the_check_would_fail_on_an_undocumented_route(engine: Engine) -> None:
    app = make_app(engine, None)
    app.router.routes.append(Route("/api/v1/new", lambda request: None))
    assert ("/api/v1/new", "get") in app_operations(app) - documented(openapi_document())


def structure_errors(document: dict[str, Any]) -> list[str]:
    """What breaks OpenAPI 3.0's required structure: fields, parameters, responses, $refs."""
    errors = []
    if not re.fullmatch(r"3\.0\.\d+", str(document.get("openapi"))):
        errors.append("openapi must be 3.0.x")
    info = document.get("info", {})
    errors += [f"info.{k} is required" for k in ("title", "version") if not info.get(k)]
    schemes = document.get("components", {}).get("securitySchemes", {})
    for path, item in document.get("paths", {}).items():
        if not path.startswith("/"):
            errors.append(f"{path}: a path starts with /")
        templated = set(re.findall(r"{([^}]+)}", path))
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            if method not in METHODS:
                errors.append(f"{where}: not an HTTP method")
                continue
            params = op.get("parameters", [])
            in_path = {p["name"] for p in params if p.get("in") == "path"}
            if in_path != templated:
                errors.append(f"{where}: path parameters {in_path} != {templated}")
            for p in params:
                if p.get("in") not in ("query", "header", "path", "cookie") or "name" not in p:
                    errors.append(f"{where}: parameter {p} needs a name and in")
                if p.get("in") == "path" and p.get("required") is not True:
                    errors.append(f"{where}: path parameter {p['name']} must be required")
                if "schema" not in p and "content" not in p:
                    errors.append(f"{where}: parameter {p['name']} needs a schema")
            responses = op.get("responses", {})
            if not responses:
                errors.append(f"{where}: responses are required")
            for code, response in responses.items():
                if not re.fullmatch(r"[1-5](\d\d|XX)|default", code):
                    errors.append(f"{where}: response code {code}")
                if not response.get("description"):
                    errors.append(f"{where} {code}: a response needs a description")
            for requirement in op.get("security", []):
                errors += [
                    f"{where}: no security scheme {n}" for n in requirement if n not in schemes
                ]
    for ref in re.findall(r"'\$ref': '([^']+)'", str(document)):
        node: Any = document
        for part in ref.removeprefix("#/").split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if not ref.startswith("#/") or node is None:
            errors.append(f"$ref {ref} does not resolve")
    return errors


def test_the_document_has_openapi_3_structure() -> None:
    document = openapi_document()
    assert structure_errors(document) == []
    ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), "operationIds must be unique"


def test_the_structural_check_catches_breakage() -> None:
    broken = openapi_document()
    study = broken["paths"]["/api/v1/studies/{study_uid}"]["get"]
    study["parameters"] = []
    study["responses"]["200"]["content"]["application/json"]["schema"]["$ref"] = "#/x/Nope"
    del broken["info"]["title"]
    errors = structure_errors(broken)
    assert "info.title is required" in errors
    assert any("path parameters set() != {'study_uid'}" in e for e in errors)
    assert "$ref #/x/Nope does not resolve" in errors
