"""A stand-in RIS: takes HL7 messages over MLLP on loopback, records them, gives back ACKs.

For tests and the demo, where no RIS exists. It is honest about the wire: it reads MLLP blocks
byte by byte (<VT> message <FS><CR>), independently of the client's library, refuses a block
that does not start with <VT>, and answers each message with an ACK of its control ID: AA, or
the AE/AR and error text it was told to give, or nothing at all (``silent``) to test timeouts.

    python -m imaging_ai.outputs.mllp_listener --port 2575
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import socketserver
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

import hl7  # type: ignore[import-untyped]

from imaging_ai.outputs.hl7 import escape

log = logging.getLogger(__name__)

START, END = b"\x0b", b"\x1c\r"


@dataclass(frozen=True)
class Answer:
    """What the listener answers: an ACK code with its error text; or silence (``silent``);
    or closing the connection without a word (``drop``)."""

    code: str = "AA"
    text: str = ""
    silent: bool = False
    drop: bool = False


class RisListener:
    """An MLLP listener on ``host`` (loopback by default); port 0 picks a free port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, answer: Answer = Answer()) -> None:
        self.answer = answer
        self.received: list[str] = []
        self._lock = threading.Lock()
        listener = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                listener._serve(self.request)

        self._server = socketserver.ThreadingTCPServer(
            (host, port), Handler, bind_and_activate=False
        )
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        self._server.server_bind()
        self._server.server_activate()
        # A short poll interval: stop() waits for the serving loop to notice.
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
        """Stop serving and close the socket."""
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

    def _serve(self, conn: socket.socket) -> None:
        """One connection: answer each complete block until the client closes."""
        buffer = b""
        while chunk := conn.recv(65536):
            buffer += chunk
            while END in buffer:
                block, buffer = buffer.split(END, 1)
                if not block.startswith(START):
                    log.warning("MLLP block without <VT> start; closing the connection")
                    return
                reply = self._receive(block[1:].decode("utf-8", errors="replace"))
                if reply is None:
                    return
                if reply:
                    conn.sendall(START + reply.encode("utf-8") + END)

    def _receive(self, text: str) -> str | None:
        """Record a message; the ACK to send, "" to stay silent, None to hang up."""
        with self._lock:
            self.received.append(text)
            answer = self.answer
        message = hl7.parse(text.replace("\n", "\r"))
        control = str(message.segment("MSH")(10))
        log.info("stand-in RIS received message %s; answering %s", control, answer.code)
        if answer.drop:
            return None
        return "" if answer.silent else ack(control, answer.code, answer.text)


def ack(control_id: str, code: str = "AA", text: str = "") -> str:
    """An HL7 v2.5.1 ACK of ``control_id``: MSA, and an ERR with ``text`` for an error."""
    now = datetime.now(UTC).strftime("%Y%m%d%H%M%S%z")
    segments = [
        f"MSH|^~\\&|RIS|HOSPITAL|IMAGING_AI||{now}||ACK^R01^ACK|ACK{escape(control_id)}|P|2.5.1",
        f"MSA|{code}|{escape(control_id)}" + (f"|{escape(text)}" if text else ""),
    ]
    if code != "AA" and text:
        segments.append(f"ERR|||207^Application internal error^HL70357|E||||{escape(text)}")
    return "\r".join(segments) + "\r"


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
