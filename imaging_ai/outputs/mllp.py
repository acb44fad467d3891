"""Takes an HL7 message and a RIS address; sends it over MLLP and gives the RIS's acknowledgement.

Original-mode acknowledgement: AA (or the enhanced-mode commit CA) is success; AE, AR, CE, CR,
an acknowledgement of another message, silence past the timeout, a refused or dropped
connection are a :class:`~imaging_ai.errors.DeliveryError` whose text says which, for the
outbox to record and retry. Transport is python-hl7's asyncio MLLP streams. Logs carry the
control ID and the address, never patient data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import hl7  # type: ignore[import-untyped]
from hl7.mllp import InvalidBlockError, open_hl7_connection  # type: ignore[import-untyped]

from imaging_ai.errors import DeliveryError

log = logging.getLogger(__name__)

SUCCESS = frozenset({"AA", "CA"})
_MEANING = {
    "AE": "application error",
    "AR": "application reject",
    "CE": "commit error",
    "CR": "commit reject",
}


@dataclass(frozen=True)
class Ack:
    """A RIS's answer to one message (MSA), with any error text (MSA-3, ERR)."""

    code: str
    control_id: str
    text: str = ""

    @property
    def ok(self) -> bool:
        """True for AA (and CA): the RIS took the message."""
        return self.code in SUCCESS


def segments(message: str) -> str:
    """The message with CR between segments, whatever line ends it was stored with.

    Text files read with universal newlines turn CR into LF; HL7 needs CR. Fields never hold
    raw line breaks (they are escaped), so every line break is a segment boundary.
    """
    lines = message.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\r".join(line for line in lines if line) + "\r"


def control_id(message: str) -> str:
    """MSH-10 of a message.

    Raises
    ------
    DeliveryError
        The text is not an HL7 message (a damaged payload: resending cannot help).
    """
    try:
        return str(hl7.parse(segments(message)).segment("MSH")(10))
    except (hl7.ParseException, KeyError, IndexError) as exc:
        raise DeliveryError(f"the stored HL7 message is not valid HL7 ({exc})") from exc


def parse_ack(text: str) -> Ack:
    """An Ack from ACK text.

    Raises
    ------
    DeliveryError
        The text is not an HL7 message with an MSA segment.
    """
    try:
        message = hl7.parse(segments(text))
        message.segment("MSA")
    except (hl7.ParseException, KeyError, IndexError) as exc:
        raise DeliveryError("the RIS answered with something that is not an HL7 ACK") from exc
    code = _text(message, "MSA", 1, 1).strip().upper()
    details = [_text(message, "MSA", 1, 3)]
    for n in range(1, sum(str(segment(0)) == "ERR" for segment in message) + 1):
        # ERR-8 user message, else ERR-3's text (2.5); else the text in ERR-1's code (2.3)
        details.append(
            _text(message, "ERR", n, 8)
            or _text(message, "ERR", n, 3, 2)
            or _text(message, "ERR", n, 1, 4, 2)
            or _text(message, "ERR", n, 1, 4)
        )
    unique = dict.fromkeys(d for d in details if d)  # many RIS repeat MSA-3 in ERR-8
    return Ack(code, _text(message, "MSA", 1, 2), "; ".join(unique))


def _text(
    message: hl7.Message, segment: str, number: int, field: int, component: int = 1, sub: int = 1
) -> str:
    """A field, component or subcomponent, unescaped; "" where the message does not have it."""
    try:
        return str(message.extract_field(segment, number, field, 1, component, sub))
    except (IndexError, KeyError):
        return ""


async def send_oru_async(host: str, port: int, message: str, timeout: float = 30.0) -> Ack:
    """Send ``message`` and wait for its acknowledgement; see :func:`send_oru`."""
    text = segments(message)
    expected = control_id(text)
    where = f"RIS at {host}:{port}"
    try:
        async with asyncio.timeout(timeout):
            reply = await _exchange(host, port, text)
    except TimeoutError:
        raise DeliveryError(f"{where} sent no acknowledgement within {timeout:g} s") from None
    except ConnectionRefusedError:
        raise DeliveryError(f"{where} refused the connection (is its HL7 listener up?)") from None
    except asyncio.IncompleteReadError:
        raise DeliveryError(f"{where} closed the connection without acknowledging") from None
    except (InvalidBlockError, ValueError) as exc:
        raise DeliveryError(f"{where} answered with a malformed MLLP block ({exc})") from None
    except OSError as exc:
        raise DeliveryError(f"cannot reach {where}: {exc.strerror or exc}") from None
    ack = parse_ack(reply)
    log.info("ORU %s to %s:%d: %s", expected, host, port, ack.code)
    if ack.control_id != expected:
        raise DeliveryError(f"{where} acknowledged message {ack.control_id!r}, not {expected!r}")
    if not ack.ok:
        meaning = _MEANING.get(ack.code, "unknown acknowledgement code")
        raise DeliveryError(
            f"{where} answered {ack.code} ({meaning}): {ack.text or 'no reason given'}"
        )
    return ack


async def _exchange(host: str, port: int, text: str) -> str:
    reader, writer = await open_hl7_connection(
        host, port, encoding="utf-8", encoding_errors="replace"
    )
    try:
        writer.writeblock(text.encode("utf-8"))
        await writer.drain()
        block: bytes = await reader.readblock()
        return block.decode("utf-8", errors="replace")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def send_oru(host: str, port: int, message: str, timeout: float = 30.0) -> Ack:
    """Send an HL7 message to a RIS over MLLP and wait for its ACK.

    Parameters
    ----------
    host, port
        The RIS's MLLP listener.
    message
        ER7 text (CR or LF between segments).
    timeout
        Seconds for the whole exchange: connect, send, acknowledgement.

    Returns
    -------
    Ack
        An AA (or CA) acknowledgement of this message.

    Notes
    -----
    Runs its own event loop (``asyncio.run``): call it from a thread such as the outbox's;
    code already in an event loop awaits :func:`send_oru_async` instead.

    Raises
    ------
    DeliveryError
        AE/AR (with the RIS's error text), no answer in time, connection refused or dropped,
        or an answer that is not an acknowledgement of this message.
    """
    return asyncio.run(send_oru_async(host, port, message, timeout))
