"""docs/conformance.md against the code: its generated tables are what
scripts/conformance_tables.py prints, and the statements beside them that the tables cannot carry
(C-STORE statuses, what the A-ASSOCIATE-AC answers, which syntax is chosen) hold."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydicom.uid import (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEGLSLossless,
)
from pynetdicom.pdu import A_ASSOCIATE_AC, A_ASSOCIATE_RQ
from pynetdicom.pdu_primitives import (
    A_ASSOCIATE,
    AsynchronousOperationsWindowNegotiation,
    ImplementationClassUIDNotification,
    ImplementationVersionNameNotification,
    MaximumLengthNotification,
    SCP_SCU_RoleSelectionNegotiation,
    SOPClassExtendedNegotiation,
)
from pynetdicom.presentation import build_context
from pynetdicom.sop_class import CTImageStorage  # type: ignore[attr-defined]

from imaging_ai import receive_store
from imaging_ai.dicom import association, dul, negotiation
from imaging_ai.receive_contexts import supported_contexts

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "docs" / "conformance.md"
RUN = "PYTHONPATH=.:devkit .venv/bin/python scripts/conformance_tables.py --write"


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    """scripts/conformance_tables.py as a module (a dev script, not in the package)."""
    spec = importlib.util.spec_from_file_location(
        "conformance_tables", ROOT / "scripts" / "conformance_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tables: ModuleType) -> dict[str, str]:
    return dict(tables.generated())


def test_generated_sections_are_what_the_code_gives(
    tables: ModuleType, generated: dict[str, str]
) -> None:
    stale = tables.differences(DOCUMENT.read_text(), generated)
    assert not stale, (
        f"docs/conformance.md's generated sections {stale} differ from the code (or their "
        f"markers are missing): run `{RUN}`, check the diff, and fix the prose beside them"
    )


def test_a_changed_or_missing_section_is_caught(
    tables: ModuleType, generated: dict[str, str]
) -> None:
    text = tables.rewritten(DOCUMENT.read_text(), generated)
    assert tables.differences(text, generated) == []
    edited = text.replace("| CT Image Storage |", "| MR Image Storage |", 1)
    assert tables.differences(edited, generated) == ["sop-classes"]
    unmarked = text.replace("<!-- generated: scu-statuses -->", "", 1)
    assert tables.differences(unmarked, generated) == ["scu-statuses"]


def test_rewriting_puts_the_code_s_tables_between_the_markers(
    tables: ModuleType, generated: dict[str, str]
) -> None:
    stale = DOCUMENT.read_text().replace("| Segmentation Storage |", "| Old Storage |")
    fresh = tables.rewritten(stale, generated)
    assert tables.in_document(fresh) == generated
    assert "Old Storage" not in fresh


def _documented_statuses(text: str) -> set[int]:
    """The status codes of the storage SCP's C-STORE table (the one with a "When" column)."""
    start = text.index("| Status | Meaning | When |")
    rows = text[start:].split("\n\n", 1)[0].splitlines()[2:]
    return {int(re.match(r"\| `0x([0-9A-F]{4})`", row).group(1), 16) for row in rows}  # type: ignore[union-attr]


def _statuses_in(module: ModuleType) -> set[int]:
    return {v for k, v in vars(module).items() if k.startswith("STATUS_") and isinstance(v, int)}


def test_the_scp_statuses_documented_are_the_ones_it_answers() -> None:
    answered = _statuses_in(receive_store) | _statuses_in(association)
    assert _documented_statuses(DOCUMENT.read_text()) == answered


def _request(*user_items: object, syntaxes: list[str] | None = None) -> bytes:
    """An A-ASSOCIATE-RQ body proposing CT Image Storage, with extra user information items."""
    primitive = A_ASSOCIATE()
    primitive.application_context_name = dul.APPLICATION_CONTEXT
    primitive.calling_ae_title = "PACS"
    primitive.called_ae_title = "IMAGING_AI"
    context = build_context(CTImageStorage, syntaxes)
    context.context_id = 1
    primitive.presentation_context_definition_list = [context]
    max_length = MaximumLengthNotification()
    max_length.maximum_length_received = 16384
    primitive.user_information = [max_length, *user_items]
    pdu = A_ASSOCIATE_RQ()
    pdu.from_primitive(primitive)
    return bytes(pdu.encode())[6:]  # the body, after the PDU header


def _accepted(body: bytes) -> A_ASSOCIATE:
    offer = negotiation.answer(body, 131072, supported_contexts())
    assert offer.refused is None
    pdu = A_ASSOCIATE_AC()
    pdu.decode(offer.accept)
    return pdu.to_primitive()


def test_the_association_answer_negotiates_nothing_but_what_is_documented() -> None:
    """No asynchronous operations window, no role selection, no extended negotiation is
    answered, even when the requestor asks for them (4.2.1.2, 4.2.1.4)."""
    window = AsynchronousOperationsWindowNegotiation()
    window.maximum_number_operations_invoked = 4
    window.maximum_number_operations_performed = 4
    role = SCP_SCU_RoleSelectionNegotiation()
    role.sop_class_uid = CTImageStorage
    role.scu_role, role.scp_role = True, True
    extended = SOPClassExtendedNegotiation()
    extended.sop_class_uid = CTImageStorage
    extended.service_class_application_information = b"\x02\x00\x00\x00\x01\x00"
    answer = _accepted(_request(window, role, extended))
    kinds = {type(item) for item in answer.user_information}
    assert kinds == {
        MaximumLengthNotification,
        ImplementationClassUIDNotification,
        ImplementationVersionNameNotification,
    }
    by_kind = {type(item): item for item in answer.user_information}
    uid = by_kind[ImplementationClassUIDNotification].implementation_class_uid
    assert uid == dul.IMPLEMENTATION_CLASS_UID
    assert f"| Implementation Class UID | {uid} |" in DOCUMENT.read_text()


def test_the_scp_takes_the_requestor_s_first_syntax_it_decodes() -> None:
    # Issue 20: the sender's choice wins when it is one we decode (JPEG-LS lossless here).
    answer = _accepted(
        _request(syntaxes=[JPEGLSLossless, ImplicitVRLittleEndian, ExplicitVRLittleEndian])
    )
    (context,) = answer.presentation_context_definition_results_list
    assert context.result == 0x00
    assert context.transfer_syntax == [JPEGLSLossless]
