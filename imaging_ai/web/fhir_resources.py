"""Takes a report's stored FHIR Bundle with its database rows; gives its resources as ``/fhir``
publishes them: ids that can be read back, absolute fullUrls, the configured identifier systems,
the stored report status and the ImagingStudy's series from the catalogue.

The stored ``fhir.json`` (see :mod:`imaging_ai.outputs.fhir`) is a self-contained collection
whose resources have UUIDs derived from the job's UIDs and refer to each other by ``urn:uuid:``.
Published, each resource's id is ``<job id>-<its UUID in hex>``: stable (both parts are stored),
unique, and it names the job, so a read by id finds the report without scanning; references
become relative (``Patient/<id>``), resolved against the base URL of the fullUrls.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from imaging_ai.outputs.fhir import SYSTEMS

Json = dict[str, Any]
# Every resource type a stored bundle holds, each readable by id.
RESOURCE_TYPES = ("DiagnosticReport", "ImagingStudy", "Observation", "Patient", "Device")
_ID = re.compile(r"([1-9][0-9]{0,18})-([0-9a-f]{32})")


@dataclass(frozen=True)
class CatalogSeries:
    """A series of the study as the catalogue has it."""

    uid: str
    number: int | None
    modality: str
    instances: int


@dataclass(frozen=True)
class StoredReport:
    """A report row and its stored bundle: what publishing needs."""

    job_id: int
    status: str
    created_at: datetime
    bundle: Json
    series: tuple[CatalogSeries, ...] = ()


@dataclass(frozen=True)
class Publication:
    """Where and how resources are published: ``[fhir]`` with the base URL resolved."""

    base_url: str
    patient_system: str = ""
    accession_system: str = ""


def resource_id(job_id: int, stored_id: str) -> str:
    """The published id of the stored resource ``stored_id`` of job ``job_id``."""
    return f"{job_id}-{uuid.UUID(stored_id).hex}"


def job_of(published_id: str) -> int | None:
    """The job id a published resource id names; None if it is not one of ours."""
    match = _ID.fullmatch(published_id)
    return int(match.group(1)) if match else None


def published_entries(report: StoredReport, publication: Publication) -> list[Json]:
    """The report's resources, published: ``[{"fullUrl": ..., "resource": ...}]``."""
    stored = [entry["resource"] for entry in report.bundle.get("entry", [])]
    names = {r["id"]: f"{r['resourceType']}/{resource_id(report.job_id, r['id'])}" for r in stored}
    entries = []
    for original in stored:
        resource = _relative_references(copy.deepcopy(original), names)
        resource["id"] = resource_id(report.job_id, original["id"])
        _publish(resource, report, publication)
        address = f"{publication.base_url}/{resource['resourceType']}/{resource['id']}"
        entries.append({"fullUrl": address, "resource": resource})
    return entries


def searchset(reports: Sequence[StoredReport], publication: Publication, url: str) -> Json:
    """A FHIR searchset Bundle: each report's DiagnosticReport a match, the rest included."""
    entries = []
    for report in reports:
        for entry in published_entries(report, publication):
            match = entry["resource"]["resourceType"] == "DiagnosticReport"
            entries.append({**entry, "search": {"mode": "match" if match else "include"}})
    bundle: Json = {"resourceType": "Bundle", "type": "searchset"}
    bundle["total"] = sum(1 for e in entries if e["search"]["mode"] == "match")
    bundle["link"] = [{"relation": "self", "url": url}]
    # FHIR allows no empty array: a search that matches nothing has no entry element.
    return bundle | ({"entry": entries} if entries else {})


def _relative_references(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every ``urn:uuid:`` reference to a resource of the bundle made relative."""
    if isinstance(value, list):
        return [_relative_references(v, names) for v in value]
    if not isinstance(value, dict):
        return value
    reference = value.get("reference")
    if isinstance(reference, str) and reference.startswith("urn:uuid:"):
        value["reference"] = names.get(reference.removeprefix("urn:uuid:"), reference)
    return {k: _relative_references(v, names) for k, v in value.items()}


def _publish(resource: Json, report: StoredReport, publication: Publication) -> None:
    """The serving-time fields: last update, status, identifier systems, catalogue series."""
    meta = resource.setdefault("meta", {})
    meta["lastUpdated"] = report.created_at.astimezone(UTC).isoformat(timespec="seconds")
    kind = resource["resourceType"]
    if kind == "DiagnosticReport":
        resource["status"] = report.status  # "amended" once a re-analysis stores it
    systems = {"MR": publication.patient_system, "ACSN": publication.accession_system}
    for identifier in resource.get("identifier", []):
        codes = [c.get("code") for c in identifier.get("type", {}).get("coding", [])]
        system = next((systems[c] for c in codes if c in systems), "")
        if system:
            identifier["system"] = system
    if kind == "ImagingStudy":
        _add_catalog_series(resource, report.series)


def _add_catalog_series(study: Json, catalog: Sequence[CatalogSeries]) -> None:
    """The study's received series before our SEG and SR series, with the counts."""
    ours = study.get("series", [])
    for series in ours:
        series["numberOfInstances"] = len(series.get("instance", []))
    known = {s["uid"] for s in ours}
    received = [_series(s) for s in catalog if s.uid not in known and s.modality]
    study["series"] = received + ours
    study["numberOfSeries"] = len(study["series"])
    study["numberOfInstances"] = sum(s["numberOfInstances"] for s in study["series"])


def _series(series: CatalogSeries) -> Json:
    entry: Json = {"uid": series.uid}
    if series.number is not None and series.number >= 0:
        entry["number"] = series.number  # unsignedInt
    entry["modality"] = {"system": SYSTEMS["DCM"], "code": series.modality}
    entry["numberOfInstances"] = series.instances
    return entry
