"""The state enums: their values are the stored strings, and the daemon's code uses members."""

from __future__ import annotations

import ast
import re
from datetime import timedelta
from enum import StrEnum
from pathlib import Path

import pytest
from sqlalchemy import Engine, String, inspect, select, text, update
from sqlalchemy.orm import InstrumentedAttribute

import imaging_ai
from imaging_ai.db.models import Base, Delivery, Job, Report, StateType, Study
from imaging_ai.db.session import session_factory, utcnow
from imaging_ai.states import (
    ChildState,
    DeliveryState,
    JobState,
    PoolPhase,
    ReportStatus,
    StudyState,
    WorkerState,
)

PACKAGE = Path(imaging_ai.__file__).parent
# Not the daemon's code: the dev package's phantoms and benchmarks (STYLE.md 14).
NOT_SHIPPED = ("bench", "phantom")
# The strings the database holds today (and the API, FHIR search, metrics labels show):
# changing one would strand stored rows, so these are pinned here.
STORED = {
    StudyState: {"receiving", "queued", "processing", "delivering", "done", "failed"},
    JobState: {"queued", "processing", "done", "failed"},
    DeliveryState: {"pending", "done", "cancelled", "refused"},
    ReportStatus: {"preliminary"},
}
IN_MEMORY: tuple[type[StrEnum], ...] = (ChildState, WorkerState, PoolPhase)
COLUMNS: list[tuple[InstrumentedAttribute[StrEnum], type[StrEnum], StrEnum]] = [
    (Study.state, StudyState, StudyState.RECEIVING),
    (Job.state, JobState, JobState.QUEUED),
    (Delivery.state, DeliveryState, DeliveryState.PENDING),
    (Report.status, ReportStatus, ReportStatus.PRELIMINARY),
]
STATE_NAMES = {"state", "status", "_phase", "phase"}
EVERY: tuple[type[StrEnum], ...] = (*STORED, *IN_MEMORY)
STATE_VALUES = {m.value for states in EVERY for m in states}


def test_values_are_the_stored_strings() -> None:
    for states, values in STORED.items():
        assert {m.value for m in states} == values, states.__name__


def test_model_defaults_are_the_first_state() -> None:
    for column, states, first in COLUMNS:
        default = column.property.columns[0].default
        assert default is not None and default.arg is first, column
        assert isinstance(default.arg, states)


def test_migrated_columns_hold_every_value(engine: Engine) -> None:
    """The migrations' state columns (String(16)) store each value and give back members."""
    found = {
        (table, c["name"]): c["type"]
        for table in ("studies", "jobs", "deliveries", "reports")
        for c in inspect(engine).get_columns(table)
    }
    for column, states, _ in COLUMNS:
        table, name = column.property.columns[0].table.name, column.key
        kind = found[table, name]
        assert isinstance(kind, String) and kind.length is not None
        assert max(len(m.value) for m in states) <= kind.length, (table, name)
    _seed(engine)
    sessions = session_factory(engine)
    for column, states, _ in COLUMNS:
        model = column.class_
        table = model.__table__.name
        for member in states:
            with sessions() as s, s.begin():
                s.execute(update(model).values({column.key: member}))
            with sessions() as s:
                raw = s.execute(text(f"SELECT {column.key} FROM {table}")).scalar_one()
                read = s.execute(select(column)).scalar_one()
            assert type(raw) is str and raw == member.value
            assert read is member


def _seed(engine: Engine) -> None:
    now = utcnow()
    with session_factory(engine)() as s, s.begin():
        study = Study(study_instance_uid="1.2.3", received_at=now, last_instance_at=now)
        s.add(study)
        s.flush()
        job = Job(
            study_id=study.id,
            priority="urgent",
            rank=0,
            deadline=now + timedelta(hours=1),
            created_at=now,
        )
        s.add(job)
        s.flush()
        s.add(Report(study_id=study.id, job_id=job.id, created_at=now))
        s.add(
            Delivery(
                study_id=study.id,
                kind="seg",
                destination="pacs",
                payload="results/seg.dcm",
                next_try_at=now,
                created_at=now,
            )
        )


def test_every_state_column_is_typed() -> None:
    named = [
        (table.name, c)
        for table in Base.metadata.tables.values()
        for c in table.columns
        if c.name in STATE_NAMES
    ]
    covered = {(c.property.columns[0].table.name, c.key) for c, _, _ in COLUMNS}
    assert {(table, c.name) for table, c in named} == covered
    assert all(isinstance(c.type, StateType) for _, c in named)


# -- no bare state literal in the daemon's code


def _state_like(node: ast.expr) -> bool:
    """``x.state``, ``Job.state``, ``self._phase``, ``state``: where a state is kept."""
    if isinstance(node, ast.Attribute):
        return node.attr in STATE_NAMES
    return isinstance(node, ast.Name) and node.id in STATE_NAMES


def _literals(node: ast.expr | None) -> list[ast.Constant]:
    """State values written as strings in ``node`` (or its tuple, list or set items)."""
    if isinstance(node, ast.Constant) and node.value in STATE_VALUES:
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [c for item in node.elts for c in _literals(item)]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return []


def _assigned(targets: list[ast.expr], value: ast.expr | None) -> list[ast.Constant]:
    found = []
    for target in targets:
        if _state_like(target):
            found += _literals(value)
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            pairs = zip(target.elts, value.elts, strict=False)
            found += [c for t, v in pairs if _state_like(t) for c in _literals(v)]
    return found


def bare_states(source: str) -> list[int]:
    """Lines where a state is compared with, assigned or passed as a string literal."""
    found = [c for node in ast.walk(ast.parse(source)) for c in _bare(node)]
    return sorted({c.lineno for c in found})


def _bare(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(_state_like(o) for o in operands):
            return [c for o in operands if not _state_like(o) for c in _literals(o)]
    elif isinstance(node, ast.Assign):
        return _assigned(node.targets, node.value)
    elif isinstance(node, ast.AnnAssign):
        found = _assigned([node.target], node.value)
        if isinstance(node.value, ast.Call) and _state_like(node.target):  # a column's default
            defaults = [k.value for k in node.value.keywords if k.arg == "default"]
            found += [c for d in defaults for c in _literals(d)]
        return found
    elif isinstance(node, ast.Call):  # Job(state=...), .values(state=...), Job.state.in_(...)
        found = [c for k in node.keywords if k.arg in STATE_NAMES for c in _literals(k.value)]
        if _state_membership(node.func):
            found += [c for a in node.args for c in _literals(a)]
        return found
    return []


def _state_membership(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr in ("in_", "not_in")
        and _state_like(func.value)
    )


def _daemon_modules() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0] not in NOT_SHIPPED
    ]


def test_the_check_finds_bare_states() -> None:
    source = """
job.state = "queued"
job.state, job.node = "done", ""
query.where(Job.state == "pending", Delivery.state.in_(("done", "cancelled")))
update(Job).values(state="processing")
if w.state in ("starting", "ready") or self._phase != "running":
    pass
study.state = "delivering" if count else "done"
class Row:
    state: Mapped[str] = mapped_column(String(16), default="receiving")
    status: str = "preliminary"
"""
    assert bare_states(source) == [2, 3, 4, 5, 6, 8, 10, 11]
    unrelated = """
log.info("study %d done", study_id)
notice = {"done": action.name}
checks = {"disk": "ok"}
if problem == "ok":
    pass
job.notes = [*job.notes, "queued again after the daemon restarted"]
"""
    assert bare_states(unrelated) == []


def test_no_bare_state_literal_in_the_daemon() -> None:
    found = {
        str(p.relative_to(PACKAGE)): lines
        for p in _daemon_modules()
        if (lines := bare_states(p.read_text()))
    }
    assert found == {}, "use the members of imaging_ai.states"


TEMPLATE_LITERAL = re.compile(r"\.(state|status)\s*(==|!=|in|not in)\s*[\"'(\[]")


@pytest.mark.parametrize(
    "template", sorted((PACKAGE / "web" / "templates").glob("*.html")), ids=lambda p: p.name
)
def test_templates_compare_states_with_members(template: Path) -> None:
    lines = [
        n
        for n, line in enumerate(template.read_text().splitlines(), 1)
        if TEMPLATE_LITERAL.search(line)
    ]
    assert lines == [], f"{template.name}: compare with StudyState/DeliveryState members"
