"""The tests' FHIR R4 schema check: it is the published 4.0.1 schema, it catches what the schema
forbids, and its fast resource choice gives the verdict of the schema's own ``oneOf``."""

from __future__ import annotations

import gzip
import hashlib
from typing import Any

import pytest
from jsonschema import Draft6Validator

from tests.fhir_schema import SCHEMA, fhir_schema, schema_errors

PUBLISHED_SHA256 = "73bc879b1476fea7e096fd71c5fb5967d8c48cc9ffc28706f66613f6a82af3cb"


def report(**fields: Any) -> dict[str, Any]:
    resource = {
        "resourceType": "DiagnosticReport",
        "id": "12-ab",
        "status": "preliminary",
        "code": {"coding": [{"system": "http://loinc.org", "code": "24627-2"}]},
        "subject": {"reference": "Patient/12-cd"},
    }
    return {k: v for k, v in (resource | fields).items() if v is not None}


def bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    entries = [{"fullUrl": f"https://h/fhir/X/{i}", "resource": r} for i, r in enumerate(resources)]
    return {"resourceType": "Bundle", "type": "searchset", "total": 1, "entry": entries}


def test_the_file_is_the_published_schema() -> None:
    assert hashlib.sha256(gzip.decompress(SCHEMA.read_bytes())).hexdigest() == PUBLISHED_SHA256
    schema = fhir_schema()
    assert schema["id"] == "http://hl7.org/fhir/json-schema/4.0"
    assert (
        "4.0.1" in schema["definitions"]["CapabilityStatement"]["properties"]["fhirVersion"]["enum"]
    )


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (report(status="done"), "status: 'done' is not one of"),
        # The JSON schema requires no primitive (each may come as _status instead): code it does.
        (report(code=None), "'code' is a required property"),
        (report(issued="2026-01-01T10:00"), "issued: '2026-01-01T10:00' does not match"),
        (report(composition={"reference": "x"}), "Additional properties are not allowed"),
        (report(id="a b"), "id: 'a b' does not match"),
        (bundle(report(status="done")), "entry.0.resource.status: 'done' is not one of"),
        (bundle({"resourceType": "Nonsense"}), "'Nonsense' is not an R4 resource type"),
    ],
)
def test_what_the_schema_forbids_is_caught(document: dict[str, Any], expected: str) -> None:
    assert any(expected in error for error in schema_errors(document)), schema_errors(document)


def test_a_valid_report_passes() -> None:
    assert schema_errors(report()) == []
    assert schema_errors(bundle(report(), {"resourceType": "Patient", "id": "p"})) == []


@pytest.mark.parametrize(
    "document",
    [
        bundle(report(), {"resourceType": "Patient", "id": "p", "gender": "male"}),
        bundle(report(), {"resourceType": "Patient", "id": "p", "gender": "x"}),
        bundle({"resourceType": "Nonsense"}),
    ],
)
def test_same_verdict_as_the_schemas_own_one_of(document: dict[str, Any]) -> None:
    plain = Draft6Validator(fhir_schema())
    assert plain.is_valid(document) == (schema_errors(document) == [])
