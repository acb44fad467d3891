"""Takes a received instance's UIDs and gives the head of its Part-10 file (PS3.10 section 7.1).

The spool keeps every instance as a DICOM file: the preamble, "DICM" and the File Meta
Information group written here, then the data set's bytes as they arrived.
"""

from __future__ import annotations

import struct

from imaging_ai.dicom import codec
from imaging_ai.dicom.dul import IMPLEMENTATION_CLASS_UID, IMPLEMENTATION_VERSION

_PREAMBLE = b"\x00" * 128 + b"DICM"


def part10_header(
    sop_class_uid: str, sop_instance_uid: str, transfer_syntax_uid: str, source_ae: str = ""
) -> bytes:
    """Preamble, "DICM" and the File Meta Information group of a Part-10 file (PS3.10 7.1).

    Encoded directly: building it through pydicom costs more than the rest of a C-STORE's
    bookkeeping. The group is always explicit VR little endian.
    """
    elements = b"".join(
        (
            codec.explicit_element(0x00020001, "OB", b"\x00\x01"),
            _meta_element(0x0002, "UI", sop_class_uid),
            _meta_element(0x0003, "UI", sop_instance_uid),
            _meta_element(0x0010, "UI", transfer_syntax_uid),
            _meta_element(0x0012, "UI", IMPLEMENTATION_CLASS_UID),
            _meta_element(0x0013, "SH", IMPLEMENTATION_VERSION),
            _meta_element(0x0016, "AE", source_ae) if source_ae else b"",
        )
    )
    group_length = codec.explicit_element(0x00020000, "UL", struct.pack("<L", len(elements)))
    return _PREAMBLE + group_length + elements


def _meta_element(element: int, vr: str, value: str) -> bytes:
    """One short explicit-VR element of group 0002, padded to even length (UI with NUL)."""
    return codec.explicit_element(0x00020000 | element, vr, codec.padded(value, vr))
