"""The official FHIR R4 (4.0.1) JSON schema (tests/schemas/README.md says where it came from), and
``schema_errors``: every way a FHIR JSON document breaks it, in words with the path.

Every FHIR answer in the tests goes through :func:`assert_valid_fhir`.

The schema picks a resource's definition with a ``oneOf`` over all 145 resource types (at the
top and in every Bundle entry and contained resource). Every resource definition requires its
own ``resourceType`` constant, so exactly one branch can match: the branch named by the
instance's ``resourceType``. The validator here checks that branch only, which is the same verdict
as the ``oneOf`` (a resource type the schema does not know still fails), but about twenty times
faster and with errors that say what is wrong instead of "not valid under any of the given
schemas".
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft6Validator, ValidationError, validators

SCHEMA = Path(__file__).parent / "schemas" / "fhir.schema.json.gz"
_REF = "#/definitions/"
_one_of = Draft6Validator.VALIDATORS["oneOf"]


@cache
def fhir_schema() -> dict[str, Any]:
    """The schema as published (the gzipped file, decoded)."""
    loaded: dict[str, Any] = json.loads(gzip.decompress(SCHEMA.read_bytes()))
    return loaded


def _resource_one_of(
    validator: Any, one_of: list[dict[str, str]], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """``oneOf`` over resource types: the branch of the instance's ``resourceType``."""
    refs = [branch.get("$ref", "") for branch in one_of]
    kind = instance.get("resourceType") if isinstance(instance, dict) else None
    if len(refs) < 100 or not all(ref.startswith(_REF) for ref in refs):
        yield from _one_of(validator, one_of, instance, schema)  # not the resource choice
    elif f"{_REF}{kind}" not in refs:
        yield ValidationError(f"resourceType {kind!r} is not an R4 resource type")
    else:
        yield from validator.descend(instance, {"$ref": f"{_REF}{kind}"})


_Validator = validators.extend(Draft6Validator, {"oneOf": _resource_one_of})


@cache
def _validator() -> Any:
    return _Validator(fhir_schema())


def schema_errors(document: dict[str, Any]) -> list[str]:
    """Every error of ``document`` against the R4 schema: ``"<path>: <message>"``."""
    errors = sorted(_validator().iter_errors(document), key=lambda e: list(map(str, e.path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]


def assert_valid_fhir(document: dict[str, Any]) -> None:
    """Fail with every schema error of ``document`` (a resource or a Bundle)."""
    errors = schema_errors(document)
    assert errors == [], "not valid FHIR R4:\n" + "\n".join(errors)
