"""Takes the table of documented operations below; gives the OpenAPI 3.0 document of the RIS API
and the FHIR API, served at ``GET /api/v1/openapi.json``.

The document is written here, by hand, per path, so that it says what each parameter means;
tests/web/test_openapi.py walks the app's routes and fails when a ``/api/v1`` or ``/fhir`` route
is not in it, or the document names one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import imaging_ai
from imaging_ai.web.fhir import FHIR_JSON
from imaging_ai.web.fhir_resources import RESOURCE_TYPES
from imaging_ai.web.fhir_search import SEARCH_PARAMS

Json = dict[str, Any]
_STR, _INT = {"type": "string"}, {"type": "integer"}
_NULLABLE_STR = {"type": "string", "nullable": True}


@dataclass(frozen=True)
class Param:
    """A query parameter."""

    name: str
    description: str
    schema: Json
    required: bool = False


@dataclass(frozen=True)
class Operation:
    """A GET operation: what it answers, its query parameters, its errors."""

    summary: str
    answer: str  # a schema name under components.schemas
    query: tuple[Param, ...] = ()
    errors: tuple[int, ...] = (401, 403)
    public: bool = False


_ACCESSION = Param("accession", "Accession Number (0008,0050).", _STR)
_FHIR_QUERY = tuple(
    Param(p.name, f"{p.documentation} (FHIR search type {p.type}).", _STR) for p in SEARCH_PARAMS
)
_FHIR_QUERY += (
    Param("patient:identifier", "The patient identifier: [system|]value.", _STR),
    Param("_format", "json, application/json or application/fhir+json.", _STR),
)
OPERATIONS: dict[str, Operation] = {
    "/api/v1/openapi.json": Operation("This document.", "OpenApi", errors=(), public=True),
    "/api/v1/studies": Operation(
        "Studies, newest first (no patient identifiers).",
        "StudyList",
        (
            _ACCESSION,
            Param("state", "Study state: receiving, queued, processing, delivering, ...", _STR),
            Param("limit", "How many, 1 to 500 (default 100).", _INT),
        ),
        (400, 401, 403),
    ),
    "/api/v1/studies/{study_uid}": Operation(
        "One study by Study Instance UID.", "Study", errors=(401, 403, 404)
    ),
    "/api/v1/reports": Operation(
        "The reports of an accession number (audited).",
        "ReportList",
        (Param("accession", "Accession Number (0008,0050), at most 64 characters.", _STR, True),),
        (400, 401, 403),
    ),
    "/api/v1/reports/{study_uid}": Operation(
        "The report of a study (audited).", "Report", errors=(401, 403, 404)
    ),
    "/fhir/metadata": Operation(
        "FHIR R4 CapabilityStatement.", "FhirResource", errors=(), public=True
    ),
    "/fhir/DiagnosticReport": Operation(
        "FHIR R4 search: a searchset Bundle, the DiagnosticReports as matches and the resources "
        "they refer to included (audited).",
        "FhirResource",
        _FHIR_QUERY,
        (400, 401, 403),
    ),
} | {
    f"/fhir/{kind}/{{id}}": Operation(
        f"FHIR R4 read of a {kind} by its id (audited).", "FhirResource", errors=(401, 403, 404)
    )
    for kind in RESOURCE_TYPES
}
_ERRORS = {
    400: "A parameter that cannot be used.",
    401: "No valid Authorization: Bearer token.",
    403: "The token's role may not do this.",
    404: "Not found.",
}


def openapi_document() -> Json:
    """The OpenAPI 3.0 document of every operation in :data:`OPERATIONS`."""
    paths = {path: {"get": _operation(path, op)} for path, op in OPERATIONS.items()}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "imaging-ai RIS API and FHIR R4 API",
            "version": imaging_ai.__version__,
            "description": "Reports of the AI analysis of CT studies, for RIS. Tokens and their "
            "roles are configured in [http] tokens (role ris or admin).",
        },
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        | {"schemas": SCHEMAS},
    }


def _operation(path: str, op: Operation) -> Json:
    fhir = path.startswith("/fhir")
    media = FHIR_JSON if fhir else "application/json"
    error = "OperationOutcome" if fhir else "Error"
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    parameters = [{"name": n, "in": "path", "required": True, "schema": _STR} for n in names] + [
        {"name": p.name, "in": "query", "required": p.required}
        | {"description": p.description, "schema": p.schema}
        for p in op.query
    ]
    responses = {"200": _answer(op.summary, media, op.answer)} | {
        str(code): _answer(_ERRORS[code], media, error) for code in op.errors
    }
    operation: Json = {"summary": op.summary, "operationId": _operation_id(path)}
    operation |= {"parameters": parameters} if parameters else {}
    operation["responses"] = responses
    operation["security"] = [] if op.public else [{"bearer": []}]
    return operation


def _answer(description: str, media: str, schema: str) -> Json:
    return {
        "description": description,
        "content": {media: {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


def _operation_id(path: str) -> str:
    words = [p.strip("{}").replace(".", "_") for p in path.split("/") if p]
    return "get_" + "_".join(words)


def _object(properties: Json, required: tuple[str, ...] = ()) -> Json:
    schema: Json = {"type": "object", "properties": properties}
    return schema | ({"required": list(required)} if required else {})


_STUDY = _object(
    {
        "study_uid": _STR,
        "accession": _STR,
        "state": _STR,
        "priority": _NULLABLE_STR,
        "priority_reason": _NULLABLE_STR,
        "deadline": _NULLABLE_STR,
        "instance_count": _INT,
        "series_count": _INT,
        "late_instances": _INT,
        "received_at": _NULLABLE_STR,
        "last_instance_at": _NULLABLE_STR,
        "completed_at": _NULLABLE_STR,
        "completion_reason": _NULLABLE_STR,
        "error": _NULLABLE_STR,
        "notes": {"type": "array", "items": _STR},
        "series": {
            "type": "array",
            "description": "GET /api/v1/studies/{uid} only: each series, and why it is not "
            "analysed (not CT, our own result, localizer...); null where it may be or was.",
            "items": _object(
                {
                    "series_uid": _STR,
                    "series_number": {"type": "integer", "nullable": True},
                    "modality": _STR,
                    "instance_count": _INT,
                    "not_analysed": _NULLABLE_STR,
                }
            ),
        },
    },
    ("study_uid", "state"),
)
_REPORT = _object(
    {
        "study_uid": _STR,
        "accession": _STR,
        "status": {"type": "string", "description": "FHIR DiagnosticReport status words."},
        "ai_generated": {"type": "boolean"},
        "created_at": _NULLABLE_STR,
        "impression": _STR,
        "lesions": {"type": "array", "items": {"type": "object"}},
        "organ_volumes_ml": {"type": "object", "additionalProperties": {"type": "number"}},
        "models": {"type": "object"},
        "timings_s": {"type": "object"},
        "coordinates": _STR,
    },
    ("study_uid", "status"),
)
SCHEMAS: Json = {
    "Study": _STUDY,
    "StudyList": _object({"studies": {"type": "array", "items": _STUDY}}, ("studies",)),
    "Report": _REPORT,
    "ReportList": _object({"reports": {"type": "array", "items": _REPORT}}, ("reports",)),
    "Error": _object({"error": _STR}, ("error",)),
    "FhirResource": _object(
        {"resourceType": _STR, "id": _STR},
        ("resourceType",),
    )
    | {"description": "A FHIR R4 resource in JSON (http://hl7.org/fhir/R4/)."},
    "OperationOutcome": _object(
        {"resourceType": {"type": "string", "enum": ["OperationOutcome"]}}
        | {"issue": {"type": "array", "items": {"type": "object"}}},
        ("resourceType", "issue"),
    ),
    "OpenApi": {"type": "object", "description": "An OpenAPI 3.0 document."},
}


def openapi_routes() -> list[Route]:
    """``GET /api/v1/openapi.json``: open, like ``/fhir/metadata`` (no patient data)."""
    document = openapi_document()

    def openapi(request: Request) -> Response:
        return JSONResponse(document)

    return [Route("/api/v1/openapi.json", openapi)]
