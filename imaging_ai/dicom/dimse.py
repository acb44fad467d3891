"""Takes DIMSE command sets as bytes and gives them decoded; encodes the responses (PS3.7).

A storage SCP reads a C-STORE-RQ or C-ECHO-RQ's command set and answers with a response
command set, both implicit VR little endian (PS3.7 section 6.3.1). Both are coded here with
the byte codec (``codec``) instead of through pydicom, which cost about 80 µs to decode and
a tenth of a millisecond to encode, on every C-STORE.
"""

from __future__ import annotations

import struct
from typing import Any

from pydicom import Dataset

from imaging_ai.dicom import codec
from imaging_ai.dicom.dul import ProtocolError

# DIMSE command fields, PS3.7 section E.1.
C_STORE_RQ = 0x0001
C_STORE_RSP = 0x8001
C_ECHO_RQ = 0x0030
C_ECHO_RSP = 0x8030
NO_DATASET = 0x0101

# Largest DIMSE command set taken (a C-STORE-RQ's is ~200 bytes).
MAX_COMMAND_LENGTH = codec.MAX_COMMAND_LENGTH


# Command elements (group 0000, PS3.7 section E.1) a storage SCP reads, with their VRs;
# others are skipped.
_COMMAND_ELEMENTS = {
    0x0000: ("CommandGroupLength", "UL"),
    0x0002: ("AffectedSOPClassUID", "UI"),
    0x0003: ("RequestedSOPClassUID", "UI"),
    0x0100: ("CommandField", "US"),
    0x0110: ("MessageID", "US"),
    0x0120: ("MessageIDBeingRespondedTo", "US"),
    0x0600: ("MoveDestination", "AE"),
    0x0700: ("Priority", "US"),
    0x0800: ("CommandDataSetType", "US"),
    0x0900: ("Status", "US"),
    0x0902: ("ErrorComment", "LO"),
    0x0903: ("ErrorID", "US"),
    0x1000: ("AffectedSOPInstanceUID", "UI"),
    0x1001: ("RequestedSOPInstanceUID", "UI"),
    0x1030: ("MoveOriginatorApplicationEntityTitle", "AE"),
    0x1031: ("MoveOriginatorMessageID", "US"),
}
_COMMAND_TAGS = frozenset(_COMMAND_ELEMENTS)  # group 0000: the element number is the tag
_GROUP_END = 0x00010000


class Command:
    """A decoded DIMSE command set: its elements by keyword, read like a pydicom Dataset."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, int | str]) -> None:
        self._values = values

    def get(self, keyword: str, default: Any = None) -> Any:
        """The element's value, or ``default`` when absent."""
        return self._values.get(keyword, default)

    def __contains__(self, keyword: object) -> bool:
        return keyword in self._values

    def __getattr__(self, keyword: str) -> Any:
        try:
            return self._values[keyword]
        except KeyError:
            raise AttributeError(keyword) from None


def decode_command(data: bytes | bytearray) -> Command:
    """A DIMSE command set (always implicit VR little endian), decoded directly.

    Through pydicom, decoding a C-STORE-RQ and reading its elements took ~80 µs per image.

    Raises
    ------
    ProtocolError
        An element outside group 0000, or one cut off or of the wrong length for its VR.
    """
    data = bytes(data)  # the command buffer (bytearray): ~200 bytes
    walked = codec.walk(data, 0, len(data), explicit=False, kept=_COMMAND_TAGS, stop=_GROUP_END)
    if walked is None:
        raise ProtocolError(
            "malformed DIMSE command set: it ends inside an element, or an element has an "
            "undefined length"
        )
    if walked.stop >= 0:
        tag = walked.stop_tag
        raise ProtocolError(
            f"malformed DIMSE command set: element ({tag >> 16:04X},{tag & 0xFFFF:04X}) "
            f"outside group 0000 at {walked.stop}"
        )
    values: dict[str, int | str] = {}
    for tag, (_, _, raw) in walked.elements.items():
        keyword, vr = _COMMAND_ELEMENTS[tag]
        values[keyword] = _command_value(vr, raw)
    return Command(values)


def _command_value(vr: str, raw: bytes) -> int | str:
    if vr not in codec.NUMBER_FORMATS:
        return raw.decode("ascii", "replace").strip("\x00 ")
    value = codec.number(raw, vr)
    if value is None:
        raise ProtocolError(f"malformed DIMSE command set: {vr} value of {len(raw)} bytes")
    return value


def response(
    request: Command | Dataset, command_field: int, status: int, comment: str = ""
) -> bytes:
    """The encoded response command set (group length first) to a C-STORE or C-ECHO request.

    Encoded directly, implicit VR little endian (PS3.7 section 6.3.1) with the elements in tag
    order: through pydicom it took a tenth of a millisecond, on every C-STORE.
    """
    elements = [
        _command_text(0x0002, str(request.get("AffectedSOPClassUID", "")), "UI"),
        _command_us(0x0100, command_field),
        _command_us(0x0120, int(request.get("MessageID", 0))),
        _command_us(0x0800, NO_DATASET),
        _command_us(0x0900, status),
    ]
    if comment:
        # Error Comment is LO: at most 64 characters.
        elements.append(_command_text(0x0902, comment[:64], "LO"))
    instance = request.get("AffectedSOPInstanceUID")
    if instance is not None:
        elements.append(_command_text(0x1000, str(instance), "UI"))
    body = b"".join(elements)
    return codec.implicit_element(0x00000000, struct.pack("<L", len(body))) + body


def _command_us(element: int, value: int) -> bytes:
    return codec.implicit_element(element, struct.pack("<H", value))


def _command_text(element: int, value: str, vr: str) -> bytes:
    return codec.implicit_element(element, codec.padded(value, vr))
