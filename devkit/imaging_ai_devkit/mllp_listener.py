"""A stand-in RIS: takes HL7 messages over MLLP on loopback, records them, gives back ACKs.

For tests and the demo, where no RIS exists. The listener is hl7apy's ``MLLPServer``: it
reads each ``<VT> message <FS><CR>`` block, refuses one that does not start with ``<VT>``,
hands the message to a handler by its type (MSH-9) and writes back the handler's framed
reply. The daemon sends with python-hl7, so the two ends share no MLLP code. The handler here
records the message and answers with an ACK of its control ID built with hl7apy: AA, or the
AE/AR and error text it was told to give; or nothing at all (``silent``, to test timeouts);
or it hangs up without a word (``drop``). A message of another type is answered AR.

    python -m imaging_ai_devkit.mllp_listener --port 2575
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

from hl7apy.consts import VALIDATION_LEVEL  # type: ignore[import-untyped]
from hl7apy.core import Message  # type: ignore[import-untyped]
from hl7apy.mllp import (  # type: ignore[import-untyped]
    AbstractErrorHandler,
    AbstractHandler,
    MLLPServer,
)
from hl7apy.parser import parse_message  # type: ignore[import-untyped]

from imaging_ai.outputs.hl7 import set_fields

log = logging.getLogger(__name__)

VERSION = "2.5.1"
ORU_TYPES = ("ORU^R01^ORU_R01", "ORU^R01")
"""MSH-9 as hl7apy's server matches it: the text of the field."""
SILENT_HOLD_S = 30.0
"""How long a silent listener holds a connection before closing it."""


@dataclass(frozen=True)
class Answer:
    """What the listener answers: an ACK code with its error text; or silence (``silent``);
    or closing the connection without a word (``drop``)."""

    code: str = "AA"
    text: str = ""
    silent: bool = False
    drop: bool = False


class _HangUp(Exception):
    """Raised by a handler so that hl7apy's server closes the connection without a reply."""


class RisListener:
    """An MLLP listener on ``host`` (loopback by default); port 0 picks a free port.

    ``received`` lists every message it was sent, in order; ``answer`` may be changed while
    it runs.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, answer: Answer = Answer()) -> None:
        self.answer = answer
        self.received: list[str] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        handlers: dict[str, tuple[type, RisListener]] = {
            kind: (_OruHandler, self) for kind in ORU_TYPES
        }
        handlers["ERR"] = (_ErrorHandler, self)
        self._server = MLLPServer(host, port, handlers, timeout=SILENT_HOLD_S)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="ris-listener", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> RisListener:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release silent connections and close the socket."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()

    def __enter__(self) -> RisListener:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def reply(self, text: str) -> str:
        """Record a message; give the framed ACK to send, or "" for silence.

        Raises
        ------
        _HangUp
            When told to drop the connection.
        """
        with self._lock:
            self.received.append(text)
            answer = self.answer
        control = str(parse_message(text).msh.msh_10.value)
        log.info("stand-in RIS received message %s; answering %s", control, answer.code)
        if answer.drop:
            raise _HangUp
        if answer.silent:
            self._stopping.wait(SILENT_HOLD_S)
            return ""
        return _framed(ack(control, answer.code, answer.text))


class _OruHandler(AbstractHandler):  # type: ignore[misc]
    def __init__(self, message: str, listener: RisListener) -> None:
        super().__init__(message)
        self.listener = listener

    def reply(self) -> str:
        return self.listener.reply(self.incoming_message)


class _ErrorHandler(AbstractErrorHandler):  # type: ignore[misc]
    """A message the handlers do not take: AR with the reason; a hang-up stays one."""

    def __init__(self, exc: Exception, message: str, listener: RisListener) -> None:
        super().__init__(exc, message)
        self.listener = listener

    def reply(self) -> str:
        if isinstance(self.exc, _HangUp):
            raise self.exc
        log.warning("stand-in RIS rejected a message: %s", self.exc)
        try:
            control = str(parse_message(self.incoming_message).msh.msh_10.value)
        except Exception:
            control = ""
        return _framed(ack(control, "AR", str(self.exc)))


def _framed(text: str) -> str:
    # hl7apy's server writes what a handler returns as it is, so the framing goes on here.
    return f"\x0b{text}\x1c\r"


def ack(control_id: str, code: str = "AA", text: str = "") -> str:
    """An HL7 v2.5.1 ACK of ``control_id``, built with hl7apy: MSA, and an ERR with ``text``
    for an error. ER7 text, segments ended by CR."""
    message = Message("ACK", version=VERSION, validation_level=VALIDATION_LEVEL.STRICT)
    now = datetime.now(UTC).strftime("%Y%m%d%H%M%S%z")
    set_fields(
        message.msh,
        {
            3: "RIS",
            4: "HOSPITAL",
            5: "IMAGING_AI",
            7: now,
            9: ("ACK", "R01", "ACK"),
            10: f"ACK{control_id}"[:199],
            11: "P",
            12: VERSION,
        },
    )
    set_fields(message.add_segment("MSA"), {1: code, 2: control_id, 3: text})
    if code != "AA" and text:
        error = ("207", "Application internal error", "HL70357")
        set_fields(message.add_segment("ERR"), {3: error, 4: "E", 8: text})
    message.validate()
    return str(message.to_er7()) + "\r"


def main(argv: list[str] | None = None) -> None:
    """Run a stand-in RIS until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2575)
    parser.add_argument("--answer", default="AA", choices=["AA", "AE", "AR"])
    parser.add_argument("--text", default="", help="error text sent with AE or AR")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    listener = RisListener(args.host, args.port, Answer(args.answer, args.text))
    log.info("stand-in RIS listening on %s:%d", *listener.address)
    with contextlib.suppress(KeyboardInterrupt):
        listener.serve_forever()


if __name__ == "__main__":
    main()
