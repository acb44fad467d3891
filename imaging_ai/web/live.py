"""Takes the daemon's live status (any nesting of dicts, lists and dataclasses); gives panels of
label/value pairs and tables that a template can show without knowing the keys in advance."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Words for keys the daemon reports today; other keys are shown with underscores as spaces.
LABELS = {
    "node": "Node",
    "processing": "Study in hand",
    "receivers": "DICOM receivers",
    "processes": "processes alive",
    "active": "associations open",
    "stored": "instances stored since start",
    "late": "late instances since start",
    "refused": "associations refused since start",
    "restarts": "restarts since start",
    "accepting": "accepting associations",
    "receiver_processes": "DICOM receiver processes",
    "restart_in_s": "restart in (s)",
    "last_exit": "last exit",
    "workers": "Inference workers",
    "busy_fraction": "busy",
    "batch_sizes": "batch sizes (size × batches)",
}


@dataclass(frozen=True)
class Table:
    """Rows of a list of records; columns are the union of their keys, in first-seen order."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Panel:
    """One top-level key of the live status."""

    title: str
    facts: tuple[tuple[str, str], ...] = ()
    table: Table | None = None


def live_panels(live: Callable[[], Mapping[str, Any]]) -> tuple[list[Panel], str]:
    """Panels for the status page, and an error in words if the live status failed."""
    try:
        state = live()
    except Exception as exc:
        # The page must still show the database's view when the in-memory one fails.
        log.exception("live status failed")
        return [], f"live status unavailable ({exc.__class__.__name__})"
    facts = tuple((label(k), text(k, v)) for k, v in state.items() if not _nested(v))
    panels = [Panel("This node", facts)] if facts else []
    for key, value in state.items():
        value = _plain(value)
        if isinstance(value, Mapping):
            panels.append(
                Panel(label(key), tuple((label(k), text(k, v)) for k, v in value.items()))
            )
        elif _records(value):
            panels.append(Panel(label(key), table=_table(value)))
    return panels, ""


def label(key: object) -> str:
    """Words for a key."""
    return LABELS.get(str(key), str(key).replace("_", " "))


def text(key: object, value: Any) -> str:
    """A value as a person reads it: ratios as percentages, bytes in MiB, pairs as a list."""
    name, value = str(key), _plain(value)
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and (name.endswith(("_fraction", "_ratio"))):
        return f"{value:.0%}"
    if isinstance(value, int | float) and name.endswith("_bytes"):
        return f"{value / 2**20:,.0f} MiB"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{text('', k)}: {text(k, v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        parts = [f"{v[0]}×{v[1]}" if _pair(v) else text("", v) for v in value]
        return ", ".join(parts) or "–"
    return str(value)


def _table(records: Sequence[Mapping[str, Any]]) -> Table:
    columns: dict[str, None] = {}
    for record in records:
        columns.update(dict.fromkeys(str(k) for k in record))
    rows = tuple(tuple(text(c, record.get(c)) for c in columns) for record in records)
    return Table(tuple(label(c) for c in columns), rows)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple) and value and all(_plain_record(v) for v in value):
        return [_plain(v) for v in value]
    return value


def _plain_record(value: Any) -> bool:
    return isinstance(value, Mapping) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def _records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _nested(value: Any) -> bool:
    value = _plain(value)
    return isinstance(value, Mapping) or _records(value)


def _pair(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2
