"""Takes the `[dicom]` settings; gives the DICOM port's listener and connections set up for DICOM.

`open_listener` is the one listening socket of the receiver pool (`imaging_ai.receive_pool`),
which hands each accepted connection to a receiver process; `Server` listens in-process for a
lone `imaging_ai.receive.Receiver` (`Receiver.start`). Each accepted connection is `set_up`
(TCP_NODELAY, the kernel's read and write timeouts, wrapped for TLS if `ssl_context` gives one)
and, under TLS, its `handshake` run; the association on it is the receiver's.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import ssl
import struct
from collections.abc import Callable

from imaging_ai.admission import Ticket
from imaging_ai.config import DicomConfig
from imaging_ai.errors import StartupError

log = logging.getLogger(__name__)

# Serves one accepted connection: (socket, peer address, TLS context or None).
Serve = Callable[[socket.socket, str, ssl.SSLContext | None], None]


def open_listener(config: DicomConfig, backlog: int = 64) -> socket.socket:
    """The listening DICOM socket, for a process that hands connections to receivers.

    Raises
    ------
    StartupError
        The address cannot be bound, with a hint.
    """
    family = socket.AF_INET6 if ":" in config.bind else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((config.bind, config.port))
        listener.listen(backlog)
    except OSError as exc:
        listener.close()
        raise StartupError(
            f"cannot listen for DICOM on {config.bind}:{config.port}: "
            f"{exc.strerror}; change dicom.port or stop the other program"
        ) from exc
    return listener


def ssl_context(config: DicomConfig) -> ssl.SSLContext | None:
    """The TLS context for accepted connections, if TLS is configured."""
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_ca:
        context.load_verify_locations(config.tls_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class Server(socketserver.ThreadingTCPServer):
    """Accepts connections and runs each association in a daemon thread.

    Raises OSError when the address cannot be bound.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, config: DicomConfig, serve: Serve) -> None:
        self.serve = serve
        self.tls = ssl_context(config)
        if ":" in config.bind:
            self.address_family = socket.AF_INET6
        super().__init__((config.bind, config.port), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, Server)
        server.serve(self.request, str(self.client_address[0]), server.tls)


def set_up(sock: socket.socket, timeout_s: float, tls: ssl.SSLContext | None) -> socket.socket:
    """An accepted connection ready for DICOM: TCP_NODELAY, timeouts, and TLS if given.

    A TLS connection comes back wrapped, its handshake not yet run (`handshake`): in
    wrap_socket it would close the descriptor when it fails, and the admission gate must let
    go of the descriptor first.
    """
    # DCMTK writes each PDU header and body separately; without TCP_NODELAY every
    # response waits for a delayed ACK (~40 ms per image).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _set_timeout(sock, timeout_s)
    if tls is None:
        return sock
    return tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


def handshake(sock: ssl.SSLSocket, ticket: Ticket) -> bool:
    """Run the TLS handshake of an accepted connection; False (logged) if it failed."""
    try:
        sock.do_handshake()
    except (ssl.SSLError, OSError) as exc:
        if not ticket.closed:  # else the gate cut it off at its deadline and logs that
            log.warning("TLS handshake with %s failed: %s", ticket.address, exc)
        return False
    return True


def _set_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Time out a blocked read or write after ``timeout_s`` (an OSError, as settimeout's).

    The kernel's SO_RCVTIMEO/SO_SNDTIMEO on a blocking socket, not ``settimeout``: Python
    implements that with a poll(2) before every recv and send, about a dozen extra system
    calls per image.
    """
    seconds = int(timeout_s)
    interval = struct.pack("@ll", seconds, int((timeout_s - seconds) * 1_000_000))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, interval)
