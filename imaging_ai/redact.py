"""Keeps patient identifiers out of logs and stored error text (issue 18, item 9).

highdicom warns with every single-component PatientName quoted ("The string "Doe" is unlikely
to represent the intended person name ..."); pydicom and hl7apy quote the DA/TM/PN values they
cannot convert ("Unable to convert '19AB0304' to 'DA' object", "invalid literal for int() with
base 10: '19AB'"). A log message about a patient, a person name or a date/time/name value has
its quoted values replaced by ``<redacted>``; an exception's message, logged in a traceback or
stored as a study's error, has all of them replaced, since what it quotes may be a header's
value even where it does not say so. The rest of the text, what went wrong, is kept.

This is a net for library messages, not a parser: a value a library prints unquoted is only
caught where its message is known (hl7apy's "... is not an HL7 valid date value").
"""

from __future__ import annotations

import logging
import re

REDACTED = "<redacted>"

# What makes a message one whose quoted values may be a patient's.
# pydicom's "Invalid value for VR UI: '...'" quotes raw bytes, which in a damaged data set run on
# into the next elements (a PatientID among them): any message about a VR is one.
_ABOUT_PATIENT = re.compile(
    r"patient|person ?name|birth|\b(?:PN|DA|DT|TM|VR)\b|value representation",
    re.IGNORECASE,
)
# A quoted value: the quote opens after a non-word character, and an apostrophe followed by a
# letter ("O'Brien") belongs to the value, so that "the study's" opens nothing.
_QUOTED = re.compile(
    r"""(?<!\w)'((?:[^'\n]|'(?=\w))*)'(?!\w)|(?<!\w)"((?:[^"\n]|"(?=\w))*)"(?!\w)"""
)
# pydicom names the VR it could not convert to in quotes: "to 'DA' object" is kept.
_VR_OBJECT = re.compile(r"\s+object\b")
# hl7apy puts the value first, unquoted.
_HL7_VALUE = re.compile(r"\S+(?= is not an HL7 valid \w+ value)")


def redact_text(text: str) -> str:
    """``text`` with the quoted values redacted where it is about a patient's data."""
    if not _ABOUT_PATIENT.search(text):
        return _HL7_VALUE.sub(REDACTED, text)
    return redact_all(text)


def redact_all(text: str) -> str:
    """``text`` with every quoted value redacted, for an exception's message: what it quotes
    may be a header's value even where it does not say so ("invalid literal for int() with
    base 10: '19AB'" is pydicom reading PatientBirthDate 19AB0304)."""
    text = _HL7_VALUE.sub(REDACTED, text)

    def replace(match: re.Match[str]) -> str:
        quote = match.group(0)[0]
        value = match.group(1) if quote == "'" else match.group(2)
        if re.fullmatch(r"[A-Z]{2}", value) and _VR_OBJECT.match(text, match.end()):
            return match.group(0)
        return f"{quote}{REDACTED}{quote}"

    return _QUOTED.sub(replace, text)


def exception_text(exc: BaseException) -> str:
    """An exception's message as it may be stored (a study's or a job's error) or shown."""
    return redact_all(str(exc))


def redact_traceback(text: str) -> str:
    """A formatted traceback with its exceptions' messages redacted (:func:`redact_all`).

    The messages are the lines that start in the first column; the indented lines (where,
    and the source) are code and kept as they are.
    """
    return "\n".join(line if line[:1].isspace() else redact_all(line) for line in text.split("\n"))


class RedactingFilter(logging.Filter):
    """Redacts a record's message, traceback and stack in place; never drops a record.

    Attached to handlers (a logger's own filters do not see its children's records), so that
    whatever a handler writes has been through it; applying it twice changes nothing.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging itself reports it
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_traceback(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Send warnings through logging ("py.warnings") and redact on every handler of
    ``logger`` (the root logger by default)."""
    logging.captureWarnings(True)
    target = logger if logger is not None else logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
