"""Takes imaging_ai's own lists; gives the generated tables of docs/conformance.md.

Each table sits in the document between ``<!-- generated: NAME -->`` and ``<!-- end -->``;
``tests/test_conformance_doc.py`` fails when one differs from what this prints. Sections:

- ``implementation``: the identity each side announces (``imaging_ai.dicom.dul`` for the
  storage SCP, pynetdicom's ``AE`` as ``imaging_ai.outbox_pacs`` builds it for the SCU) and
  the File Meta of the files each side writes;
- ``sop-classes``: every SOP class as SCP and as SCU;
- ``scp-contexts``: the storage SCP's presentation contexts
  (``imaging_ai.receive_contexts.supported_contexts``, as on a machine with every pixel
  decoder installed), grouped by their transfer syntaxes, which are listed in the order
  negotiation prefers them;
- ``scu-contexts``: what the outbox proposes: the SOP class and transfer syntax of each
  result object, read as ``outbox_pacs`` reads a file, from real results of the shipped
  fixture (``imaging_ai.outputs.warm.fixture_results``) with one PACS per SR class;
- ``scu-statuses``: how the outbox reads a C-STORE response (``outbox_pacs``'s sets).

    .venv/bin/python scripts/conformance_tables.py            # print every section
    .venv/bin/python scripts/conformance_tables.py --write    # put them into the document
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from unittest import mock

from pydicom import dcmread
from pydicom.filebase import DicomBytesIO
from pydicom.uid import UID
from pynetdicom.presentation import PresentationContext
from pynetdicom.status import STORAGE_SERVICE_CLASS_STATUS

from imaging_ai import outbox_pacs, receive_contexts
from imaging_ai.config import Config, DicomConfig, OutputsConfig, PacsDestination
from imaging_ai.dicom import dul
from imaging_ai.outputs.files import EncodedResults
from imaging_ai.outputs.sr.classes import COMPREHENSIVE_3D, SR_IODS
from imaging_ai.outputs.warm import fixture_results

DOCUMENT = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"
SECTION = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end -->)", re.DOTALL)


def table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    """A markdown table."""
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


@cache
def encoded_results() -> EncodedResults:
    """The fixture's results as the daemon makes them for one PACS per SR class."""
    pacs = tuple(
        PacsDestination(f"PACS{n}", "127.0.0.1", 104, sr=sr) for n, sr in enumerate(SR_IODS)
    )
    return fixture_results(Config(outputs=OutputsConfig(pacs=pacs)))


def result_objects() -> list[tuple[str, UID, UID, str]]:
    """(object, SOP class, transfer syntax, configuration that sends it) of every result the
    outbox may send."""
    encoded = encoded_results()
    objects = [
        ("SEG", encoded.seg, '`results` holds "seg" (default)'),
        (
            "SR",
            encoded.sr,
            f'`results` holds "sr" (default), `sr = "{COMPREHENSIVE_3D}"` (default)',
        ),
        *(
            ("SR", data, f'`results` holds "sr", `sr = "{sr}"`')
            for sr, _, data in encoded.other_srs
        ),
    ]
    found = []
    with tempfile.TemporaryDirectory() as folder:
        for n, (kind, data, when) in enumerate(objects):
            path = Path(folder) / f"{n}.dcm"
            path.write_bytes(bytes(data))
            sop_class, syntax = outbox_pacs._context_of(path)  # as the outbox proposes it
            found.append((kind, sop_class, syntax, when))
    return found


def file_meta(data: bytes | memoryview) -> tuple[str, str]:
    """Implementation Class UID and Version Name of a Part-10 file's File Meta."""
    meta = dcmread(DicomBytesIO(bytes(data)), stop_before_pixels=True).file_meta
    return str(meta.ImplementationClassUID), str(meta.get("ImplementationVersionName", ""))


def implementation() -> str:
    """What each side announces at association, and the File Meta of what it writes."""
    scu = outbox_pacs.scu_ae("IMAGING_AI")
    seg_uid, seg_version = file_meta(encoded_results().seg)
    rows = [
        ("Implementation Class UID", dul.IMPLEMENTATION_CLASS_UID, scu.implementation_class_uid),
        (
            "Implementation Version Name",
            dul.IMPLEMENTATION_VERSION,
            scu.implementation_version_name,
        ),
        ("Maximum PDU length received", f"{DicomConfig().max_pdu} (`dicom.max_pdu`)",
         scu.maximum_pdu_size),
        (
            "File Meta of the files it writes",
            "spooled instances: the Implementation Class UID and Version Name above",
            f"SEG and SR: {seg_uid}, {seg_version} (highdicom's)",
        ),
    ]  # fmt: skip
    return table(["", "Storage SCP (receiving from PACS)", "Storage SCU (sending results)"], rows)


def sop_classes() -> str:
    """Every SOP class, and whether we use it as SCU, provide it as SCP, or both."""
    scp = {UID(str(cx.abstract_syntax)) for cx in receive_contexts.supported_contexts()}
    scu = {sop_class for _, sop_class, _, _ in result_objects()}
    rows = [
        (uid.name, f"`{uid}`", "Yes" if uid in scu else "No", "Yes" if uid in scp else "No")
        for uid in sorted(scp | scu, key=lambda u: (u.name, str(u)))
    ]
    return table(["SOP Class", "SOP Class UID", "SCU", "SCP"], rows)


def every_decoder_contexts() -> list[PresentationContext]:
    """The SCP's presentation contexts where every pixel decoder is installed.

    What is installed varies from one machine to the next; which syntax needs one does not
    (the table says), so the document lists them all, whatever this machine has.
    """
    with mock.patch.object(receive_contexts, "_decoder_available", lambda uid: True):
        return receive_contexts.supported_contexts()


def scp_contexts() -> str:
    """The SCP's presentation contexts: each set of abstract syntaxes with its syntaxes."""
    groups: dict[tuple[UID, ...], list[UID]] = {}
    for cx in every_decoder_contexts():
        syntaxes = tuple(UID(str(ts)) for ts in cx.transfer_syntax)
        groups.setdefault(syntaxes, []).append(UID(str(cx.abstract_syntax)))
    parts = []
    for n, (syntaxes, abstract) in enumerate(groups.items(), start=1):
        parts.append(f"**Group {n}: abstract syntaxes**\n\n")
        parts.append(
            table(
                ["Abstract Syntax", "UID", "Role", "Extended Negotiation"],
                ((a.name, f"`{a}`", "SCP", "None") for a in abstract),
            )
        )
        parts.append(f"\n**Group {n}: transfer syntaxes, in the order the SCP prefers them**\n\n")
        parts.append(
            table(
                ["Preference", "Transfer Syntax", "UID", "Accepted"],
                ((k, ts.name, f"`{ts}`", _condition(ts)) for k, ts in enumerate(syntaxes, 1)),
            )
        )
        parts.append("\n")
    return "".join(parts).rstrip("\n") + "\n"


def _condition(uid: UID) -> str:
    return "where a pixel decoder for it is installed" if uid.is_compressed else "always"


def scu_contexts() -> str:
    """One presentation context per result object: its SOP class, in its own syntax only."""
    rows = [
        (
            f"{sop_class.name} ({kind})",
            f"`{sop_class}`",
            syntax.name,
            f"`{syntax}`",
            "SCU",
            "None",
            when,
        )
        for kind, sop_class, syntax, when in result_objects()
    ]
    header = ["Abstract Syntax", "UID", "Transfer Syntax", "UID", "Role", "Ext. Neg.", "Sent when"]
    return table(header, rows)


def _meaning(code: int) -> str:
    return STORAGE_SERVICE_CLASS_STATUS.get(code, ("", "unknown status"))[1] or "Success"


def scu_statuses() -> str:
    """What the outbox does with each C-STORE response status."""
    rows: list[tuple[str, str, str]] = []
    rows += [
        (f"`0x{c:04X}`", _meaning(c), "stored: delivery done") for c in sorted(outbox_pacs.STORED)
    ]
    rows += [
        (f"`0x{c:04X}`", _meaning(c), "refused for good: delivery `refused`, not sent again")
        for c in sorted(outbox_pacs.FINAL_STATUSES)
    ]
    rows += [
        (
            f"`0x{r.start:04X}`–`0x{r.stop - 1:04X}`",
            _meaning(r.start),
            "refused for good: delivery `refused`, not sent again",
        )
        for r in outbox_pacs.FINAL_RANGES
    ]
    rows.append(("any other", "e.g. `0xA7xx` Out of Resources, `0x0110` Processing Failure",
                 "failed: an attempt with its reason, tried again with backoff"))  # fmt: skip
    return table(["Status", "Meaning", "What the outbox does"], rows)


SECTIONS: dict[str, Callable[[], str]] = {
    "implementation": implementation,
    "sop-classes": sop_classes,
    "scp-contexts": scp_contexts,
    "scu-contexts": scu_contexts,
    "scu-statuses": scu_statuses,
}


def generated() -> dict[str, str]:
    """Every section's text, by name."""
    return {name: make() for name, make in SECTIONS.items()}


def in_document(text: str) -> dict[str, str]:
    """The generated sections as the document has them, by name."""
    return {m.group(2): m.group(3) for m in SECTION.finditer(text)}


def differences(text: str, sections: dict[str, str]) -> list[str]:
    """The names of the sections the document lacks or has otherwise than ``sections``."""
    found = in_document(text)
    return [name for name, body in sections.items() if found.get(name) != body]


def rewritten(text: str, sections: dict[str, str]) -> str:
    """The document with each generated section replaced by ``sections``' text."""
    missing = set(sections) - set(in_document(text))
    if missing:
        raise SystemExit(f"{DOCUMENT} has no marker for: {', '.join(sorted(missing))}")
    return SECTION.sub(lambda m: m.group(1) + sections[m.group(2)] + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the sections of {DOCUMENT}")
    args = parser.parse_args()
    sections = generated()
    if args.write:
        DOCUMENT.write_text(rewritten(DOCUMENT.read_text(), sections))
        return 0
    for name, body in sections.items():
        sys.stdout.write(f"<!-- generated: {name} -->\n{body}<!-- end -->\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
