"""Takes the query of ``GET /fhir/DiagnosticReport``; gives the SQL conditions it means on studies
and reports (all ANDed), or a 400 that names the parameter it cannot use.

The parameters are those of R4's DiagnosticReport search that this server implements, in
:data:`SEARCH_PARAMS` (the CapabilityStatement lists the same table): a parameter given twice
means both, a comma inside one value means either.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, and_, false, func, not_, or_
from starlette.exceptions import HTTPException

from imaging_ai.db.models import Report, Study
from imaging_ai.web.fhir_resources import job_of


@dataclass(frozen=True)
class SearchParam:
    """One search parameter as the CapabilityStatement declares it."""

    name: str
    type: str
    documentation: str


SEARCH_PARAMS = (
    SearchParam(
        "identifier",
        "token",
        "The accession number: [system|]value (system as [fhir] accession_identifier_system).",
    ),
    SearchParam(
        "patient",
        "reference",
        "The report's Patient: Patient/id, or with the :identifier modifier (also written as "
        "the chain patient.identifier) the patient identifier [system|]value (system as [fhir] "
        "patient_identifier_system).",
    ),
    SearchParam(
        "date",
        "date",
        "The study date (DiagnosticReport.effective), kept to the day: YYYY, YYYY-MM or "
        "YYYY-MM-DD, with the prefix eq (default), ne, gt, lt, ge or le.",
    ),
    SearchParam(
        "status",
        "token",
        "The report status (preliminary for every report the models write; amended after a "
        "re-analysis).",
    ),
)
# The R4 value set of DiagnosticReport.status (required binding).
REPORT_STATUSES = frozenset(
    {"registered", "partial", "preliminary", "final", "amended", "corrected", "appended"}
    | {"cancelled", "entered-in-error", "unknown"}
)
_FORMATS = frozenset({"json", "application/json", "application/fhir+json"})
_DATE = re.compile(r"(eq|ne|gt|lt|ge|le|sa|eb|ap)?([0-9]{4})(?:-([0-9]{2})(?:-([0-9]{2}))?)?")


@dataclass(frozen=True)
class Search:
    """A parsed search: SQL conditions, and Patient ids that only the bundles can check."""

    conditions: tuple[ColumnElement[bool], ...] = ()
    patient_ids: tuple[frozenset[str], ...] = ()  # each set: one of these (AND between sets)
    accessions: tuple[str, ...] = field(default=())  # for the audit log


def parse_search(
    items: Sequence[tuple[str, str]], patient_system: str, accession_system: str
) -> Search:
    """The search that the query's (name, value) pairs ask for.

    Raises
    ------
    HTTPException
        400 for an unknown parameter or modifier, or a value that cannot be used.
    """
    conditions: list[ColumnElement[bool]] = []
    patients: list[frozenset[str]] = []
    accessions: list[str] = []
    for name, raw in items:
        if name == "_format":
            if raw not in _FORMATS:
                raise HTTPException(400, f"_format {raw!r}: this server answers JSON only")
            continue
        values = _values(name, raw)
        if name == "identifier":
            codes = _tokens(values, accession_system)
            accessions += codes
            conditions.append(Study.accession_number.in_(codes) if codes else false())
        elif name in ("patient:identifier", "patient.identifier"):
            patient_codes = _tokens(values, patient_system)
            conditions.append(Study.patient_id.in_(patient_codes) if patient_codes else false())
        elif name == "patient":
            ids = frozenset(_patient_id(v) for v in values)
            jobs = {job for job in map(job_of, ids) if job is not None}
            conditions.append(Report.job_id.in_(jobs) if jobs else false())
            patients.append(ids)
        elif name == "date":
            conditions.append(or_(*(_date(v) for v in values)))
        elif name == "status":
            conditions.append(Report.status.in_(_statuses(values)))
        else:
            known = ", ".join(p.name for p in SEARCH_PARAMS)
            raise HTTPException(
                400, f"unknown search parameter {name!r} for DiagnosticReport (known: {known})"
            )
    return Search(tuple(conditions), tuple(patients), tuple(accessions))


def _values(name: str, raw: str) -> list[str]:
    values = [v.strip() for v in raw.split(",")]
    if not all(values) or any(len(v) > 200 for v in values):
        raise HTTPException(400, f"search parameter {name} needs a value (at most 200 characters)")
    return values


def _tokens(values: list[str], our_system: str) -> list[str]:
    """The codes of ``[system|]code`` tokens whose system (if given) is the one we publish."""
    codes = []
    for value in values:
        system, bar, code = value.rpartition("|")
        if not code:
            raise HTTPException(400, f"token {value!r} has no value after the '|'")
        if not bar or system == our_system:
            codes.append(code)
    return codes


def _patient_id(value: str) -> str:
    """The id of a Patient reference: ``id``, ``Patient/id`` or ``<base>/Patient/id``."""
    kind, _, ident = value.rpartition("/")
    if kind and not kind.endswith("Patient"):
        raise HTTPException(400, f"patient {value!r} must refer to a Patient")
    return ident


def _statuses(values: list[str]) -> list[str]:
    unknown = [v for v in values if v not in REPORT_STATUSES]
    if unknown:
        allowed = ", ".join(sorted(REPORT_STATUSES))
        raise HTTPException(
            400, f"status {unknown[0]!r} is not a DiagnosticReport status ({allowed})"
        )
    return values


def _date(value: str) -> ColumnElement[bool]:
    """The condition on the study date (YYYYMMDD text, which compares as dates do)."""
    match = _DATE.fullmatch(value)
    if match is None:
        raise HTTPException(
            400,
            f"date {value!r}: give [prefix]YYYY, YYYY-MM or YYYY-MM-DD (the study date is "
            "kept to the day)",
        )
    prefix, year, month, day = (
        match.group(1) or "eq",
        match.group(2),
        match.group(3),
        match.group(4),
    )
    if prefix in ("sa", "eb", "ap"):
        raise HTTPException(400, f"date prefix {prefix!r} is not supported (eq ne gt lt ge le)")
    first, last = _day_range(value, int(year), month, day)
    column = Study.study_date
    known = func.length(column) == 8
    return and_(
        known,
        {
            "eq": column.between(first, last),
            "ne": not_(column.between(first, last)),
            "gt": column > last,
            "lt": column < first,
            "ge": column >= first,
            "le": column <= last,
        }[prefix],
    )


def _day_range(value: str, year: int, month: str | None, day: str | None) -> tuple[str, str]:
    """The first and last day (YYYYMMDD) of a date search value's precision."""
    try:
        if month is None:
            return f"{year:04d}0101", f"{year:04d}1231"
        last_day = calendar.monthrange(year, int(month))[1]
        if day is None:
            return f"{year:04d}{month}01", f"{year:04d}{month}{last_day:02d}"
        if not 1 <= int(day) <= last_day:
            raise ValueError(day)
    except (ValueError, calendar.IllegalMonthError):
        raise HTTPException(400, f"date {value!r} is not a calendar date") from None
    return f"{year:04d}{month}{day}", f"{year:04d}{month}{day}"
